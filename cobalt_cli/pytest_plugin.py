"""`pytest` runs Cobalt experiments: one test per dataset item (× repetition).

Registered through the `pytest11` entry point as `cobalt` (`-p no:cobalt` turns it off); it
does something only in a Cobalt project (a `cobalt.toml` from pytest's root folder upward).
It collects the experiment files under `test_dir` (`test_match`); each item is a test named
after its experiment and key, `experiments/qa.cobalt.py::qa-agent[capital-canada]`, and an
experiment with `thresholds` gets one more, `…::qa-agent::thresholds`.

An experiment runs once, when its first selected test runs, with only the selected items
(`-k`, `--lf`, node ids), in-process as `cobalt run` would; the run is stored in the history.
A test fails when its item errored or timed out, or when an evaluation errored or scored below
that evaluator's pass mark (`Evaluator(..., pass_threshold=...)`, 0.5 by default); the reason
is the failure message.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cobalt.verdict import Verdict, evaluation_verdict, pass_mark


class ItemFailed(Exception):
    """An item's test failed; the message says why (shown without a Python traceback)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cobalt")
    group.addoption(
        "--cobalt-concurrency",
        type=int,
        default=None,
        help="Items of an experiment run at once (default: the experiment's).",
    )


def _project(config: pytest.Config) -> Any:
    """The Cobalt configuration of the project pytest runs in, or None (then: inert)."""
    cached = getattr(config, "_cobalt_project", False)
    if cached is not False:
        return cached
    from cobalt.config import find_config_file, load_config

    found = find_config_file(Path(str(config.rootpath)))
    project = load_config(found.parent) if found else None
    config._cobalt_project = project  # type: ignore[attr-defined]
    return project


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    project = _project(parent.config)
    if project is None or not file_path.name.endswith((".cobalt.py", ".experiment.py")):
        return None
    from cobalt_app import discovery

    if file_path.resolve() not in {p.resolve() for p in discovery.discover(project)}:
        return None  # not under test_dir, or not matching test_match
    return ExperimentFile.from_parent(parent, path=file_path)


class ExperimentFile(pytest.File):
    def collect(self) -> Iterator[pytest.Item]:
        from cobalt.dataset import item_key
        from cobalt_app import discovery
        from cobalt_project import bootstrap

        project = bootstrap.setup(_project(self.config))
        loaded = discovery.load_file(self.path, project.project_dir)
        if loaded.error:
            raise self.CollectError(f"{self.path.name} failed to import: {loaded.error}")
        for experiment in loaded.experiments:
            run = ExperimentRun(experiment, project)
            keys = [item_key(item)[:200] for item in experiment.dataset.items]
            for key in keys:
                for repetition in range(experiment.runs):
                    suffix = f"-{repetition + 1}" if experiment.runs > 1 else ""
                    yield ItemTest.from_parent(
                        self,
                        name=f"{experiment.name}[{key}{suffix}]",
                        run=run,
                        key=key,
                        repetition=repetition,
                    )
            if experiment.thresholds:
                yield ThresholdsTest.from_parent(
                    self, name=f"{experiment.name}::thresholds", run=run
                )


class ExperimentRun:
    """One experiment's run, started by the first of its tests that pytest runs."""

    def __init__(self, experiment: Any, project: Any) -> None:
        self.experiment = experiment
        self.project = project
        self.run: Any = None
        self.outcomes: dict[tuple[str, int], dict[str, Any]] = {}

    def ensure_ran(self, session: pytest.Session) -> None:
        if self.run is not None:
            return
        from cobalt.dataset import item_key
        from cobalt_app import launcher, results

        selected = {
            test.key for test in session.items if isinstance(test, ItemTest) and test.run is self
        }
        experiment = self.experiment
        if len(selected) < len(experiment.dataset):
            dataset = experiment.dataset.filter(lambda item: item_key(item)[:200] in selected)
            experiment = dataclasses.replace(experiment, dataset=dataset)
        concurrency = session.config.getoption("cobalt_concurrency")
        overrides = {"concurrency": concurrency} if concurrency else None
        (self.run,) = launcher.execute([experiment], self.project, overrides=overrides)
        for entry in results.iter_item_entries(self.run):
            self.outcomes[(entry["key"], entry["runIndex"])] = entry

    def pass_marks(self) -> dict[str, float]:
        return {
            e.name: pass_mark(e.options.get("pass_threshold")) for e in self.experiment.evaluators
        }


class ExperimentTest(pytest.Item):
    """A test of an experiment's run: failures read as Cobalt's reasons, not tracebacks."""

    run: ExperimentRun

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style=None) -> Any:
        if isinstance(excinfo.value, ItemFailed):
            run_id = self.run.run.id if self.run.run else "—"
            return f"{self.name} (run {run_id}):\n{excinfo.value}"
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, self.run.experiment.line, self.name


class ItemTest(ExperimentTest):
    def __init__(self, *, run: ExperimentRun, key: str, repetition: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run = run
        self.key = key
        self.repetition = repetition

    def runtest(self) -> None:
        self.run.ensure_ran(self.session)
        entry = self.run.outcomes.get((self.key, self.repetition))
        if entry is None:
            raise ItemFailed(f"item {self.key!r} was not recorded in run {self.run.run.id}")
        problems = item_problems(entry, self.run.pass_marks())
        if problems:
            raise ItemFailed("\n".join(problems))


class ThresholdsTest(ExperimentTest):
    def __init__(self, *, run: ExperimentRun, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run = run

    def runtest(self) -> None:
        from cobalt_app import ci_verdict

        self.run.ensure_ran(self.session)
        report = ci_verdict.gate_run(self.run.run, self.run.project)
        failed = [check.line() for check in report.checks if not check.passed]
        if failed:
            raise ItemFailed("thresholds not met:\n" + "\n".join(failed))


def item_problems(entry: dict[str, Any], pass_marks: dict[str, float]) -> list[str]:
    """Why an item's test fails: its error, or each evaluation that errored or failed its
    pass mark (`cobalt.verdict`)."""
    if entry["status"] != "ok":
        return [f"{entry['status']}: {entry.get('error') or ''}".rstrip()]
    problems = []
    for name, evaluation in (entry.get("evaluations") or {}).items():
        score = evaluation.get("score")
        mark = pass_mark(pass_marks.get(name))
        judged = evaluation_verdict(score, mark, error="error" in evaluation)
        if judged is Verdict.ERROR:
            problems.append(f"{name}: evaluation error: {evaluation.get('error')}")
        elif judged is Verdict.FAIL:
            reason = evaluation.get("reason") or ""
            problems.append(f"{name} scored {score:.2f} (pass mark {mark:.2f}): {reason}")
    return problems
