"""`cobalt compare A B --pairwise NAME`: a pairwise judge's win rate of run B over run A.

For each item key both runs scored (first repetition, both outputs present), the judge is
asked which output is better, in both orders (`evaluators.pairwise.judge_pair`); the win rate
of B counts ties half, with a bootstrap interval (`cobalt.pairwise.win_rate`). The judge is
the pairwise evaluator of that name as run B (else run A) recorded it; the CLI and MCP also
look in the experiment file as it is now, so a judge can be added without re-running. Calls go
through the provider hub, its rate limits and the judge cache, as every judge's do.
"""

from __future__ import annotations

import asyncio
from typing import Any

from cobalt.config import Config
from cobalt.errors import CobaltError
from cobalt.evaluator import Evaluator
from cobalt.pairwise import win_rate
from cobalt_app import aio, engine
from cobalt_app.evaluators.base import EvaluationError
from cobalt_app.evaluators.pairwise import judge_pair, pair_prompt
from cobalt_app.models import ItemResult, Run

CONCURRENCY = 8  # pairs judged at once (each is two calls, under the hub's rate limits)
ITEMS_SHOWN = 200
REQUEST_PAIRS = 500  # the most a page or API request judges (two calls each) while it waits
ERRORS_SHOWN = 5


class PairwiseError(CobaltError):
    """The pairwise comparison cannot be made; the message says why and what to do."""

    field = "judge"


def pairwise_judge(a: Run, b: Run, name: str, config: Config | None = None) -> Evaluator:
    """The pairwise evaluator `name` as run B or run A recorded it, else (with `config`) as
    B's experiment file defines it now."""
    described = _recorded(b, name) or _recorded(a, name)
    if described is None and config is not None and b.file:
        described = _in_file(config, b, name)
    if described is None:
        known = pairwise_judges(a, b)
        raise PairwiseError(
            f"no pairwise judge named {name!r} in run {b.id} or run {a.id}"
            + (f"; pairwise judges there: {', '.join(known)}" if known else "")
            + '. Declare one in the experiment: Evaluator("better", type="pairwise", '
            'prompt="Which answer is more helpful for {{input}}?")'
        )
    if described.get("type") != "pairwise":
        raise PairwiseError(
            f"evaluator {name!r} is of type {described.get('type')!r}, not a pairwise judge "
            '(type="pairwise")'
        )
    options = {k: v for k, v in described.items() if k not in ("name", "type")}
    return Evaluator(name, "pairwise", **options)


def pairwise_judges(a: Run, b: Run) -> list[str]:
    """The names of the pairwise judges either run recorded."""
    return sorted(
        {
            e["name"]
            for run in (a, b)
            for e in run.config.get("evaluators", [])
            if e.get("type") == "pairwise"
        }
    )


def _recorded(run: Run, name: str) -> dict[str, Any] | None:
    return next((e for e in run.config.get("evaluators", []) if e.get("name") == name), None)


def _in_file(config: Config, run: Run, name: str) -> dict[str, Any] | None:
    from cobalt_app.launcher import load_experiments

    experiments, errors, _ = load_experiments(config, [run.file])
    if errors:
        raise PairwiseError(f"{run.file} failed to import: {errors[0].error}")
    for experiment in experiments:
        if experiment.name == run.name:
            found = next((e for e in experiment.evaluators if e.name == name), None)
            return found.describe() if found else None
    return None


def _pairs(a: Run, b: Run) -> list[tuple[str, dict[str, Any], Any, Any]]:
    """(item key, B's item, A's output, B's output) of the keys both runs scored."""

    def outputs(run: Run) -> dict[str, tuple[Any, Any]]:
        rows = ItemResult.objects.filter(
            run=run, run_index=0, status=ItemResult.Status.OK, output__isnull=False
        ).values_list("item_key", "input", "output")
        return {key: (item, output) for key, item, output in rows}

    in_a, in_b = outputs(a), outputs(b)
    keys = sorted(set(in_a) & set(in_b), key=str)
    return [(k, in_b[k][0], in_a[k][1], in_b[k][1]) for k in keys]


def pairwise_compare(
    a: Run,
    b: Run,
    name: str,
    config: Config,
    *,
    find_in_file: bool = False,
    no_cache: bool = False,
    max_pairs: int | None = None,
) -> dict[str, Any]:
    """The judge's verdict on every matched item and B's win rate over A. `max_pairs`: refuse
    more (a web request waits for every call; the CLI and MCP have no such limit)."""
    judge = pairwise_judge(a, b, name, config if find_in_file else None)
    pairs = _pairs(a, b)
    if not pairs:
        raise PairwiseError(
            f"runs {a.id} and {b.id} have no item keys with an output in both; nothing to judge"
        )
    if max_pairs is not None and len(pairs) > max_pairs:
        raise PairwiseError(
            f"runs {a.id} and {b.id} have {len(pairs):,} items to judge, {2 * len(pairs):,} judge "
            f"calls; a page or API request judges at most {max_pairs:,}: run "
            f"`cobalt compare {a.id} {b.id} --pairwise {name}` (or the MCP tool cobalt_pairwise)"
        )
    db = aio.DatabaseThread()
    try:
        env = engine.make_env(config, db, no_cache=no_cache)
        judged = aio.run(_judge_all(judge, pairs, env))
    finally:
        db.close()
    outcomes = [row["outcome"] for row in judged if row["outcome"]]
    errors = [row for row in judged if row["error"]]
    rate = win_rate(outcomes, order_disagreements=sum(r["ordersDisagree"] for r in judged))
    return {
        "judge": name,
        "runA": a.id,
        "runB": b.id,
        **rate.as_dict(),
        "errors": len(errors),
        "errorMessages": list(dict.fromkeys(r["error"] for r in errors))[:ERRORS_SHOWN],
        "tokens": sum(r["tokens"] for r in judged),
        "cost": sum(r["cost"] for r in judged),
        "items": judged[:ITEMS_SHOWN],
    }


async def _judge_all(judge: Evaluator, pairs: list, env: Any) -> list[dict[str, Any]]:
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(key: str, item: dict[str, Any], output_a: Any, output_b: Any):
        row = {
            "itemKey": key,
            "outcome": None,
            "reason": "",
            "error": "",
            "ordersDisagree": False,
            "tokens": 0,
            "cost": 0.0,
        }
        async with gate:
            try:
                judged = await judge_pair(judge, pair_prompt(judge, item), output_a, output_b, env)
            except EvaluationError as exc:
                return row | {"error": str(exc), "tokens": exc.tokens, "cost": exc.cost}
        return row | {
            "outcome": judged.outcome,
            "reason": judged.reason,
            "ordersDisagree": judged.orders_disagree,
            "tokens": judged.usage.tokens,
            "cost": judged.usage.cost,
        }

    return list(await asyncio.gather(*(one(*pair) for pair in pairs)))
