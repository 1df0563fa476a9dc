"""An experiment's `concurrency` holds across team workers on a loaded machine, with items
longer than the visibility timeout. (Apart from tests/test_team_concurrency.py, which says how
it is observed, so that the two modules run on two xdist workers at once.)
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.team_harness import Team
from tests.test_team_concurrency import SHORT_VISIBILITY, assert_each_item_ran_once, most_at_once

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def cpu_hogs() -> Iterator[list[subprocess.Popen]]:
    """Two processes spinning beside the workers: as many as this machine has cores."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        yield hogs
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait(timeout=10)


@pytest.mark.timeout(300)
def test_concurrency_holds_on_a_loaded_machine_with_items_longer_than_the_visibility_timeout(
    team: Team, cpu_hogs: list[subprocess.Popen]
):
    # Every core busy: workers import the experiment and renew their leases slowly, so the
    # sweeper sends lanes again, and each item outlives the visibility timeout, so Redis hands
    # every lane's message to a second worker; three workers, twelve threads, three lanes.
    team.write_experiment(items=12, delay=4.0, timeout=60, concurrency=3, call_agent=False)
    workers = [team.start_worker(env=SHORT_VISIBILITY) for _ in range(3)]
    result = team.cli("run", timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert all(hog.poll() is None for hog in cpu_hogs)  # the machine was loaded throughout
    for worker in workers:
        assert "raised unexpected" not in worker.err()
    assert most_at_once(team.folder / "spans.log") == (12, 3)
    assert_each_item_ran_once(team, 12)
