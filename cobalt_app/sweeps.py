"""Sweeps in storage: one experiment run once per variant (`cobalt.variants`), its runs
ordinary runs with `sweep` and `variant` set.

Built on top of the engine: `assign()` gives the launcher's variant experiments their sweep
before their runs are created (`services.run_create` stores `sweep`/`variant`); the runs then
go through the engine like any others, sharing the judge cache and the rate budget (embedded:
one after another; team: queued together). When the last of them is finalised, whoever
finalises it (`runs.lifecycle.finalise` calls `settle()`), the sweep is analysed
(`cobalt.sweep_stats`, from the runs' stored score tables), the analysis stored on the sweep
with the runs it was computed from, and its results file (`"sweep"`) written. Every door
reads `summary()`, which never writes: the stored analysis, or — for a sweep still running,
or one whose run changed since — one computed for the request.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from django.db import transaction
from django.utils import timezone

from cobalt import sweep_stats, verdict
from cobalt.config import Config, ConfigError
from cobalt.errors import NotFoundError
from cobalt.experiments import Experiment
from cobalt.gates import Check, check_sweep
from cobalt.variants import Variant, default_label, parse_selection, select
from cobalt_app import score_tables
from cobalt_app.models import ItemResult, Run, Sweep
from cobalt_app.services import variant_stored

IDENTICAL_SAMPLE = 50  # items whose outputs are compared to tell an ignored variant key
logger = logging.getLogger("cobalt.sweeps")


class SweepNotFound(NotFoundError):
    pass


def assign(experiments: list[Experiment], *, file_of: Any = None) -> list[str]:
    """Create a sweep for each group of variant experiments without one (consecutive, same
    declaring experiment) and set their `sweep_id`; the ids of the sweeps created."""
    created: list[str] = []
    groups: dict[tuple[str | None, str], list[Experiment]] = {}
    for experiment in experiments:
        if experiment.variant is not None and experiment.sweep_id is None:
            groups.setdefault((experiment.file, experiment.sweep_of or ""), []).append(experiment)
    for (_, name), members in groups.items():
        declared = [m.variant for m in members]
        sweep = Sweep.objects.create(
            name=name,
            file=file_of(members[0]) if file_of else (members[0].file or ""),
            variants=[variant_stored(v.label, v.values) for v in declared],
            default_label=default_label(declared, members[0].default_variant) or "",
        )
        for member in members:
            member.sweep_id = sweep.id
        created.append(sweep.id)
    if created:
        prewarm_tests()
    return created


def prewarm_tests() -> None:
    """Import scipy.stats (the paired tests: ~1 s) in the background while the runs execute,
    not after them (a plain `cobalt run` never imports it)."""
    import threading

    def load() -> None:
        import scipy.stats  # noqa: F401

    threading.Thread(target=load, name="cobalt-sweep-prewarm", daemon=True).start()


def sweep_get(sweep_id: str) -> Sweep:
    try:
        if "\x00" in sweep_id or len(sweep_id) > 32:  # no database stores a NUL
            raise Sweep.DoesNotExist
        return Sweep.objects.get(id=sweep_id)
    except Sweep.DoesNotExist:
        raise SweepNotFound(f"no sweep {sweep_id!r}; `cobalt sweeps` lists them") from None


def sweep_exists(sweep_id: str) -> bool:
    return len(sweep_id) <= 32 and Sweep.objects.filter(id=sweep_id).exists()


def sweep_list(limit: int = 20, name: str | None = None) -> list[Sweep]:
    found = Sweep.objects.all()
    if name:
        found = found.filter(name__icontains=name)
    return list(found[:limit])


def variant_runs(sweep: Sweep) -> dict[str, Run]:
    """The latest run of each variant of the sweep, by label, in declared order."""
    latest: dict[str, Run] = {}
    for run in Run.objects.filter(sweep=sweep).order_by("created_at"):
        latest[(run.variant or {}).get("label", run.name)] = run
    order = [v["label"] for v in sweep.variants]
    return {label: latest[label] for label in order if label in latest}


def _first_error(run: Run) -> str:
    found = (
        ItemResult.objects.filter(run=run, status__in=[ItemResult.Status.ERROR, "timeout"])
        .order_by("item_index")
        .values_list("error", flat=True)
        .first()
    )
    return (found or "").strip().splitlines()[-1][:300] if found else ""


def table_of(run: Run) -> score_tables.ScoreTable:
    """The run's score table; a finished run's is kept in this process with the compare
    page's (`score_tables.kept`): a sweep page reads twelve of them. A page reads; the
    finalisation stores it."""
    return score_tables.kept(run, keep=False)


def variant_data(
    label: str, run: Run, table: score_tables.ScoreTable | None = None
) -> sweep_stats.VariantData:
    table = table_of(run) if table is None else table
    marks = verdict.pass_marks((run.config or {}).get("evaluators", []))
    columns = {name: table.column(name) for name in table.evaluators}
    quality, passed = sweep_stats.item_quality(columns, marks, len(table))
    summary = run.summary or {}
    latency = summary.get("latency") or {}
    errors = int(run.error_count + run.timeout_count)
    return sweep_stats.VariantData(
        label=label,
        values=(run.variant or {}).get("values", {}),
        run_id=run.id,
        status=run.status,
        keys=table.keys,
        quality=quality,
        passed=passed,
        items=run.total_items,
        errors=errors,
        first_error=_first_error(run) if errors else (run.failure or ""),
        latency_p50=latency.get("p50"),
        latency_p95=latency.get("p95"),
        tokens=run.total_tokens,
        cost=run.estimated_cost,
    )


def analysis(
    sweep: Sweep,
    runs: dict[str, Run] | None = None,
    tables: dict[str, score_tables.ScoreTable] | None = None,
) -> dict[str, Any]:
    """The sweep's analysis computed now from its runs as they are; nothing is written."""
    runs = variant_runs(sweep) if runs is None else runs
    tables = tables or {}
    data = [variant_data(label, run, tables.get(label)) for label, run in runs.items()]
    result = sweep_stats.analyse(data, default=sweep.default_label or None)
    result["ignoredKeys"] = ignored_keys(sweep, runs)
    missing = [v["label"] for v in sweep.variants if v["label"] not in runs]
    unfinished = [label for label, run in runs.items() if run.status != Run.Status.COMPLETED]
    result.update(
        id=sweep.id,
        name=sweep.name,
        file=sweep.file,
        keys=sorted({k for v in sweep.variants for k in v["values"]}),
        missing=missing,
        unfinished=unfinished,
        complete=not missing and not unfinished,
        basis=basis(runs),
    )
    if result["ignoredKeys"]:
        keys = ", ".join(result["ignoredKeys"])
        result["verdict"] += (
            f" Variant key(s) {keys}: identical outputs across variants that differ only in "
            "them; does the runner read ctx.variant?"
        )
    running = [label for label, run in runs.items() if run.status not in Run.FINISHED]
    if running or missing:
        done = len(runs) - len(running)
        result["verdict"] = (
            f"Still running ({done} of {len(sweep.variants)} variants finished); so far: "
            + result["verdict"]
        )
    return result


def basis(runs: dict[str, Run]) -> dict[str, str]:
    """What an analysis was computed from: each variant's run, its status and when it ended
    (a resumed or re-finalised run changes it)."""
    return {
        label: f"{run.id} {run.status} {run.finished_at.isoformat() if run.finished_at else ''}"
        for label, run in runs.items()
    }


def summary(
    sweep: Sweep,
    runs: dict[str, Run] | None = None,
    tables: dict[str, score_tables.ScoreTable] | None = None,
) -> dict[str, Any]:
    """The sweep's analysis, read only (every door asks this): the stored one while its runs
    are as they were then (`settle`), else computed now and not stored — for a sweep still
    running, what is known so far. `runs` (`variant_runs`) and `tables` (`tables_of`), when
    the caller has them."""
    runs = variant_runs(sweep) if runs is None else runs
    return sweep.summary if is_current(sweep, runs) else analysis(sweep, runs, tables)


def tables_of(runs: dict[str, Run]) -> dict[str, score_tables.ScoreTable]:
    """The runs' score tables by label: read once for a page's analysis and its matrix."""
    return {label: table_of(run) for label, run in runs.items()}


def is_current(sweep: Sweep, runs: dict[str, Run]) -> bool:
    """The stored analysis was computed from these runs as they are now."""
    stored = sweep.summary or {}
    if "basis" in stored:
        return stored["basis"] == basis(runs)
    # Stored before analyses named their runs: current if every run ended before it.
    return (
        bool(stored)
        and sweep.analysed_at is not None
        and all(
            run.finished_at is not None and run.finished_at <= sweep.analysed_at
            for run in runs.values()
        )
    )


def settle(sweep_ids: Iterable[str], config: Config) -> list[dict[str, Any]]:
    """Once every variant of a sweep has a finished run: analyse it, store the analysis and
    write its results file (`"sweep"`), once for those runs. `lifecycle.finalise` calls it
    for each variant's run, whoever finalises it (a lane, a team worker, a cancel, the
    sweeper); the launcher calls it after a sweep's runs. Returns the analyses stored now or
    before; a sweep with a variant not finished is left as it is (its page computes what is
    known so far)."""
    settled = []
    for sweep_id in dict.fromkeys(sweep_ids):
        with transaction.atomic():  # the row lock: two finalisers analyse once
            sweep = Sweep.objects.select_for_update().filter(id=sweep_id).first()
            if sweep is None:
                continue
            runs = variant_runs(sweep)
            declared = {v["label"] for v in sweep.variants}
            if set(runs) != declared or any(r.status not in Run.FINISHED for r in runs.values()):
                continue
            if is_current(sweep, runs):
                settled.append(sweep.summary)
                continue
            result = analysis(sweep, runs)
            Sweep.objects.filter(id=sweep.id).update(summary=result, analysed_at=timezone.now())
            try:
                write_sweep_file(sweep, result, config.results_dir)
            except OSError:  # a full disk must not undo the stored analysis
                logger.exception("could not write the results file of sweep %s", sweep.id)
        settled.append(result)
    return settled


def ignored_keys(sweep: Sweep, runs: dict[str, Run]) -> list[str]:
    """Variant keys the runner seems to ignore: every pair of variants differing only in that
    key produced identical outputs on the first items."""
    outputs: dict[str, list[str]] = {}
    for label, run in runs.items():
        rows = ItemResult.objects.filter(run=run, run_index=0, status=ItemResult.Status.OK)
        rows = rows.order_by("item_index").values_list("output", flat=True)[:IDENTICAL_SAMPLE]
        outputs[label] = [json.dumps(o, sort_keys=True, default=str) for o in rows]
    values = {v["label"]: v["values"] for v in sweep.variants if v["label"] in runs}
    ignored = []
    for key in sorted({k for v in values.values() for k in v}):
        groups: dict[str, list[str]] = {}
        for label, vals in values.items():
            rest = json.dumps({k: v for k, v in vals.items() if k != key}, sort_keys=True)
            groups.setdefault(rest, []).append(label)
        pairs = [g for g in groups.values() if len(g) > 1]
        if pairs and all(
            outputs[g[0]] and all(outputs[m] == outputs[g[0]] for m in g[1:]) for g in pairs
        ):
            ignored.append(key)
    return ignored


def write_sweep_file(sweep: Sweep, result: dict[str, Any], results_dir: Path) -> Path:
    """`<timestamp>_<name>_sweep_<id>.json`: `{"sweep": analysis}` beside the runs' files."""
    from cobalt_app.results import RESULTS_NAME_MAX, iso

    results_dir.mkdir(parents=True, exist_ok=True)
    stamp = sweep.created_at.strftime("%Y-%m-%dT%H-%M-%S")
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", sweep.name).strip("-")[:RESULTS_NAME_MAX] or "sweep"
    path = results_dir / f"{stamp}_{safe}_sweep_{sweep.id}.json"
    temporary = path.with_name(path.name + ".tmp")
    document = {"sweep": {**result, "timestamp": iso(sweep.created_at)}}
    temporary.write_text(json.dumps(document, indent=2, default=str))
    temporary.replace(path)
    return path


# --- the matrix: items × variants ----------------------------------------------------------


def matrix_rows(
    sweep: Sweep,
    *,
    offset: int = 0,
    limit: int = 50,
    order: list[str] | None = None,
    runs: dict[str, Run] | None = None,
    tables: dict[str, score_tables.ScoreTable] | None = None,
) -> tuple[list[str], list[dict[str, Any]], int]:
    """One page of the items × variants matrix: (labels, rows, total keys). A row: the item
    key and, per variant (in `order`, e.g. the ranking; else as declared), its scores by
    evaluator, its status and its verdict (the one rule). `runs` (`variant_runs`) and
    `tables` (`tables_of`), when the caller has them."""
    runs = variant_runs(sweep) if runs is None else runs
    if order:
        runs = {label: runs[label] for label in order if label in runs}
    known = tables or {}
    tables = {label: known.get(label) or table_of(run) for label, run in runs.items()}
    if not tables:
        return [], [], 0
    first = next(iter(tables.values())).keys
    if all(len(t.keys) == len(first) and np.array_equal(t.keys, first) for t in tables.values()):
        all_keys = first  # the usual case: every variant ran the same items (sorted already)
    else:
        all_keys = np.unique(np.concatenate([t.keys for t in tables.values()]))
    page = all_keys[offset : offset + limit]
    rows = [{"key": k.decode(), "cells": []} for k in page.tolist()]
    for label, table in tables.items():
        marks = verdict.pass_marks((runs[label].config or {}).get("evaluators", []))
        found = np.searchsorted(table.keys, page)
        clipped = np.minimum(found, max(len(table.keys) - 1, 0))
        present = (found < len(table.keys)) & (table.keys[clipped] == page)
        columns = {name: table.column(name)[clipped] for name in table.evaluators}
        for i, row in enumerate(rows):
            row["cells"].append(_cell(label, table, columns, marks, int(clipped[i]), i, present[i]))
    return list(tables), rows, int(len(all_keys))


def _cell(
    label: str,
    table: score_tables.ScoreTable,
    columns: dict[str, np.ndarray],
    marks: dict[str, float],
    position: int,
    i: int,
    present: bool,
) -> dict[str, Any]:
    """A cell: its verdict (the one rule, for its colour), status, scores, and its text."""
    if not present:
        return {"variant": label, "status": "missing", "verdict": "none", "scores": {},
                "text": "not run"}  # fmt: skip
    status = score_tables.STATUSES[int(table.status[position])]
    scores = {}
    verdicts = []
    for name, column in columns.items():
        value = float(column[i])
        if value != value:  # NaN: not scored
            continue
        scores[name] = value
        verdicts.append(verdict.score_verdict(value, marks.get(name)))
    final = verdict.item_verdict(verdicts, errored=status != ItemResult.Status.OK)
    text = " · ".join(f"{name} {value:.2f}" for name, value in scores.items())
    if status != ItemResult.Status.OK:
        text = f"{status} {text}".strip()
    return {"variant": label, "status": status, "verdict": str(final), "scores": scores,
            "text": text}  # fmt: skip


# --- the CI gate (`[ci.sweep]`) ---------------------------------------------------------------


def find_variant(sweep: Sweep, spec: str) -> str:
    """The label of the one variant `spec` names: its label, or `key=value[,key=value]`."""
    declared = [Variant(v["values"], v["label"]) for v in sweep.variants]
    if any(v.label == spec for v in declared):
        return spec
    try:
        found = select(declared, parse_selection([spec.replace(" ", ",")]))
    except ValueError as exc:
        raise ConfigError(f"[ci.sweep] {exc}") from None
    if len(found) != 1:
        labels = ", ".join(v.label for v in declared)
        raise ConfigError(
            f"[ci.sweep] {spec!r} names {len(found)} variants of sweep {sweep.name!r}; name one "
            f"of: {labels}"
        )
    return found[0].label


def gate_checks(sweep_ids: Iterable[str], config: Config) -> list[Check]:
    """`cobalt run --ci` with `[ci.sweep]`: one check per sweep of this invocation."""
    gate = (config.get("ci") or {}).get("sweep")
    if not gate:
        return []
    checks = []
    for sweep_id in dict.fromkeys(sweep_ids):
        sweep = Sweep.objects.get(id=sweep_id)
        result = summary(sweep)
        chosen = (
            find_variant(sweep, gate["variant"]) if gate.get("variant") else sweep.default_label
        )
        if chosen not in result["ranking"]:
            raise ConfigError(f"[ci.sweep] the variant {chosen!r} did not run in sweep {sweep.id}")
        paired: dict[str, Any] = {}
        if gate["require"] == "candidate-beats-default":
            candidate = find_variant(sweep, gate["candidate"])
            runs = variant_runs(sweep)
            paired = sweep_stats.paired(
                variant_data(chosen, runs[chosen]),
                variant_data(candidate, runs[candidate]),
                float(gate.get("alpha", sweep_stats.ALPHA)),
            )
        checks.append(check_sweep(gate, result, chosen, paired))
    return checks
