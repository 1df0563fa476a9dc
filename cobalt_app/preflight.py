"""Checks made before a run starts, so that a run that cannot succeed never calls the agent.

`check()` runs in `launcher.execute()`, the door every run goes through (`cobalt run`,
`python file.cobalt.py`, the API, the MCP server, team mode). It refuses, each with the file
and line of the evaluator and of its experiment, and what to do:

* an evaluator type that no built-in or plugin registers (with a did-you-mean);
* an option its type does not read (each type declares its options with `register()`), and
  what a type's own `validate` finds (a DeepEval or Ragas metric's name and parameters);
* a provider API key that an evaluator will need and that is not set (the same lookup the
  provider calls make, `providers.resolve_api_key`). In team mode the workers hold the keys,
  so this part is left to them;
* a dataset with no items (a run of nothing would pass any gate).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cobalt.config import Config
from cobalt.errors import CobaltError
from cobalt.evaluator import Evaluator
from cobalt.experiments import Experiment
from cobalt_app import evaluators, plugins
from cobalt_app.models import Evaluation, ItemResult, Run, RunTag
from cobalt_app.providers import ProviderError, resolve_api_key


@dataclass(frozen=True)
class Problem:
    """One reason a run cannot start, pointing at the evaluator that has it (no evaluator:
    the experiment itself, e.g. its dataset)."""

    experiment: str
    experiment_at: str  # "experiments/qa.cobalt.py:14"
    evaluator: str
    evaluator_at: str
    message: str

    def line(self) -> str:
        """The problem on its own line (as `--ci` lists it)."""
        if not self.evaluator:
            return f"experiment {self.experiment!r} ({self.experiment_at}): {self.message}"
        return (
            f"{self.evaluator_at}: evaluator {self.evaluator!r} of experiment "
            f"{self.experiment!r} ({self.experiment_at}): {self.message}"
        )


class PreflightError(CobaltError):
    """The run did not start: no item ran and no agent was called."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        blocks: dict[tuple[str, str], list[Problem]] = {}
        for problem in problems:
            blocks.setdefault((problem.experiment, problem.experiment_at), []).append(problem)
        lines = []
        for (name, where), found in blocks.items():
            lines.append(f"experiment {name!r} ({where}) cannot start:")
            lines.extend(
                f"  {p.evaluator_at}: evaluator {p.evaluator!r}: {p.message}"
                if p.evaluator
                else f"  {p.message}"
                for p in found
            )
        lines.append("Nothing ran and no agent was called; fix the above and run again.")
        super().__init__("\n".join(lines))


def check(experiments: list[Experiment], config: Config) -> None:
    """Raise `PreflightError` when any experiment cannot run; `PluginError` for a bad plugin."""
    found = problems(experiments, config)
    if found:
        raise PreflightError(found)


def problems(experiments: list[Experiment], config: Config) -> list[Problem]:
    """Every problem of these experiments' evaluators, in the order they are declared."""
    plugins.load_plugins(config)  # plugin types and their options (a no-op once loaded)
    judge_config = dict(config.get("judge") or {})
    found: list[Problem] = []
    for experiment in experiments:
        experiment_at = location(config, experiment.file, experiment.line)
        if len(experiment.dataset) == 0:
            message = empty(experiment, location(config, experiment.file, None))
            found.append(Problem(experiment.name, experiment_at, "", "", message))
        for evaluator in experiment.evaluators:
            messages = evaluator_problems(evaluator, judge_config, keys=not config.team_mode)
            evaluator_at = location(config, *evaluator.defined_at)
            found.extend(
                Problem(experiment.name, experiment_at, evaluator.name, evaluator_at, message)
                for message in messages
            )
        found.extend(length_problems(experiment, experiment_at, config))
    return found


def empty(experiment: Experiment, experiment_file: str) -> str:
    """ "Dataset is empty in <file>" (the original's words, which its users search for): the
    dataset's file, or the experiment file that holds an inline dataset."""
    from cobalt.dataset import INLINE_SOURCE

    dataset = experiment.dataset
    named = f"the dataset {dataset.name!r}" if dataset.name else "the inline dataset"
    inline = dataset.source in ("", INLINE_SOURCE)
    return (
        f"Dataset is empty in {experiment_file if inline else dataset.source}: {named} has "
        "no items, so "
        "there is nothing to run; check the file, the query or the filter/slice that produced it"
    )


def evaluator_problems(
    evaluator: Evaluator, judge_config: dict[str, Any], *, keys: bool = True
) -> list[str]:
    registered = evaluators.evaluator_type(evaluator.type)
    if registered is None:
        return [unknown_type(evaluator.type)]
    if registered.validate is not None:
        found = registered.validate(evaluator)  # its options included
    elif not registered.options_declared:
        found = []  # a plugin that declares no options takes any (the original's plugins)
    else:
        found = [
            unknown_option(option, registered)
            for option in evaluator.given_options()
            if option not in registered.accepted
        ]
    if keys and registered.provider_uses is not None:
        found.extend(missing_keys(evaluator, registered, judge_config))
    return found


def unknown_type(type_name: str) -> str:
    known = evaluators.known_types()
    close = difflib.get_close_matches(type_name, known, n=1, cutoff=0.6)
    guess = f" Did you mean {close[0]!r}?" if close else ""
    return (
        f"unknown evaluator type {type_name!r}.{guess} Known types: {', '.join(known)} "
        "(plugins add more: `plugins = [...]` in cobalt.toml)"
    )


def unknown_option(option: str, registered: evaluators.EvaluatorType) -> str:
    accepted = registered.accepted
    close = difflib.get_close_matches(option, accepted, n=1, cutoff=0.6)
    guess = f" Did you mean `{close[0]}=`?" if close else ""
    builtin = registered.implementation.__module__.startswith(evaluators.__name__)
    declare = "" if builtin else " (a plugin type declares them: `register(..., options=[...])`)"
    return (
        f"the {registered.name} evaluator has no option `{option}=`.{guess} "
        f"Its options: {', '.join(accepted)}{declare}"
    )


def missing_keys(
    evaluator: Evaluator, registered: evaluators.EvaluatorType, judge_config: dict[str, Any]
) -> list[str]:
    found: list[str] = []
    for use in registered.provider_uses(evaluator, judge_config):
        try:
            resolve_api_key(
                use.provider,
                judge_config=judge_config,
                api_key_env=use.api_key_env,
                base_url=use.base_url,
                purpose=use.purpose,
            )
        except ProviderError as exc:
            if str(exc) not in found:
                found.append(str(exc))
    return found


def location(config: Config, file: str | None, line: int | None) -> str:
    """`experiments/qa.cobalt.py:14`: relative to the project when the file is inside it."""
    if not file:
        return "<unknown file>"
    path = Path(file)
    try:
        shown = path.resolve().relative_to(config.project_dir).as_posix()
    except (ValueError, OSError):
        shown = str(path)
    return f"{shown}:{line}" if line else shown


# What the database stores, from the models: PostgreSQL refuses a longer value and SQLite keeps
# it, so a name, tag or id that fits one backend and not the other is refused here, on both.
NAME_MAX = Run._meta.get_field("name").max_length
TAG_MAX = RunTag._meta.get_field("name").max_length
EVALUATOR_NAME_MAX = Evaluation._meta.get_field("evaluator").max_length
ITEM_ID_MAX = ItemResult._meta.get_field("item_key").max_length


def length_problems(experiment: Experiment, experiment_at: str, config: Config) -> list[Problem]:
    """Names, tags, evaluator names and item ids longer than the database stores."""
    found: list[Problem] = []

    def add(message: str, evaluator: Evaluator | None = None) -> None:
        if evaluator is None:
            found.append(Problem(experiment.name, experiment_at, "", "", message))
            return
        evaluator_at = location(config, *evaluator.defined_at)
        shown = shorten(evaluator.name)
        found.append(Problem(experiment.name, experiment_at, shown, evaluator_at, message))

    if len(experiment.name) > NAME_MAX:
        add(too_long("the experiment name", experiment.name, NAME_MAX))
    for tag in experiment.tags:
        if len(str(tag)) > TAG_MAX:
            add(too_long(f"the tag {shorten(str(tag))!r}", str(tag), TAG_MAX))
    for evaluator in experiment.evaluators:
        if len(evaluator.name) > EVALUATOR_NAME_MAX:
            add(too_long("the evaluator name", evaluator.name, EVALUATOR_NAME_MAX), evaluator)
    source = experiment.dataset.source
    dataset = "the inline dataset" if source == "inline" else source
    for index, item in enumerate(experiment.dataset):
        item_id = item.get("id")
        if item_id is not None and len(str(item_id)) > ITEM_ID_MAX:
            what = f"the id of item at index {index} (in {dataset})"
            add(too_long(what, str(item_id), ITEM_ID_MAX))
            break  # one is enough to say what to do
    return found


def too_long(what: str, value: str, limit: int) -> str:
    return (
        f"{what} is {len(value)} characters long; Cobalt stores at most {limit} on every "
        "database. Shorten it"
    )


def shorten(text: str, width: int = 40) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
