"""Pairwise judgements: which of two outputs is better, asked in both orders, and win rates.

A pairwise judge sees the same input with two outputs, once as (first, second) and once as
(second, first). Its verdict counts only when both orders agree; when they disagree the pair
is a tie: a judge that prefers whichever output comes first (position bias) produces ties, not
wins. A win rate counts ties as half a win, and its 95% interval is a seeded percentile
bootstrap over the compared items (ties make the per-item outcome 0, ½ or 1, which a binomial
interval does not model).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

BOOTSTRAP_DRAWS = 4000
TIES = "ties count as half a win"
METHOD = "95% percentile bootstrap over items (seeded)"


def parse_winner(data: dict[str, Any] | None) -> str | None:
    """ "A", "B" or "tie" from a judge's JSON reply (`{"winner": ...}`), else None."""
    if not isinstance(data, dict):
        return None
    winner = data.get("winner")
    if not isinstance(winner, str):
        return None
    cleaned = winner.strip().strip(".").lower()
    return {"a": "A", "b": "B", "tie": "tie", "output a": "A", "output b": "B"}.get(cleaned)


def combine(forward: str, backward: str) -> str:
    """The verdict of a pair from its two orders. `forward`: the winner when the candidate is
    shown second (as B); `backward`: the winner when it is shown first (as A). Returns
    "win" (the candidate is better), "loss" or "tie" (a tie, or the orders disagree)."""
    candidate_forward = {"B": "win", "A": "loss"}.get(forward, "tie")
    candidate_backward = {"A": "win", "B": "loss"}.get(backward, "tie")
    return candidate_forward if candidate_forward == candidate_backward else "tie"


OUTCOME_SCORE = {"win": 1.0, "tie": 0.5, "loss": 0.0}


@dataclass(frozen=True)
class WinRate:
    """The candidate's win rate over n compared items (ties half), with its interval."""

    wins: int
    ties: int
    losses: int
    value: float | None
    low: float | None
    high: float | None
    order_disagreements: int = 0  # ties that came from the two orders disagreeing

    @property
    def n(self) -> int:
        return self.wins + self.ties + self.losses

    def as_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "wins": self.wins,
            "tied": self.ties,
            "losses": self.losses,
            "orderDisagreements": self.order_disagreements,
            "winRate": self.value,
            "low": self.low,
            "high": self.high,
            "ties": TIES,
            "method": METHOD,
        }


def win_rate(outcomes: Sequence[str], *, order_disagreements: int = 0, seed: int = 0) -> WinRate:
    """The win rate of `outcomes` ("win", "tie", "loss"), ties half, with a bootstrap interval."""
    import numpy as np  # here: every `cobalt run` loads the pairwise evaluator, few use it

    counts = {name: sum(1 for o in outcomes if o == name) for name in OUTCOME_SCORE}
    if not outcomes:
        return WinRate(0, 0, 0, None, None, None, order_disagreements)
    scores = np.array([OUTCOME_SCORE[o] for o in outcomes])
    rng = np.random.default_rng(seed)
    draws = rng.choice(scores, size=(BOOTSTRAP_DRAWS, len(scores)), replace=True).mean(axis=1)
    low, high = np.percentile(draws, [2.5, 97.5])
    return WinRate(
        counts["win"],
        counts["tie"],
        counts["loss"],
        float(scores.mean()),
        float(low),
        float(high),
        order_disagreements,
    )
