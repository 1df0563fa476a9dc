"""A label is about an output: it comes back with the same output in a re-judged, a replayed
and a cached run of the real `cobalt` command, and reads as stale once the output changed."""

from __future__ import annotations

import json

from tests.conftest import Project
from tests.fake_provider import FakeProvider
from tests.test_replay import CAPITALS_AGENT, capitals, cobalt, latest_results, provider, urls

__all__ = ["capitals", "provider"]  # fixtures, used by name below

LABELS = [
    {"itemKey": "peru", "verdict": "fail", "note": "Lima is right, but say why"},
    {"itemKey": "japan", "verdict": "pass", "score": 0.9},
]


def exported(project: Project, live: dict[str, str], run_id: str) -> dict[str, dict]:
    result = cobalt(project, live, "labels", "export", run_id, "--format", "jsonl")
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    return {row["itemKey"]: row for row in rows}


def listed(project: Project, live: dict[str, str], run_id: str) -> str:
    result = cobalt(project, live, "labels", "list", run_id)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_labels_come_back_with_the_same_output_and_go_stale_when_it_changes(
    capitals: Project, provider: FakeProvider
):
    live = urls(provider)
    first = cobalt(capitals, live, "run", "--record")
    assert first.returncode == 0, first.stdout + first.stderr
    run_id = latest_results(capitals, "capitals")["id"]
    rows = [{"run": run_id, "evaluator": "judge", **label} for label in LABELS]
    (capitals.path / "labels.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    imported = cobalt(capitals, live, "labels", "import", "labels.jsonl", "--reviewer", "ana")
    assert imported.returncode == 0, imported.stdout + imported.stderr
    assert "2 new" in imported.stdout

    # A re-judge scores the same outputs again: the labels are there, current.
    rejudged = cobalt(capitals, live, "rejudge", run_id)
    assert rejudged.returncode == 0, rejudged.stdout + rejudged.stderr
    rejudge_id = latest_results(capitals, "capitals")["id"]
    assert rejudge_id != run_id
    again = exported(capitals, live, rejudge_id)
    assert {k: (r["verdict"], r["reviewer"]) for k, r in again.items()} == {
        "peru": ("fail", "ana"),
        "japan": ("pass", "ana"),
    }
    assert again["peru"]["disagrees"] is True  # the judge gave 0.7: a pass
    assert again["japan"]["score"] == 0.9

    # A replayed run (the provider stopped) has the same outputs: the labels are current, and
    # they are in its results file beside the scores.
    provider.stop()
    replayed = cobalt(capitals, live, "run", "--replay", keys=False)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    replay_id = latest_results(capitals, "capitals")["id"]
    assert set(exported(capitals, live, replay_id)) == {"peru", "japan"}
    in_file = {i["key"]: i.get("labels") for i in latest_results(capitals, "capitals")["items"]}
    assert [label["verdict"] for label in in_file["peru"]] == ["fail"]
    assert in_file["france"] in (None, [])
    assert "stale" not in listed(capitals, live, replay_id)

    # The agent now answers differently: the labels read as stale, never as current.
    capitals.write(
        "experiments/capitals.cobalt.py",
        CAPITALS_AGENT.replace(
            "return reply.choices[0].message.content",
            "return reply.choices[0].message.content + '!'",
        ),
    )
    changed = cobalt(capitals, live, "run", "--replay", keys=False)
    assert changed.returncode == 0, changed.stdout + changed.stderr
    changed_id = latest_results(capitals, "capitals")["id"]
    assert exported(capitals, live, changed_id) == {}
    text = listed(capitals, live, changed_id)
    assert "2 stale (the output changed)" in text, text
    rows = [line for line in text.splitlines() if "ana" in line]
    assert len(rows) == 2 and all("stale" in row for row in rows), text
