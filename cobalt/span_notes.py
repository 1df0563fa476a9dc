"""What a run says of its items' traces that did not get all their service's spans (an HTTP
target's, exported to the run's OTLP receiver): one wording, stored in the run's summary
(`serviceSpans.note`, see `cobalt_app.received.service_spans`) for the terminal, the run page,
the results file, the API and the MCP tools."""

from __future__ import annotations

from typing import Any

from cobalt.wording import plural


def missing_spans_note(facts: dict[str, Any]) -> str | None:
    """The warning for `facts` (`linked`, `noSpans`, `incomplete` item traces; where the run's
    receiver listened, `receiver`, and the project's `cobalt serve`, `serve`, base URLs; how
    long the receiver waited, `waitedS`), or None when every trace is complete or no receiver
    waited for them (a team run's spans go to `cobalt serve`, whenever they come)."""
    none, partial, waited = (
        facts.get("noSpans", 0),
        facts.get("incomplete", 0),
        facts.get("waitedS"),
    )
    here, dashboard = facts.get("receiver"), facts.get("serve")
    if not (none or partial) or waited is None or not here:
        return None
    serve = f"this project's `cobalt serve` ({dashboard}/v1/traces)" if dashboard else ""
    if none == facts.get("linked"):
        return (
            f"no service exported spans within {waited:g} s of the last item to this run's "
            f"receiver ({here}/v1/traces){' or ' + serve if serve else ''}: the items' "
            "timelines show none of their services' own spans, and tokens and cost none of "
            f"their model calls. Point the service's OTEL_EXPORTER_OTLP_ENDPOINT at {here}"
            f"{f' (or {dashboard})' if dashboard else ''} and have it continue each request's "
            "`traceparent`"
        )
    later = (
        f"Spans sent later join the items if they go to {serve}; this run's receiver "
        f"({here}/v1/traces) has closed"
        if serve
        else f"Spans sent later to {here}/v1/traces join the items only if a `cobalt serve` "
        "of this project listens there"
    )
    said = []
    if none:
        said.append(f"{plural(none, 'item')} had no span from their service")
    if partial:
        said.append(
            f"{plural(partial, 'item')} had not their service's span under the run's request "
            "(its root, which ends last)"
        )
    what = (
        "tokens and cost count none of their service's model calls"
        if not partial
        else "their timelines, tokens and cost leave out the service's spans that did not come"
    )
    return (
        f"{' and '.join(said)} {waited:g} s after the last item ([receiver] grace): {what}. {later}"
    )
