"""Labels as files: a run's labels exported as CSV or JSON Lines, and such a file imported.

Export writes exactly what import reads, so a file can go to a spreadsheet and back. A row
names its label by `run` (id or unique prefix), `itemKey` and `repetition` (0-based), then
`evaluator`, `reviewer`, `verdict` (pass/fail), `score` (a corrected score, 0 to 1), `note`,
`expectedOutput` (a corrected expected output: JSON text in CSV, any JSON value in JSON
Lines; empty for none) and `version` (the label's version when exported: an import is
refused for a label someone changed since). `item`, `judgeScore`, `judgeVerdict` and
`disagrees` are there to read and are ignored on import.

Import saves each row with `labels.label_save` on its own: a bad row is reported with its
line number and reason, and the other rows are still saved. A row equal to the stored label
leaves it (and its version) as it is.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cobalt.errors import CobaltError
from cobalt_app import labels
from cobalt_app.liveness import settled
from cobalt_app.models import Label, Run
from cobalt_app.selectors import RunNotFound, run_get

COLUMNS = (
    "run",
    "item",
    "itemKey",
    "repetition",
    "evaluator",
    "reviewer",
    "verdict",
    "score",
    "note",
    "expectedOutput",
    "version",
    "judgeScore",
    "judgeVerdict",
    "disagrees",
)
REQUIRED = ("run", "itemKey", "evaluator")
TEXT_COLUMNS = ("run", "itemKey", "evaluator", "reviewer", "verdict", "note", "expectedOutput")
FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}
# What a spreadsheet would run as a formula (see `exports.safe_cell`), and the quote that
# marks a cell prefixed against it: both get a leading `'`, which import removes.
ESCAPED = ("=", "+", "-", "@", "\t", "\r", "'")


class LabelFileError(CobaltError):
    """A file that cannot be read as labels at all (its format, encoding or header)."""


# Export -------------------------------------------------------------------------------------


def export_rows(run: Run, *, evaluator: str | None = None) -> list[dict[str, Any]]:
    """The run's current labels (not the stale ones) as rows, in item order: the columns of
    `LabelRow.as_json`, after the run's id."""
    rows = []
    for row in labels.run_labels(run, evaluator=evaluator, stale=False):
        entry = row.as_json()
        rows.append({"run": run.id, **{column: entry[column] for column in COLUMNS[1:]}})
    return rows


def export_labels(run: Run, fmt: str, *, evaluator: str | None = None) -> str:
    """The run's labels as a CSV (with a header) or JSON Lines document."""
    rows = export_rows(run, evaluator=evaluator)
    if fmt == "jsonl":
        return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    if fmt != "csv":
        raise LabelFileError(f"unknown label file format {fmt!r}: use csv or jsonl")
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(COLUMNS)
    for row in rows:
        writer.writerow([_csv_cell(name, row[name]) for name in COLUMNS])
    return buffer.getvalue()


def _csv_cell(name: str, value: Any) -> str:
    if name == "expectedOutput":
        value = "" if value is None else json.dumps(value, ensure_ascii=False)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    text = str(value)
    return "'" + text if name in TEXT_COLUMNS and text.startswith(ESCAPED) else text


# Import -------------------------------------------------------------------------------------


@dataclass
class LineError:
    line: int
    reason: str


@dataclass
class ImportReport:
    created: int = 0
    updated: int = 0
    unchanged: int = 0
    errors: list[LineError] = field(default_factory=list)

    @property
    def saved(self) -> int:
        return self.created + self.updated


def file_format(path: str | Path) -> str:
    """csv or jsonl, by the file's extension."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise LabelFileError(
            f"{path}: a label file ends in .csv or .jsonl (found {suffix or 'no extension'!r})"
        )
    return FORMATS[suffix]


def import_file(path: str | Path, *, reviewer: str) -> ImportReport:
    """Import a .csv or .jsonl label file; `reviewer` labels rows that name none."""
    fmt = file_format(path)
    try:
        text = Path(path).read_bytes().decode("utf-8-sig")
    except OSError as exc:
        raise LabelFileError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise LabelFileError(f"{path}: not UTF-8 text; save it as UTF-8") from None
    return import_labels(text, fmt, reviewer=reviewer)


def import_labels(text: str, fmt: str, *, reviewer: str) -> ImportReport:
    """Save every row of a CSV or JSON Lines document; each bad row is a `LineError`."""
    report = ImportReport()
    importer = _Importer(reviewer)
    for line, row in parse_rows(text, fmt):
        try:
            if isinstance(row, str):
                raise labels.LabelError(row)
            outcome = importer.save(row)
        except labels.LabelError as exc:
            report.errors.append(LineError(line, str(exc)))
            continue
        setattr(report, outcome, getattr(report, outcome) + 1)
    return report


def parse_rows(text: str, fmt: str) -> Iterator[tuple[int, dict[str, Any] | str]]:
    """(line number, row) of each row, or (line number, why it cannot be read); blank lines
    are skipped."""
    if fmt == "jsonl":
        yield from _jsonl_rows(text)
    elif fmt == "csv":
        yield from _csv_rows(text)
    else:
        raise LabelFileError(f"unknown label file format {fmt!r}: use csv or jsonl")


def _jsonl_rows(text: str) -> Iterator[tuple[int, dict[str, Any] | str]]:
    # Split on "\n" only: U+2028 and friends are legal inside JSON strings.
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            yield number, f"not JSON ({exc})"
            continue
        if not isinstance(row, dict):
            yield number, 'not a JSON object: a line is one label, {"run": ..., ...}'
            continue
        yield number, row


def _csv_rows(text: str) -> Iterator[tuple[int, dict[str, Any] | str]]:
    reader = csv.reader(io.StringIO(text, newline=""))
    header = _csv_header(reader)
    if header is None:
        return
    start = reader.line_num + 1
    while True:
        try:
            record = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            yield start, f"not CSV ({exc})"
            return
        line, start = start, reader.line_num + 1
        if any(cell.strip() for cell in record):
            yield line, _csv_row(header, record)


def _csv_header(reader: Iterator[list[str]]) -> list[str] | None:
    """The header's column names (None for an empty file), with every required column."""
    try:
        header = next(reader)
    except StopIteration:
        return None
    except csv.Error as exc:
        raise LabelFileError(f"line 1: the header is not CSV ({exc})") from None
    header = [name.strip() for name in header]
    missing = [name for name in REQUIRED if name not in header]
    if missing:
        raise LabelFileError(
            f"line 1: the header has no {', '.join(missing)} column (it needs "
            f"{', '.join(REQUIRED)}, verdict or score; `cobalt labels export` writes them all)"
        )
    return header


def _csv_row(header: list[str], record: list[str]) -> dict[str, Any] | str:
    """One record as a row by column name, or what is wrong with it."""
    if len(record) != len(header):
        return f"{len(record)} fields; the header has {len(header)}"
    row: dict[str, Any] = {}
    for name, cell in zip(header, record, strict=True):
        if name in TEXT_COLUMNS and cell.startswith("'"):
            cell = cell[1:]  # the quote export put before a formula-like cell
        row[name] = cell
    expected = row.get("expectedOutput", "")
    if expected.strip():
        try:
            row["expectedOutput"] = json.loads(expected)
        except ValueError as exc:
            return f'expectedOutput: not JSON ({exc}); write text in quotes: "Lyon"'
    else:
        row["expectedOutput"] = None
    return row


class _Importer:
    """Saves rows, looking each run up once and comparing with the labels it has."""

    def __init__(self, reviewer: str) -> None:
        self.reviewer = reviewer
        self.runs: dict[str, Run] = {}
        self.current: dict[str, dict[tuple[int, str, str], Label]] = {}

    def save(self, row: dict[str, Any]) -> str:
        run = self.run(row.get("run"))
        key = _text(row, "itemKey")
        if not key:
            raise labels.LabelError("itemKey: the item key is missing")
        repetition = _whole(row, "repetition", 0)
        item = labels.find_item(run, key=key, repetition=repetition)
        evaluator = _text(row, "evaluator")
        reviewer = _text(row, "reviewer") or self.reviewer
        verdict = row.get("verdict")
        if isinstance(verdict, str):
            verdict = verdict.strip().lower()
        score = row.get("score")
        note = row.get("note") or ""
        expected = row.get("expectedOutput")
        version = _whole(row, "version", None)
        stored = self.current[run.id].get((item.id, evaluator, reviewer.strip()))
        if stored is not None and _same(stored, run, evaluator, verdict, score, note, expected):
            return "unchanged"
        label = labels.label_save(
            run=run,
            item_id=item.id,
            evaluator=evaluator,
            reviewer=reviewer,
            verdict=verdict,
            score=score,
            note=note,
            expected_output=expected,
            version=version,
        )
        current = self.current[run.id]
        for shown, known in list(current.items()):  # the label shows on each repetition
            if known.id == label.id:
                current[shown] = label
        current[item.id, label.evaluator, label.reviewer] = label
        return "created" if label.version == 1 else "updated"

    def run(self, given: Any) -> Run:
        if not isinstance(given, str) or not given.strip():
            raise labels.LabelError("run: the run id is missing")
        given = given.strip()
        if given not in self.runs:
            try:
                run = settled(run_get(given))  # a run whose process vanished ended
            except RunNotFound as exc:
                raise labels.LabelError(f"run: {exc}") from None
            self.runs[given] = run
            if run.id not in self.current:
                self.current[run.id] = {
                    (row.item_id, row.label.evaluator, row.label.reviewer): row.label
                    for row in labels.run_labels(run, stale=False)
                }
        return self.runs[given]


def _same(
    stored: Label, run: Run, evaluator: str, verdict: Any, score: Any, note: str, expected: Any
) -> bool:
    """Whether saving the row would store what is stored already."""
    try:
        values = labels.clean_label(
            run,
            evaluator=evaluator,
            reviewer=stored.reviewer,
            verdict=verdict,
            score=score,
            note=note,
        )
    except labels.LabelError:
        return False  # label_save says what is wrong
    return (
        values["verdict"] == stored.verdict
        and values["score"] == stored.score
        and values["note"] == stored.note
        and expected == stored.expected_output
    )


def _text(row: dict[str, Any], name: str) -> str:
    value = row.get(name)
    if value is None:
        value = ""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise labels.LabelError(f"{name}: {value!r} is not text")
    return str(value).strip()


def _whole(row: dict[str, Any], name: str, default: int | None) -> int | None:
    value = row.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        return default
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise labels.LabelError(f"{name}: {value!r} is not a whole number of 0 or more")
