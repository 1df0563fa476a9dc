"""`ExperimentReport`: the public view of one finished run (the results-file format)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class ExperimentReport:
    """A finished run. `report.statistics["relevance"]["avg"]`, `report.to_dict()`."""

    data: dict[str, Any]
    results_path: str | None = None

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

    def __repr__(self) -> str:
        scores = ", ".join(f"{k}={v.get('avg')}" for k, v in self.statistics.items())
        return f"ExperimentReport(id={self.id!r}, name={self.name!r}, {scores})"
