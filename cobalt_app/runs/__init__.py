"""The life of a run, the same in every mode and from every door.

- `lifecycle`: create, resume, cancel and finalise a run (finalising stores the summary and
  sends the webhooks, whoever finalises: the last lane, a cancel, the sweeper, a crash).
- `claims`: take a run's pending items (one conditional UPDATE) and record outcomes only for
  the claim still current.
- `recorder`: finished items recorded in batches, one bad outcome never sinking the others.
- `lane`: claim a few items → execute (or re-score) each with the run's step → record →
  claim again, until none is left. The one engine: `embedded` runs `concurrency` lanes in
  this process; a team worker runs one lane per Celery message (`worker_runtime`).
"""

from cobalt.errors import CobaltError


class TeamModeError(CobaltError):
    """Team mode is misconfigured; the message says what to set."""
