"""The production traces page on a phone: Chromium at 390 px, against the real `cobalt serve`
with traces its OTLP receiver stored (long inputs, long names, as services send them)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.conftest import served
from tests.helpers import axe_violations
from tests.test_browser import ARTIFACTS, CHROMIUM, browser  # noqa: F401 - a fixture

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs /usr/bin/chromium")
PHONE = {"viewport": {"width": 390, "height": 844}, "device_scale_factor": 2, "is_mobile": True}
QUESTION = (
    "Which of our enterprise-plan customers in the Asia-Pacific region renewed their "
    "contracts after the price change, and what did each of them say about support?"
)

# The elements that scroll sideways: wider inside than their box, their overflow scrolling.
SIDEWAYS = """
[...document.querySelectorAll("body *")].filter(e => e.scrollWidth > e.clientWidth + 1
  && ["auto", "scroll"].includes(getComputedStyle(e).overflowX)).map(e => e.outerHTML.slice(0, 80))
"""


def export(trace: int) -> bytes:
    """One trace as a service's exporter sends it: an agent span (the question, a long
    attribute) and a model call under it."""
    request = ExportTraceServiceRequest()
    resource = request.resource_spans.add()
    name = resource.resource.attributes.add()
    name.key, name.value.string_value = "service.name", "customer-insights-agent-eu-west-1"
    scope = resource.scope_spans.add()
    for n, (span_name, operation) in enumerate(
        [("invoke_agent customer_insights_orchestrator", "invoke_agent"), ("chat gpt-4o", "chat")]
    ):
        span = scope.spans.add()
        span.trace_id = (trace + 1).to_bytes(16, "big")
        span.span_id = (n + 1).to_bytes(8, "big")
        if n:
            span.parent_span_id = (1).to_bytes(8, "big")
        span.name = span_name
        span.start_time_unix_nano = 1_700_000_000_000_000_000 + n * 1_000_000
        span.end_time_unix_nano = span.start_time_unix_nano + 2_500_000_000
        attributes = {
            "gen_ai.operation.name": operation,
            "input.value": f"{QUESTION} ({trace})",
            "output.value": "Three renewed: " + ", ".join(f"customer-{i}" for i in range(40)),
            "user.session_fingerprint": "f" * 120,
        }
        for key, value in attributes.items():
            kv = span.attributes.add()
            kv.key, kv.value.string_value = key, value
    return request.SerializeToString()


def test_the_traces_pages_fit_a_phone(project, browser):  # noqa: F811 - the fixture
    with served(project) as url:
        for trace in range(3):
            answer = httpx.post(
                f"{url}/v1/traces",
                content=export(trace),
                headers={"Content-Type": "application/x-protobuf"},
                timeout=60,
            )
            assert answer.status_code == 200, answer.text
        trace_id = f"{1:032x}"
        context = browser.new_context(**PHONE)
        tab = context.new_page()
        try:
            for name, path in {"traces": "/traces/", "trace": f"/traces/{trace_id}/"}.items():
                tab.goto(url + path)
                assert "enterprise-plan customers" in tab.locator("body").inner_text()
                tab.screenshot(path=str(ARTIFACTS / f"phone-{name}.png"), full_page=True)
                width = tab.evaluate("document.documentElement.scrollWidth")
                assert width <= 390, f"{path} is {width}px wide at 390"
                # Nor does a part of it scroll sideways (the table did, in its frame).
                assert tab.evaluate(SIDEWAYS) == [], path
        finally:
            context.close()
        pages = ["/traces/", f"/traces/{trace_id}/"]
        for scheme in ("light", "dark"):
            found = axe_violations(browser, url, pages, scheme=scheme, viewport=PHONE["viewport"])
            assert found == {}, (scheme, found)
