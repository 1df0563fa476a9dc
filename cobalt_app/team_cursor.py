"""The run's claim cursor (team mode): lanes take the run's next items by primary-key range.

A run's item rows are created together, so their ids are (nearly) consecutive. When a run is
dispatched, the ids after those its first messages name are handed out from a cursor in
Redis: each claim advances it by its size (one HINCRBY, atomic across every worker) and
takes the still-pending items whose ids fall in that range (`claims.items_claim_range`, one
UPDATE by primary key). A claim's cost so stays the same whatever the run's size or the
table's statistics; claiming "the run's first pending items" instead reads every pending
item of the run at each claim (the planner's choice for `claims.CLAIM_NEXT_SQL`, a cost that
grows with the run).

The cursor only speeds things up: once it is exhausted (or gone, or Redis forgot it), a
lane claims with `claims.items_claim_next`, which finds every item still pending — those
put back by the sweeper or a warm shutdown, those another run's ids interleaved with. So
nothing is lost whatever the cursor says.
"""

from __future__ import annotations

from cobalt_app.runs.claims import Claim, items_claim_next, items_claim_range
from cobalt_app.team_broker import KEY, redis_client

CURSOR_TTL = 7 * 86400  # seconds: as the run's dispatch time
DENSE = 0.5  # the share of a range's ids that must be the run's pending items

# KEYS: the cursor; ARGV: the claim's size. The range [first, end) taken, or nothing when
# the cursor is exhausted or unknown.
TAKE = """
local limit = tonumber(redis.call('hget', KEYS[1], 'end'))
if not limit then return nil end
local stop = redis.call('hincrby', KEYS[1], 'next', ARGV[1])
local first = stop - tonumber(ARGV[1])
if first >= limit then return nil end
return {first, math.min(stop, limit)}
"""


def cursor_key(run_id: str) -> str:
    return f"{KEY}cursor:{run_id}"


def cursor_set(run_id: str, ids: list[int]) -> None:
    """Hand out these ids (sorted) by range from now on; none, or ids too sparse for ranges
    (a resumed run's few failed items): claims by query only."""
    key = cursor_key(run_id)
    dense = bool(ids) and len(ids) >= DENSE * (ids[-1] + 1 - ids[0])
    with redis_client().pipeline(transaction=True) as pipe:
        pipe.delete(key)
        if dense:
            pipe.hset(key, mapping={"next": ids[0], "end": ids[-1] + 1})
            pipe.expire(key, CURSOR_TTL)
        pipe.execute()


def cursor_take(run_id: str, count: int) -> tuple[int, int] | None:
    """The next `count` ids of the run's range, [first, end), or None once exhausted."""
    taken = redis_client().eval(TAKE, 1, cursor_key(run_id), count)
    return (int(taken[0]), int(taken[1])) if taken else None


def claim_next(run_id: str, worker: str, limit: int) -> list[Claim]:
    """Up to `limit` of the run's pending items: the cursor's next range, else (exhausted)
    the run's first pending items by query."""
    while (taken := cursor_take(run_id, limit)) is not None:
        claims = items_claim_range(run_id, worker, *taken)
        if claims:
            return claims
    return items_claim_next(run_id, worker, limit)
