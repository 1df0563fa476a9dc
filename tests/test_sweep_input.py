"""Bad sweep input at the door: `cobalt run` on an empty grid, and `--variants` naming no
declared variant, each refused before anything runs, saying what to write instead."""

from __future__ import annotations

EMPTY_GRID = """
import cobalt
from cobalt import Dataset

cobalt.experiment("empty", Dataset(items=[{"id": "a"}]), lambda ctx: "x", variants={})
"""

GRID = """
import cobalt
from cobalt import Dataset

cobalt.experiment(
    "grid", Dataset(items=[{"id": "a"}]), lambda ctx: ctx.variant["model"],
    variants={"model": ["small", "large"]},
)
"""


def test_an_empty_grid_fails_the_file_naming_what_to_pass(project, cobalt_cli):
    project.write("experiments/empty.cobalt.py", EMPTY_GRID)
    done = cobalt_cli(project, "run", "--ci")
    assert done.returncode == 2, done.stdout + done.stderr
    said = " ".join((done.stdout + done.stderr).split())
    assert "experiment 'empty': `variants` is an empty grid; give each key a list of values" in said
    assert not (project.path / ".cobalt" / "results").exists()


def test_variants_matching_none_are_refused_naming_those_there_are(project, cobalt_cli):
    project.write("experiments/grid.cobalt.py", GRID)
    done = cobalt_cli(project, "run", "--variants", "model=medium")
    assert done.returncode == 2, done.stdout + done.stderr  # a usage error
    said = " ".join((done.stdout + done.stderr).split())
    assert "--variants model=medium matches no variant; there are: model=small, model=large" in said
    assert not (project.path / ".cobalt" / "results").exists()
