"""The compare pages: is B better than A?

    GET /compare/?a=<id>&b=<id>[&b=<id>…]   a baseline against up to five runs (also
                                             ?runs=<id>,<id>,…): the verdict strip, the
                                             paired tests, every matched item by class
    GET /compare/item/?a=<id>&b=<id>&key=…  one item side by side: a slide-over over the
                                             compare page (htmx), a page of its own otherwise

The reads are `page_compare` and `page_compare_side`; a view parses, calls and responds.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django import forms
from django.http import HttpResponse
from django.shortcuts import render

from cobalt.config import active_config
from cobalt.errors import CobaltError
from cobalt_app import (
    page_compare,
    page_compare_side,
    page_compare_table,
    run_search,
    selectors,
)
from cobalt_app.models import Run
from cobalt_app.pairwise_compare import REQUEST_PAIRS, pairwise_compare, pairwise_judges
from cobalt_app.selectors import RunNotFound, run_get
from cobalt_app.views import ITEMS_PER_PAGE, RECENT_RUNS, HtmxHttpRequest, page, partial_or_page

FILTERS = page_compare_table.FILTERS
OVER = ("", *(str(n) for n in range(1, page_compare.MAX_OTHERS + 1)), page_compare_table.ANY)


class CompareForm(forms.Form):
    a = forms.CharField(required=False, max_length=32, label="Run A (baseline)")
    b = forms.CharField(required=False, max_length=32, label="Run B (candidate)")
    runs = forms.CharField(required=False, max_length=33 * (page_compare.MAX_OTHERS + 1))
    key = forms.CharField(required=False, max_length=200)
    evaluator = forms.CharField(required=False, max_length=100)
    change = forms.ChoiceField(required=False, choices=[("", "any"), *((c, c) for c in FILTERS)])
    sort = forms.ChoiceField(required=False, choices=[(s, s) for s in page_compare.PAIR_SORTS])
    over = forms.ChoiceField(required=False, choices=[(o, o) for o in OVER])
    group = forms.CharField(required=False, max_length=200, label="Group by")
    value = forms.CharField(required=False, max_length=200)
    page = forms.IntegerField(required=False, min_value=1)
    pairwise = forms.CharField(required=False, max_length=100)

    def clean(self) -> dict[str, Any]:
        """`ids`: the baseline then the others, from `runs=a,b,c` or from `a=` and each `b=`."""
        data = super().clean()
        if data.get("runs"):
            ids = [part.strip() for part in data["runs"].split(",") if part.strip()]
        else:
            others = [value.strip() for value in self.data.getlist("b") if value.strip()]
            ids = [data.get("a") or "", *others]
        if len(ids) < 2 or not ids[0]:
            raise forms.ValidationError("give a baseline run (A) and at least one run B")
        if len(ids) > page_compare.MAX_OTHERS + 1:
            raise forms.ValidationError(
                f"compare a baseline with at most {page_compare.MAX_OTHERS} runs at once"
            )
        if any(len(run_id) > 32 for run_id in ids):
            raise forms.ValidationError("a run id has at most 32 characters")
        data["ids"] = ids
        return data


def runs_query(a: Run, others: list[Run]) -> str:
    """`a=…&b=…[&b=…]`: the runs of a compare as its links carry them."""
    return urlencode([("a", a.id), *(("b", run.id) for run in others)])


@page
def compare(request: HtmxHttpRequest) -> HttpResponse:
    form = CompareForm(request.GET or None)
    context: dict[str, Any] = {
        "form": form,
        "recent": selectors.run_list(limit=RECENT_RUNS, brief=True),
    }
    if form.is_valid():
        try:
            runs = [run_get(run_id) for run_id in form.cleaned_data["ids"]]
        except RunNotFound as exc:
            form.add_error(None, str(exc))
        else:
            data = form.cleaned_data
            a, others = runs[0], runs[1:]
            if data["group"]:  # the runs' indexes hold their fields' values (`group_counts`)
                for run in runs:
                    run_search.prepare(run)
            key = data["key"]
            context |= {"a": a, "b": others[0], "key": key, "runs_query": runs_query(a, others)}
            if request.htmx and request.htmx.target == "side" and key:
                context["side"] = page_compare_side.side_by_side(a, others[0], key)
                return partial_or_page(request, "cobalt/compare.html", context, "side")
            context |= _comparison_context(a, others, data)
            target = request.htmx.target if request.htmx else None
            if target in ("pairs", "grouped"):
                return partial_or_page(request, "cobalt/compare.html", context, target)
    return render(request, "cobalt/compare.html", context)


def _comparison_context(a: Run, others: list[Run], data: dict[str, Any]) -> dict[str, Any]:
    names = list(dict.fromkeys([*a.evaluator_names, *others[0].evaluator_names]))
    evaluator = data["evaluator"] if data["evaluator"] in names else ""
    change = data["change"] or ""
    sort = data["sort"] or "delta"
    group_by, value = data["group"] or "", data["value"] or ""
    comparison = page_compare.compare(
        a,
        others,
        evaluator=evaluator,
        change=change,
        sort=sort,
        over=data["over"] or "",
        group_by=group_by,
        group=(group_by, value) if group_by and value else None,
        page=data["page"] or 1,
        per_page=ITEMS_PER_PAGE,
    )
    table = comparison.table
    filters = {"evaluator": evaluator, "change": change, "sort": sort}
    if table.group:  # j/k in the side by side walk the group's rows
        filters |= {"group": group_by, "value": value}
    if table.more:  # j/k in the side by side walk the same rows: over the same runs
        filters |= {"over": table.over, "among": ",".join(run.id for run in others)}
    return {
        "comparison": comparison,
        "strip": comparison.strip,
        "strip_rows": page_compare.strip_rows(comparison.strip),
        "table": table,
        "evaluator": evaluator,
        "change": change,
        "pair_sort": sort,
        "changes": (*page_compare.CHANGES, page_compare.CHANGED),
        "filters": urlencode(filters),
        "charts": comparison.chart_data,
        "groups": comparison.groups,
        "field_keys": run_search.field_keys(a),
        "side": page_compare_side.side_by_side(a, others[0], data["key"]) if data["key"] else None,
        **_pairwise_context(a, others[0], data["pairwise"]),
    }


def _pairwise_context(a: Run, b: Run, judge: str) -> dict[str, Any]:
    """The runs' pairwise judges, and the win rate of B when one was asked for (each pair's
    answers are cached: asking again costs nothing)."""
    context: dict[str, Any] = {"pairwise_judges": pairwise_judges(a, b), "pairwise_judge": judge}
    if judge:
        try:
            context["pairwise"] = pairwise_compare(
                a, b, judge, active_config(), max_pairs=REQUEST_PAIRS
            )
        except CobaltError as exc:
            context["pairwise_error"] = str(exc)
    return context


class SideForm(forms.Form):
    a = forms.CharField(max_length=32)
    b = forms.CharField(max_length=32)
    key = forms.CharField(max_length=200)
    evaluator = forms.CharField(required=False, max_length=100)
    change = forms.ChoiceField(required=False, choices=[("", "any"), *((c, c) for c in FILTERS)])
    sort = forms.ChoiceField(required=False, choices=[(s, s) for s in page_compare.PAIR_SORTS])
    over = forms.ChoiceField(required=False, choices=[(o, o) for o in OVER])
    group = forms.CharField(required=False, max_length=200)
    value = forms.CharField(required=False, max_length=200)
    among = forms.CharField(required=False, max_length=33 * page_compare.MAX_OTHERS)

    def clean_among(self) -> list[str]:
        """The compare's other runs (B first), when it had more than one: j/k then walk
        its rows, filtered and sorted over the same runs."""
        ids = [part.strip() for part in self.cleaned_data["among"].split(",") if part.strip()]
        if len(ids) > page_compare.MAX_OTHERS or any(len(i) > 32 for i in ids):
            raise forms.ValidationError("at most 5 run ids of at most 32 characters")
        return ids


@page
def compare_item(request: HtmxHttpRequest) -> HttpResponse:
    """One item of A and B side by side; the previous and next keys of the compare table
    (its filter and sort, carried in the query) for j/k."""
    form = SideForm(request.GET)
    if not form.is_valid():
        return render(request, "cobalt/compare_side.html", {"form": form}, status=400)
    data = form.cleaned_data
    try:
        a, b = run_get(data["a"]), run_get(data["b"])
        among = [b]
        if b.id in data["among"]:  # from a compare of several runs
            among = [b if run_id == b.id else run_get(run_id) for run_id in data["among"]]
    except RunNotFound as exc:
        form.add_error(None, str(exc))
        return render(request, "cobalt/compare_side.html", {"form": form}, status=404)
    names = list(dict.fromkeys([*a.evaluator_names, *among[0].evaluator_names]))
    filters = {
        "evaluator": data["evaluator"] if data["evaluator"] in names else "",
        "change": data["change"] or "",
        "sort": data["sort"] or "delta",
    }
    over = (data["over"] or "") if len(among) > 1 else ""
    group = (data["group"], data["value"]) if data["group"] and data["value"] else None
    previous_key, next_key = page_compare_table.neighbours(
        a, among, data["key"], over=over, group=group, **filters
    )
    if group:
        filters |= {"group": group[0], "value": group[1]}
    if len(among) > 1:
        filters |= {"over": over, "among": ",".join(run.id for run in among)}
    query = urlencode({"a": a.id, "b": b.id, **filters})
    shown = {name: value for name, value in filters.items() if name != "among"}
    back = urlencode([("a", a.id), *(("b", run.id) for run in among), *shown.items()])
    context = {
        "a": a,
        "b": b,
        "key": data["key"],
        "side": page_compare_side.side_by_side(a, b, data["key"]),
        "query": query,
        "previous_key": previous_key,
        "next_key": next_key,
        "back": f"?{back}",
        "floating": bool(request.htmx and not request.htmx.history_restore_request),
    }
    return partial_or_page(request, "cobalt/compare_side.html", context, "panel")
