"""Item addresses by number (`page_triage.item_url`), carrying the list they are seen in."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django import template
from django.urls import reverse

from cobalt_app import page_triage

register = template.Library()


@register.simple_tag
def item_url(
    run_id: str,
    number: int,
    run_index: int = 0,
    params: Iterable[tuple[str, Any]] | None = None,
    **extra: Any,
) -> str:
    """`/runs/<id>/items/<number>/`, with `?repeat=N` for a repetition, the list's
    parameters and `extra` ones (a page of the trace)."""
    return page_triage.item_url(run_id, number, run_index, [*(params or []), *extra.items()])


@register.simple_tag
def item_download_url(run_id: str, number: int, run_index: int, part: str) -> str:
    url = reverse("cobalt:item-download", args=[run_id, number, part])
    return f"{url}?repeat={run_index + 1}" if run_index else url
