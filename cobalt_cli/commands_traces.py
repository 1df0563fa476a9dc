"""Production traces a service exported to the OTLP receiver: `cobalt traces list|show|
to-dataset` (the reads and writes are `cobalt_app.production_traces`)."""

from __future__ import annotations

from typing import Annotated

import typer

traces_app = typer.Typer(
    name="traces",
    help="Production traces services sent to the OTLP receiver: list, show, turn into tests.",
    no_args_is_help=True,
)


def list_traces(
    service: Annotated[
        str | None, typer.Option("--service", "-s", help="Only this service's.")
    ] = None,
    status: Annotated[str | None, typer.Option(help="ok or error.")] = None,
    since: Annotated[
        str | None, typer.Option(metavar="AGE", help="Started in the last AGE (30m, 12h, 7d).")
    ] = None,
    attribute: Annotated[
        list[str] | None,
        typer.Option("--attribute", "-a", metavar="KEY=VALUE", help="A root span attribute."),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, help="Traces to list.")] = 50,
) -> None:
    """Production traces, newest first."""
    from rich.markup import escape
    from rich.table import Table

    from cobalt_cli.console import out
    from cobalt_cli.project import setup

    setup()
    from cobalt_app import production_traces

    found = production_traces.traces(
        service=service,
        status=status,
        since=production_traces.since_ago(since) if since else None,
        attributes=attribute or (),
    )[:limit]
    table = Table(box=None, padding=(0, 2), header_style="bold")
    for column in ("Trace", "Service", "Root span", "Status", "Spans", "Duration", "Started"):
        table.add_column(column)
    rows = list(found)
    for trace in rows:
        table.add_row(
            trace.trace_id[:16],
            escape(trace.service or "—"),
            escape(trace.name or "—"),
            trace.status,
            str(trace.span_count),
            f"{trace.duration_ms or 0:.0f}ms",
            trace.started_at.strftime("%Y-%m-%d %H:%M:%S") if trace.started_at else "—",
        )
    if not rows:
        out().print(
            "No production traces. Point an OpenTelemetry exporter at this project's "
            "`cobalt serve` (OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:PORT)."
        )
        return
    out().print(table, soft_wrap=False)


def show_trace(
    trace_id: Annotated[str, typer.Argument(help="The trace's id (its first 6+ characters).")],
) -> None:
    """A trace's root input and output and its span tree."""
    from rich.markup import escape

    from cobalt_cli.console import out
    from cobalt_cli.project import setup

    setup()
    from cobalt_app import production_traces, received, trace_spans

    trace = production_traces.get(trace_id)
    console = out()
    console.print(f"[bold]Trace {trace.trace_id}[/] {escape(trace.service)} · {trace.status}")
    console.print(f"Input:  {escape(trace.input or '—')}")
    console.print(f"Output: {escape(trace.output or '—')}")
    steps = received.steps_of_trace(trace)
    console.print(trace_spans.summary(steps))
    for row in trace_spans.timeline(steps):
        error = f"  [red]{escape(row['error'] or '')}[/]" if row["status"] == "error" else ""
        console.print(
            f"{row['indent']}{row['number']:>3}. {row['kind']:<9} {escape(row['name'])} "
            f"[dim]{row['durationMs']:.0f}ms[/]{error}"
        )


def to_dataset(
    trace_ids: Annotated[list[str], typer.Argument(help="Traces (ids or their first 6+ chars).")],
    file: Annotated[
        str, typer.Option("--file", "-f", help="The project's .jsonl dataset to append to.")
    ] = "datasets/production.jsonl",
) -> None:
    """Append production traces to a dataset as items (input, expected output, the trace), with
    a recording of their model calls to replay them offline where the trace holds them."""
    from rich.markup import escape

    from cobalt_cli.console import out
    from cobalt_cli.project import setup

    setup()
    from cobalt_app import production_traces

    done = production_traces.to_dataset(trace_ids, file)
    console = out()
    console.print(f"Added {len(done['added'])} items to {escape(done['file'])}.")
    if done["recorded"]:
        console.print(
            f"{len(done['recorded'])} of them hold their model calls: they replay offline "
            "(`cobalt run --replay`)."
        )
    if done["skipped"]:
        console.print(f"Already there: {escape(', '.join(done['skipped']))}.")


def register(app: typer.Typer) -> None:
    """Add this area's commands to the `cobalt` app."""
    traces_app.command(name="list")(list_traces)
    traces_app.command(name="show")(show_trace)
    traces_app.command(name="to-dataset")(to_dataset)
    app.add_typer(traces_app)
