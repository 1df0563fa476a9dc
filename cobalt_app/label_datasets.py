"""Labels become tests: a reviewed item appended to a JSON Lines dataset of the project.

The line is the item as the run saw it, keyed by its item key (`id`), with the reviewer's
corrected expected output when their label has one (else the item's own), and the review in
`metadata`; the next `cobalt run` over that file runs it. The file is appended to, never
rewritten; an item whose id it already holds is refused and nothing is written.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from cobalt.config import active_config
from cobalt.dataset import Dataset, DatasetError
from cobalt_app import labels, storable
from cobalt_app.models import Run

EXPECTED = "expected_output"  # the field evaluators compare with unless told another


class DatasetRefused(labels.LabelError):
    """A dataset file the item cannot be added to (outside the project, not .jsonl, broken)."""


class ItemAlreadyInDataset(labels.LabelConflict):
    """The dataset file already holds an item with this id."""


def add_to_dataset(
    *,
    run: Run,
    item_id: int,
    path: str,
    reviewer: str | None = None,
    evaluator: str | None = None,
) -> dict[str, Any]:
    """Append the run's item to the project's JSON Lines dataset `path` (relative to the
    project folder; created with its folders when missing). The expected output is the one
    corrected in the label of `reviewer` (any reviewer's when None) on `evaluator` (any),
    else the item's own. Returns the file (relative), its line number and the line. A run
    still going is refused (`LabelConflict`), as a label on it is: its items are not final."""
    if not run.is_finished:
        raise labels.LabelConflict(
            f"run {run.id} is still {run.status}: add its items once it has finished"
        )
    project = active_config().project_dir.resolve()
    target = dataset_path(path, project)
    item = labels.find_item(run, item_id=item_id)
    label = _chosen_label(run, item.id, reviewer=reviewer, evaluator=evaluator)
    line = dataset_line(
        run, item.input, item.item_key, label, evaluator=evaluator, reviewer=reviewer
    )
    text = storable.dumps_at(line, "item")
    shown = target.relative_to(project).as_posix()
    target.parent.mkdir(parents=True, exist_ok=True)
    with locked(target) as fh:
        fh.seek(0)
        existing = fh.read().decode("utf-8-sig", errors="replace")
        _check_new(existing, line["id"], target, shown)
        ended = not existing or existing.endswith("\n")
        if not ended:
            fh.write(b"\n")
        number = existing.count("\n") + (1 if ended else 2)
        fh.write((text + "\n").encode("utf-8"))
    return {"file": shown, "line": number, "id": line["id"], "item": line}


def dataset_path(path: str, project: Path) -> Path:
    """`path` resolved in the project folder (symlinks followed), or `DatasetRefused`."""
    if not isinstance(path, str) or not path.strip() or "\x00" in path:
        raise DatasetRefused("file: name a .jsonl file inside the project, e.g. datasets/x.jsonl")
    given = Path(path.strip()).expanduser()
    target = (given if given.is_absolute() else project / given).resolve()
    if not target.is_relative_to(project):
        raise DatasetRefused(
            f"file: {path} resolves outside the project folder ({project}); only files inside "
            "the project can be used"
        )
    if given.suffix.lower() != ".jsonl" or target.suffix.lower() != ".jsonl":
        raise DatasetRefused(f"file: {path} is not a .jsonl file (items are added as JSON Lines)")
    if target.exists() and not target.is_file():
        raise DatasetRefused(f"file: {path} is not a file")
    return target


def dataset_line(
    run: Run,
    snapshot: Any,
    key: str,
    label: labels.LabelRow | None,
    *,
    evaluator: str | None = None,
    reviewer: str | None = None,
) -> dict[str, Any]:
    """The dataset item: the run's snapshot of it keyed by its item key, `expected_output`
    corrected by the label (also under the evaluator's own expected field, when it compares
    another), and the review in `metadata` (without a label: who added it)."""
    item = dict(snapshot) if isinstance(snapshot, dict) else {"input": snapshot}
    field = _expected_field(run, label.label.evaluator if label else evaluator)
    if label is not None and label.label.expected_output is not None:
        expected = label.label.expected_output
    else:
        expected = item.get(field, item.get(EXPECTED, item.get("expected")))
    metadata = item.pop("metadata", None)
    line: dict[str, Any] = {"id": key, "input": item.pop("input", None)}
    line.update((name, value) for name, value in item.items() if name != "id")
    line[EXPECTED] = expected
    if field != EXPECTED and field in item:
        line[field] = expected
    line["metadata"] = {
        **(metadata if isinstance(metadata, dict) else {}),
        "reviewNote": label.label.note if label else "",
        "reviewer": label.label.reviewer if label else reviewer,
        "verdict": label.label.verdict if label else None,
        "fromRun": run.id,
    }
    return line


def _expected_field(run: Run, evaluator: str | None) -> str:
    for described in run.config.get("evaluators", []):
        if described.get("name") == evaluator and isinstance(described.get("field"), str):
            return described["field"]
    return EXPECTED


def _chosen_label(
    run: Run, item_id: int, *, reviewer: str | None, evaluator: str | None
) -> labels.LabelRow | None:
    """The label whose review the line carries: current before stale, one with a corrected
    expected output before one without, then the latest."""
    rows = labels.run_labels(run, item_ids=[item_id], evaluator=evaluator, reviewer=reviewer)
    if not rows:
        return None
    return max(
        rows,
        key=lambda row: (
            not row.stale,
            row.label.expected_output is not None,
            row.label.updated_at,
        ),
    )


def _check_new(existing: str, item_id: str, target: Path, shown: str) -> None:
    """`ItemAlreadyInDataset` when the file holds the item's id, `DatasetRefused` when it is
    not a dataset."""
    if not existing.strip():
        return
    try:
        keys = Dataset.from_jsonl(target).keys()
    except DatasetError as exc:
        where = f"{shown}, line {exc.line}" if exc.line else shown
        raise DatasetRefused(f"file: {where}: {exc.reason}") from None
    if item_id in keys:
        raise ItemAlreadyInDataset(
            f"file: {shown} already has an item with id {item_id!r}; nothing was written"
        )


@contextlib.contextmanager
def locked(target: Path) -> Iterator[IO[bytes]]:
    """The file opened to read and append, locked against other writers (where the system
    has `flock`): two reviewers adding the same item cannot both write it."""
    fd = os.open(target, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    with os.fdopen(fd, "a+b") as fh:
        try:
            import fcntl
        except ImportError:  # Windows: no lock
            yield fh
            return
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield fh
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
