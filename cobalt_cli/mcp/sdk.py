"""The `mcp` SDK's server API, from whichever major is installed (1.x or 2.x).

mcp 2 renamed the high-level server (`mcp.server.fastmcp.FastMCP` became
`mcp.server.mcpserver.MCPServer`) and its protocol error (`McpError(ErrorData(...))` became
`MCPError(code=..., message=...)`); the rest of what Cobalt uses (tools built with
`Tool.from_function`, resources, prompts, `Context.report_progress`, the low-level server's
stdio loop) is the same in both. Frameworks still pin `mcp<2` (CrewAI), so a project that
installs one of them beside Cobalt gets mcp 1.x: every module of the MCP server imports the
SDK's server classes from here, never from the SDK itself.
"""

from __future__ import annotations

from typing import Any

from mcp.types import CallToolResult
from pydantic import ValidationError

try:
    from mcp.server.mcpserver import Context, MCPServer
    from mcp.server.mcpserver.exceptions import ResourceError, ToolError
    from mcp.server.mcpserver.tools.base import Tool
    from mcp.shared.exceptions import MCPError

    SDK_MAJOR = 2
except ImportError:  # mcp 1.x
    from mcp.server.fastmcp import Context
    from mcp.server.fastmcp import FastMCP as MCPServer
    from mcp.server.fastmcp.exceptions import ResourceError, ToolError
    from mcp.server.fastmcp.tools.base import Tool
    from mcp.shared.exceptions import McpError as MCPError

    SDK_MAJOR = 1

__all__ = [
    "SDK_MAJOR",
    "Context",
    "MCPServer",
    "ResourceError",
    "Tool",
    "ToolError",
    "is_error",
    "lowlevel",
    "new_server",
    "protocol_error",
    "structured_content",
    "tool_result",
]


class Server(MCPServer):
    """The SDK's server, whose tool errors for arguments that fail the input schema say what
    is wrong in one line per argument, not as pydantic's report with its links."""

    async def call_tool(self, name: str, arguments: dict[str, Any], *args: Any) -> Any:
        try:
            return await super().call_tool(name, arguments, *args)
        except ToolError as exc:
            if not isinstance(exc.__cause__, ValidationError):
                raise
            tool = self._tool_manager.get_tool(name)
            known = list((tool.parameters.get("properties") or {}) if tool else [])
            problems = "; ".join(argument_problem(e, known) for e in exc.__cause__.errors())
            raise ToolError(f"Error executing tool {name}: {problems}") from exc.__cause__


def argument_problem(error: Any, known: list[str]) -> str:
    """`status: input should be 'failing', 'passing' … (got 'failed')`, or `fiel is not an
    argument; the arguments are: file, filter, …`."""
    name = ".".join(str(part) for part in error.get("loc", ())) or "arguments"
    if error.get("type") == "extra_forbidden":
        return f"{name} is not an argument; the arguments are: {', '.join(known)}"
    if error.get("type") == "missing":
        return f"{name} is required"
    message = str(error.get("msg", "invalid"))
    return f"{name}: {message[:1].lower()}{message[1:]} (got {error.get('input')!r})"


def new_server(name: str, *, version: str, **settings: Any) -> MCPServer:
    """The high-level server; mcp 1.x takes the version on its low-level server."""
    if SDK_MAJOR == 2:
        return Server(name, version=version, **settings)
    server = Server(name, **settings)
    lowlevel(server).version = version
    return server


def lowlevel(server: MCPServer) -> Any:
    """The low-level server under the high-level one (its stdio runner takes no streams)."""
    if SDK_MAJOR == 2:
        return server._lowlevel_server  # noqa: SLF001
    return server._mcp_server  # noqa: SLF001


def protocol_error(code: int, message: str) -> MCPError:
    """A JSON-RPC error answered to the client (e.g. INVALID_PARAMS for a prompt argument)."""
    if SDK_MAJOR == 2:
        return MCPError(code=code, message=message)
    from mcp.types import ErrorData

    return MCPError(ErrorData(code=code, message=message))


# mcp 1.x's protocol types have only the protocol's (camelCase) field names; 2.x's have
# snake_case names and accept the camelCase ones as aliases. Built and read by those names.


def tool_result(content: list[Any], structured: dict[str, Any] | None) -> CallToolResult:
    """A tool's answer: its content blocks and its structured content."""
    return CallToolResult.model_validate({"content": content, "structuredContent": structured})


def is_error(result: CallToolResult) -> bool:
    return bool(getattr(result, "is_error" if SDK_MAJOR == 2 else "isError"))


def structured_content(result: CallToolResult) -> dict[str, Any] | None:
    return getattr(result, "structured_content" if SDK_MAJOR == 2 else "structuredContent")
