"""Write a runnable experiment file for an agent from a spec the configured LLM designs.

`generate_experiment()` reads the agent's source (inside the project), lists its top-level
functions and asks the judge LLM (`[judge]` in the config, through `ProviderHub.chat`) for a
spec (`generate_prompt`), checks it (`generate_spec`), renders `experiments/<agent>.cobalt.py`
(`generate_render`), imports the file through `discovery.load_file` to prove it loads, and
optionally runs its first item (nothing is recorded in the history).

The LLM must reply with one JSON object (code fences are tolerated),
`generate_prompt.REPLY_FORMAT`:

- `name`: the experiment name; `description`: one sentence, written as a comment;
- `function`: a top-level function of the agent file; `arguments`: its parameters mapped to
  dataset item fields (`{"question": "input"}` calls `answer(question=item["input"])`);
- `items`: the dataset, each with a unique `id`, a `category` (`normal`, `edge` or
  `adversarial`) and the fields the arguments and evaluators use;
- `evaluators`: `llm-judge` (`prompt` with `{{output}}` and item fields), `exact-match` and
  `contains` (`field`), `max-length` (`max_chars`).

The file is rendered from that data with `repr()` only: nothing the LLM wrote becomes code.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cobalt.config import Config
from cobalt.dataset import item_key
from cobalt.experiments import Experiment
from cobalt.run_settings import RunSettings
from cobalt_app import aio, discovery
from cobalt_app.generate_prompt import ask_llm, build_prompt
from cobalt_app.generate_render import render_experiment
from cobalt_app.generate_spec import GenerateError, agent_functions, check_spec, parse_spec

MAX_SOURCE_BYTES = 2_000_000
MAX_DATASET_SIZE = 50
EXPERIMENT_SUFFIXES = (".cobalt.py", ".experiment.py")


@dataclass
class GeneratedExperiment:
    path: str
    name: str
    agent_file: str
    function: str
    items: list[dict[str, Any]]
    evaluators: list[dict[str, Any]]
    overwritten: bool
    model: str
    tokens: int
    trial: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "name": self.name,
            "agentFile": self.agent_file,
            "function": self.function,
            "itemCount": len(self.items),
            "categories": dict(Counter(item["category"] for item in self.items)),
            "items": self.items,
            "evaluators": self.evaluators,
            "overwritten": self.overwritten,
            "verified": True,
            "model": self.model,
            "tokens": self.tokens,
            "trial": self.trial,
            "notes": self.notes,
            "next": f"cobalt_run with file {self.path!r}",
        }


def generate_experiment(
    config: Config,
    *,
    agent_file: str,
    output_file: str | None = None,
    dataset_size: int = 10,
    context: str | None = None,
    overwrite: bool = False,
    run_one_item: bool = False,
    importing: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
) -> GeneratedExperiment:
    """Ask the judge LLM for a dataset and evaluators for an agent; write and verify the file.

    `importing()` is entered around writing and importing the file only (not the LLM call):
    a long-lived caller holds its import lock there."""
    project = config.project_dir.resolve()
    agent_path = discovery.confine(agent_file, project, what="agentFile")
    if not agent_path.exists():
        raise GenerateError(f"agentFile {agent_file!r} does not exist (looked at {agent_path})")
    if not agent_path.is_file() or agent_path.suffix != ".py":
        raise GenerateError(f"agentFile {agent_file!r} is not a Python file (.py)")
    if agent_path.stat().st_size > MAX_SOURCE_BYTES:
        raise GenerateError(
            f"agentFile {agent_file!r} is larger than {MAX_SOURCE_BYTES // 1_000_000} MB; "
            "point at the module that defines the agent's entry function"
        )
    if not 1 <= dataset_size <= MAX_DATASET_SIZE:
        raise GenerateError(f"datasetSize must be between 1 and {MAX_DATASET_SIZE}")
    output_path = output_target(config, agent_path, output_file)
    if output_path.exists() and not overwrite:
        raise GenerateError(
            f"{relative(output_path, project)} already exists; pass overwrite: true to replace "
            "it, or choose another outputFile"
        )
    source = agent_path.read_text(encoding="utf-8", errors="replace")
    functions = agent_functions(source, relative(agent_path, project))
    prompt = build_prompt(
        relative(agent_path, project), source, functions, dataset_size, context or ""
    )
    reply, model, tokens = ask_llm(config, prompt)
    spec = parse_spec(reply)
    notes = check_spec(spec, functions, dataset_size)
    function = functions[spec["function"]]
    text = render_experiment(
        spec,
        function,
        agent_path=agent_path,
        output_path=output_path,
        project_dir=project,
    )
    with importing():
        existed = output_path.exists()
        write_atomically(output_path, text)
        experiment = verify(output_path, project, spec["name"])
        trial = try_first_item(experiment, config) if run_one_item else None
    return GeneratedExperiment(
        path=relative(output_path, project),
        name=spec["name"],
        agent_file=relative(agent_path, project),
        function=spec["function"],
        items=spec["items"],
        evaluators=spec["evaluators"],
        overwritten=existed,
        model=model,
        tokens=tokens,
        trial=trial,
        notes=notes,
    )


def relative(path: Path, project: Path) -> str:
    return path.relative_to(project).as_posix()


def output_target(config: Config, agent_path: Path, output_file: str | None) -> Path:
    if output_file:
        path = discovery.confine(output_file, config.project_dir, what="outputFile")
        if not path.name.endswith(EXPERIMENT_SUFFIXES):
            raise GenerateError(
                f"outputFile {output_file!r} must end with .cobalt.py or .experiment.py, "
                "so `cobalt run` discovers it"
            )
        return path
    slug = re.sub(r"[^A-Za-z0-9_-]+", "-", agent_path.stem).strip("-") or "agent"
    return discovery.confine(config.test_dir / f"{slug}.cobalt.py", config.project_dir)


def write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp{os.getpid()}")
    temporary.write_text(text, encoding="utf-8")
    temporary.replace(path)


def verify(path: Path, project: Path, name: str) -> Experiment:
    """Import the written file the way `cobalt run` does; it must register `name`."""
    loaded = discovery.load_file(path, project)
    shown = relative(path, project)
    if loaded.error:
        tail = "\n".join((loaded.traceback or "").strip().splitlines()[-6:])
        raise GenerateError(
            f"wrote {shown}, but it fails to import: {loaded.error}\n{tail}\n"
            "Fix the file (or the agent), or call cobalt_generate again with overwrite: true."
        )
    for experiment in loaded.experiments:
        if experiment.name == name:
            return experiment
    raise GenerateError(f"wrote {shown}, but importing it registered no experiment {name!r}")


def try_first_item(experiment: Experiment, config: Config) -> dict[str, Any]:
    """Run the agent and the evaluators on the first item only; nothing is recorded."""
    from cobalt_app import engine
    from cobalt_app.services import ItemSnapshot

    item = experiment.dataset[0]
    snapshot = ItemSnapshot(id=0, item_index=0, run_index=0, item_key=item_key(item), item=item)
    timeout = float(experiment.timeout or RunSettings.from_config(config).timeout)

    async def attempt() -> engine.ItemOutcome:
        db = aio.DatabaseThread()
        env = engine.make_env(config, db)
        threads = aio.Threads("cobalt-generate", 1)
        try:
            return await engine.execute_item(
                experiment, snapshot, env, timeout=timeout, threads=threads
            )
        finally:
            threads.shutdown()
            await env.hub.aclose()
            db.close()

    outcome = aio.run(attempt())
    return {
        "itemKey": outcome.item_key,
        "status": outcome.status,
        "error": outcome.error or None,
        "output": outcome.output,
        "latencyMs": outcome.latency_ms,
        "evaluations": {
            e.evaluator: (
                {"score": e.score, "reason": e.reason}
                if e.status == "ok"
                else {"score": None, "error": e.error}
            )
            for e in outcome.evaluations
        },
    }
