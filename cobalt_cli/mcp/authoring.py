"""`cobalt_generate`: an experiment file written for an agent by the configured LLM."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import anyio.from_thread
from mcp.types import CallToolResult

from cobalt_cli.mcp.budget import shortened
from cobalt_cli.mcp.project import Project
from cobalt_cli.mcp.reads import result


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
    """Runs on a worker thread: the LLM call holds no lock; writing and importing the file
    take the project's import lock, as runs do."""
    from cobalt_app.generate import generate_experiment

    @contextlib.contextmanager
    def importing() -> Iterator[None]:
        anyio.from_thread.run(project.lock.acquire)
        try:
            with project.importing():
                yield
        finally:
            anyio.from_thread.run_sync(project.lock.release)

    generated = generate_experiment(
        project.config(),
        agent_file=agent_file,
        output_file=output_file,
        dataset_size=dataset_size,
        context=context,
        overwrite=overwrite,
        run_one_item=run_one_item,
        importing=importing,
    )
    data: dict[str, Any] = shortened(generated.to_dict(), 2_000)
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
    return result(text, data)
