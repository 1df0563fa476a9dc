"""Lane slots: at most `concurrency` lanes of a run execute at once, across all workers.

A run's lanes are Celery messages (`team.enqueue`), and more of them can reach the workers
than the run's `concurrency`: Redis gives a message held past its visibility timeout to a
second worker, and the sweeper sends lanes again for items whose lease ran out or whose
messages seem lost (a worker still importing the experiment on a loaded machine looks like
that). So a lane executes only while it holds one of the run's `concurrency` slots: a Redis
key per (run, slot), taken with SET NX, renewed by its worker's heartbeat and deleted when
the lane ends. A message finding every slot held ends at once (its items are the live
lanes' to claim); a slot whose worker died expires after the lease grace, before its items'
leases (the heartbeat renews slots first), so the lanes the sweeper sends then find it free.
A lane that lost its slot anyway (its worker was silent for a whole grace period and another
lane took it) stops at once (`worker_runtime`).
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field

from cobalt_app.runs.claims import lease_grace
from cobalt_app.team_broker import KEY, redis_client

# KEYS: the run's slots; ARGV: token, ttl (ms). The first free slot taken, or -1.
TAKE = """
for i, key in ipairs(KEYS) do
  if redis.call('set', key, ARGV[1], 'NX', 'PX', ARGV[2]) then return i - 1 end
end
return -1
"""
# KEYS: slots held; ARGV: ttl (ms), then each slot's token. The positions of the slots
# another lane holds now; a slot that expired unclaimed (or a Redis restart) is taken again.
RENEW = """
local lost = {}
for i, key in ipairs(KEYS) do
  local holder = redis.call('get', key)
  if holder == ARGV[i + 1] then
    redis.call('pexpire', key, ARGV[1])
  elseif not holder then
    redis.call('set', key, ARGV[i + 1], 'PX', ARGV[1])
  else
    table.insert(lost, i - 1)
  end
end
return lost
"""
RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


def slot_keys(run_id: str, concurrency: int) -> list[str]:
    return [f"{KEY}lane:{run_id}:{slot}" for slot in range(concurrency)]


def lanes_held(run_id: str, concurrency: int) -> int:
    """How many of the run's lanes are executing now (on live workers)."""
    return int(redis_client().exists(*slot_keys(run_id, concurrency)))


@dataclass(eq=False)
class Slot:
    """A lane's slot while the lane executes, and the items its lane holds."""

    run_id: str
    key: str
    token: str
    items: set[int] = field(default_factory=set)
    lost: bool = False  # another lane took it: this one stops


class Slots:
    """The slots of this worker's lanes: taken, renewed and released one call at a time, so a
    renewal never takes back a slot its lane has just released."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.held: list[Slot] = []
        self.lock = threading.Lock()

    def take(self, run_id: str, concurrency: int) -> Slot | None:
        """A free slot of the run for a new lane, or None: `concurrency` lanes execute."""
        token = f"{self.owner}:{uuid.uuid4().hex[:12]}"
        keys = slot_keys(run_id, concurrency)
        with self.lock:
            taken = int(redis_client().eval(TAKE, len(keys), *keys, token, _ttl_ms()))
            if taken < 0:
                return None
            slot = Slot(run_id, keys[taken], token)
            self.held.append(slot)
        return slot

    def renew(self) -> list[Slot]:
        """Renew every slot held here; returns those that other lanes took meanwhile."""
        with self.lock:
            held = [slot for slot in self.held if not slot.lost]
            if not held:
                return []
            keys = [slot.key for slot in held]
            tokens = [slot.token for slot in held]
            lost = redis_client().eval(RENEW, len(keys), *keys, _ttl_ms(), *tokens)
            return [held[int(position)] for position in lost]

    def release(self, slot: Slot) -> None:
        with self.lock:
            self.held.remove(slot)
            redis_client().eval(RELEASE, 1, slot.key, slot.token)


def _ttl_ms() -> int:
    """A slot outlives its last renewal by the lease grace (`COBALT_LEASE_GRACE`)."""
    return int(lease_grace() * 1000)
