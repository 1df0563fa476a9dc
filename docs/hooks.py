"""The references of the documentation site, generated from the code when the site is built.

An MkDocs hook (`hooks:` in mkdocs.yml): `on_files` adds five pages that exist in no file, so
they cannot drift from what they describe:

- reference/cli.md: every `cobalt` command and option, walked from the Typer app's Click tree;
- reference/settings.md: every `cobalt.toml` setting with its default, from the settings
  table (`cobalt/config.py`, whose run settings' defaults are `cobalt/run_settings.py`);
- reference/evaluators.md: every evaluator type and the options it accepts, from the
  evaluator registry (`cobalt_app/evaluators/`);
- reference/mcp.md: the MCP server's tools with their input and output schemas, as the server
  lists them (`cobalt_cli/mcp/`);
- reference/rest-api.md: the REST API from the OpenAPI schema drf-spectacular serves, and the
  schema itself as openapi.json.

tests/test_docs.py compares these pages with the code. Django is set up on a project folder
of its own (a temporary one), so a build leaves nothing in the checkout.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

EVALUATOR_SUMMARIES = {
    "llm-judge": "an LLM scores the output from your prompt (the default type)",
    "pairwise": "an LLM says which of two outputs is better, asked in both orders",
    "function": "your function scores it",
    "exact-match": "the output equals an item field",
    "similarity": "embedding similarity to an item field",
    "contains": "the output contains some text",
    "not-contains": "the output contains none of some text",
    "regex": "a pattern is found in the output",
    "json-valid": "the output is JSON",
    "json-schema": "the output matches a JSON Schema",
    "levenshtein": "normalised edit similarity to an item field",
    "latency": "a per-item latency budget",
    "cost": "a per-item cost budget",
    "tool-calls": "the tools the agent called against the item's expected calls",
    "trajectory": "an LLM judge grades the whole tool-call sequence and answer",
    "steps": "the trace stays within a budget of model and tool calls",
    "tool-errors": "the share of the trace's tool calls that did not fail",
    "loops": "0 when one tool is called with the same arguments too many times in a row",
    "tool-used": "a tool was called, per the trace",
    "tool-not-used": "a tool was not called, per the trace",
    "turns": "a conversation's length is within bounds",
    "goal-reached": "the simulated user's verdict in a conversation",
    "autoevals": "a scorer of the autoevals package",
    "deepeval": "a DeepEval metric by class name",
    "ragas": "a Ragas metric by name",
}

SETTING_SUMMARIES = {
    "test_dir": "the folder holding the experiment files",
    "test_match": "the globs an experiment file's path matches",
    "output_dir": "where Cobalt keeps its database and results files",
    "judge": "the model LLM-judge evaluators call",
    "simulator": "the simulated user's model in conversations (default: the judge's)",
    "concurrency": "items in parallel",
    "timeout": "seconds per item",
    "timeout_grace": "seconds a timed-out item's code gets to stop",
    "cache": "the judge cache",
    "ci": "`cobalt run --ci`'s gates",
    "dashboard": "`cobalt serve`'s address",
    "database_url": "team mode: the PostgreSQL database",
    "broker_url": "team mode: the Redis broker",
    "rate_limits": "requests per minute, by provider, shared by a team",
    "webhooks": "signed JSON posts after runs and CI verdicts",
    "plugins": "project files that register evaluator types",
    "env": "environment variables set while experiments run",
    "trace": "trace capture",
    "calibration": "when a judge counts as calibrated",
    "prices": "model prices, USD per million input and output tokens",
    "replay": "`--record` / `--replay` matching",
    "mcp": "the MCP server",
    "results": "the results file's form",
    "langfuse": "`Dataset.from_langfuse` credentials",
    "langsmith": "`Dataset.from_langsmith` credentials",
    "braintrust": "`Dataset.from_braintrust` credentials",
    "basalt": "`Dataset.from_basalt` credentials",
    "retention": "what `cobalt clean` and the team sweeper delete",
}

GENERATED = {
    "reference/cli.md": lambda: cli_page(),
    "reference/settings.md": lambda: settings_page(),
    "reference/evaluators.md": lambda: evaluators_page(),
    "reference/mcp.md": lambda: mcp_page(),
    "reference/rest-api.md": lambda: rest_api_page(),
    "reference/openapi.json": lambda: json.dumps(openapi_schema(), indent=2, sort_keys=True),
}


def on_files(files: Any, config: Any) -> Any:
    """MkDocs: add the generated pages (and openapi.json) to the site."""
    from mkdocs.structure.files import File

    for path, make in GENERATED.items():
        files.append(File.generated(config, path, content=make()))
    return files


# -- Django, once, on a project of its own ---------------------------------------------------

_READY: list[Path] = []


def django_ready() -> Path:
    """Set Django up on a temporary project folder (never the checkout); return the folder."""
    if not _READY:
        folder = Path(tempfile.mkdtemp(prefix="cobalt-docs-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        os.environ.setdefault("COBALT_PROJECT_DIR", str(folder))
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cobalt_project.settings")
        import django

        django.setup()
        _READY.append(Path(os.environ["COBALT_PROJECT_DIR"]))
    return _READY[0]


def cell(text: Any) -> str:
    """A Markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def code(value: Any) -> str:
    return f"`{value if isinstance(value, str) else json.dumps(value, default=str)}`"


# -- The CLI ------------------------------------------------------------------------------


def cli_commands() -> Iterator[tuple[str, Any]]:
    """(`cobalt run`, its Click command) for every command and subcommand, depth first."""
    import typer

    from cobalt_cli.main import app

    # Typer carries its own copy of Click (typer._click): duck typing, no isinstance.
    def walk(prefix: str, group: Any) -> Iterator[tuple[str, Any]]:
        context = group.context_class(group, info_name=prefix)
        for name in sorted(group.list_commands(context)):
            command = group.get_command(context, name)
            if command is None or command.hidden:
                continue
            yield f"{prefix} {name}", command
            if hasattr(command, "list_commands"):
                yield from walk(f"{prefix} {name}", command)

    root = typer.main.get_command(app)
    yield "cobalt", root
    yield from walk("cobalt", root)


def cli_options(command: Any) -> list[str]:
    """Every option name of a command (`--filter`, `-q`, ...)."""
    names: list[str] = []
    for param in command.params:
        if param.param_type_name == "option":
            names += [*param.opts, *param.secondary_opts]
    return names


def cli_page() -> str:
    lines = [
        "# CLI reference",
        "",
        "Every command of `cobalt`, generated from its Typer app (`cobalt_cli/main.py`) when "
        "this site was built. `cobalt COMMAND --help` prints the same.",
        "",
    ]
    for path, command in cli_commands():
        lines += [f"## `{path}`", "", command.help.strip() if command.help else "", ""]
        context = command.context_class(command, info_name=path)
        lines += ["```", " ".join(command.collect_usage_pieces(context)).join([path + " ", ""])]
        lines += ["```", ""]
        rows = [param_row(param) for param in command.params if param.name != "help"]
        if rows:
            lines += ["| parameter | default | what it does |", "|---|---|---|", *rows, ""]
    return "\n".join(lines)


def param_row(param: Any) -> str:
    if param.param_type_name == "argument":
        name = f"`{param.human_readable_name}`" + ("" if param.required else " (optional)")
    else:
        name = ", ".join(f"`{opt}`" for opt in [*param.opts, *param.secondary_opts])
    default = param.default
    shown = "" if default in (None, (), [], False) or callable(default) else code(default)
    if param.param_type_name == "option" and param.is_flag and default is True:
        shown = "on"
    return f"| {name} | {cell(shown)} | {cell(getattr(param, 'help', None) or '')} |"


# -- Settings -----------------------------------------------------------------------------


def settings_rows() -> list[tuple[str, Any, str]]:
    """(dotted key, default or None, what it is) for every setting `cobalt.toml` accepts."""
    from cobalt.config import CI_SETTINGS, DEFAULTS, SETTINGS, TABLE_SETTINGS, WEBHOOK_KEYS
    from cobalt.results_file import FORMATS, LARGE_RUN
    from cobalt_cli.mcp.project import DEFAULT_RESULT_TOKENS

    tables = {**TABLE_SETTINGS, "ci": CI_SETTINGS, "webhooks": WEBHOOK_KEYS}
    defaults = {
        **DEFAULTS,
        "results": {"format": FORMATS[0], "compress": "auto", "large_run": LARGE_RUN},
        "mcp": {"result_tokens": DEFAULT_RESULT_TOKENS},
    }
    rows: list[tuple[str, Any, str]] = []
    for key in SETTINGS:
        default = defaults.get(key)
        summary = SETTING_SUMMARIES.get(key, "")
        if key in tables:
            rows.append((key, None, summary))
            table_defaults = default if isinstance(default, dict) else {}
            for sub in tables[key]:
                rows.append((f"{key}.{sub}", table_defaults.get(sub), ""))
        else:
            rows.append((key, default, summary))
    return rows


def settings_page() -> str:
    from cobalt.config import ENV_OVERRIDES

    lines = [
        "# Settings reference",
        "",
        "Every key `cobalt.toml` accepts, with its default, generated from the settings table "
        "(`cobalt/config.py`; the run settings' defaults live in `cobalt/run_settings.py`). A "
        "key not listed here stops every command with the file, the line and the closest "
        "setting. [Configuration](../concepts/configuration.md) explains them.",
        "",
        "| setting | default | what it is |",
        "|---|---|---|",
    ]
    for key, default, summary in settings_rows():
        shown = "" if default in (None, {}, []) else code(default)
        lines.append(f"| `{key}` | {cell(shown)} | {cell(summary)} |")
    lines += [
        "",
        "## Environment variables",
        "",
        "They override the file:",
        "",
        "| variable | setting |",
        "|---|---|",
        *(f"| `{name}` | `{dotted}` |" for name, (dotted, _) in ENV_OVERRIDES.items()),
        "",
    ]
    return "\n".join(lines)


# -- Evaluators ---------------------------------------------------------------------------


def evaluator_types() -> dict[str, list[str]]:
    """Every registered evaluator type → the options `Evaluator(...)` accepts for it."""
    django_ready()
    from cobalt_app.evaluators import evaluator_type, known_types

    return {name: evaluator_type(name).accepted for name in known_types()}


def evaluators_page() -> str:
    from cobalt_app.evaluators import COMMON_OPTIONS, evaluator_type

    lines = [
        "# Evaluator types",
        "",
        "Every type `Evaluator(type=...)` accepts, with the options it reads, generated from "
        "the evaluator registry's declarations (`cobalt_app/evaluators/`). Every type also "
        "takes " + ", ".join(f"`{o}`" for o in COMMON_OPTIONS) + "; any other option is "
        "refused before the run starts. [Evaluators](../concepts/evaluators.md) explains "
        "what each does.",
        "",
        "| type | what it does | options | calls a model |",
        "|---|---|---|---|",
    ]
    for name, accepted in evaluator_types().items():
        own = [o for o in accepted if o not in COMMON_OPTIONS]
        options = ", ".join(f"`{o}`" for o in own) or "—"
        calls = "yes" if evaluator_type(name).calls_provider else ""
        summary = EVALUATOR_SUMMARIES.get(name, first_line(evaluator_type(name).implementation))
        lines.append(f"| `{name}` | {cell(summary)} | {options} | {calls} |")
    return "\n".join([*lines, ""])


def first_line(fn: Callable[..., Any]) -> str:
    return ((fn.__doc__ or "").strip().splitlines() or [""])[0]


# -- MCP ----------------------------------------------------------------------------------


def mcp_tools() -> list[Any]:
    """The tools as the MCP server lists them to a client (`tools/list`)."""
    folder = django_ready()
    from cobalt.config import load_config
    from cobalt_cli.mcp.project import Project
    from cobalt_cli.mcp.server import build_server

    server = build_server(Project(load_config(folder)))
    return asyncio.run(server.list_tools())


def mcp_page() -> str:
    lines = [
        "# MCP tools",
        "",
        "The tools `cobalt mcp` serves, with their schemas, as the server lists them to a "
        "client (generated from `cobalt_cli/mcp/`). [Use Cobalt from Claude Code]"
        "(../how-to/claude-code.md) shows how to register the server.",
        "",
    ]
    for tool in mcp_tools():
        lines += [f"## `{tool.name}`", "", (tool.description or "").strip(), ""]
        lines += ["| argument | type | required | what it is |", "|---|---|---|---|"]
        schema = tool.input_schema or {}
        required = set(schema.get("required", []))
        for name, prop in schema.get("properties", {}).items():
            kind = schema_type(prop)
            yes = "yes" if name in required else ""
            lines.append(
                f"| `{name}` | {cell(kind)} | {yes} | {cell(prop.get('description', ''))} |"
            )
        lines += ["", '??? note "Input and output schemas"', ""]
        for label, data in (("input", tool.input_schema), ("output", tool.output_schema)):
            lines += [f"    {label}:", "", "    ```json"]
            lines += [f"    {line}" for line in json.dumps(data, indent=2).splitlines()]
            lines += ["    ```", ""]
    return "\n".join(lines)


def schema_type(prop: dict[str, Any]) -> str:
    if "type" in prop:
        return str(prop["type"])
    choices = prop.get("anyOf") or prop.get("oneOf") or []
    names = [schema_type(c) if "enum" not in c else "/".join(map(str, c["enum"])) for c in choices]
    return " or ".join(n for n in names if n) or (
        "/".join(map(str, prop["enum"])) if "enum" in prop else ""
    )


# -- REST API -----------------------------------------------------------------------------


@functools.cache
def openapi_schema() -> dict[str, Any]:
    """The OpenAPI schema `/api/schema/` serves (drf-spectacular)."""
    django_ready()
    from drf_spectacular.drainage import GENERATOR_STATS
    from drf_spectacular.generators import SchemaGenerator

    with GENERATOR_STATS.silence():  # its enum-naming notes are the server's, not the docs'
        return SchemaGenerator().get_schema(request=None, public=True)


def rest_api_page() -> str:
    schema = openapi_schema()
    lines = [
        "# REST API reference",
        "",
        f"{schema['info']['title']} {schema['info']['version']}, generated from the OpenAPI "
        "schema `cobalt serve` serves at `/api/schema/` (with Swagger UI at `/api/docs/`). "
        "The whole schema: [openapi.json](openapi.json). "
        "[Use the REST API](../how-to/rest-api.md) shows it at work.",
        "",
    ]
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            lines += operation_lines(method, path, operation)
    return "\n".join(lines)


def operation_lines(method: str, path: str, operation: dict[str, Any]) -> list[str]:
    text = operation.get("description") or operation.get("summary") or ""
    lines = [f"## `{method.upper()} {path}`", "", text.strip(), ""]
    parameters = operation.get("parameters", [])
    if parameters:
        lines += ["| parameter | in | type | what it is |", "|---|---|---|---|"]
        for p in parameters:
            kind = cell(schema_type(p.get("schema", {})))
            about = cell(p.get("description", ""))
            lines.append(f"| `{p['name']}` | {p['in']} | {kind} | {about} |")
        lines.append("")
    statuses = ", ".join(f"`{status}`" for status in operation.get("responses", {}))
    return [*lines, f"Answers: {statuses}.", ""]
