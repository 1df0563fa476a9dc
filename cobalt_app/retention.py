"""Keeping the history small: deleting old runs, traces and recordings, then giving the space
back. `cobalt clean` and the team sweeper (`[retention]` in cobalt.toml) call `clean`.

Three kinds, each chosen by age and/or by rank among its experiment's newest:
- runs: whole runs (items, evaluations, traces, tags, score table, results file). Never one
  still queued or running, nor one CI compares with (`baseline_reasons`). Labels given on a
  deleted run stay (`Label.run` is SET_NULL): a label belongs to an output, not to a run.
- traces: the `ItemTrace` rows of runs, the runs themselves kept.
- recordings: `Recording` rows; "the newest N" are those of the experiment's N latest
  recording runs (`recorded_by`), as replaying needs the last recordings whoever ran since.
Rows go through the ORM in bounded chunks (memory flat in the size of a run, a writer never
waits long), then `blob_store.prune_orphans` drops the blobs nothing refers to any more.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from django.db import OperationalError, connection, transaction
from django.db.models import Count, Max, Model, QuerySet
from django.utils import timezone

from cobalt.config import TTL_UNITS, Config, parse_age
from cobalt_app import blob_store, liveness, selectors
from cobalt_app.models import (
    Blob,
    Evaluation,
    ItemField,
    ItemResult,
    ItemTrace,
    JudgeCall,
    Label,
    Recording,
    Run,
    RunScoreTable,
    RunTag,
    SearchIndex,
)

RUNS, TRACES, RECORDINGS = "runs", "traces", "recordings"
KINDS = (RUNS, TRACES, RECORDINGS)
CHUNK = 2000  # rows per delete: one short transaction each
RUN_BATCH = 500  # run ids per query
ACTIVE = (Run.Status.QUEUED, Run.Status.RUNNING)
# What a user calls the rows Django reports deleting (tags and score tables go unmentioned).
WORDS = {
    Run: "runs",
    ItemResult: "items",
    Evaluation: "evaluations",
    ItemTrace: "traces",
    Recording: "recordings",
}
# The tables a clean may touch: measured before and after, vacuumed when touched.
TABLES = (
    Run,
    RunTag,
    ItemResult,
    Evaluation,
    ItemTrace,
    RunScoreTable,
    Recording,
    Label,
    Blob,
    JudgeCall,
    SearchIndex,  # a run's search index (`run_search`) goes with it
    ItemField,
)

# Where a project's CI names its baseline runs: `cobalt run --ci --baseline <run id>`.
CI_FILES = (
    ".github/workflows/*.yml",
    ".github/workflows/*.yaml",
    ".gitlab-ci.yml",
    ".circleci/config.yml",
    ".buildkite/*.yml",
    "azure-pipelines.yml",
    "bitbucket-pipelines.yml",
    "Jenkinsfile",
    "Makefile",
    "justfile",
)
BASELINE_ARGUMENT = re.compile(r"--baseline(?:=|\s+)[\"']?([0-9a-f]{4,32})\b")


@dataclass(frozen=True)
class Rule:
    """What to delete of one kind: what is older than `older_than` seconds (None: any age)
    and not among the `keep_last` newest of its experiment (None: whatever its rank)."""

    kind: str
    older_than: float | None = None
    keep_last: int | None = None

    def describe(self) -> str:
        """`runs older than 90d, except the 20 newest of each experiment`."""
        text = self.kind
        if self.older_than is not None:
            text += f" older than {age_text(self.older_than)}"
        if self.keep_last is not None and self.kind == RECORDINGS:
            text += f", except those of each experiment's {self.keep_last} latest recording runs"
        elif self.keep_last is not None:
            text += f", except the {self.keep_last} newest of each experiment"
        return text if text != self.kind else f"all {self.kind}"


@dataclass(frozen=True)
class Kept:
    """A run that matched a rule and stays, and why."""

    run_id: str
    experiment: str
    why: str


@dataclass(frozen=True)
class Space:
    """The database's size before the clean and after giving space back (`how`), or why it
    was not given back now (`given_back` false)."""

    before: int
    after: int
    how: str
    database: str  # the SQLite file, or "PostgreSQL"
    given_back: bool = True

    @property
    def returned(self) -> int:
        return max(0, self.before - self.after)


@dataclass
class Report:
    """What a clean deleted (or, dry, would delete) per kind, what it kept and the space."""

    rules: list[Rule]
    dry_run: bool
    deleted: dict[str, Counter[str]] = field(default_factory=dict)
    kept: list[Kept] = field(default_factory=list)
    labels_unlinked: int = 0
    blobs: int = 0
    space: Space | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def anything(self) -> bool:
        return any(sum(counts.values()) for counts in self.deleted.values()) or bool(self.blobs)

    def summary(self) -> str:
        """One line for a log: `1 runs (3 items, 6 evaluations); 40 traces (2 runs)`."""
        parts = []
        for kind, counts in self.deleted.items():
            details = ", ".join(f"{n} {word}" for word, n in counts.items() if word != kind)
            parts.append(f"{counts[kind]} {kind}" + (f" ({details})" if details else ""))
        return "; ".join(parts)


def age_text(seconds: float) -> str:
    """`2592000` → `30d`: the largest unit that divides it."""
    for unit, size in sorted(TTL_UNITS.items(), key=lambda pair: -pair[1]):
        if unit and seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def policy(config: Config) -> list[Rule]:
    """The rules of `[retention]`: one per kind given an age, `keep_last` applying to each;
    `keep_last` alone cleans runs (their traces go with them)."""
    table = config.get("retention") or {}
    keep_last = table.get("keep_last")
    ages: dict[str, float | None] = {
        kind: parse_age(table[kind], key=f"retention.{kind}") for kind in KINDS if kind in table
    }
    if keep_last is not None and not ages:
        ages[RUNS] = None
    return [Rule(kind, ages[kind], keep_last) for kind in KINDS if kind in ages]


def clean(
    rules: Iterable[Rule], config: Config, *, experiment: str | None = None, dry_run: bool = False
) -> Report:
    """Apply `rules` (to one experiment's history if named); with `dry_run`, count only."""
    report = Report(rules=list(rules), dry_run=dry_run)
    liveness.sweep()  # a run whose process vanished is finished: it may go
    before = None if dry_run else _database_bytes()
    touched: set[type[Model]] = set()
    for rule in report.rules:
        counts: Counter[str] = Counter()
        report.deleted[rule.kind] = counts
        if rule.kind == RECORDINGS:
            _clean_recordings(rule, experiment, dry_run, counts, touched)
        else:
            runs = _matching_runs(rule, experiment)
            if rule.kind == RUNS:
                _clean_runs(runs, config, dry_run, counts, touched, report)
            else:
                _clean_traces(runs, dry_run, counts, touched, report)
    if experiment is not None and not _experiment_exists(experiment):
        report.notes.append(f"no runs or recordings of an experiment named {experiment!r}")
    if dry_run:
        return report
    if touched & {ItemTrace, Recording}:
        report.blobs = blob_store.prune_orphans()
        if report.blobs:
            touched.add(Blob)
    if report.anything and before is not None:
        report.space = _give_space_back(before, touched)
    return report


# ---------------------------------------------------------------------------------- runs


@dataclass(frozen=True)
class Candidate:
    """A run a rule selects."""

    id: str
    name: str
    status: str


def _matching_runs(rule: Rule, experiment: str | None) -> list[Candidate]:
    """The runs the rule selects, newest first within each experiment."""
    rows = Run.objects.order_by("name", "-created_at", "-id").values_list(
        "id", "name", "status", "created_at"
    )
    if experiment is not None:
        rows = rows.filter(name=experiment)
    cutoff = (
        None if rule.older_than is None else timezone.now() - timedelta(seconds=rule.older_than)
    )
    matched, current, rank = [], None, 0
    for run_id, name, status, created_at in rows.iterator(chunk_size=5000):
        rank = rank + 1 if name == current else 1
        current = name
        if rule.keep_last is not None and rank <= rule.keep_last:
            continue
        if cutoff is None or created_at < cutoff:
            matched.append(Candidate(run_id, name, status))
    return matched


def _finished(runs: list[Candidate], report: Report, what: str) -> list[Candidate]:
    """The runs nothing executes any more; the others are kept and named."""
    for run in runs:
        if run.status in ACTIVE:
            report.kept.append(Kept(run.id, run.name, f"still {run.status}: {what}"))
    return [run for run in runs if run.status not in ACTIVE]


def _clean_runs(
    runs: list[Candidate],
    config: Config,
    dry_run: bool,
    counts: Counter[str],
    touched: set[type[Model]],
    report: Report,
) -> None:
    runs = _finished(runs, report, "a run is deleted once it has ended")
    reasons = baseline_reasons(config, runs)
    report.kept.extend(Kept(run.id, run.name, reasons[run.id]) for run in runs if run.id in reasons)
    doomed = [run.id for run in runs if run.id not in reasons]
    for batch in _batches(doomed):
        report.labels_unlinked += Label.objects.filter(run_id__in=batch).count()
    if dry_run:
        for batch in _batches(doomed):
            counts["runs"] += len(batch)
            counts["items"] += ItemResult.objects.filter(run_id__in=batch).count()
            counts["evaluations"] += Evaluation.objects.filter(run_id__in=batch).count()
            counts["traces"] += ItemTrace.objects.filter(item__run_id__in=batch).count()
            counts["result files"] += len(_results_files(batch, config))
        return
    for run_id in doomed:
        _delete_run(run_id, config, counts, touched)
    if report.labels_unlinked:
        touched.add(Label)


def _delete_run(
    run_id: str, config: Config, counts: Counter[str], touched: set[type[Model]]
) -> None:
    """One run: its items a chunk at a time (their evaluations and traces with them), then
    the run row, then its results file. Skipped if someone resumed it meanwhile."""
    if not Run.objects.filter(id=run_id).exclude(status__in=ACTIVE).exists():
        return
    files = _results_files([run_id], config)
    _delete(ItemResult.objects.filter(run_id=run_id), counts, touched)
    with transaction.atomic():
        _tally(Run.objects.filter(id=run_id).delete()[1], counts, touched)
    for path in files:
        path.unlink(missing_ok=True)
        counts["result files"] += 1


def _results_files(run_ids: list[str], config: Config) -> list[Path]:
    """The results files of these runs that exist in this project's results folder (a team
    run's path may be another machine's)."""
    folder = config.results_dir.resolve()
    paths = Run.objects.filter(id__in=run_ids).exclude(results_path="")
    found = []
    for text in paths.values_list("results_path", flat=True):
        path = Path(text).resolve()
        if path.parent == folder and path.is_file():
            found.append(path)
    return found


def baselines_among(config: Config, *, older_than: float | None) -> list[Kept]:
    """The finished runs older than `older_than` seconds (any age: None) that CI compares
    with, each with why: what a clean that ignores baselines would delete unsaid."""
    runs = [run for run in _matching_runs(Rule(RUNS, older_than), None) if run.status not in ACTIVE]
    reasons = baseline_reasons(config, runs)
    return [Kept(run.id, run.name, reasons[run.id]) for run in runs if run.id in reasons]


def baseline_reasons(config: Config, runs: Iterable[Candidate]) -> dict[str, str]:
    """Run id → why CI compares with it, for those of `runs` it does: the newest completed
    run of each experiment (`--baseline latest`), a run named by `--baseline <id>` in the
    project's CI files, or listed in `[retention] baselines`."""
    runs = list(runs)
    reasons: dict[str, str] = {}
    for name in {run.name for run in runs}:
        latest = selectors.latest_run(name)
        if latest is not None:
            reasons[latest.id] = (
                f"the newest completed run of {name!r}, which `--baseline latest` compares with"
            )
    named = [(p, "[retention] baselines") for p in config.get("retention.baselines") or []]
    named += ci_references(config.project_dir)
    for run in runs:
        for prefix, where in named:
            if run.id.startswith(prefix) and run.id not in reasons:
                reasons[run.id] = f"named by `--baseline {prefix}` in {where}"
    return reasons


def ci_references(project_dir: Path) -> list[tuple[str, str]]:
    """(run id or prefix, file) of each `--baseline <id>` in the CI files of the project's
    folder and of each folder above it up to the repository's root (the one with `.git`)."""
    folders = [project_dir, *project_dir.parents]
    root = next((i for i, f in enumerate(folders) if (f / ".git").exists()), 0)
    found = []
    for folder in folders[: root + 1]:
        for pattern in CI_FILES:
            for path in sorted(folder.glob(pattern)):
                try:
                    text = path.read_text(encoding="utf-8", errors="replace")
                except OSError:
                    continue
                where = str(path.relative_to(folder))
                found += [(m.group(1), where) for m in BASELINE_ARGUMENT.finditer(text)]
    return found


# -------------------------------------------------------------------------------- traces


def _clean_traces(
    runs: list[Candidate],
    dry_run: bool,
    counts: Counter[str],
    touched: set[type[Model]],
    report: Report,
) -> None:
    runs = _finished(runs, report, "its traces are still being written")
    for batch in _batches([run.id for run in runs]):
        traces = ItemTrace.objects.filter(item__run_id__in=batch)
        if dry_run:
            per_run = list(traces.values("item__run_id").annotate(n=Count("pk")).values_list("n"))
            counts["runs"] += len(per_run)
            counts["traces"] += sum(n for (n,) in per_run)
            continue
        for run_id in batch:
            deleted = _delete(ItemTrace.objects.filter(item__run_id=run_id), counts, touched)
            counts["runs"] += bool(deleted)


# ---------------------------------------------------------------------------- recordings


def _clean_recordings(
    rule: Rule,
    experiment: str | None,
    dry_run: bool,
    counts: Counter[str],
    touched: set[type[Model]],
) -> None:
    rows = Recording.objects.all()
    if experiment is not None:
        rows = rows.filter(experiment=experiment)
    if rule.older_than is not None:
        rows = rows.filter(recorded_at__lt=timezone.now() - timedelta(seconds=rule.older_than))
    if rule.keep_last is not None:
        for name, sessions in _newest_sessions(experiment, rule.keep_last).items():
            rows = rows.exclude(experiment=name, recorded_by__in=sessions)
    if dry_run:
        counts["recordings"] += rows.count()
    else:
        _delete(rows, counts, touched)


def _newest_sessions(experiment: str | None, keep: int) -> dict[str, list[str]]:
    """Per experiment, the runs (`recorded_by`) that made its `keep` newest recordings."""
    sessions = Recording.objects.values_list("experiment", "recorded_by").annotate(
        last=Max("recorded_at")
    )
    if experiment is not None:
        sessions = sessions.filter(experiment=experiment)
    newest: dict[str, list[str]] = {}
    for name, run_id, _last in sessions.order_by("experiment", "-last"):
        kept = newest.setdefault(name, [])
        if len(kept) < keep:
            kept.append(run_id)
    return newest


# ---------------------------------------------------------------------------------- rows


def _delete(rows: QuerySet, counts: Counter[str], touched: set[type[Model]]) -> int:
    """Delete `rows` through the ORM (cascades included), `CHUNK` at a time in key order;
    returns how many of `rows`' own model went."""
    model = rows.model
    key = model._meta.pk.name
    gone, last = 0, None
    while True:
        page = rows if last is None else rows.filter(**{f"{key}__gt": last})
        ids = list(page.order_by(key).values_list(key, flat=True)[:CHUNK])
        if not ids:
            return gone
        with transaction.atomic():
            # `only` the key: the collector would otherwise load (and decode) every column.
            _, deleted = model.objects.filter(**{f"{key}__in": ids}).only(key).delete()
        gone += deleted.get(model._meta.label, 0)
        _tally(deleted, counts, touched)
        last = ids[-1]


def _tally(deleted: dict[str, int], counts: Counter[str], touched: set[type[Model]]) -> None:
    for model in TABLES:
        number = deleted.get(model._meta.label, 0)
        if number:
            touched.add(model)
            if model in WORDS:
                counts[WORDS[model]] += number


def _batches(ids: list[str]) -> Iterator[list[str]]:
    for start in range(0, len(ids), RUN_BATCH):
        yield ids[start : start + RUN_BATCH]


def _experiment_exists(name: str) -> bool:
    return (
        Run.objects.filter(name=name).exists() or Recording.objects.filter(experiment=name).exists()
    )


# --------------------------------------------------------------------------------- space


def _database_bytes() -> int | None:
    """The SQLite file with its write-ahead log, or the PostgreSQL tables a clean touches."""
    if connection.vendor == "sqlite":
        path = Path(connection.settings_dict["NAME"])
        files = (path, path.with_name(path.name + "-wal"))
        return sum(f.stat().st_size for f in files if f.exists())
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT coalesce(sum(pg_total_relation_size(quote_ident(t)::regclass)), 0) "
                "FROM unnest(%s::text[]) AS t",
                [[model._meta.db_table for model in TABLES]],
            )
            return int(cursor.fetchone()[0])
    return None


def _give_space_back(before: int, touched: set[type[Model]]) -> Space:
    """SQLite: VACUUM rewrites the file without the freed pages (or, when the database uses
    incremental auto-vacuum, `incremental_vacuum` drops them), then the log is truncated.
    PostgreSQL: VACUUM (ANALYZE) of the touched tables makes the dead rows' space reusable
    at once and tells the planner how small the tables became; the files keep their size."""
    if connection.vendor == "sqlite":
        database = Path(connection.settings_dict["NAME"]).name
        if Run.objects.filter(status__in=ACTIVE).exists():
            # VACUUM holds the database for as long as it copies it: a run would wait on it.
            how = "runs are in progress, and VACUUM would hold them up"
            return Space(before, before, how, database, given_back=False)
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA auto_vacuum")
            incremental = cursor.fetchone()[0] == 2
            try:
                if incremental:
                    cursor.execute("PRAGMA incremental_vacuum")
                    cursor.fetchall()  # each step frees a page: step it to the end
                else:
                    cursor.execute("VACUUM")
                cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except OperationalError as exc:
                how = f"another process holds the database ({exc})"
                return Space(before, before, how, database, given_back=False)
        after = _database_bytes() or 0
        return Space(before, after, "incremental vacuum" if incremental else "VACUUM", database)
    tables = sorted(model._meta.db_table for model in touched)
    with connection.cursor() as cursor:
        quoted = ", ".join(connection.ops.quote_name(table) for table in tables)
        cursor.execute(f"VACUUM (ANALYZE) {quoted}")
    after = _database_bytes() or 0
    how = f"VACUUM (ANALYZE) of {len(tables)} table{'s' * (len(tables) != 1)}"
    return Space(before, after, how, "PostgreSQL")
