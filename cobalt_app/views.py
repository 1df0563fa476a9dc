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
    page_triage,
    run_search,
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
    q = forms.CharField(required=False, max_length=200, label="Search")
    key = forms.CharField(required=False, max_length=200, label="Field")
    value = forms.CharField(required=False, max_length=200)
    group = forms.CharField(required=False, max_length=200, label="Group by")

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
        narrowed = data.get("status") or data.get("min") is not None or data.get("max") is not None
        if narrowed:  # a status or a score range lists all items (failures have no status)
            return "all"
        if data.get("view"):
            return data["view"]
        return "all" if self.data.get("sort") else "failures"

    def list_state(self) -> page_triage.ListState:
        """The list these filters name (`page_triage.ListState`), carried to each item."""
        data = self.cleaned_data if self.is_valid() else {}
        return page_triage.ListState(
            view=self.chosen_view(),
            status=data.get("status") or "",
            evaluator=data.get("evaluator") or "",
            min=data.get("min"),
            max=data.get("max"),
            sort=data.get("sort") or "index",
            q=(data.get("q") or "").strip(),
            key=data.get("key") or "",
            value=data.get("value") or "",
        )


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
    run_search.prepare(run)  # a finished run's index, built apart for its searches
    form = ItemFilterForm(request.GET, run=run)
    filters = form.cleaned_data if form.is_valid() else {}
    state = form.list_state()
    found = page_triage.found_ids(run, state)
    scope = page_triage.id_scope(found)
    page_number = filters.get("page") or 1
    # A run whose items ran several times shows one row per item in every view.
    repeated = is_repeated(RunSettings.from_run_config(run.config))
    if state.view == "failures":
        failures = page_repeats.repeated_failure_page if repeated else page_triage.failure_page
        items: page_items.ItemsPage = failures(
            run, evaluator=state.evaluator, scope=scope, page=page_number, per_page=ITEMS_PER_PAGE
        )
    else:
        listing = page_repeats.repeated_item_page if repeated else page_items.item_page
        listed = state.filters(scope, found)
        items = listing(run, listed, page=page_number, per_page=ITEMS_PER_PAGE)
    group = filters.get("group") or ""
    context |= {
        "form": form,
        "view": state.view,
        "items": items,
        "sort": state.sort,
        "item_statuses": ItemResult.Status.choices,
        "items_url": request.get_full_path(),
        "flaky": page_items.flaky_marks(run, {row.key for row in items.rows}),
        "list_params": state.params(),
        "groups": page_triage.run_groups(run, group, state, scope) if group else None,
    }
    if target != "item-results":
        context["field_keys"] = run_search.field_keys(run)
    if target is None:
        context["previous"] = selectors.previous_run(run)
        context["labels"] = labels.label_summary(run)  # beside the link to review mode
    partial = "item-results" if target == "item-results" else "items"
    return partial_or_page(request, "cobalt/run_detail.html", context, partial)


def is_repeated(run_settings: RunSettings) -> bool:
    """Items that run more than once: repetitions, or `--repeat-flaky`."""
    return run_settings.runs > 1 or bool(run_settings.repeat_flaky)


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
