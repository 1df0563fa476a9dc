"""Evaluator plugins: from an installed package's entry points and from project files."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO

EXPERIMENT = """
from cobalt import Dataset, Evaluator, experiment

experiment(
    "plugged",
    Dataset([{"id": "a", "answer": "Paris"}, {"id": "b", "answer": "Lyon is big"}]),
    lambda ctx: ctx.item["answer"],
    evaluators=[
        Evaluator(name="kw", type="keyword", keyword="paris"),
        Evaluator(name="short", type="short-answer", max_chars=6),
    ],
    thresholds={"kw": {"avg": 0.5}, "short": {"avg": 0.5}},
)
"""

PACKAGE = {
    "cobalt_kw_plugin/__init__.py": """
        def keyword(evaluator, target, env):
            word = evaluator.options["keyword"]
            hit = word.lower() in str(target.output).lower()
            return {"score": 1.0 if hit else 0.0, "reason": f"{'has' if hit else 'lacks'} {word}"}


        keyword.options = ["keyword"]
    """,
    "cobalt_kw_plugin/lengths.py": """
        from cobalt_app.evaluators import EvalOutcome, register

        @register("short-answer", options=["max_chars"])
        async def short_answer(evaluator, target, env):
            size = len(str(target.output))
            ok = size <= evaluator.options["max_chars"]
            return EvalOutcome(evaluator.name, 1.0 if ok else 0.0, reason=f"{size} characters")
    """,
    "cobalt_kw_plugin-0.1.dist-info/METADATA": """
        Metadata-Version: 2.1
        Name: cobalt-kw-plugin
        Version: 0.1
    """,
    "cobalt_kw_plugin-0.1.dist-info/entry_points.txt": """
        [cobalt.evaluators]
        keyword = cobalt_kw_plugin:keyword
        lengths = cobalt_kw_plugin.lengths
    """,
}

FILE_PLUGIN = """
from cobalt_app.evaluators import EvalOutcome, register


@register("keyword", options=["keyword"])
async def keyword(evaluator, target, env):
    hit = evaluator.options["keyword"] in str(target.output).lower()
    return EvalOutcome(evaluator.name, float(hit), reason="file plugin")


@register("short-answer")
def short(evaluator, target, env):
    raise AssertionError("registered directly, so it must be async; replaced below")


async def short_answer(evaluator, target, env):
    ok = len(str(target.output)) <= evaluator.options["max_chars"]
    return EvalOutcome(evaluator.name, float(ok), reason="file plugin")


register("short-answer", options=["max_chars"])(short_answer)
"""


def install_package(folder: Path, files: dict[str, str]) -> Path:
    """A real installed distribution: a package and its *.dist-info with entry points."""
    for relative, text in files.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    return folder


def with_site(site: Path) -> dict[str, str]:
    return {"PYTHONPATH": f"{REPO}{os.pathsep}{site}", "GITHUB_ACTIONS": "false"}


def item_scores(stdout: str) -> dict[tuple[str, str], tuple[float | None, str]]:
    events = [json.loads(line) for line in stdout.splitlines()]
    scores = {}
    for event in events:
        if event["event"] == "item.finished":
            for name, evaluation in event["evaluations"].items():
                detail = evaluation.get("reason") or evaluation.get("error")
                scores[(event["key"], name)] = (evaluation["score"], detail)
    return scores


def test_an_evaluator_type_from_an_installed_entry_point(project, cobalt_cli, tmp_path):
    site = install_package(tmp_path / "site", PACKAGE)
    project.write("experiments/plugged.cobalt.py", EXPERIMENT)
    result = cobalt_cli(project, "run", "--ci", "--reporter", "json", env=with_site(site))
    assert result.returncode == 0, result.stderr
    assert item_scores(result.stdout) == {
        ("a", "kw"): (1.0, "has paris"),
        ("b", "kw"): (0.0, "lacks paris"),
        ("a", "short"): (1.0, "5 characters"),
        ("b", "short"): (0.0, "11 characters"),
    }

    # Without the package the types are unknown: the run does not start.
    result = cobalt_cli(project, "run", "--ci", "--reporter", "json", env=with_site(tmp_path))
    assert result.returncode == 2
    assert "experiments/plugged.cobalt.py:8: evaluator 'kw'" in result.stderr
    assert "unknown evaluator type 'keyword'" in result.stderr
    assert item_scores(result.stdout) == {}


def test_an_evaluator_type_from_a_plugin_file_in_the_config(project, cobalt_cli):
    project.write("experiments/plugged.cobalt.py", EXPERIMENT)
    project.write("plugins/my_evals.py", FILE_PLUGIN)
    project.write("cobalt.toml", 'test_dir = "experiments"\nplugins = ["plugins/my_evals.py"]\n')
    result = cobalt_cli(project, "run", "--ci", "--reporter", "json", env={"GITHUB_ACTIONS": ""})
    assert result.returncode == 0, result.stderr
    assert item_scores(result.stdout) == {
        ("a", "kw"): (1.0, "file plugin"),
        ("b", "kw"): (0.0, "file plugin"),
        ("a", "short"): (1.0, "file plugin"),
        ("b", "short"): (0.0, "file plugin"),
    }


def test_a_broken_entry_point_is_an_error_naming_it(project, cobalt_cli, tmp_path):
    broken = dict(PACKAGE)
    broken["cobalt_kw_plugin-0.1.dist-info/entry_points.txt"] = """
        [cobalt.evaluators]
        keyword = cobalt_kw_plugin:no_such_function
    """
    site = install_package(tmp_path / "site", broken)
    project.write("experiments/plugged.cobalt.py", EXPERIMENT)
    result = cobalt_cli(project, "run", env=with_site(site))
    assert result.returncode == 2
    assert (
        "plugin entry point 'keyword' (cobalt_kw_plugin:no_such_function) from the package "
        "'cobalt-kw-plugin' failed to load: AttributeError:"
    ) in result.stderr
    assert project.results_files() == []


@pytest.mark.parametrize(
    ("files", "plugins", "message"),
    [
        (
            {"plugins/broken.py": "import math\n\nmath.sqrt(-1)\n"},
            ["plugins/broken.py"],
            "plugin 'plugins/broken.py' failed to load: ValueError: math domain error (line 3)",
        ),
        (
            {"plugins/sneaky.py": FILE_PLUGIN.replace('register("keyword"', 'register("function"')},
            ["plugins/sneaky.py"],
            "plugin 'plugins/sneaky.py' redefines the built-in evaluator type 'function'",
        ),
        (
            {"plugins/empty.py": "VALUE = 1\n"},
            ["plugins/empty.py"],
            "plugin 'plugins/empty.py' registered no evaluator type",
        ),
        ({}, ["plugins/gone.py"], "plugin file 'plugins/gone.py' (from `plugins` in cobalt.toml)"),
        ({}, ["../elsewhere.py"], "resolves outside the project folder"),
    ],
    ids=["raises", "replaces-builtin", "registers-nothing", "missing", "outside"],
)
def test_a_broken_plugin_file_is_an_error_naming_it(project, cobalt_cli, files, plugins, message):
    project.write("experiments/plugged.cobalt.py", EXPERIMENT)
    for relative, text in files.items():
        project.write(relative, text)
    project.write("cobalt.toml", f'test_dir = "experiments"\nplugins = {json.dumps(plugins)}\n')
    result = cobalt_cli(project, "run", "--ci")
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr
    assert project.results_files() == []
