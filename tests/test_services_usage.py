"""A service's own model calls count in the item's tokens and cost: their spans' `gen_ai.usage`
is added to the item whether the spans came before its result was written or after it finished
(within the grace period), and a finished run's totals follow."""

from __future__ import annotations

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from cobalt_app import otlp, received
from cobalt_app.models import ItemResult, ReceivedTrace, Run
from tests.helpers import add_attributes
from tests.test_pages import keys, make_run


def export(trace_id: str, calls: list[tuple[int, int]], first: int = 1) -> bytes:
    """A service's spans: its `agent` span (when `first` is 1) and model calls under it, each
    reporting (input, output) tokens of gpt-4o-mini."""
    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    spans = [("agent", {"gen_ai.operation.name": "invoke_agent"})] if first == 1 else []
    for used_in, used_out in calls:
        usage = {"gen_ai.usage.input_tokens": used_in, "gen_ai.usage.output_tokens": used_out}
        spans.append(("chat", {"gen_ai.operation.name": "chat", **usage}))
    for n, (name, attributes) in enumerate(spans, start=first):
        span = scope.spans.add()
        span.trace_id, span.span_id = bytes.fromhex(trace_id), n.to_bytes(8, "big")
        if n > 1:
            span.parent_span_id = (1).to_bytes(8, "big")
        span.name = name
        span.start_time_unix_nano = 1_700_000_000_000_000_000 + n
        span.end_time_unix_nano = span.start_time_unix_nano + 1000
        model = span.attributes.add()
        model.key, model.value.string_value = "gen_ai.request.model", "gpt-4o-mini"
        add_attributes(span, attributes)
    return request.SerializeToString()


@pytest.mark.django_db
def test_service_usage_counts_in_the_item_whichever_comes_first_and_in_the_finished_run():
    run = make_run("svc", keys=keys(2), evaluators=())
    early, late = ItemResult.objects.filter(run=run).order_by("item_index")
    before = (run.total_tokens, early.tokens, early.cost, late.tokens, late.cost)
    # Spans before the item's result links their trace (a fast exporter) ...
    otlp.receive(export("a1" * 16, [(100, 20)]), "application/x-protobuf", "")
    received.link_items([(early.id, "a1" * 16, "c1" * 8)])
    # ... and after the run finished (its exporter's next batch, within the grace period).
    received.link_items([(late.id, "b2" * 16, "c2" * 8)])
    otlp.receive(export("b2" * 16, [(300, 40)]), "application/x-protobuf", "")
    otlp.receive(export("b2" * 16, [(5, 5)], first=3), "application/x-protobuf", "")
    otlp.receive(export("b2" * 16, [(5, 5)], first=3), "application/x-protobuf", "")  # a retry
    early.refresh_from_db()
    late.refresh_from_db()
    assert early.tokens - before[1] == 120 and early.cost > before[2]
    assert late.tokens - before[3] == 350 and late.cost > before[4]
    run.refresh_from_db()
    assert run.total_tokens == before[0] + 470
    assert run.summary["totalTokens"] == run.total_tokens and run.estimated_cost > 0
    assert list(ReceivedTrace.objects.order_by("trace_id").values_list("tokens", flat=True)) == [
        120,
        350,
    ]
    assert Run.objects.get(id=run.id).status == run.status
