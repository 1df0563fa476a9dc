"""`pairwise`: a judge asked which of two outputs is better for the same input, in both orders.

In a run, a pairwise judge compares the agent's output with the item's reference (`field=`,
default `expected_output`): 1 when the output wins in both orders, 0 when the reference does,
0.5 for a tie or when the orders disagree. `cobalt compare A B --pairwise NAME` asks the same
judge about run A's and run B's outputs of each item (`cobalt_app.pairwise_compare`).

The judge answers `{"winner": "A" | "B" | "tie", "reason": "..."}`; each order is one call
through the provider hub and the judge cache, like `llm-judge`. A reply that is not such JSON
is retried once with a stricter instruction, then is an evaluation error naming the judge.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from cobalt.evaluator import Evaluator
from cobalt.pairwise import OUTCOME_SCORE, combine, parse_winner
from cobalt_app.cache import cached_call
from cobalt_app.evaluators.base import (
    EvalOutcome,
    EvalTarget,
    EvaluationError,
    context_variables,
    register,
)
from cobalt_app.evaluators.llm_judge import (
    chat_once,
    judge_call,
    judge_provider,
    judge_request,
    judge_target,
    judgement_data,
)
from cobalt_app.evaluators.usage import Usage
from cobalt_app.templating import TemplateError, render, template_context

DEFAULT_PROMPT = "Which of the two outputs answers this input better?\n\nInput:\n{{input}}"
PAIR_FORMAT = (
    'Respond with JSON only: {"winner": "A" or "B" or "tie", "reason": "<one or two sentences>"}'
)
PAIR_STRICT = (
    "Your previous reply could not be used. Reply with exactly one JSON object and nothing "
    'else — no prose, no code fences: {"winner": "A" or "B" or "tie", "reason": "<text>"}'
)
OPTIONS = ("prompt", "field", "context", "model", "provider", "base_url", "api_key_env")


@dataclass
class PairJudgement:
    """The candidate against the baseline: "win", "loss" or "tie", and what it cost."""

    outcome: str
    reason: str
    orders_disagree: bool
    usage: Usage
    cached: bool
    call: dict[str, Any] | None = None  # both orders' prompts and replies ("Show judge call")


def pair_text(output: Any) -> str:
    return (
        output if isinstance(output, str) else json.dumps(output, ensure_ascii=False, default=str)
    )


def pair_prompt(evaluator: Evaluator, item: dict[str, Any], extra: dict[str, Any] | None = None):
    """The judge's question about an item, rendered (the outputs are appended per order)."""
    context = template_context(item, None, {}, extra)
    try:
        return render(evaluator.prompt or DEFAULT_PROMPT, context)
    except TemplateError as exc:
        raise EvaluationError(str(exc)) from exc


async def judge_pair(
    evaluator: Evaluator, question: str, baseline: Any, candidate: Any, env: Any
) -> PairJudgement:
    """Ask in both orders: candidate second (as B), then candidate first (as A)."""
    usage = Usage()
    forward, reason_f, cached_f, turns_f = await _ask(
        evaluator, question, pair_text(baseline), pair_text(candidate), env, usage
    )
    backward, reason_b, cached_b, turns_b = await _ask(
        evaluator, question, pair_text(candidate), pair_text(baseline), env, usage
    )
    outcome = combine(forward, backward)
    disagree = outcome == "tie" and not forward == backward == "tie"
    reason = (
        f"candidate shown as B: {forward} ({reason_f}); shown as A: {backward} ({reason_b})"
        + ("; the orders disagree: a tie" if disagree else "")
    )
    call = judge_call(judge_target(evaluator, env), [*turns_f, *turns_b])
    if call is not None:
        call["via"] = "the pairwise judge, asked in both orders"
    return PairJudgement(outcome, reason, disagree, usage, cached_f and cached_b, call)


async def _ask(
    evaluator: Evaluator, question: str, first: str, second: str, env: Any, usage: Usage
) -> tuple[str, str, bool, list[dict[str, Any]]]:
    """The winner of one order, the judge's reason, whether the cache answered, and the
    call's prompts and replies (capped and redacted as they are cached)."""
    target = judge_target(evaluator, env)
    user = (
        f"{question}\n\n<output_a>\n{first}\n</output_a>\n\n<output_b>\n{second}\n</output_b>"
        f"\n\n{PAIR_FORMAT}"
    )
    params = {"temperature": 0}

    async def judged() -> dict[str, Any]:
        last = ""
        turns: list[dict[str, str]] = []
        for message in (user, f"{user}\n\n{PAIR_STRICT}"):
            text = await chat_once(
                env, target, usage, message, params, f"the pairwise judge {evaluator.name!r}"
            )
            turns.append({"prompt": message, "reply": text})
            data = judgement_data(text)
            winner = parse_winner(data)
            if winner is not None:
                reason = str((data or {}).get("reason") or "")
                call = judge_call(target, turns) or {}
                return {"winner": winner, "reason": reason, "turns": call.get("calls", [])}
            last = text.strip().replace("\n", " ")
        shown = last if len(last) <= 200 else last[:197] + "..."
        raise usage.error(
            f'the pairwise judge {evaluator.name!r} did not answer JSON {{"winner": "A"|"B"|'
            f'"tie", ...}} twice; last reply: {shown!r}'
        )

    request = judge_request("pairwise", target, params, user)
    answer, cached = await cached_call(
        env, request, judged, provider=target["provider"], model=target["model"]
    )
    return answer["winner"], answer["reason"], cached, answer.get("turns") or []


@register("pairwise", options=OPTIONS, providers=judge_provider)
async def pairwise(evaluator: Evaluator, target: EvalTarget, env: Any) -> EvalOutcome:
    field = evaluator.field or "expected_output"
    if field not in target.item:
        raise EvaluationError(
            f"the pairwise judge {evaluator.name!r} compares the output with the item's "
            f"{field!r} field, which this item lacks; name the reference with `field=`"
        )
    question = pair_prompt(evaluator, target.item, await context_variables(evaluator, target))
    judged = await judge_pair(evaluator, question, target.item[field], target.output, env)
    return EvalOutcome(
        evaluator.name,
        OUTCOME_SCORE[judged.outcome],
        reason=f"{judged.outcome} against {field}: {judged.reason}",
        cached=judged.cached,
        tokens=judged.usage.tokens,
        cost=judged.usage.cost,
        unpriced_model=judged.usage.unpriced,
        judge_call=judged.call,
    )
