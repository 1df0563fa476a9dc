"""Live terminal output of a run (seed §4): header box, a line per item, progress, summary."""

from __future__ import annotations

import sys
from typing import Any

from rich.box import ROUNDED
from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import cobalt

LOW_SCORE = 0.5


def fmt_score(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def fmt_ms(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value / 1000:.1f}s" if value >= 10_000 else f"{value:.0f}ms"


class ConsoleReporter:
    """Prints a run as it happens. Plain fast lines when the output is not a terminal."""

    def __init__(self, console: Console | None = None, *, quiet: bool = False) -> None:
        self.console = console or Console(
            highlight=False, width=None if sys.stdout.isatty() else 160
        )
        self.quiet = quiet
        self.progress: Progress | None = None
        self.task_id: Any = None
        self.items_in_dataset = 0
        self.runs = 1
        self.header_printed = False

    def banner(self) -> None:
        self.console.print(f"\n [bold]cobalt[/] v{cobalt.__version__}\n")

    def file_started(self, relative_path: str) -> None:
        self.console.print(f" Running: [cyan]{escape(relative_path)}[/]")

    def run_started(self, run, experiment) -> None:
        config = run.config
        self.runs = int(config.get("runs", 1))
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
        self.console.print()
        self.console.print(f" [bold]{escape(run.name)}[/]  [dim]run {run.id}[/]")
        self.console.print(Panel(body, box=ROUNDED, expand=False, padding=(0, 1)))
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

    def item_line(self, outcome) -> tuple[str, str]:
        """(plain text, rich markup) of one item's line."""
        label = f"Item {outcome.item_index + 1}/{self.items_in_dataset}"
        if outcome.run_index >= self.runs:  # --repeat-flaky: a flaky item's extra repetitions
            label += f" (repeat {outcome.run_index + 1})"
        elif self.runs > 1:
            label += f" (run {outcome.run_index + 1}/{self.runs})"
        latency = fmt_ms(outcome.latency_ms)
        if outcome.status == "ok":
            parts, low = [], False
            for evaluation in outcome.evaluations:
                if evaluation.status == "ok":
                    parts.append(f"{evaluation.evaluator}: {evaluation.score:.2f}")
                    low = low or evaluation.score < LOW_SCORE
                else:
                    parts.append(f"{evaluation.evaluator}: eval error")
            scores = " | ".join(parts) if parts else "no evaluators"
            errors = any(e.status != "ok" for e in outcome.evaluations)
            suffix = "  ⚠ low score" if low else ""
            suffix += "  ⚠ evaluation error" if errors else ""
            plain = f"  ✓ {label} — {scores}  {latency}{suffix}"
            markup = f"  [green]✓[/] {label} — {escape(scores)}  [dim]{latency}[/]"
            markup += f"[yellow]{suffix}[/]" if suffix else ""
            return plain, markup
        if outcome.status == "timeout":
            plain = f"  ⏱ {label} — timeout: {outcome.error}"
            return plain, f"  [yellow]⏱[/] {label} — [yellow]{escape(outcome.error)}[/]"
        error = outcome.error.splitlines()[0] if outcome.error else outcome.status
        plain = f"  ✗ {label} — error: {error}  {latency}"
        return plain, f"  [red]✗[/] {label} — [red]{escape(error)}[/]  [dim]{latency}[/]"

    def item_finished(self, outcome, done: int, total: int) -> None:
        if self.quiet:
            return
        plain, markup = self.item_line(outcome)
        if self.progress is not None:
            self.progress.console.print(markup)
            self.progress.update(self.task_id, completed=done)
        else:
            self.console.file.write(plain + "\n")

    def stop_progress(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    def run_finished(self, run) -> None:
        self.stop_progress()
        print_summary(self.console, run)


def print_summary(console: Console, run) -> None:
    summary = run.summary
    console.print()
    console.rule(f"[bold]Results: {escape(run.name)}[/]", align="left")
    table = Table(box=None, padding=(0, 2), pad_edge=True)
    with_ci = any(v.get("ci95") for v in summary.get("scores", {}).values())
    columns = ("Evaluator", "Avg", "95% CI", "Min", "Max", "P50", "P95", "Errors")
    for column in columns if with_ci else [c for c in columns if c != "95% CI"]:
        table.add_column(column, justify="left" if column == "Evaluator" else "right")
    for name, values in summary.get("scores", {}).items():
        ci = values.get("ci95")
        interval = [f"[{ci['low']:.2f}, {ci['high']:.2f}]" if ci else "—"] if with_ci else []
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
        console.print(table)
    for line in repetition_lines(summary):
        console.print(f"  {escape(line)}")
    status = summary.get("itemStatus", {})
    console.print()
    console.print(
        f"  Total items:    {summary.get('totalItems', 0)}"
        f"  ({status.get('ok', 0)} ok, {status.get('error', 0)} errors,"
        f" {status.get('timeout', 0)} timeouts)"
    )
    console.print(f"  Total time:     {fmt_ms(summary.get('totalDurationMs'))}")
    console.print(f"  Avg latency:    {fmt_ms(summary.get('avgLatencyMs'))}")
    tokens = summary.get("totalTokens", 0)
    console.print(
        f"  Total tokens:   {tokens:,} (estimated cost: ${summary.get('estimatedCost', 0):.4f};"
        f" agent {summary.get('agentTokens', 0):,}, judge {summary.get('judgeTokens', 0):,})"
    )
    if summary.get("cachedEvaluations"):
        console.print(f"  Cached judge replies: {summary['cachedEvaluations']}")
    for line in warnings(run):
        console.print(f"  [yellow]⚠ {escape(line)}[/]")
    console.print()
    if run.results_path:
        console.print(f" Results saved to {escape(display_path(run.results_path))}", soft_wrap=True)
    console.print(f" Run ID: [bold]{run.id}[/]")
    console.print(" Dashboard: cobalt serve\n")


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
    from cobalt_app.models import Evaluation, ItemResult

    lines: list[str] = []
    summary = run.summary
    low = (
        Evaluation.objects.filter(run=run, status="ok", score__lt=LOW_SCORE)
        .values_list("evaluator", "item__item_index")
        .order_by("evaluator", "item__item_index")
    )
    by_evaluator: dict[str, list[int]] = {}
    for evaluator, index in low:
        by_evaluator.setdefault(evaluator, []).append(index + 1)
    for evaluator, indexes in by_evaluator.items():
        shown = ", ".join(f"#{i}" for i in sorted(set(indexes))[:8])
        more = "…" if len(set(indexes)) > 8 else ""
        lines.append(
            f"{len(indexes)} item{'s' * (len(indexes) > 1)} scored below {LOW_SCORE} on "
            f"'{evaluator}' (item {shown}{more})"
        )
    failed = ItemResult.objects.filter(run=run, status__in=["error", "timeout"]).values_list(
        "item_index", "status", "error"
    )[:5]
    for index, status, error in failed:
        first = (error or status).splitlines()[0]
        lines.append(f"item #{index + 1} {status}: {first}")
    extra = summary.get("errors", 0) + summary.get("timeouts", 0) - len(failed)
    if extra > 0:
        lines.append(f"… and {extra} more failed items")
    if summary.get("evaluationErrors"):
        first_error = (
            Evaluation.objects.filter(run=run, status="error").values_list("evaluator", "error")
        ).first()
        lines.append(
            f"{summary['evaluationErrors']} evaluation error(s); first: "
            f"{first_error[0]}: {first_error[1]}"
        )
    return lines


def display_path(path: str) -> str:
    from pathlib import Path

    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return path


def stderr_console() -> Console:
    return Console(file=sys.stderr, highlight=False)
