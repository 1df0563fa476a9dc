"""Production traces: what services sent to the OTLP receiver, and turning them into tests.

    GET  /traces/                 the list (service, status, since, attribute filters)
    GET  /traces/<trace id>/      one trace: its root input and output, its span tree
    POST /traces/dataset/         append the chosen traces to a dataset file (logged in)

The reads and the write are `production_traces`; a view parses, calls and responds.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from django.conf import settings
from django.contrib import messages
from django.core.paginator import Paginator
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from cobalt.errors import CobaltError
from cobalt_app import page_trace, production_traces, received, trace_spans
from cobalt_app.views import CONTENT_SECURITY_POLICY, HtmxHttpRequest

PAGE_SIZE = 50
DEFAULT_DATASET = "datasets/production.jsonl"


@require_GET
def traces_list(request: HtmxHttpRequest) -> HttpResponse:
    query = request.GET
    filters = {
        "service": query.get("service", "").strip(),
        "status": query.get("status", "").strip(),
        "since": query.get("since", "").strip(),
        "attribute": query.get("attribute", "").strip(),
    }
    error = ""
    page = None
    try:
        found = production_traces.traces(
            service=filters["service"] or None,
            status=filters["status"] or None,
            since=production_traces.since_ago(filters["since"]) if filters["since"] else None,
            attributes=[filters["attribute"]] if filters["attribute"] else (),
        )
        page = Paginator(found, PAGE_SIZE).get_page(query.get("page"))
    except CobaltError as exc:
        error = str(exc)
    context = {
        "page": page,
        "filters": filters,
        "error": error,
        "services": production_traces.services(),
        "dataset": query.get("path") or DEFAULT_DATASET,
        "chosen": set(query.getlist("trace")),
        "query": urlencode({k: v for k, v in filters.items() if v}),
    }
    response = render(request, "cobalt/traces.html", context, status=400 if error else 200)
    response["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    return response


@require_GET
def trace_detail(request: HtmxHttpRequest, trace_id: str) -> HttpResponse:
    trace = production_traces.get(trace_id)
    steps = received.steps_of_trace(trace)
    page = request.GET.get("page", "1")
    context = {
        "trace": trace,
        "tree": page_trace.trace_page(steps, int(page) if page.isdigit() else 1),
        "summary": trace_spans.summary(steps),
        "dataset": DEFAULT_DATASET,
    }
    response = render(request, "cobalt/trace.html", context)
    response["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    return response


def with_choice(back: str, request: HtmxHttpRequest) -> str:
    """`back` with the chosen traces and the dataset file in its query: where a person who
    must log in first comes back to, their choice still made."""
    url = urlsplit(back)
    kept = [(k, v) for k, v in parse_qsl(url.query) if k not in ("trace", "path")]
    chosen = [("trace", trace) for trace in request.POST.getlist("trace")]
    path = request.POST.get("path", "").strip()
    query = urlencode(kept + chosen + ([("path", path)] if path else []))
    return urlunsplit(("", "", url.path, query, ""))


@require_POST
def traces_to_dataset(request: HtmxHttpRequest) -> HttpResponse:
    """Append the chosen traces to the dataset file (a logged-in user only: it writes)."""
    back = request.POST.get("back") or reverse("cobalt:traces")
    if not back.startswith("/"):
        back = reverse("cobalt:traces")
    if not request.user.is_authenticated:
        return redirect(f"{settings.LOGIN_URL}?{urlencode({'next': with_choice(back, request)})}")
    chosen = request.POST.getlist("trace")
    path = request.POST.get("path", "").strip() or DEFAULT_DATASET
    try:
        done = production_traces.to_dataset(chosen, path)
    except CobaltError as exc:
        messages.error(request, str(exc))
        return redirect(back)
    text = f"Added {len(done['added'])} items to {done['file']}."
    if done["recorded"]:
        text += f" {len(done['recorded'])} of them replay offline (cobalt run --replay)."
    if done["skipped"]:
        text += f" Already there: {', '.join(done['skipped'])}."
    messages.success(request, text)
    return redirect(back)
