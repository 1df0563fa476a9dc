"""CLI commands of the mcp area: `cobalt mcp`."""

import typer


def register(app: typer.Typer) -> None:
    """Add this area's commands to the `cobalt` app."""

    @app.command()
    def mcp() -> None:
        """Start the MCP server on stdio, for Claude Code and other MCP clients."""
        from cobalt_cli.mcp.server import serve

        try:
            serve()
        except KeyboardInterrupt:
            raise typer.Exit(0) from None
