"""Checks of a conversation (`experiment(..., conversation=True)`): `turns` and `goal-reached`."""

from __future__ import annotations

from typing import Any

from cobalt.evaluator import Evaluator
from cobalt_app.evaluators.base import EvalOutcome, EvalTarget, EvaluationError, register


def conversation_info(target: EvalTarget) -> dict[str, Any]:
    info = (target.metadata or {}).get("conversation")
    if not isinstance(info, dict):
        raise EvaluationError(
            "this item is not a conversation: use it in an experiment with conversation=True"
        )
    return info


@register("turns", options=("min_turns", "max_turns"))
async def turns(evaluator: Evaluator, target: EvalTarget, env: Any) -> EvalOutcome:
    """1 when the number of assistant turns is within `min_turns`..`max_turns`, else 0."""
    count = int(conversation_info(target)["turns"])
    low, high = evaluator.options.get("min_turns", 1), evaluator.options.get("max_turns")
    for name, value in (("min_turns", low), ("max_turns", high)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise EvaluationError(f"`{name}=` must be a whole number (got {value!r})")
    within = count >= low and (high is None or count <= high)
    bounds = f"{low}..{high}" if high is not None else f"at least {low}"
    return EvalOutcome(evaluator.name, float(within), reason=f"{count} turns (expected {bounds})")


@register("goal-reached", options=())
async def goal_reached(evaluator: Evaluator, target: EvalTarget, env: Any) -> EvalOutcome:
    """The simulated user's verdict: 1 when it ended the conversation with its goal reached."""
    info = conversation_info(target)
    if "goalReached" not in info:
        if info.get("ended") == "max_turns":
            return EvalOutcome(
                evaluator.name, 0.0, reason=f"no verdict: stopped at {info['turns']} turns"
            )
        raise EvaluationError(
            'goal-reached needs a simulated user (an item with `user`: {"goal": ...})'
        )
    reached = bool(info["goalReached"])
    verdict = info.get("verdict") or ("goal reached" if reached else "the user gave up")
    return EvalOutcome(evaluator.name, float(reached), reason=verdict)
