"""`cobalt mcp`: the MCP server (stdio) through which a coding agent drives Cobalt.

Tools `cobalt_run`, `cobalt_results`, `cobalt_compare`, `cobalt_generate`; resources
`cobalt://config`, `cobalt://experiments`, `cobalt://latest-results`; prompts `improve-agent`,
`generate-tests`, `regression-check` (seed 000 §13, seed 003). Each is a short adapter over the
launcher, the selectors, `results` and `generate`.

stdout is the protocol: logs go to stderr. The project is the folder holding the `cobalt.toml`
found upward from where the server starts; every file argument must resolve inside it.
"""

import asyncio
import contextlib
import importlib
import json
import logging
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import anyio
import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS, CallToolResult, TextContent, ToolAnnotations
from pydantic import Field

import cobalt
from cobalt.config import Config, ConfigError, load_config

log = logging.getLogger("cobalt.mcp")

MAX_ITEMS = 100  # items of a run returned inline, failing ones first; all are in the results file
MAX_TEXT = 2_000  # characters of any one string (input, output, reason) in a tool result
MAX_LIST = 50  # elements of any one list inside an item
MAX_RESULT_CHARS = 300_000  # the JSON of one tool result, roughly
FAILING_SHOWN = 10  # failing items described in the plain-language summary
LOW_SCORE = 0.5
COBALT_PACKAGES = {"cobalt", "cobalt_app", "cobalt_cli", "cobalt_project", "tests"}
VENDORED_DIRS = {"site-packages", "dist-packages", "node_modules", "__pypackages__"}

INSTRUCTIONS = """\
Cobalt runs experiments on an AI agent: a dataset, a runner that calls the agent, evaluators
that score each output. Use cobalt_run to run experiments (all, or one file), read the failing
items and the judges' reasons, change the agent, run again, then cobalt_compare the two runs.
cobalt_generate writes a new experiment file for an agent. Paths are relative to the project."""


# --------------------------------------------------------------------------- the project


class Project:
    """The project the server works in; its configuration is re-read for every call."""

    def __init__(self, config: Config) -> None:
        self.dir = config.project_dir.resolve()
        # One run or generation at a time: both import (and forget) the project's modules.
        self.code_lock = threading.Lock()

    def config(self) -> Config:
        return load_config(self.dir)

    def relative(self, path: str | Path | None) -> str | None:
        if not path:
            return None
        try:
            return Path(path).resolve().relative_to(self.dir).as_posix()
        except ValueError:
            return str(path)


def forget_project_modules(project_dir: Path) -> int:
    """Drop the project's own modules from `sys.modules`, so edited agent code is re-imported.

    A long-lived server would otherwise keep running the agent as it was at the first call.
    Virtualenvs inside the project (`.venv`, site-packages) and Cobalt itself are kept.
    """
    root = str(project_dir) + os.sep
    dropped = 0
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if not file or name == "__main__" or name.split(".")[0] in COBALT_PACKAGES:
            continue
        path = os.path.abspath(file)
        if not path.startswith(root):
            continue
        parts = Path(path[len(root) :]).parts
        if any(p.startswith(".") or p in VENDORED_DIRS for p in parts):
            continue
        del sys.modules[name]
        dropped += 1
    importlib.invalidate_caches()
    return dropped


# --------------------------------------------------------------------------- errors


def anticipated() -> tuple[type[Exception], ...]:
    """Failures with a message meant for the user (logged without a traceback)."""
    from cobalt.dataset import DatasetError
    from cobalt_app.discovery import PathOutsideProject
    from cobalt_app.generate import GenerateError
    from cobalt_app.providers import ProviderError
    from cobalt_app.selectors import RunNotFound

    return (
        PathOutsideProject,
        ConfigError,
        RunNotFound,
        GenerateError,
        ProviderError,
        DatasetError,
        FileNotFoundError,
    )


def describe(exc: BaseException) -> str:
    """A message for the client: what went wrong and, where known, what to do."""
    from cobalt_app.discovery import PathOutsideProject
    from cobalt_app.selectors import RunNotFound

    if isinstance(exc, PathOutsideProject):
        return f"refused: {exc}"
    if isinstance(exc, ConfigError):
        return f"configuration error: {exc}"
    if isinstance(exc, RunNotFound):
        return str(exc).replace("`cobalt history` lists runs", "cobalt_results lists runs")
    if isinstance(exc, anticipated()):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


@contextlib.contextmanager
def tool_errors(tool: str) -> Iterator[None]:
    """Every failure becomes a tool error with a useful message; the server never crashes."""
    try:
        yield
    except ToolError:
        raise
    except Exception as exc:
        if isinstance(exc, anticipated()):
            log.info("%s refused: %s", tool, exc)
        else:
            log.exception("%s failed", tool)
        raise ToolError(describe(exc)) from exc


@contextlib.contextmanager
def resource_errors(uri: str) -> Iterator[None]:
    try:
        yield
    except ResourceError:
        raise
    except Exception as exc:
        log.exception("reading %s failed", uri)
        raise ResourceError(f"{uri}: {describe(exc)}") from exc


@contextlib.contextmanager
def database() -> Iterator[None]:
    """ORM work on a worker thread: drop stale connections before and after (PostgreSQL)."""
    from django.db import close_old_connections

    close_old_connections()
    try:
        yield
    finally:
        close_old_connections()


# --------------------------------------------------------------------------- shaping results


def clip(value: Any, limit: int = MAX_TEXT) -> Any:
    """Long strings and lists are cut, saying so; containers are walked."""
    if isinstance(value, str):
        if len(value) <= limit:
            return value
        return value[:limit] + f"… [truncated: {len(value)} characters in all]"
    if isinstance(value, dict):
        return {key: clip(inner, limit) for key, inner in value.items()}
    if isinstance(value, list):
        shown = [clip(inner, limit) for inner in value[:MAX_LIST]]
        if len(value) > MAX_LIST:
            shown.append(f"… [truncated: {len(value)} elements in all]")
        return shown
    return value


def item_problems(entry: dict[str, Any]) -> list[str]:
    """Why an item of the results document is failing (empty when it passes)."""
    if entry.get("status") not in (None, "ok"):
        return [f"{entry['status']}: {entry.get('error') or 'no detail'}"]
    problems = []
    for name, verdict in (entry.get("evaluations") or {}).items():
        if verdict.get("score") is None:
            problems.append(f"{name} could not score it ({verdict.get('error')})")
        elif verdict["score"] < LOW_SCORE:
            reason = f" — {verdict['reason']}" if verdict.get("reason") else ""
            problems.append(f"{name} {verdict['score']:.2f}{reason}")
    return problems


def run_report(run: Any, project: Project) -> tuple[str, dict[str, Any]]:
    """(plain-language summary, results document) of a run, bounded in size.

    Items are streamed: at most MAX_ITEMS failing and MAX_ITEMS passing ones are kept, and
    failing items come first when the document has to shrink. Every item stays in the file.
    """
    from cobalt_app.models import ItemResult
    from cobalt_app.results import iter_item_entries, run_header

    header = run_header(run)
    failing: list[dict[str, Any]] = []
    passing: list[dict[str, Any]] = []
    total = failing_total = 0
    for entry in iter_item_entries(run):
        total += 1
        if item_problems(entry):
            failing_total += 1
            if len(failing) < MAX_ITEMS:
                failing.append(entry)
        elif len(passing) < MAX_ITEMS:
            passing.append(entry)
    tracebacks = dict(
        ItemResult.objects.filter(run=run, status=ItemResult.Status.ERROR)
        .exclude(traceback="")
        .order_by("item_index", "run_index")
        .values_list("item_index", "traceback")[:FAILING_SHOWN]
    )
    text = describe_run(header, failing, failing_total, total, tracebacks)
    results_file = project.relative(run.results_path)
    limit = MAX_ITEMS
    while True:
        shown = sorted((failing + passing)[:limit], key=lambda e: (e["index"], e["runIndex"]))
        doc = {**header, "resultsFile": results_file, "items": clip(shown)}
        if len(shown) < total:
            doc["truncated"] = {
                "itemsShown": len(shown),
                "itemsTotal": total,
                "note": "failing items first; every item is in resultsFile",
            }
        if limit <= 10 or len(json.dumps(doc, default=str)) <= MAX_RESULT_CHARS:
            return text, doc
        limit //= 2


def score_line(summary: dict[str, Any]) -> str:
    parts = []
    for name, stats in (summary.get("scores") or {}).items():
        avg = stats.get("avg")
        parts.append(f"{name} avg {avg:.2f}" if avg is not None else f"{name} no scores")
    return ", ".join(parts) or "no evaluators"


def duration_text(milliseconds: float | None) -> str:
    if milliseconds is None:
        return ""
    if milliseconds < 1000:
        return f", {milliseconds:.0f} ms"
    return f", {milliseconds / 1000:.1f} s"


def describe_run(
    header: dict[str, Any],
    failing: list[dict[str, Any]],
    failing_total: int,
    total: int,
    tracebacks: dict[int, str],
) -> str:
    """A few plain-language lines about one run and its failing items."""
    summary = header.get("summary") or {}
    lines = [
        f"{header['name']} — run {header['id']} ({header.get('status')}, {total} items"
        f"{duration_text(summary.get('totalDurationMs'))}): {score_line(summary)}."
    ]
    if not failing_total:
        lines.append(f"All items passed (no errors, no score below {LOW_SCORE}).")
    else:
        lines.append(f"{failing_total} of {total} items failing:")
    for entry in failing[:FAILING_SHOWN]:
        output = entry.get("output", {}).get("output")
        shown = clip(output if isinstance(output, str) else json.dumps(output, default=str), 200)
        line = f"  - #{entry['index'] + 1} {entry.get('key')}: {'; '.join(item_problems(entry))}"
        if entry.get("status") == "ok":
            line += f" | output: {shown!r}"
        lines.append(clip(line, 600))
        if entry["index"] in tracebacks:
            tail = tracebacks[entry["index"]].strip().splitlines()[-4:]
            lines.extend(f"      {text}" for text in tail)
    if failing_total > FAILING_SHOWN:
        lines.append(f"  … and {failing_total - FAILING_SHOWN} more (see the items).")
    return "\n".join(lines)


def run_overview(run: Any, project: Project) -> dict[str, Any]:
    """One run in the shape of seed 003's latest-results entries."""
    from cobalt_app.results import run_header

    summary = run.summary or {}
    scores = {
        name: {key: stats.get(key) for key in ("avg", "min", "max")}
        for name, stats in (summary.get("scores") or {}).items()
    }
    averages = [s["avg"] for s in scores.values() if s.get("avg") is not None]
    return {
        "id": run.id,
        "name": run.name,
        "timestamp": run_header(run)["timestamp"],
        "status": run.status,
        "file": run.file or None,
        "tags": run.tags,
        "total": run.total_items,
        "completed": (summary.get("itemStatus") or {}).get("ok", 0),
        "failed": run.error_count + run.timeout_count,
        "evaluationErrors": summary.get("evaluationErrors", 0),
        "avgScore": sum(averages) / len(averages) if averages else None,
        "cost": run.estimated_cost,
        "duration": run.duration_ms,
        "scores": scores,
        "resultsFile": project.relative(run.results_path),
    }


def json_result(text: str, data: dict[str, Any]) -> CallToolResult:
    """A plain-language summary, the data as JSON text, and the same as structured content."""
    body = json.dumps(data, ensure_ascii=False, indent=1, default=str)
    structured = json.loads(body)
    return CallToolResult(
        content=[TextContent(type="text", text=text), TextContent(type="text", text=body)],
        structured_content=structured,
    )


# --------------------------------------------------------------------------- cobalt_run


class ProgressRelay:
    """Engine reporter that turns finished items into MCP progress notifications.

    `item_finished` is called on the engine's event-loop thread (or a worker's result thread
    in team mode); events cross to the MCP loop with `call_soon_threadsafe` and `forward()`
    sends them in order.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[tuple[int, int, str] | None] = asyncio.Queue()
        self.lock = threading.Lock()
        self.estimates: list[int] = []
        self.started = 0
        self.done = 0
        self.sent = 0

    def expect(self, experiments: list[Any]) -> None:
        self.estimates = [len(e.dataset) * e.runs for e in experiments]

    def run_started(self, run: Any, experiment: Any) -> None:
        with self.lock:
            if self.started < len(self.estimates):
                self.estimates[self.started] = run.total_items
            else:
                self.estimates.append(run.total_items)
            self.started += 1

    def item_finished(self, outcome: Any, done: int, total: int) -> None:
        try:
            self._relay(outcome, done, total)
        except Exception:  # progress is best effort; the run must go on
            log.exception("progress event dropped")

    def _relay(self, outcome: Any, done: int, total: int) -> None:
        scores = ", ".join(
            f"{e.evaluator} {e.score:.2f}" if e.score is not None else f"{e.evaluator} error"
            for e in outcome.evaluations
        )
        message = f"item {outcome.item_index + 1} {outcome.status}" + (
            f" · {scores}" if scores else ""
        )
        with self.lock:
            self.done += 1
            event = (self.done, max(sum(self.estimates), self.done), f"{done}/{total} {message}")
        self.loop.call_soon_threadsafe(self.queue.put_nowait, event)

    def run_finished(self, run: Any) -> None:
        pass

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, None)

    async def forward(self, ctx: Context) -> None:
        while (event := await self.queue.get()) is not None:
            progress, total, message = event
            try:
                await ctx.report_progress(progress, total, message)
                self.sent += 1
            except Exception as exc:  # a client that went away must not fail the run
                log.warning("progress notification not sent: %s", exc)


def execute_run(
    project: Project,
    relay: ProgressRelay,
    *,
    file: str | None,
    name_filter: str | None,
    concurrency: int | None,
) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    """Load and run experiments (a worker thread: the launcher blocks); the capped documents."""
    from cobalt_app import discovery, launcher

    config = project.config()
    paths = [str(discovery.confine(file, project.dir, what="file"))] if file else None
    with project.code_lock, database():
        forget_project_modules(project.dir)
        experiments, errors, files = launcher.load_experiments(
            config, paths, name_filter=name_filter
        )
        failures = [
            f"{project.relative(e.path)} failed to import: {e.error}\n"
            + "\n".join((e.traceback or "").strip().splitlines()[-8:])
            for e in errors
        ]
        if not files:
            raise ToolError(
                f"no experiment files under {project.relative(config.test_dir)} (looking for "
                f"{', '.join(config.get('test_match'))}); cobalt_generate can write one"
            )
        if not experiments:
            if failures:
                raise ToolError("\n\n".join(failures))
            raise ToolError(f"no experiment matched filter {name_filter!r}")
        relay.expect(experiments)
        runs = launcher.execute(
            experiments, config, reporter=relay, overrides={"concurrency": concurrency}
        )
        documents = [run_report(run, project) for run in runs]
    return documents, failures


async def cobalt_run_tool(
    project: Project,
    ctx: Context,
    *,
    file: str | None,
    name_filter: str | None,
    concurrency: int | None,
) -> CallToolResult:
    relay = ProgressRelay(asyncio.get_running_loop())
    failure: Exception | None = None
    async with anyio.create_task_group() as group:
        group.start_soon(relay.forward, ctx)
        try:
            documents, failures = await anyio.to_thread.run_sync(
                lambda: execute_run(
                    project, relay, file=file, name_filter=name_filter, concurrency=concurrency
                )
            )
        except Exception as exc:  # re-raised outside the task group, unwrapped
            failure = exc
        finally:
            relay.close()
    if failure is not None:
        raise failure
    text = "\n\n".join(summary for summary, _ in documents)
    if failures:
        text += "\n\nSome experiment files could not be imported:\n" + "\n\n".join(failures)
    docs = [doc for _, doc in documents]
    data = docs[0] if len(docs) == 1 else {"runs": docs}
    if failures:
        data["loadErrors"] = failures
    log.info("cobalt_run: %d run(s), %d progress notifications", len(documents), relay.sent)
    return json_result(text, data)


# --------------------------------------------------------------------------- reads


def cobalt_results_tool(
    project: Project, *, run_id: str | None, limit: int, experiment: str | None
) -> CallToolResult:
    from cobalt_app.liveness import settle, settled
    from cobalt_app.selectors import run_get, run_list

    if run_id:
        return json_result(*run_report(settled(run_get(run_id)), project))
    runs = [run_overview(run, project) for run in settle(run_list(name=experiment, limit=limit))]
    if not runs:
        text = "No runs yet" + (f" for {experiment!r}" if experiment else "") + "; use cobalt_run."
    else:
        text = "\n".join(
            f"{r['id']}  {r['name']}  {r['timestamp']}  {r['status']}  "
            f"{r['total']} items, {r['failed']} errors  avg {r['avgScore']:.2f}"
            if r["avgScore"] is not None
            else f"{r['id']}  {r['name']}  {r['timestamp']}  {r['status']}  {r['total']} items"
            for r in runs
        )
    return json_result(text, {"count": len(runs), "runs": runs})


def entries_by_key(run: Any, keys: set[str]) -> dict[str, dict[str, Any]]:
    """Results-file entries of the first repetition of the given items of a run."""
    from cobalt_app.models import ItemResult
    from cobalt_app.results import iter_item_entries

    rows = ItemResult.objects.filter(run=run, run_index=0, item_key__in=keys)
    return {entry["key"]: entry for entry in iter_item_entries(run, rows)}


def verdict_text(entry: dict[str, Any] | None, evaluator: str) -> str | None:
    verdict = (entry or {}).get("evaluations", {}).get(evaluator) or {}
    return verdict.get("reason") or verdict.get("error")


def cobalt_compare_tool(project: Project, *, run_a: str, run_b: str) -> CallToolResult:
    from cobalt_app.selectors import compare_runs, run_get
    from cobalt_app.significance import describe_result

    a, b = run_get(run_a), run_get(run_b)
    diff = compare_runs(a, b, top=FAILING_SHOWN)
    changes = diff["regressions"] + diff["improvements"]
    keys = {change["key"] for change in changes}
    items_a, items_b = entries_by_key(a, keys), entries_by_key(b, keys)
    for change in changes:
        entry_a, entry_b = items_a.get(change["key"]), items_b.get(change["key"])
        change["input"] = clip((entry_b or entry_a or {}).get("input"))
        change["outputA"] = clip((entry_a or {}).get("output", {}).get("output"))
        change["outputB"] = clip((entry_b or {}).get("output", {}).get("output"))
        change["reasonA"] = clip(verdict_text(entry_a, change["evaluator"]))
        change["reasonB"] = clip(verdict_text(entry_b, change["evaluator"]))
    lines = [f"Run A {a.id} ({a.name}) → run B {b.id} ({b.name}):"]
    if a.name != b.name:
        lines.append("Note: the runs belong to different experiments; items match by key.")
    for name, values in diff["evaluators"].items():
        if values["delta"] is None:
            lines.append(f"  {name}: only scored in one run")
        else:
            lines.append(
                f"  {name}: {values['a']:.2f} → {values['b']:.2f} ({values['delta']:+.2f})"
            )
        if name in diff["significance"]:  # the paired test: is the change more than noise?
            lines.append(f"    paired test: {describe_result(diff['significance'][name])}")
    lines.append(
        f"{diff['regressionCount']} regressions and {diff['improvementCount']} improvements "
        f"across {diff['matchedItems']} matched items."
    )
    for label, rows in (("Regressed", diff["regressions"]), ("Improved", diff["improvements"])):
        for row in rows:
            lines.append(
                clip(
                    f"  {label}: {row['key']} · {row['evaluator']} {row['a']:.2f} → {row['b']:.2f}"
                    f" | output B: {row['outputB']!r} | reason B: {row['reasonB']!r}",
                    600,
                )
            )
    diff["note"] = "outputs and reasons are from each run's first repetition of the item"
    return json_result("\n".join(lines), diff)


def cobalt_generate_tool(
    project: Project,
    *,
    agent_file: str,
    output_file: str | None,
    dataset_size: int,
    context: str | None,
    overwrite: bool,
    run_one_item: bool,
) -> CallToolResult:
    from cobalt_app.generate import generate_experiment

    config = project.config()
    with project.code_lock:
        forget_project_modules(project.dir)
        generated = generate_experiment(
            config,
            agent_file=agent_file,
            output_file=output_file,
            dataset_size=dataset_size,
            context=context,
            overwrite=overwrite,
            run_one_item=run_one_item,
        )
    data = clip(generated.to_dict())
    categories = ", ".join(f"{n} {c}" for c, n in data["categories"].items())
    text = (
        f"Wrote {data['path']} ({'replaced' if data['overwritten'] else 'new'}): experiment "
        f"{data['name']!r} calling {data['function']}() from {data['agentFile']}, "
        f"{data['itemCount']} items ({categories}), evaluators "
        + ", ".join(f"{e['name']} ({e['type']})" for e in data["evaluators"])
        + ". It imports cleanly."
    )
    if data["trial"]:
        trial = data["trial"]
        scores = ", ".join(
            f"{name} {verdict['score']:.2f}"
            if verdict.get("score") is not None
            else f"{name} error"
            for name, verdict in trial["evaluations"].items()
        )
        text += (
            f" First item {trial['itemKey']}: {trial['status']}"
            + (f" ({trial['error']})" if trial.get("error") else f" ({scores})" if scores else "")
            + "."
        )
    if data["notes"]:
        text += " Notes: " + "; ".join(data["notes"]) + "."
    text += f" Next: cobalt_run with file {data['path']!r}."
    return json_result(text, data)


def config_resource(project: Project) -> dict[str, Any]:
    """Seed 003's config shape, built from the redacted configuration only."""
    from cobalt.config import parse_ttl, redact
    from cobalt_app.providers import DEFAULT_KEY_VARS

    config = project.config()
    data = config.redacted()
    judge = data.get("judge") or {}
    provider = judge.get("provider") or "openai"
    variable = DEFAULT_KEY_VARS.get(provider, "")
    if judge.get("api_key"):
        key_source = "api_key in the configuration"
    elif variable and os.environ.get(variable):
        key_source = variable
    else:
        key_source = None
    ttl = parse_ttl((data.get("cache") or {}).get("ttl"))
    return {
        "projectDir": str(project.dir),
        "configFile": project.relative(config.path),
        "testDir": project.relative(config.test_dir),
        "outputDir": data.get("output_dir"),
        "concurrency": data.get("concurrency"),
        "timeout": int(float(data.get("timeout", 30)) * 1000),
        "judge": {
            "provider": provider,
            "model": judge.get("model"),
            "baseUrl": redact(judge.get("base_url"), "database_url"),
            "apiKey": "[REDACTED]" if key_source else None,
            "apiKeySource": key_source,
        },
        "cache": {
            "enabled": bool((data.get("cache") or {}).get("enabled", True)),
            "ttl": int(ttl * 1000) if ttl else None,
        },
        "ciMode": os.environ.get("CI", "").lower() in ("1", "true", "yes"),
        "thresholds": (data.get("ci") or {}).get("thresholds") or {},
        "tags": data.get("tags") or [],
        "plugins": data.get("plugins") or [],
        "mode": "team" if config.team_mode else "embedded",
        "database": data.get("database_url") or "embedded SQLite",
    }


def experiments_resource(project: Project) -> dict[str, Any]:
    from cobalt_app.discovery import discover

    config = project.config()
    files = discover(config)
    experiments = []
    for path in files:
        name = path.name
        for suffix in (".cobalt.py", ".experiment.py", ".py"):
            if name.endswith(suffix):
                name = name[: -len(suffix)]
                break
        experiments.append({"path": project.relative(path), "name": name})
    return {
        "testDir": project.relative(config.test_dir),
        "count": len(experiments),
        "experiments": experiments,
    }


def latest_results_resource(project: Project, limit: int = 50) -> dict[str, Any]:
    """The newest finished run of each experiment (seed 003)."""
    from django.db.models import OuterRef, Subquery

    from cobalt_app.models import Run

    newest = (
        Run.objects.filter(name=OuterRef("name"), status__in=Run.FINISHED)
        .order_by("-created_at")
        .values("id")[:1]
    )
    runs = Run.objects.filter(id=Subquery(newest)).order_by("-created_at")[:limit]
    results = [run_overview(run, project) for run in runs]
    return {"count": len(results), "results": results}


# --------------------------------------------------------------------------- prompts

IMPROVE_AGENT = """\
Analyze the latest cobalt results for the experiment {experiment!r}: read the resource \
cobalt://latest-results (or call cobalt_results with experiment={experiment!r} and then with \
the run id) and identify the failing items — scores below {threshold}, errors and timeouts — \
with the evaluators' reasons. Read the experiment file (cobalt://experiments lists them) and \
the agent source code it imports. Suggest specific improvements to raise every evaluator \
above {threshold}, then apply them, run the experiment again with cobalt_run, and use \
cobalt_compare (previous run as runA, the new run as runB) to check that the failing items \
improved without new regressions. Repeat while it helps."""

GENERATE_TESTS = """\
Analyze the agent at {agent_file!r}: understand its purpose, its inputs and outputs, the \
prompts and APIs it uses, and its expected behaviour. Then call cobalt_generate with \
agentFile={agent_file!r} (add what you learned in `context`) to create a comprehensive \
experiment file covering normal cases, edge cases and adversarial inputs. Run the generated \
file with cobalt_run; if it fails to import or errors, fix the file and run it again. \
Finally present the scores and the weakest items."""

REGRESSION_CHECK = """\
Run the cobalt experiments{scope} with cobalt_run. For each new run, find the previous run of \
the same experiment (cobalt_results with experiment=<name> lists runs newest first) and call \
cobalt_compare with the previous run as runA and the new run as runB. Report every \
regression: the item, the evaluator, the score change, the two outputs and the judges' \
reasons. If there are regressions, identify the root cause (a change in the agent, its \
prompt, the dataset or the evaluators) and propose a fix."""


# --------------------------------------------------------------------------- the server


def build_server(config: Config) -> MCPServer:
    """The MCP server of one project: tools, resources and prompts."""
    project = Project(config)
    server: MCPServer = MCPServer(
        "cobalt", version=cobalt.__version__, instructions=INSTRUCTIONS, log_level="WARNING"
    )

    @server.tool(
        name="cobalt_run",
        description=(
            "Run cobalt experiments and return structured results with scores per evaluator "
            "and per item (the results-file format), plus a plain-language summary of the "
            "failing items. Sends a progress notification per finished item."
        ),
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False),
    )
    async def cobalt_run(
        ctx: Context,
        file: Annotated[
            str | None,
            Field(description="Experiment file inside the project. Default: every experiment."),
        ] = None,
        filter: Annotated[
            str | None, Field(description="Only experiments whose name matches (substring/glob).")
        ] = None,
        concurrency: Annotated[
            int | None, Field(ge=1, le=256, description="Items in parallel (overrides config).")
        ] = None,
    ) -> CallToolResult:
        with tool_errors("cobalt_run"):
            return await cobalt_run_tool(
                project, ctx, file=file, name_filter=filter, concurrency=concurrency
            )

    @server.tool(
        name="cobalt_results",
        description=(
            "List past experiment runs (newest first), or get the detailed results of one run."
        ),
        annotations=ToolAnnotations(read_only_hint=True),
    )
    def cobalt_results(
        runId: Annotated[
            str | None, Field(description="A run id (or a unique prefix) to get its results.")
        ] = None,
        limit: Annotated[int, Field(ge=1, le=200, description="Runs to list.")] = 10,
        experiment: Annotated[
            str | None, Field(description="List only runs whose experiment name contains this.")
        ] = None,
    ) -> CallToolResult:
        with tool_errors("cobalt_results"), database():
            return cobalt_results_tool(project, run_id=runId, limit=limit, experiment=experiment)

    @server.tool(
        name="cobalt_compare",
        description=(
            "Compare two runs: per-evaluator deltas and the items that regressed or improved "
            "(matched by item key) with both outputs and the judges' reasons."
        ),
        annotations=ToolAnnotations(read_only_hint=True),
    )
    def cobalt_compare(
        runA: Annotated[str, Field(description="Baseline run id.")],
        runB: Annotated[str, Field(description="Candidate run id.")],
    ) -> CallToolResult:
        with tool_errors("cobalt_compare"), database():
            return cobalt_compare_tool(project, run_a=runA, run_b=runB)

    @server.tool(
        name="cobalt_generate",
        description=(
            "Read an agent's source, ask the configured LLM for a dataset (normal, edge and "
            "adversarial cases) and evaluators suited to it, and write a runnable experiment "
            "file (default experiments/<agent>.cobalt.py) that imports the agent. Verifies the "
            "file imports. Refuses to overwrite an existing file unless overwrite is true."
        ),
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False),
    )
    def cobalt_generate(
        agentFile: Annotated[
            str, Field(description="The agent's Python source file, inside the project.")
        ],
        outputFile: Annotated[
            str | None,
            Field(
                description="Where to write (*.cobalt.py). Default experiments/<agent>.cobalt.py"
            ),
        ] = None,
        datasetSize: Annotated[
            int, Field(ge=1, le=50, description="Dataset items to generate.")
        ] = 10,
        context: Annotated[
            str | None,
            Field(description="What the agent does, expected behaviour, edge cases to cover."),
        ] = None,
        overwrite: Annotated[bool, Field(description="Replace an existing file.")] = False,
        runOneItem: Annotated[
            bool, Field(description="Also run the first item (not recorded) to check it works.")
        ] = False,
    ) -> CallToolResult:
        with tool_errors("cobalt_generate"):
            return cobalt_generate_tool(
                project,
                agent_file=agentFile,
                output_file=outputFile,
                dataset_size=datasetSize,
                context=context,
                overwrite=overwrite,
                run_one_item=runOneItem,
            )

    @server.resource(
        "cobalt://config",
        name="config",
        description="The project's Cobalt configuration (API keys redacted).",
        mime_type="application/json",
    )
    def config_json() -> str:
        with resource_errors("cobalt://config"):
            return json.dumps(config_resource(project), indent=1)

    @server.resource(
        "cobalt://experiments",
        name="experiments",
        description="The experiment files of the project.",
        mime_type="application/json",
    )
    def experiments_json() -> str:
        with resource_errors("cobalt://experiments"):
            return json.dumps(experiments_resource(project), indent=1)

    @server.resource(
        "cobalt://latest-results",
        name="latest-results",
        description="The newest finished run of each experiment, with scores per evaluator.",
        mime_type="application/json",
    )
    def latest_results_json() -> str:
        with resource_errors("cobalt://latest-results"), database():
            return json.dumps(latest_results_resource(project), indent=1, default=str)

    @server.prompt(
        name="improve-agent",
        description="Find an experiment's failing items and improve the agent until it passes.",
    )
    def improve_agent(experiment: str, threshold: str = "0.8") -> str:
        try:
            value = float(threshold)
        except ValueError:
            raise MCPError(
                code=INVALID_PARAMS,
                message=f"threshold must be a number from 0 to 1 (got {threshold!r})",
            ) from None
        return IMPROVE_AGENT.format(experiment=experiment, threshold=value)

    @server.prompt(
        name="generate-tests",
        description="Write a Cobalt experiment for an agent file with cobalt_generate.",
    )
    def generate_tests(agentFile: str) -> str:
        return GENERATE_TESTS.format(agent_file=agentFile)

    @server.prompt(
        name="regression-check",
        description="Run the experiments, compare with the previous runs, explain regressions.",
    )
    def regression_check(experiment: str | None = None) -> str:
        scope = f" for {experiment!r} (cobalt_run with filter={experiment!r})" if experiment else ""
        return REGRESSION_CHECK.format(scope=scope)

    return server


def serve() -> None:
    """Start Django for the project found from the current folder and serve MCP on stdio."""
    from cobalt_project import bootstrap

    config = load_config(require_project=True)
    with contextlib.redirect_stdout(sys.stderr):  # nothing but protocol may reach stdout
        bootstrap.setup(config)
    level = os.environ.get("COBALT_LOG_LEVEL", "INFO").upper()
    log.setLevel(level if level in logging.getLevelNamesMapping() else "INFO")
    os.chdir(config.project_dir)  # experiment files open datasets relative to the project
    server = build_server(config)
    # The SDK adds a handler to the root logger; Cobalt's loggers already write to stderr.
    logging.getLogger("cobalt").propagate = False
    log.info(
        "cobalt mcp serving %s (%s mode)",
        config.project_dir,
        config.team_mode and "team" or "embedded",
    )
    server.run("stdio")
