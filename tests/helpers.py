"""Helpers the test modules share, written once: declare an experiment, run it in-process with
the real engine, read a run id off the command's output, and ask axe-core what a page breaks.

Import them from test modules (`from tests.helpers import define, execute`), not from conftest:
they import the engine, which needs Django set up (pytest-django does that before it collects
the test modules, after it has loaded conftest).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cobalt import Dataset, experiment, load_config
from cobalt.experiments import Experiment, collecting
from cobalt_app import launcher

if TYPE_CHECKING:
    from cobalt_app.models import Run
    from tests.conftest import Project


def define(*args: Any, **kwargs: Any) -> Experiment:
    """The experiment that `experiment(*args, **kwargs)` declares, without registering it."""
    with collecting() as found:
        experiment(*args, **kwargs)
    return found[0]


def execute(project: Project, *experiments: Experiment, **options: Any) -> list[Run]:
    """Run the experiments in this process with the project's config (`launcher.execute`)."""
    return launcher.execute(list(experiments), load_config(project.path), **options)


def execute_one(project: Project, experiment: Experiment, **options: Any) -> Run:
    """Run one experiment; its run as stored once it finished."""
    (run,) = execute(project, experiment, **options)
    run.refresh_from_db()
    return run


def run_with(
    project: Project,
    evaluators: list,
    runner: Callable,
    *,
    name: str,
    items: Iterable[dict] | Dataset,
    config_text: str | None = None,
    **options: Any,
) -> Run:
    """Run `runner` over `items` as the experiment `name`, scored by `evaluators`; with
    `config_text`, the project's cobalt.toml is replaced first. Returns the run (as returned by
    the launcher); `options` go to `launcher.execute` (e.g. `no_cache=True`)."""
    if config_text:
        project.write("cobalt.toml", config_text)
    dataset = items if isinstance(items, Dataset) else Dataset(items=list(items))
    (run,) = execute(project, define(name, dataset, runner, evaluators=evaluators), **options)
    return run


def run_id_of(done: str | subprocess.CompletedProcess[str]) -> str:
    """The run id a `cobalt run` printed ("Run ID: …"); given the finished command rather than
    its output, it must have succeeded."""
    if isinstance(done, subprocess.CompletedProcess):
        assert done.returncode == 0, done.stdout + done.stderr
        done = done.stdout
    found = re.search(r"Run ID:\s*(\S+)", done)
    assert found, f"no run id in:\n{done}"
    return found.group(1)


AXE = Path(__file__).resolve().parent / "vendor" / "axe-core" / "axe.min.js"  # 4.10.2, MPL-2.0
_AXE_RUN = """async () => (await axe.run(document, {runOnly: ["wcag2a", "wcag2aa"]}))
    .violations.map(v => `${v.id}: ${v.nodes.map(n => n.html).join(" | ")}`)"""


def axe_violations(
    browser: Any,
    base_url: str,
    paths: Iterable[str],
    *,
    scheme: str,
    viewport: dict[str, int],
    ready: dict[str, str] | None = None,
) -> dict[str, list[str]]:
    """The WCAG 2 A and AA violations axe-core finds on each page (`{path: ["rule: html"]}`,
    only pages with some), in a new context of the Playwright `browser` with that colour
    scheme and viewport. `ready` names, per path, a selector to wait for before looking (a
    page drawn by a script). The context bypasses CSP: axe is injected as an inline script,
    which the pages' policy forbids."""
    context = browser.new_context(bypass_csp=True, color_scheme=scheme, viewport=viewport)
    tab = context.new_page()
    tab.set_default_timeout(60_000)
    found = {}
    try:
        for path in paths:
            tab.goto(base_url + path)
            if ready and path in ready:
                tab.wait_for_selector(ready[path])
            tab.add_script_tag(path=str(AXE))
            violations = tab.evaluate(_AXE_RUN)
            if violations:
                found[path] = violations
    finally:
        context.close()
    return found


def add_attributes(span: Any, attributes: dict[str, int | str]) -> None:
    """OTLP key-values on a protobuf span of an export request: ints as int_value, the rest as
    string_value."""
    for key, value in attributes.items():
        kv = span.attributes.add()
        kv.key = key
        if isinstance(value, int):
            kv.value.int_value = value
        else:
            kv.value.string_value = value
