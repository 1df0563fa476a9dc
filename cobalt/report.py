"""`ExperimentReport`: the public view of one finished run (the results-file format).

In a notebook it renders itself (`_repr_html_`: scores with their 95% intervals, errors, the
failing items with their reasons, a link to the run's page when `cobalt serve` is up), and
`await experiment(...)` works too: the report is awaitable and gives itself.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from cobalt.results_file import load_results
from cobalt.verdict import Verdict, evaluation_verdict

FAILURES_SHOWN = 20


@dataclass
class ExperimentReport:
    """A finished run. `report.statistics["relevance"]["avg"]`, `report.to_dict()`."""

    data: dict[str, Any]
    results_path: str | None = None

    @classmethod
    def load(cls, path: str | Path) -> ExperimentReport:
        """The report of a results file, in any of its forms (`.json`, `.jsonl`, `.gz`)."""
        return cls(load_results(path), results_path=str(path))

    @property
    def id(self) -> str:
        return self.data["id"]

    @property
    def name(self) -> str:
        return self.data["name"]

    @property
    def timestamp(self) -> str:
        return self.data["timestamp"]

    @property
    def status(self) -> str:
        return self.data.get("status", "completed")

    @property
    def tags(self) -> list[str]:
        return self.data.get("tags", [])

    @property
    def results(self) -> list[dict[str, Any]]:
        return self.data.get("items", [])

    items = results

    @property
    def summary(self) -> dict[str, Any]:
        return self.data["summary"]

    @property
    def statistics(self) -> dict[str, dict[str, Any]]:
        return self.summary.get("scores", {})

    @property
    def total_items(self) -> int:
        return self.summary.get("totalItems", 0)

    @property
    def successful_items(self) -> int:
        return self.summary.get("itemStatus", {}).get("ok", 0)

    @property
    def failed_items(self) -> int:
        return self.total_items - self.successful_items

    @property
    def total_tokens(self) -> int:
        return self.summary.get("totalTokens", 0)

    @property
    def estimated_cost(self) -> float:
        return self.summary.get("estimatedCost", 0.0)

    @property
    def unpriced_models(self) -> list[str]:
        """Models that spent tokens and have no price: `estimated_cost` leaves them out."""
        return self.summary.get("unpricedModels", [])

    @property
    def duration_ms(self) -> float:
        return self.summary.get("totalDurationMs", 0.0)

    def to_dict(self) -> dict[str, Any]:
        return self.data

    def failures(self) -> list[dict[str, Any]]:
        """The items that errored or timed out, or have an evaluation that errored or scored
        below its evaluator's pass mark (its `verdict`), in dataset order (results-file
        entries)."""
        return [item for item in self.items if _failed(item)]

    def __await__(self) -> Generator[Any, None, ExperimentReport]:
        """`await experiment(...)` in a notebook: the run is over already, this is its report."""
        return self
        yield  # a generator: `await` needs one

    def _repr_html_(self) -> str:
        summary = self.summary or {}
        status = summary.get("itemStatus", {})
        rows = "".join(
            f"<tr><td>{escape(name)}</td><td>{_num(v.get('avg'))}</td>"
            f"<td>{_interval(v.get('ci95'))}</td><td>{_num(v.get('min'))}</td>"
            f"<td>{_num(v.get('max'))}</td><td>{v.get('count', 0)}</td></tr>"
            for name, v in self.statistics.items()
        )
        failures = self.failures()
        failing = "".join(
            f"<li><b>#{item['index'] + 1}</b> <code>{escape(str(item['key']))}</code> "
            f"{escape(_why(item))}</li>"
            for item in failures[:FAILURES_SHOWN]
        )
        more = len(failures) - FAILURES_SHOWN
        link = _run_link(self.id)
        return (
            f'<div class="cobalt-report"><p><b>{escape(self.name)}</b> · run '
            f"<code>{escape(self.id)}</code> · {escape(self.status)} · "
            f"{self.total_items} items: {item_counts(status)} · "
            f"${self.estimated_cost:.4f}{link}</p>"
            "<table><thead><tr><th>evaluator</th><th>avg</th><th>95% CI</th><th>min</th>"
            f"<th>max</th><th>n</th></tr></thead><tbody>{rows}</tbody></table>"
            + (f"<p>{len(failures)} failing items:</p><ul>{failing}</ul>" if failures else "")
            + (f"<p>… and {more} more: <code>report.failures()</code></p>" if more > 0 else "")
            + "</div>"
        )

    def __repr__(self) -> str:
        scores = ", ".join(f"{k}={v.get('avg')}" for k, v in self.statistics.items())
        return f"ExperimentReport(id={self.id!r}, name={self.name!r}, {scores})"


def _verdict(evaluation: dict[str, Any]) -> Verdict:
    """An evaluation's verdict as its results entry states it (against its evaluator's pass
    mark); an entry written before verdicts were, against the default mark."""
    if evaluation.get("verdict"):
        return Verdict(evaluation["verdict"])
    return evaluation_verdict(evaluation.get("score"), error="error" in evaluation)


def _failing(item: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The item's evaluations that failed or errored, by evaluator."""
    evaluations = item.get("evaluations") or {}
    return {
        name: e for name, e in evaluations.items() if _verdict(e) in (Verdict.FAIL, Verdict.ERROR)
    }


def _failed(item: dict[str, Any]) -> bool:
    return item.get("status") != "ok" or bool(_failing(item))


def _why(item: dict[str, Any]) -> str:
    if item.get("status") != "ok":
        first = (item.get("error") or "").split("\n")[0]
        return f"{item.get('status')}: {first}"
    reasons = [
        f"{name} {_num(e.get('score'))}: {e.get('reason') or e.get('error') or ''}"
        for name, e in _failing(item).items()
    ]
    return "; ".join(reasons)


def item_counts(status: dict[str, int]) -> str:
    """`11 ok, 1 error, 0 timeouts`."""
    errors, timeouts = status.get("error", 0), status.get("timeout", 0)
    return (
        f"{status.get('ok', 0)} ok, {errors} error{'s' * (errors != 1)}, "
        f"{timeouts} timeout{'s' * (timeouts != 1)}"
    )


def _num(value: Any) -> str:
    return "—" if value is None else f"{value:.2f}"


def _interval(ci: Any) -> str:
    if not isinstance(ci, dict) or ci.get("low") is None:
        return "—"
    return f"[{ci['low']:.2f}, {ci['high']:.2f}]"


def _run_link(run_id: str) -> str:
    """` · <a>open the run</a>` when this project's dashboard answers on its port."""
    from cobalt.config import active_config
    from cobalt.dashboard import running_dashboard

    base = running_dashboard(active_config())
    if base is None:
        return " · <code>cobalt serve</code> to see it in the dashboard"
    url = f"{base}/runs/{run_id}/"
    return f' · <a href="{escape(url)}" target="_blank">open the run</a>'
