"""Team mode: the spans of items executed by a real worker process are recorded with their
items (PostgreSQL) and shown on the run page served by `cobalt serve`."""

from __future__ import annotations

import contextlib

import pytest

from tests.conftest import logged_in
from tests.team_harness import Team
from tests.test_blob_store import stored_value
from tests.trace_agents import WEATHER_EXPERIMENT


@pytest.mark.timeout(240)
def test_spans_recorded_by_a_worker_appear_on_the_run_page(team: Team):
    (team.folder / "experiments" / "weather.cobalt.py").write_text(WEATHER_EXPERIMENT)
    team.start_worker("--concurrency", "4")
    done = team.cli("run", timeout=180)
    assert done.returncode == 0 and "3 ok, 1 error" in done.stdout, done.stdout + done.stderr
    assert "no weather station in Atlantis  " in done.stdout and "· 2 steps" in done.stdout
    run_id = team.latest_run()
    assert team.run_row(run_id)["mode"] == "team"
    rows = team.services.query(
        "SELECT i.item_key, i.item_index + 1, i.tokens, t.data, t.blobs FROM cobalt_app_itemresult i "
        "JOIN cobalt_app_itemtrace t ON t.item_id = i.id WHERE i.run_id = %s",
        [run_id],
    )
    blobs = dict(team.services.query("SELECT sha256, data FROM cobalt_app_blob"))
    traces = {
        key: (number, tokens, stored_value(data, refs, blobs))
        for key, number, tokens, data, refs in rows
    }
    assert set(traces) == {"paris", "lima", "oslo", "atlantis"}
    for city in ("paris", "lima", "oslo"):
        _, tokens, steps = traces[city]
        assert [(s["kind"], s["name"]) for s in steps] == [
            ("llm", "ChatCompletion"),
            ("tool", "get_weather"),
            ("llm", "ChatCompletion"),
        ]
        assert steps[1]["output"] == f"sunny in {city.title()}"
        assert tokens == sum(s["inputTokens"] + s["outputTokens"] for s in steps[::2])

    team.create_user("ops", "team-pass-123")
    with contextlib.closing(logged_in(team.serve(), "ops", "team-pass-123")) as browser:
        paris = traces["paris"][0]  # the item's number
        page = browser.get(f"/runs/{run_id}/items/{paris}/")
        assert page.status_code == 200
        assert "3 steps: 2 model calls, 1 tool call" in page.text
        assert page.text.count('<li class="step step-') == 3
        assert "sunny in Paris" in page.text
