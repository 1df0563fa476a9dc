"""Review mode: people label the judge's verdicts on a finished run, one item at a time.

    GET  /runs/<id>/review/?evaluator=NAME&item=ID  the review page (its panel swaps with htmx)
    POST /runs/<id>/review/label/                   save a label, then the next unreviewed item
    POST /runs/<id>/review/dataset/                 append the reviewed item to a dataset file

The queue (failures and borderline items first, then the others in a seeded random order),
the one write and its checks live in `labels`; a view parses, calls and responds. Labelling
always needs a logged-in user, whose user name is the reviewer: an anonymous visitor is sent
to the login page even where anonymous reads are allowed (embedded mode on loopback). A plain
form post is answered with a redirect (303) to the next item, an htmx post with that item's
panel and its URL; a refused save shows the page again with its message and everything
typed still in the form (status 400, 404 or 409).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.cache import patch_vary_headers
from django.utils.http import urlencode
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import HttpResponseClientRedirect, push_url

from cobalt.config import active_config
from cobalt_app import label_datasets, labels, page_items, page_values
from cobalt_app.labels import LabelConflict, LabelError
from cobalt_app.models import Run
from cobalt_app.page_selectors import pass_marks
from cobalt_app.views import CONTENT_SECURITY_POLICY, HtmxHttpRequest, get_run_or_404

TEMPLATE = "cobalt/review.html"
PANEL = "review-panel"
DEFAULT_DATASET = "datasets/reviewed.jsonl"
DISAGREEMENTS_SHOWN = 50


def reviewer_only(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A review view: a logged-in user only (else the login page, then back to the review),
    sent with the pages' Content-Security-Policy."""

    @wraps(view)
    def wrapped(request: HtmxHttpRequest, run_id: str, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated:
            back = request.get_full_path() if request.method == "GET" else review_url(run_id)
            login = f"{settings.LOGIN_URL}?{urlencode({'next': back})}"
            return HttpResponseClientRedirect(login) if request.htmx else redirect(login)
        response = view(request, run_id, *args, **kwargs)
        response.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        return response

    return wrapped


class LabelForm(forms.Form):
    """What the label form posts; the values themselves are checked by `labels.label_save`."""

    evaluator = forms.CharField(max_length=100)
    item = forms.IntegerField(min_value=1)
    verdict = forms.CharField(required=False, max_length=8)
    score = forms.CharField(required=False, max_length=40, strip=True)
    note = forms.CharField(required=False, strip=False)
    expected_output = forms.CharField(required=False, strip=False)
    version = forms.IntegerField(required=False, min_value=0)


class DatasetForm(forms.Form):
    evaluator = forms.CharField(max_length=100)
    item = forms.IntegerField(min_value=1)
    path = forms.CharField(max_length=500)


def review_url(run_id: str, evaluator: str = "", item_id: int | None = None) -> str:
    query = {k: v for k, v in (("evaluator", evaluator), ("item", item_id)) if v}
    url = reverse("cobalt:review", args=[run_id])
    return f"{url}?{urlencode(query)}" if query else url


# Views --------------------------------------------------------------------------------------


@require_GET
@reviewer_only
def review(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    run = get_run_or_404(run_id)
    if run.id != run_id:
        query = request.GET.urlencode()
        return redirect(f"{review_url(run.id)}?{query}" if query else review_url(run.id))
    evaluator = request.GET.get("evaluator") or labels.default_review_evaluator(run) or ""
    try:
        item_id = int(request.GET["item"]) if request.GET.get("item") else None
    except ValueError:
        return _respond(request, run, evaluator, None, error="item: not an item id", status=400)
    return _respond(request, run, evaluator, item_id, start=item_id is None)


@require_POST
@reviewer_only
def review_label(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    run = get_run_or_404(run_id)
    form = LabelForm(request.POST)
    if not form.is_valid():
        return _form_error(request, run, form)
    data = form.cleaned_data
    evaluator, item_id = data["evaluator"], data["item"]
    try:
        label = labels.label_save(
            run=run,
            item_id=item_id,
            evaluator=evaluator,
            reviewer=request.user.get_username(),
            verdict=data["verdict"] or None,
            score=data["score"] or None,
            note=_lines(data["note"]),
            expected_output=parse_expected(_lines(data["expected_output"])),
            version=data["version"] or 0,
        )
    except LabelError as exc:
        return _respond(
            request,
            run,
            evaluator,
            item_id,
            values=_posted(request, data),
            error=str(exc),
            status=exc.http_status,
            conflict=isinstance(exc, LabelConflict),
        )
    queue = labels.review_queue(run, evaluator, reviewer=request.user.get_username())
    next_id = queue.next_after(item_id) or item_id  # all reviewed: stay on this one
    item_url = review_url(run.id, evaluator, item_id)
    messages.success(
        request,
        f"Saved your {label.verdict} on item {label.item_key!r} ({evaluator}).",
        extra_tags=item_url,
    )
    return _after_write(request, run, evaluator, next_id)


@require_POST
@reviewer_only
def review_dataset(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    """Append the reviewed item (with its corrected expected output, when there is one) to a
    dataset file of the project (`label_datasets.add_to_dataset`)."""
    run = get_run_or_404(run_id)
    form = DatasetForm(request.POST)
    if not form.is_valid():
        return _form_error(request, run, form)
    data = form.cleaned_data
    evaluator, item_id, path = data["evaluator"], data["item"], data["path"].strip()
    values = {"path": path}
    try:
        added = label_datasets.add_to_dataset(
            run=run,
            item_id=item_id,
            path=path,
            reviewer=request.user.get_username(),
            evaluator=evaluator,
        )
    except ValueError as exc:  # LabelError, or the dataset's own (a bad path, a duplicate id)
        status = getattr(exc, "http_status", 400)
        return _respond(
            request, run, evaluator, item_id, values=values, error=str(exc), status=status
        )
    messages.success(
        request, f"Added item {added['id']!r} to {added['file']}, line {added['line']}."
    )
    return _after_write(request, run, evaluator, item_id)


# Helpers ------------------------------------------------------------------------------------


def parse_expected(text: str) -> Any:
    """A corrected expected output as typed: JSON when it reads as JSON, else the text itself;
    None (not corrected) when empty."""
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def _lines(text: str) -> str:
    """Text from a textarea, whose lines browsers end with CR LF, with the LF of typed text."""
    return text.replace("\r\n", "\n")


def expected_text(value: Any) -> str:
    """A stored corrected expected output as the form shows it (`parse_expected` reads it
    back the same): text as typed, unless it would read as JSON; anything else as JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        try:
            json.loads(value)
        except ValueError:
            return value
    return json.dumps(value, ensure_ascii=False, indent=2)


def default_dataset_path(run: Run) -> str:
    """The run's own JSONL dataset when its config records one in the project, else
    `datasets/reviewed.jsonl`."""
    source = (run.config.get("dataset") or {}).get("source")
    if not isinstance(source, str) or not source.lower().endswith(".jsonl") or "://" in source:
        return DEFAULT_DATASET
    path = Path(source)
    if not path.is_absolute():
        return source
    try:
        return str(path.resolve().relative_to(active_config().project_dir.resolve()))
    except ValueError:  # outside the project
        return DEFAULT_DATASET


def _posted(request: HttpRequest, data: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the form sent, to show it again as typed."""
    posted = {
        name: request.POST.get(name, "")
        for name in ("verdict", "score", "note", "expected_output", "path")
    }
    posted["version"] = (data or {}).get("version") or 0
    return posted


def _form_error(request: HtmxHttpRequest, run: Run, form: forms.Form) -> HttpResponse:
    problems = "; ".join(f"{field}: {' '.join(errors)}" for field, errors in form.errors.items())
    item_id = form.cleaned_data.get("item") if hasattr(form, "cleaned_data") else None
    evaluator = request.POST.get("evaluator", "")
    return _respond(
        request, run, evaluator, item_id, values=_posted(request), error=problems, status=400
    )


def _after_write(request: HtmxHttpRequest, run: Run, evaluator: str, item_id: int) -> HttpResponse:
    """A plain post is redirected (303) to the item's page; htmx gets its panel and URL."""
    url = review_url(run.id, evaluator, item_id)
    if not request.htmx:
        response = HttpResponseRedirect(url)
        response.status_code = 303  # See Other: the browser GETs the next item
        return response
    return push_url(_respond(request, run, evaluator, item_id), url)


def _respond(
    request: HtmxHttpRequest,
    run: Run,
    evaluator: str,
    item_id: int | None,
    *,
    values: dict[str, Any] | None = None,
    error: str = "",
    status: int = 200,
    start: bool = False,
    conflict: bool = False,
) -> HttpResponse:
    """The review page (or its panel, for htmx) on `item_id` of the evaluator's queue; with
    `start`, on the first item the reviewer has not labelled."""
    context = review_context(
        request, run, evaluator, item_id, values=values, error=error, start=start
    )
    if conflict and context["item"] is not None:
        # Refused because the label changed meanwhile: the form keeps what was typed, and
        # saving it again replaces the label the page now shows.
        mine = context["mine"]
        context["values"]["version"] = mine.label.version if mine is not None else 0
    if context["missing"] and status == 200:
        status = 404
    if context["bad_evaluator"] and status == 200:
        status = 400
    partial = request.htmx and not request.htmx.history_restore_request
    response = render(
        request, f"{TEMPLATE}#{PANEL}" if partial else TEMPLATE, context, status=status
    )
    patch_vary_headers(response, ["HX-Request"])
    return response


def review_context(
    request: HttpRequest,
    run: Run,
    evaluator: str,
    item_id: int | None,
    *,
    values: dict[str, Any] | None = None,
    error: str = "",
    start: bool = False,
) -> dict[str, Any]:
    reviewer = request.user.get_username()
    rows = labels.run_labels(run)  # read once: counts, disagreements and this item's labels
    context: dict[str, Any] = {
        "run": run,
        "evaluator": evaluator,
        "evaluators": run.evaluator_names,
        "error": error,
        "values": values or {},
        "item": None,
        "missing": False,
        "bad_evaluator": False,
        "summary": labels.label_summary(run, rows=rows),
        "disagreements": [r for r in rows if r.disagrees][:DISAGREEMENTS_SHOWN],
    }
    try:
        labels.check_evaluator(run, evaluator)
    except LabelError as exc:
        context["bad_evaluator"] = True
        context["error"] = error or str(exc)
        return context
    if not run.is_finished:
        return context
    queue = labels.review_queue(run, evaluator, reviewer=reviewer)
    if start:
        item_id = queue.next_after(None) or (queue.item_ids[0] if queue.item_ids else None)
    context["queue"] = queue
    if item_id is None:
        return context
    item = page_items.item_detail(run, item_id)
    if item is None:
        context["missing"] = True
        context["error"] = error or f"run {run.id} has no item with id {item_id}"
        return context
    rows = [r for r in rows if r.item_id == item.id and r.label.evaluator == evaluator]
    mine = next((r for r in rows if r.label.reviewer == reviewer and not r.stale), None)
    before, after = queue.neighbours(item.id)
    skip_to = queue.next_after(item.id)
    if skip_to == item.id:
        skip_to = after
    # What was typed (a refused save) over the stored label: the form loses nothing.
    values = {**_label_values(mine), **(values or {})}
    context |= {
        "item": item,
        "judge": _judge(run, item, evaluator),
        "others_scores": [v for v in item.verdicts if v.evaluator != evaluator],
        "shown": page_values.item_values(run, item),
        "mine": mine,
        "mine_stale": [r for r in rows if r.label.reviewer == reviewer and r.stale],
        "others": [r for r in rows if r.label.reviewer != reviewer],
        "values": values,
        "position": queue.item_ids.index(item.id) + 1 if item.id in queue.item_ids else None,
        "previous_id": before,
        "next_id": after,
        "skip_id": skip_to,
        "all_done": queue.total > 0 and queue.done == queue.total,
        "dataset_path": values.get("path") or default_dataset_path(run),
    }
    return context


def _label_values(row: labels.LabelRow | None) -> dict[str, Any]:
    if row is None:
        return {"verdict": "", "score": "", "note": "", "expected_output": "", "version": 0}
    label = row.label
    return {
        "verdict": label.verdict,
        "score": "" if label.score is None else f"{label.score:g}",
        "note": label.note,
        "expected_output": expected_text(label.expected_output),
        "version": label.version,
    }


def _judge(run: Run, item: Any, evaluator: str) -> dict[str, Any] | None:
    """The evaluator's verdict on the item, coloured by the one verdict rule."""
    evaluation = next((v for v in item.verdicts if v.evaluator == evaluator), None)
    if evaluation is None:
        return None
    errored = evaluation.status != "ok"
    return {
        "score": evaluation.score,
        "verdict": str(evaluation.verdict),  # the one rule's, set by `page_items.item_detail`
        "mark": pass_marks(run).get(evaluator),
        "reason": evaluation.reason,
        "error": evaluation.error if errored else "",
        "chain_of_thought": evaluation.chain_of_thought,
    }
