"""What a door may ask of a run, whichever mode executes it, and the experiment file's name
as the run records it: shared by the launcher, the embedded mode, team mode and the doors,
none of which needs to reach another for them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from cobalt.config import Config
from cobalt.experiments import Experiment

if TYPE_CHECKING:
    from cobalt_app.engine import Reporter


class RunOptions(TypedDict, total=False):
    """What `launcher.launch` may be asked, whichever mode runs the experiments."""

    reporter: Reporter | None
    no_cache: bool
    overrides: dict[str, Any] | None
    resume_run_id: str | None
    tags: list[str] | None


def relative_file(config: Config, experiment: Experiment) -> str:
    """The experiment file as the run records it: relative to the project when inside it."""
    if not experiment.file:
        return ""
    path = Path(experiment.file)
    try:
        return path.resolve().relative_to(config.project_dir).as_posix()
    except ValueError:
        return str(path)
