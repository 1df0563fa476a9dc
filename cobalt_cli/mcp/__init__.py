"""`cobalt mcp`: the MCP server (stdio) through which a coding agent drives Cobalt.

Tools `cobalt_run`, `cobalt_results`, `cobalt_compare`, `cobalt_generate`; resources
`cobalt://config`, `cobalt://experiments`, `cobalt://latest-results`; prompts `improve-agent`,
`generate-tests`, `regression-check` (seed 000 §13, seed 003). Each is a short adapter over the
engine, the selectors, `results` and `generate`:

- `server`: resources, prompts, stdio (stdout kept for the protocol) and signals;
- `tools`: the tools' declarations (strict arguments, output schemas);
- `workspace`: several projects below one root, each served by its own child server;
- `running`: `cobalt_run`, its progress, and cancelling the runs it started;
- `reads`: `cobalt_results` (filters, paging) and `cobalt_compare` (paging);
- `reports` and `budget`: a run as a result that fits the token budget;
- `project`: the project folder, its configuration, and reloading edited modules;
- `authoring`, `resources`, `schemas`, `errors`.

The project is the folder holding the `cobalt.toml` found upward from where the server starts
(or, in a workspace, each project below it); every file argument must resolve inside it.
"""
