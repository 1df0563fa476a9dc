"""Query-string filters of the run list and of a run's items."""

from __future__ import annotations

import django_filters
from django.db.models import Exists, OuterRef, QuerySet

from cobalt_app.models import Evaluation, ItemResult, Run


class RunFilter(django_filters.FilterSet):
    name = django_filters.CharFilter(
        field_name="name", lookup_expr="icontains", help_text="Experiment name contains."
    )
    tag = django_filters.CharFilter(method="filter_tag", help_text="Runs with this tag.")
    status = django_filters.ChoiceFilter(choices=Run.Status.choices)
    created_after = django_filters.IsoDateTimeFilter(
        field_name="created_at",
        lookup_expr="gte",
        help_text="Created at or after this ISO 8601 date-time.",
    )
    created_before = django_filters.IsoDateTimeFilter(
        field_name="created_at",
        lookup_expr="lte",
        help_text="Created at or before this ISO 8601 date-time.",
    )

    class Meta:
        model = Run
        fields = ["name", "tag", "status", "created_after", "created_before"]

    def filter_tag(self, queryset: QuerySet[Run], name: str, value: str) -> QuerySet[Run]:
        return queryset.filter(tag_rows__name=value)


class ItemFilter(django_filters.FilterSet):
    """`evaluator` with `min_score`/`max_score`: items whose score by that evaluator is in
    range; without `evaluator`, items with any evaluation in range."""

    status = django_filters.ChoiceFilter(choices=ItemResult.Status.choices)
    evaluator = django_filters.CharFilter(
        method="filter_noop", help_text="Items evaluated by this evaluator."
    )
    min_score = django_filters.NumberFilter(method="filter_noop", help_text="Score at least.")
    max_score = django_filters.NumberFilter(method="filter_noop", help_text="Score at most.")

    class Meta:
        model = ItemResult
        fields = ["status", "evaluator", "min_score", "max_score"]

    def filter_noop(self, queryset: QuerySet, name: str, value: object) -> QuerySet:
        return queryset  # applied together in filter_queryset

    def filter_queryset(self, queryset: QuerySet[ItemResult]) -> QuerySet[ItemResult]:
        queryset = super().filter_queryset(queryset)
        data = self.form.cleaned_data
        evaluator = data.get("evaluator")
        low, high = data.get("min_score"), data.get("max_score")
        if not evaluator and low is None and high is None:
            return queryset
        evaluations = Evaluation.objects.filter(item=OuterRef("pk"))
        if evaluator:
            evaluations = evaluations.filter(evaluator=evaluator)
        if low is not None:
            evaluations = evaluations.filter(score__gte=low)
        if high is not None:
            evaluations = evaluations.filter(score__lte=high)
        return queryset.filter(Exists(evaluations))
