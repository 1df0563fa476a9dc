"""Live terminal output of a run (seed §4): header box, a line per item, progress, summary."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from rich.box import ROUNDED
from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cobalt import verdict
from cobalt.config import active_config
from cobalt.run_settings import RunSettings
from cobalt.usage_notes import cost_line, estimated_usage_note, no_model_note, unpriced_named
from cobalt.version import __version__
from cobalt.wording import plural
from cobalt_app import recordings, traces
from cobalt_app.pricing import ACCEPTED_USAGE, usage_problem
from cobalt_cli.console import cli_console

# An ok item's mark by its verdict (`cobalt.verdict.item_verdict`): ✓ otherwise.
ITEM_MARKS = {verdict.Verdict.FAIL: ("✗", "red"), verdict.Verdict.ERROR: ("⚠", "yellow")}


def fmt_score(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def fmt_ms(value: float | None) -> str:
    """`850ms` below a second, `1.2s` from one second on."""
    if value is None:
        return "—"
    return f"{value / 1000:.1f}s" if value >= 1000 else f"{value:.0f}ms"


class ConsoleReporter:
    """Prints a run as it happens. Plain fast lines when the output is not a terminal, written
    together: at most one write each FLUSH_EVERY seconds (on a loop; else one a line)."""

    FLUSH_EVERY = 0.1

    def __init__(self, console: Console | None = None, *, quiet: bool = False) -> None:
        self.console = console or cli_console()
        self.quiet = quiet
        self.progress: Progress | None = None
        self.task_id: Any = None
        self.items_in_dataset = 0
        self.runs = 1
        self.header_printed = False
        self.usage_problems: dict[str, int] = {}  # first shape seen → items reporting it
        self.marks: dict[str, float] = {}  # each evaluator's pass mark
        self.output = self.console.file
        self.lines: list[str] = []  # item lines not written yet
        self.written_at = 0.0
        self.writing = threading.Lock()  # the loop's timer and the end of the run

    def banner(self) -> None:
        self.console.print(f"\n [bold]cobalt[/] v{__version__}\n")

    def run_started(self, run, experiment) -> None:
        config = run.config
        self.output = self.console.file  # looked up once: rich resolves it on every access
        self.runs = RunSettings.from_run_config(config).runs
        self.marks = verdict.pass_marks(config.get("evaluators", []))
        size = (config.get("dataset") or {}).get("size")
        self.items_in_dataset = size or max(run.total_items // max(self.runs, 1), 1)
        evaluators = len(config.get("evaluators", []))
        extra = run.total_items - self.items_in_dataset * self.runs  # --repeat-flaky
        body = (
            f"Dataset: {self.items_in_dataset} items × {self.runs} run{'s' * (self.runs > 1)}"
            f" × {evaluators} evaluator{'s' * (evaluators != 1)}"
            + (f" + {extra} repetitions of flaky items" if extra > 0 else "")
            + "\n"
            f"Concurrency: {config.get('concurrency')} | Timeout: {config.get('timeout'):g}s"
        )
        if replay := recordings.header(config.get("replay")):
            body += f"\nModel calls: {replay}"
        if trace := traces.header(active_config()):
            body += f"\n[yellow]⚠ Trace: {escape(trace)}[/]"
        self.console.print()
        self.console.print(f" [bold]{escape(run.name)}[/]  [dim]run {run.id}[/]")
        self.console.print(Panel(body, box=ROUNDED, expand=False, padding=(0, 1)), soft_wrap=False)
        if self.console.is_terminal and not self.quiet:
            self.progress = Progress(
                TextColumn("  "),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=self.console,
                transient=True,
            )
            self.progress.start()
            self.task_id = self.progress.add_task("items", total=run.total_items)

    def item_line(self, outcome, *, markup: bool = False) -> str:
        """One item's line: plain text, or rich markup (`markup`) for a terminal."""
        label = f"Item {outcome.item_index + 1}/{self.items_in_dataset}"
        if outcome.run_index >= self.runs:  # --repeat-flaky: a flaky item's extra repetitions
            label += f" (repeat {outcome.run_index + 1})"
        elif self.runs > 1:
            label += f" (run {outcome.run_index + 1}/{self.runs})"
        metadata = outcome.metadata
        conversation = metadata.get("conversation") if metadata else None
        if isinstance(conversation, dict):  # conversation=True: how many turns it took
            label += f" · {plural(int(conversation.get('turns') or 0), 'turn')}"
        latency = fmt_ms(outcome.latency_ms)
        if outcome.status == "ok":
            scores, suffix, judged = self.scores(outcome)
            mark, colour = ITEM_MARKS.get(judged, ("✓", "green"))
            if judged in ITEM_MARKS or suffix:
                latency += steps_note(outcome)
            if not markup:
                return f"  {mark} {label} — {scores}  {latency}{suffix}"
            line = f"  [{colour}]{mark}[/] {label} — {escape(scores)}  [dim]{latency}[/]"
            return line + f"[yellow]{suffix}[/]" if suffix else line
        if outcome.status == "timeout":
            steps = steps_note(outcome)
            if not markup:
                return f"  ⏱ {label} — timeout: {outcome.error}{steps}"
            return f"  [yellow]⏱[/] {label} — [yellow]{escape(outcome.error)}[/]{steps}"
        error = outcome.error.splitlines()[0] if outcome.error else outcome.status
        latency += steps_note(outcome)
        if not markup:
            return f"  ✗ {label} — error: {error}  {latency}"
        return f"  [red]✗[/] {label} — [red]{escape(error)}[/]  [dim]{latency}[/]"

    def scores(self, outcome) -> tuple[str, str, verdict.Verdict]:
        """An item's scores, its warnings (low scores, evaluation errors), its verdict."""
        parts, verdicts, low = [], [], []
        for evaluation in outcome.evaluations:
            threshold = verdict.pass_mark(self.marks.get(evaluation.evaluator))
            judged = verdict.evaluation_verdict(
                evaluation.score, threshold, error=evaluation.status != "ok"
            )
            verdicts.append(judged)
            if judged is verdict.Verdict.ERROR:
                parts.append(f"{evaluation.evaluator}: eval error")
                continue
            parts.append(f"{evaluation.evaluator}: {evaluation.score:.2f}")
            if judged is verdict.Verdict.FAIL:
                low.append(f"{evaluation.evaluator} < {threshold:g}")
        suffix = f"  ⚠ low score ({', '.join(low)})" if low else ""
        suffix += "  ⚠ evaluation error" if verdict.Verdict.ERROR in verdicts else ""
        judged = verdict.item_verdict(verdicts)
        return " | ".join(parts) if parts else "no evaluators", suffix, judged

    def item_finished(self, outcome, done: int, total: int) -> None:
        metadata = getattr(outcome, "metadata", None)
        problem = usage_problem(metadata) if metadata else None
        if problem:
            first = next(iter(self.usage_problems), problem)
            self.usage_problems[first] = self.usage_problems.get(first, 0) + 1
        if self.quiet:
            return
        if self.progress is not None:
            self.progress.console.print(self.item_line(outcome, markup=True))
            self.progress.update(self.task_id, completed=done)
        else:
            line = self.item_line(outcome) + "\n"
            with self.writing:
                self.lines.append(line)
            self._write_soon()

    def _write_soon(self) -> None:
        """Write the waiting lines now if the last write was FLUSH_EVERY ago (or there is no
        loop to write them later); else once then, on the loop. A write per line was a tenth
        of a quick run's loop: one system call each where the output is unbuffered."""
        waited = time.monotonic() - self.written_at
        if waited >= self.FLUSH_EVERY or len(self.lines) > 1000:
            self.write_lines()
            return
        if len(self.lines) > 1:
            return  # a write is due already
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.write_lines()
            return
        loop.call_later(self.FLUSH_EVERY - waited, self.write_lines)

    def write_lines(self) -> None:
        """Write the item lines waiting, in one write."""
        with self.writing:
            lines, self.lines = self.lines, []
            if lines:
                self.output.write("".join(lines))
            self.written_at = time.monotonic()

    def stop_progress(self) -> None:
        self.write_lines()
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    def run_finished(self, run) -> None:
        self.stop_progress()
        extra = [
            f"{plural(count, 'item')} reported token usage Cobalt cannot read ({shape}); "
            f"tokens and cost count them as 0. Accepted: {ACCEPTED_USAGE}"
            for shape, count in self.usage_problems.items()
        ]
        self.usage_problems = {}
        print_summary(self.console, run, extra_warnings=extra)


def steps_note(outcome) -> str:
    """` · 4 steps` after a failing item's line: how far the agent got (its trace)."""
    steps = len(getattr(outcome, "trace", None) or [])
    return f" · {plural(steps, 'step')}" if steps else ""


def print_summary(console: Console, run, *, extra_warnings: list[str] | None = None) -> None:
    summary = run.summary
    console.print()
    console.rule(f"[bold]Results: {escape(run.name)}[/]", align="left")
    # Fits 80 columns with evaluator names of up to 26 characters; longer ones fold.
    table = Table(box=None, padding=(0, 1), pad_edge=True)
    with_ci = any(v.get("ci95") for v in summary.get("scores", {}).values())
    columns = ("Evaluator", "Avg", "95% CI", "Min", "Max", "P50", "P95", "Errors")
    for column in columns if with_ci else [c for c in columns if c != "95% CI"]:
        if column == "Evaluator":
            table.add_column(column, overflow="fold", ratio=1)
        else:
            table.add_column(column, justify="right", no_wrap=True)
    for name, values in summary.get("scores", {}).items():
        ci = values.get("ci95")
        interval = [f"{ci['low']:.2f}–{ci['high']:.2f}" if ci else "—"] if with_ci else []
        table.add_row(
            escape(name),
            fmt_score(values.get("avg")),
            *interval,
            fmt_score(values.get("min")),
            fmt_score(values.get("max")),
            fmt_score(values.get("p50")),
            fmt_score(values.get("p95")),
            str(values.get("errors", 0)),
        )
    if summary.get("scores"):
        console.print(table, soft_wrap=False)
    for line in [*repetition_lines(summary), *calibration_lines(run)]:
        console.print(f"  {escape(line)}")
    status = summary.get("itemStatus", {})
    console.print()
    console.print(
        f"  Total items:    {summary.get('totalItems', 0)}"
        f"  ({status.get('ok', 0)} ok, {plural(status.get('error', 0), 'error')},"
        f" {plural(status.get('timeout', 0), 'timeout')})"
    )
    console.print(f"  Total time:     {fmt_ms(summary.get('totalDurationMs'))}")
    console.print(f"  Avg latency:    {fmt_ms(summary.get('avgLatencyMs'))}")
    tokens = summary.get("totalTokens", 0)
    console.print(
        f"  Total tokens:   {tokens:,} (estimated cost: {cost_line(summary)};"
        f" agent {summary.get('agentTokens', 0):,}, judge {summary.get('judgeTokens', 0):,})"
    )
    no_usage = estimated_usage_note(summary)
    if no_usage:
        console.print(f"  [yellow]{escape('⚠ ' + no_usage)}[/]")
    unpriced = unpriced_named(summary)
    if unpriced:
        verb = "has" if len(unpriced) == 1 else "have"
        line = (
            f"⚠ unpriced: {', '.join(unpriced)} spent tokens and {verb} no price, counted as $0 "
            "(add prices under [prices] in cobalt.toml)"
        )
        console.print(f"  [yellow]{escape(line)}[/]")
    if summary.get("cachedEvaluations"):
        console.print(f"  Cached judge replies: {summary['cachedEvaluations']}")
    for line in [*warnings(run), *(extra_warnings or [])]:
        console.print(f"  [yellow]⚠ {escape(line)}[/]")
    console.print()
    if run.status == "cancelled":
        not_run = status.get("cancelled", 0) + status.get("pending", 0)
        console.print(
            f" [yellow]Run {run.id} was cancelled: {plural(not_run, 'item')} did not run; "
            f"`cobalt run --resume {run.id}` runs them.[/]",
            soft_wrap=True,
        )
    if run.results_path:
        console.print(f" Results saved to {escape(display_path(run.results_path))}", soft_wrap=True)
    console.print(f" Run ID: [bold]{run.id}[/]")
    console.print(f" Dashboard: {escape(dashboard_hint(run))}\n", soft_wrap=True)


def dashboard_hint(run) -> str:
    """Where the run is shown: its page on this project's dashboard when its `cobalt serve`
    recorded where it listens and answers there, else `cobalt serve` and its page on the
    configured address (nothing else is asked: a run connects only where it was told to)."""
    from cobalt.dashboard import configured_address, recorded_dashboard, url_host

    config = active_config()
    base = recorded_dashboard(config)
    if base is not None:
        return f"{base}/runs/{run.id}/"
    host, port = configured_address(config)
    return f"`cobalt serve`, then http://{url_host(host)}:{port}/runs/{run.id}/"


def calibration_lines(run) -> list[str]:
    """Each judge's pass rate (raw, and corrected for its errors) and its certificate."""
    from cobalt_app.calibration import run_calibration

    lines = []
    scores = (run.summary or {}).get("scores") or {}
    for name, found in run_calibration(run).items():
        rate = (scores.get(name) or {}).get("passRate")
        raw = "—" if rate is None else f"{rate:.1%}"
        corrected = f", {found.corrected_text}" if found.corrected_text else ""
        lines.append(f"{name}: pass rate {raw} raw{corrected}")
        lines.append(f"  judge calibration: {found.line(corrected=False)}")
    return lines


def repetition_lines(summary: dict[str, Any]) -> list[str]:
    """pass@k / pass^k per evaluator, and how many items' scores moved across repetitions."""
    lines = []
    for name, values in summary.get("scores", {}).items():
        table = values.get("passAtK")
        if table:
            k = str(table["k"])
            lines.append(
                f"{name}: pass@{k} {table['passAtK'][k]:.2f}, pass^{k} {table['passHatK'][k]:.2f}"
                f" (pass@1 {table['passAtK']['1']:.2f})"
            )
    repeated = (summary.get("repetitions") or {}).get("items") or {}
    if repeated:
        moved = sum(
            1 for by in repeated.values() if any(e.get("stddev", 0) > 0 for e in by.values())
        )
        lines.append(
            f"{moved} of {len(repeated)} repeated items scored differently across repetitions"
        )
    return lines


def warnings(run) -> list[str]:
    from pathlib import Path

    from django.conf import settings

    from cobalt_app.selectors import evaluation_errors, failed_items, low_scores, runaway_items
    from cobalt_app.tracebacks import raised_at

    lines: list[str] = []
    left = runaway_items(run) if run.summary.get("timeouts") else []
    if left:
        shown = ", ".join(f"#{i + 1}" for i in left[:8]) + ("…" if len(left) > 8 else "")
        lines.append(
            f"the code of {plural(len(left), 'item')} did not stop after the timeout ({shown}): "
            "left running until this process ends (see `timeout_grace`)"
        )
    summary = run.summary
    marks = verdict.pass_marks((run.config or {}).get("evaluators", []))
    for evaluator, (count, first) in low_scores(run).items():
        shown = ", ".join(f"#{i + 1}" for i in first)
        more = "…" if count > len(first) else ""
        mark = verdict.pass_mark(marks.get(evaluator))
        lines.append(
            f"{plural(count, 'item')} scored below {mark:g} on '{evaluator}' ({shown}{more})"
        )
    failed = list(failed_items(run)[:5])
    for item in failed:
        first = (item.error or item.status).splitlines()[0]
        found = raised_at(item.traceback, Path(settings.PROJECT_DIR))
        at = f" (at {found.where})" if found else ""
        lines.append(f"item #{item.item_index + 1} {item.status}: {first}{at}")
    extra = summary.get("errors", 0) + summary.get("timeouts", 0) - len(failed)
    if extra > 0:
        lines.append(f"… and {extra} more failed {'item' if extra == 1 else 'items'}")
    unnamed = no_model_note(summary)
    if unnamed:
        lines.append(unnamed)
    spans_note = (summary.get("serviceSpans") or {}).get("note")
    if spans_note:
        lines.append(spans_note)
    for gap in summary.get("traceNotCaptured") or []:
        lines.append(
            f"the trace of {plural(gap['items'], 'item')} was not captured: {gap['why']}; "
            "evaluators that read the trace gave errors, and the agent's tokens and cost "
            "count only what was seen"
        )
    if summary.get("evaluationErrors"):
        evaluator, error = evaluation_errors(run).first()
        lines.append(
            f"{plural(summary['evaluationErrors'], 'evaluation error')}; first: "
            f"{evaluator}: {error}"
        )
    return lines


def display_path(path: str) -> str:
    from pathlib import Path

    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return path
