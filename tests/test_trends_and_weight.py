"""Trends beside the scores (error rate, cost, latency) with a table to compare two runs without
JavaScript; pages gzipped when asked (streamed exports too) and Chart.js only where a chart is."""

from __future__ import annotations

import gzip
import json
import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from cobalt_app.models import Run
from tests.test_pages import keys, make_run

pytestmark = pytest.mark.django_db

CHART_JS = re.compile(r'<script src="/static/cobalt/vendor/chart\.umd\.min[^"]*\.js"')


@pytest.fixture
def client() -> Client:
    return Client(HTTP_HOST="127.0.0.1")


def test_trends_draw_error_rate_cost_and_latency_and_tabulate_them(
    client, django_assert_num_queries
):
    now = timezone.now()
    first = make_run(
        keys=keys(4), errors={"k000": "RuntimeError: boom"}, created_at=now - timedelta(1)
    )
    second = make_run(keys=keys(4))
    Run.objects.filter(id=first.id).update(estimated_cost=0.25)
    Run.objects.filter(id=second.id).update(
        summary={**second.summary, "latency": {"p50": 120.0, "p95": 480.0}}
    )
    with django_assert_num_queries(4):  # experiments, tags, runs, judge versions
        page = client.get("/trends/?experiment=qa").content.decode()
    charts = json.loads(re.search(r'id="trend-charts"[^>]*>(.*?)</script>', page, re.S)[1])
    assert charts["runs"] == [first.id, second.id]
    assert charts["compareUrl"] == "/compare/"
    metrics = charts["metrics"]
    assert metrics["errorRate"] == [{"label": "errors and timeouts", "values": [0.25, 0.0]}]
    assert metrics["cost"][0]["values"] == [0.25, second.estimated_cost]
    assert [line["label"] for line in metrics["latency"]] == ["p50", "p95"]
    assert metrics["latency"][1]["values"][1] == 480.0
    for metric in ("errorRate", "cost", "latency"):
        assert f'data-chart="trends" data-metric="{metric}"' in page
    # The table is the charts' data, newest first, and compares two runs without script.
    table = page[page.index('<table class="trend-table"') :]
    rows = re.findall(
        r"<tr>(.*?)</tr>", table[table.index("<tbody>") : table.index("</table>")], re.S
    )
    assert second.id in rows[0] and first.id in rows[1]
    cells = re.findall(r'<td class="num">([^<]*)</td>', rows[1])
    assert cells[-5:-3] == ["1", "25%"]  # errors, error rate
    latest = re.findall(r'<td class="num">([^<]*)</td>', rows[0])
    assert latest[-5:-1] == ["0", "0%", "120ms", "480ms"]  # then p50 and p95 latency
    assert '<form class="trend-compare" method="get" action="/compare/">' in page
    assert f'name="a" value="{first.id}" aria-label="Compare {first.id} as A"' in page
    assert f'name="b" value="{second.id}" aria-label="Compare {second.id} as B"' in page


def test_pages_come_gzipped_when_asked_and_plain_otherwise(client):
    run = make_run(keys=keys(30))
    for path in ("/", f"/runs/{run.id}/", "/trends/", f"/runs/{run.id}/?view=all"):
        plain = client.get(path)
        assert plain.status_code == 200 and "Content-Encoding" not in plain
        packed = client.get(path, HTTP_ACCEPT_ENCODING="gzip, deflate, br")
        assert packed["Content-Encoding"] == "gzip" and "Accept-Encoding" in packed["Vary"]
        html = gzip.decompress(packed.content).decode()
        assert html.startswith("<!doctype html>") and len(packed.content) < len(html) / 2


def test_a_streamed_export_still_streams_every_row_when_gzipped(client):
    run = make_run(keys=keys(300))
    for fmt in ("csv", "jsonl"):
        plain = b"".join(client.get(f"/runs/{run.id}/export.{fmt}").streaming_content)
        reply = client.get(f"/runs/{run.id}/export.{fmt}", HTTP_ACCEPT_ENCODING="gzip")
        assert reply.streaming and reply["Content-Encoding"] == "gzip"
        assert "attachment" in reply["Content-Disposition"]
        assert gzip.decompress(b"".join(reply.streaming_content)) == plain
        assert plain.count(b"\n") >= 300


def test_chart_js_loads_only_on_pages_that_draw_a_chart(client):
    run = make_run(keys=keys(2))
    item = run.items.order_by("id").first()
    charted = (f"/runs/{run.id}/", f"/compare/?a={run.id}&b={run.id}", "/trends/")
    for path in charted:
        assert CHART_JS.search(client.get(path).content.decode()), path
    for path in ("/", f"/runs/{run.id}/items/{item.number}/", "/sweeps/", "/traces/"):
        page = client.get(path).content.decode()
        assert "<!doctype html>" in page and not CHART_JS.search(page), path
