"""Formatting filters and a query-string tag for the dashboard templates."""

from __future__ import annotations

import math
from typing import Any

from django import template
from django.http import QueryDict

from cobalt.run_settings import RunSettings

register = template.Library()


def _number(value: Any) -> float | None:
    """A number, or None for what templates give for missing values (None, "")."""
    if value is None or value == "":
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


@register.filter
def score(value: float | None, digits: int = 2) -> str:
    """0.8512 → "0.85"; missing → "—"."""
    value = _number(value)
    return "—" if value is None else f"{value:.{int(digits)}f}"


@register.filter
def delta(value: float | None) -> str:
    value = _number(value)
    return "—" if value is None else f"{value:+.2f}"


@register.filter
def delta3(value: float | None) -> str:
    value = _number(value)
    return "—" if value is None else f"{value:+.3f}"


@register.filter
def pvalue(value: float | None) -> str:
    value = _number(value)
    if value is None:
        return "—"
    return "< 0.001" if value < 0.001 else f"{value:.3f}"


@register.filter
def confidence(alpha: float | None) -> str:
    """alpha 0.05 → "95%"."""
    value = _number(alpha)
    return "—" if value is None else f"{1 - value:.0%}"


@register.filter
def trend_class(value: float | None) -> str:
    """CSS class for a difference: up, down or flat."""
    value = _number(value)
    if value is None or abs(value) < 1e-12:
        return "flat"
    return "up" if value > 0 else "down"


@register.filter
def percent(value: float | None) -> str:
    value = _number(value)
    return "—" if value is None else f"{value:.0%}"


@register.filter
def points(value: float | None) -> str:
    """A change of a share: 0.18 → "+18 pp", -0.5 → "−50 pp"; missing → "—"."""
    value = _number(value)
    if value is None:
        return "—"
    shown = f"{abs(value) * 100:.0f}"
    return ("±" if shown == "0" else "+" if value > 0 else "−") + f"{shown} pp"


@register.filter
def duration(ms: float | None) -> str:
    """Milliseconds as 420ms, 4.2s, 3m 05s or 1h 02m."""
    ms = _number(ms)
    if ms is None:
        return "—"
    if ms < 1000:
        return f"{ms:.0f}ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, seconds = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


@register.filter
def usage_note(summary: dict[str, Any]) -> str:
    """What the run says of its model calls that reported no usage (`cobalt.usage_notes`)."""
    from cobalt.usage_notes import estimated_usage_note

    return estimated_usage_note(summary or {}) or ""


@register.filter
def unpriced_named(summary: dict[str, Any]) -> list[str]:
    """The run's unpriced models a price would cover (`cobalt.usage_notes`)."""
    from cobalt.usage_notes import unpriced_named

    return unpriced_named(summary or {})


@register.filter
def no_model_note(summary: dict[str, Any]) -> str:
    """What the run says of tokens that named no model (`cobalt.usage_notes`), or ''."""
    from cobalt.usage_notes import no_model_note

    return no_model_note(summary or {}) or ""


@register.filter
def cost_unknown(summary: dict[str, Any]) -> bool:
    return any(e.get("method") == "unknown" for e in (summary or {}).get("estimatedUsage") or [])


@register.filter
def cost(value: float | None) -> str:
    """Dollars to the cent, or to three significant digits under a cent: $0.0000489."""
    value = _number(value)
    if value is None:
        return "—"
    if value == 0:
        return "$0.00"
    if abs(value) >= 1:
        return f"${value:,.2f}"
    if abs(value) >= 0.01:
        return f"${value:.4f}"
    digits = 2 - math.floor(math.log10(abs(value)))
    return f"${value:.{digits}f}"


@register.filter
def rate(per_second: float | None) -> str:
    """Items per second: 12.5 items/s, or per minute when slower than one a second."""
    value = _number(per_second)
    if value is None:
        return "— items/s"
    if value >= 1:
        return f"{value:.1f} items/s"
    return f"{value * 60:.1f} items/min"


@register.filter
def thousands(value: int | None) -> str:
    value = _number(value)
    return "—" if value is None else f"{int(value):,}"


@register.filter
def repetitions(run: Any) -> int:
    """How many times each of the run's items ran (`--runs`); 1 when not every item ran the
    same number of times (`--repeat-flaky` repeats only the flaky ones)."""
    settings = RunSettings.from_run_config(run.config)
    uneven = (settings.repeat_flaky or 0) > settings.runs or run.total_items % settings.runs
    return 1 if uneven else settings.runs


@register.filter
def item_count(run: Any, word: str = "") -> str:
    """The run's items, `120` (`120 items` with the word "items"), or for 40 items each run 3
    times `40 × 3` (`40 items × 3`): its 120 results are not 120 items."""
    times = repetitions(run)
    items = thousands(run.total_items // times) + (f" {word}" if word else "")
    return f"{items} × {times}" if times > 1 else items


@register.filter
def get(mapping: dict[str, Any] | None, key: str) -> Any:
    return (mapping or {}).get(key)


@register.simple_tag(takes_context=True)
def query(context: template.Context, **changes: Any) -> str:
    """The current query string with `changes` applied (None or "" removes a key)."""
    request = context.get("request")
    params = request.GET.copy() if request is not None else QueryDict(mutable=True)
    for key, value in changes.items():
        if value is None or value == "":
            params.pop(key, None)
        else:
            params[key] = str(value)
    encoded = params.urlencode()
    return f"?{encoded}" if encoded else "?"


@register.simple_tag
def sort_value(column: str, current: str) -> str:
    """The sort a click on `column` asks for: ascending first, descending on a second click."""
    return f"-{column}" if current == column else column


@register.simple_tag(takes_context=True)
def sort_query(context: template.Context, column: str, current: str) -> str:
    """The current query string sorting by `column` (see `sort_value`), from page 1."""
    return query(context, sort=sort_value(column, current), page=None)


@register.inclusion_tag("cobalt/_score_legend.html")
def score_legend() -> dict[str, Any]:
    """What the score colours mean, with the borderline margin `cobalt.verdict` uses."""
    from cobalt.verdict import BORDERLINE_MARGIN

    return {"margin": BORDERLINE_MARGIN}
