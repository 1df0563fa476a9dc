"""Dashboard pages: runs list, run detail (live while running), item panel, compare, trends.

Each view parses its query with a form, calls page selectors and renders one template; an
htmx request gets only the partial it swaps (`"page.html#partial"`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django import forms
from django.conf import settings
from django.core.paginator import Paginator
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    JsonResponse,
    StreamingHttpResponse,
)
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_GET
from django_htmx.http import HttpResponseStopPolling
from django_htmx.middleware import HtmxDetails

from cobalt.dashboard import project_fingerprint
from cobalt.run_settings import RunSettings
from cobalt_app import (
    calibration,
    exports,
    judge_loop,
    labels,
    page_items,
    page_repeats,
    page_selectors,
    page_sweep,
    page_trace,
    page_values,
    selectors,
    sweep_exports,
    sweeps,
)
from cobalt_app.liveness import settle, settled
from cobalt_app.models import ItemResult, Run
from cobalt_app.selectors import RunNotFound, run_get

RUNS_PER_PAGE = 25
RECENT_RUNS = 100  # in the compare page's run menus
ITEMS_PER_PAGE = 50
POLL_SECONDS = 2


# The pages load scripts only from this server and have no inline script (json_script data is
# not executed); styles may be inline (a score bar's width, Chart.js and htmx set them).
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


def page(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A dashboard page: GET only, sent with the Content-Security-Policy."""

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        response = view(request, *args, **kwargs)
        response.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        return response

    return require_GET(wrapped)


# Forms --------------------------------------------------------------------------------------


class RunFilterForm(forms.Form):
    name = forms.CharField(required=False, max_length=200)
    tag = forms.CharField(required=False, max_length=100)
    status = forms.ChoiceField(required=False, choices=[("", "any"), *Run.Status.choices])
    date_from = forms.DateField(required=False, label="from")
    date_to = forms.DateField(required=False, label="to")
    sort = forms.ChoiceField(
        required=False,
        choices=[(s, s) for key in selectors.RUN_SORTS for s in (key, f"-{key}")],
    )
    page = forms.IntegerField(required=False, min_value=1)


class ItemFilterForm(forms.Form):
    view = forms.ChoiceField(
        required=False, choices=[("failures", "failures"), ("all", "all items")]
    )
    status = forms.ChoiceField(required=False, choices=[("", "any"), *ItemResult.Status.choices])
    evaluator = forms.CharField(required=False, max_length=100)
    min = forms.FloatField(required=False)
    max = forms.FloatField(required=False)
    sort = forms.CharField(required=False, max_length=120)
    page = forms.IntegerField(required=False, min_value=1)

    def __init__(self, *args: Any, run: Run, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.run = run

    def clean_evaluator(self) -> str:
        name = self.cleaned_data["evaluator"]
        if name and name not in self.run.evaluator_names:
            raise forms.ValidationError(
                f"this run has no evaluator {name!r} (it has: "
                f"{', '.join(self.run.evaluator_names) or 'none'})"
            )
        return name

    def clean_sort(self) -> str:
        sort = self.cleaned_data["sort"] or "index"
        key = sort.lstrip("-")
        allowed = set(page_items.ITEM_SORTS) | {
            f"score:{name}" for name in self.run.evaluator_names
        }
        if key not in allowed:
            raise forms.ValidationError(f"cannot sort by {key!r}")
        return sort

    def chosen_view(self) -> str:
        """The failures (worst first) unless asked for all items, or for a filter or a sort
        (which apply to all items); an evaluator alone picks that evaluator's failures."""
        data = self.cleaned_data if self.is_valid() else {}
        if data.get("view"):
            return data["view"]
        narrowed = data.get("status") or data.get("min") is not None or data.get("max") is not None
        return "all" if narrowed or self.data.get("sort") else "failures"


class PageForm(forms.Form):
    """`?page=` of the item page's trace."""

    page = forms.IntegerField(required=False, min_value=1, max_value=10**9)


class TrendForm(forms.Form):
    experiment = forms.CharField(required=False, max_length=200)
    tag = forms.CharField(required=False, max_length=100)


# Helpers ------------------------------------------------------------------------------------


def partial_or_page(
    request: HtmxHttpRequest, template: str, context: dict[str, Any], partial: str
) -> HttpResponse:
    """The partial for an htmx swap, the whole page otherwise (history restores included)."""
    wants_partial = request.htmx and not request.htmx.history_restore_request
    name = f"{template}#{partial}" if wants_partial else template
    response = render(request, name, context)
    patch_vary_headers(response, ["HX-Request"])
    return response


def get_run_or_404(run_id: str) -> Run:
    try:
        return settled(run_get(run_id))
    except RunNotFound as exc:
        raise Http404(str(exc)) from None


def plural(count: int, noun: str) -> str:
    return f"{count:,} {noun}" + ("" if count == 1 else "s")


def run_url(run_id: str) -> str:
    return reverse("cobalt:run", args=[run_id])


# Views --------------------------------------------------------------------------------------


@page
def runs_list(request: HtmxHttpRequest) -> HttpResponse:
    form = RunFilterForm(request.GET)
    filters = form.cleaned_data if form.is_valid() else {}
    runs = selectors.run_list(
        name=filters.get("name") or "",
        tag=filters.get("tag") or "",
        status=filters.get("status") or "",
        date_from=filters.get("date_from"),
        date_to=filters.get("date_to"),
        sort=filters.get("sort") or "-created",
    )
    page = Paginator(runs, RUNS_PER_PAGE).get_page(request.GET.get("page"))
    rows = [{"run": run, "scores": page_selectors.score_cells(run)} for run in settle(page)]
    context = {
        "form": form,
        "page": page,
        "rows": rows,
        "runs_summary": f"{page.paginator.count:,} run"
        + ("" if page.paginator.count == 1 else "s"),
        "sort": filters.get("sort") or "-created",
        "tags": selectors.tag_names(),
        "statuses": Run.Status.choices,
    }
    return partial_or_page(request, "cobalt/runs_list.html", context, "runs")


@page
def run_status(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    """A running run's status cell on the runs list, polled until the run ends (286)."""
    run = get_run_or_404(run_id)
    response = render(request, "cobalt/runs_list.html#status-cell", {"run": run})
    if run.is_finished:
        response = HttpResponseStopPolling(response.content)
    return response


@page
def run_detail(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    run = get_run_or_404(run_id)
    if run.id != run_id:
        return redirect(run_url(run.id))
    target = request.htmx.target if request.htmx else None
    context: dict[str, Any] = {"run": run, "poll_seconds": POLL_SECONDS}
    if target not in ("items", "item-results"):
        overview = page_selectors.run_overview(run)
        context |= {"overview": overview, "charts": overview.chart_data}
        if run.is_finished:  # each judge's certificate and corrected pass rate, beside its row
            found = calibration.run_calibration(run)
            for entry in overview.evaluators:
                entry["calibration"] = found.get(entry["name"])
            context["judges"] = list(found.values())
    if target in ("live", "overview"):
        response = render(request, f"cobalt/run_detail.html#{target}", context)
        if run.is_finished:
            # 286 stops htmx polling; the body still swaps in the final summary.
            response = HttpResponseStopPolling(response.content)
        if target == "live":
            response["HX-Trigger"] = "cobalt-progress"
        patch_vary_headers(response, ["HX-Request"])
        return response
    form = ItemFilterForm(request.GET, run=run)
    filters = form.cleaned_data if form.is_valid() else {}
    view = form.chosen_view()
    # A run whose items ran several times shows one row per item in every view.
    repeated = _repeated(RunSettings.from_run_config(run.config))
    if view == "failures":
        failures = page_repeats.repeated_failure_page if repeated else page_items.failure_page
        items = failures(
            run,
            evaluator=filters.get("evaluator") or "",
            page=filters.get("page") or 1,
            per_page=ITEMS_PER_PAGE,
        )
    else:
        listing = page_repeats.repeated_item_page if repeated else page_items.item_page
        items = listing(
            run,
            status=filters.get("status") or "",
            evaluator=filters.get("evaluator") or "",
            min_score=filters.get("min"),
            max_score=filters.get("max"),
            sort=filters.get("sort") or "index",
            page=filters.get("page") or 1,
            per_page=ITEMS_PER_PAGE,
        )
    context |= {
        "form": form,
        "view": view,
        "items": items,
        "sort": filters.get("sort") or "index",
        "item_statuses": ItemResult.Status.choices,
        "items_url": request.get_full_path(),
        "flaky": page_items.flaky_marks(run, {row.key for row in items.rows}),
    }
    if target is None:
        context["previous"] = selectors.previous_run(run)
        context["labels"] = labels.label_summary(run)  # beside the link to review mode
    partial = "item-results" if target == "item-results" else "items"
    return partial_or_page(request, "cobalt/run_detail.html", context, partial)


def _repeated(run_settings: RunSettings) -> bool:
    """Items that run more than once: repetitions, or `--repeat-flaky`."""
    return run_settings.runs > 1 or bool(run_settings.repeat_flaky)


@page
def item_panel(request: HtmxHttpRequest, run_id: str, item_id: int) -> HttpResponse:
    run = get_run_or_404(run_id)
    form = PageForm(request.GET)
    trace_page = (form.cleaned_data.get("page") if form.is_valid() else None) or 1
    only_trace = request.htmx and request.htmx.target == "item-trace"  # a page of steps
    if only_trace:
        item = page_trace.trace_only(run, item_id)
    else:
        item = page_items.item_detail(run, item_id)
    if item is None:
        raise Http404(f"run {run.id} has no item {item_id}")
    if only_trace:
        context = {"run": run, "item": item, "trace": page_trace.item_trace(item, trace_page)}
        return partial_or_page(request, "cobalt/item.html", context, "trace")
    repeats = None
    if _repeated(RunSettings.from_run_config(run.config)):
        repeats = page_repeats.item_repeats(run, item, request.GET.get("repeat"))
    if repeats and repeats.current.id != item.id:  # the asked (or the worst) repeat
        item = page_items.item_detail(run, repeats.current.id)
    values = page_values.item_values(run, item)
    neighbours = page_repeats.item_neighbours if repeats else page_items.item_neighbours
    previous_id, next_id = neighbours(run, item)
    context = {
        "run": run,
        "item": item,
        "repeats": repeats,
        "previous_id": previous_id,
        "next_id": next_id,
        "trace": page_trace.item_trace(item, trace_page),
        "values": values,
        "conversation": page_items.conversation_turns(item.output, item.metadata),
        # The whole item to copy, unless the page shows only part of it (then it downloads).
        "item_json": None if values.cut else page_values.item_json(item),
        # Over a run's page (an htmx swap into #panel), not a page of its own.
        "floating": bool(request.htmx and not request.htmx.history_restore_request),
    }
    return partial_or_page(request, "cobalt/item.html", context, "panel")


@require_GET
def item_download(request: HttpRequest, run_id: str, item_id: int, part: str) -> HttpResponse:
    """The whole of an item's value a page shows only the start of, as a file (never HTML)."""
    run = get_run_or_404(run_id)
    download = page_values.item_download(run, item_id, part)
    if download is None:
        raise Http404(f"run {run.id} has no {part} for item {item_id}")
    response = HttpResponse(download.body, content_type=download.content_type)
    response["Content-Disposition"] = f'attachment; filename="{download.filename}"'
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = "default-src 'none'; sandbox"
    return response


@require_GET
def run_export(request: HttpRequest, run_id: str, fmt: str) -> StreamingHttpResponse:
    run = get_run_or_404(run_id)
    if fmt not in exports.FORMATS:
        raise Http404(f"unknown export format {fmt!r}")
    response = StreamingHttpResponse(
        exports.export(run, fmt), content_type=exports.content_type(fmt)
    )
    disposition = "inline" if request.GET.get("view") else "attachment"
    response["Content-Disposition"] = f'{disposition}; filename="{exports.filename(run, fmt)}"'
    response["X-Content-Type-Options"] = "nosniff"
    return response


@page
def trends(request: HtmxHttpRequest) -> HttpResponse:
    form = TrendForm(request.GET)
    filters = form.cleaned_data if form.is_valid() else {}
    names = selectors.experiment_names()
    experiment = filters.get("experiment") or selectors.latest_experiment()
    context: dict[str, Any] = {
        "form": form,
        "experiments": names,
        "experiment": experiment,
        "tags": selectors.tag_names(),
        "tag": filters.get("tag") or "",
    }
    if experiment:
        trend = page_selectors.trend(experiment, tag=filters.get("tag") or "")
        chart = trend.chart_data
        chart["urls"] = [run_url(run.id) for run in trend.runs]
        chart["compareUrl"] = reverse("cobalt:compare")  # two picked points open their compare
        context |= {
            "trend": trend,
            "charts": chart,
            "judge_versions": judge_loop.judge_versions(experiment),
        }
    return partial_or_page(request, "cobalt/trends.html", context, "trend")


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness, and which project this server shows (so `cobalt run --ui` can reuse it)."""
    return JsonResponse({"status": "ok", "project": project_fingerprint(settings.PROJECT_DIR)})


# Sweeps -------------------------------------------------------------------------------------


@page
def sweeps_list(request: HtmxHttpRequest) -> HttpResponse:
    return render(request, "cobalt/sweeps.html", {"sweeps": sweeps.sweep_list(100)})


@page
def sweep_detail(request: HtmxHttpRequest, sweep_id: str) -> HttpResponse:
    try:
        sweep = sweeps.sweep_get(sweep_id)
    except sweeps.SweepNotFound as exc:
        raise Http404(str(exc)) from None
    form = PageForm(request.GET)
    number = (form.cleaned_data.get("page") if form.is_valid() else None) or 1
    context = page_sweep.sweep_context(sweep, page=number, per_page=ITEMS_PER_PAGE)
    return partial_or_page(request, "cobalt/sweep.html", context, "matrix")


@require_GET
def sweep_export(request: HttpRequest, sweep_id: str, fmt: str) -> HttpResponse:
    try:
        result = sweeps.summary(sweeps.sweep_get(sweep_id))
    except sweeps.SweepNotFound as exc:
        raise Http404(str(exc)) from None
    if fmt not in sweep_exports.FORMATS:
        raise Http404(f"no export format {fmt!r}")
    response = HttpResponse(
        sweep_exports.render(result, fmt), content_type=sweep_exports.CONTENT_TYPES[fmt]
    )
    response["Content-Disposition"] = f'attachment; filename="sweep-{sweep_id}.{fmt}"'
    return response
