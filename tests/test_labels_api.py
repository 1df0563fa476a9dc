"""Human labels through the API: label an item (the reviewer is the token's user), list and
filter labels, optimistic concurrency (409), bad input by field (400), missing things (404),
who may write, the labels beside the scores (items, run detail, exports), and adding a
reviewed item to a dataset. Real engine runs, a real token; the schema checks the answers."""

from __future__ import annotations

import csv
import io
import json
import time
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from cobalt_app import exports
from cobalt_app.models import Label, Run
from tests.test_api import DEADLINE, api, api_project, execute, token, user  # noqa: F401
from tests.test_api_schema import CHECKS, api_schema, team_api  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


def item_ids(client: APIClient, run_id: str) -> dict[str, int]:
    """Item key → item result id, from the items endpoint."""
    items = client.get(f"/api/runs/{run_id}/items/", {"page_size": 500}).json()["results"]
    return {item["key"]: item["id"] for item in items}


def item_numbers(client: APIClient, run_id: str) -> dict[str, int]:
    """Item key → the item's number (its address, as on the pages), from the items endpoint."""
    items = client.get(f"/api/runs/{run_id}/items/", {"page_size": 500}).json()["results"]
    return {item["key"]: item["index"] + 1 for item in items}


def test_a_reviewer_labels_an_item_and_every_door_shows_it(api_project, api):  # noqa: F811
    run = execute("qa")
    ids = item_ids(api, run.id)
    assert len(ids) == 6

    saved = api.post(
        f"/api/runs/{run.id}/labels/",
        {
            "item": ids["q1"],
            "evaluator": "exact",
            "verdict": "pass",
            "note": "'yes' is right for q1 too",
            "expectedOutput": "yes",
            "reviewer": "mallory",  # not a field: the reviewer is who sends the token
        },
        format="json",
    )
    assert saved.status_code == 201, saved.json()
    label = saved.json()
    assert (label["reviewer"], label["itemKey"], label["item"], label["itemId"]) == (
        "alice",
        "q1",
        2,
        ids["q1"],
    )
    assert (label["judgeScore"], label["judgeVerdict"], label["disagrees"]) == (0.0, "fail", True)
    assert (label["version"], label["expectedOutput"], label["stale"]) == (1, "yes", False)

    listed = api.get(f"/api/runs/{run.id}/labels/").json()
    assert listed["count"] == 1 and listed["labels"][0]["id"] == label["id"]
    assert api.get(f"/api/runs/{run.id}/labels/", {"disagrees": "true"}).json()["count"] == 1
    assert api.get(f"/api/runs/{run.id}/labels/", {"evaluator": "length"}).json()["count"] == 0
    assert api.get(f"/api/runs/{run.id}/labels/", {"reviewer": "bob"}).json()["count"] == 0
    assert api.get(f"/api/runs/{run.id}/labels/", {"stale": "false"}).json()["count"] == 1
    on_item = api.get(f"/api/runs/{run.id}/items/2/labels/").json()  # q1 is item #2
    assert [row["id"] for row in on_item["labels"]] == [label["id"]]
    assert api.get(f"/api/runs/{run.id}/items/1/labels/").json() == {
        "count": 0,
        "labels": [],
    }

    # Beside the scores: the run detail's counts and each item's labels.
    detail = api.get(f"/api/runs/{run.id}/").json()
    assert detail["labels"] == {
        "labels": 1,
        "stale": 0,
        "itemsLabelled": 1,
        "reviewers": ["alice"],
        "disagreements": 1,
    }
    items = api.get(f"/api/runs/{run.id}/items/").json()["results"]
    by_key = {item["key"]: item for item in items}
    assert [row["verdict"] for row in by_key["q1"]["labels"]] == ["pass"]
    assert by_key["q0"]["labels"] == [] and by_key["q1"]["id"] == ids["q1"]

    # The results file was written when the run ended, before the label; exports read now.
    written = json.loads(Path(run.results_path).read_text())
    assert written["labels"]["labels"] == 0 and written["items"][1]["labels"] == []
    document = json.loads("".join(exports.export(run, "json")))
    assert document["labels"]["disagreements"] == 1
    assert document["items"][1]["labels"][0]["note"] == "'yes' is right for q1 too"
    rows = list(csv.DictReader(io.StringIO("".join(exports.export(run, "csv")))))
    assert (rows[1]["exact_labels"], rows[1]["label_disagreement"]) == ("alice: pass", "yes")
    assert (rows[0]["exact_labels"], rows[0]["label_disagreement"]) == ("", "")


def test_changing_a_label_needs_the_version_last_read_and_an_old_one_is_a_409(api_project, api):  # noqa: F811
    run = execute("qa")
    url = f"/api/runs/{run.id}/items/{item_numbers(api, run.id)['q0']}/labels/"

    first = api.post(url, {"evaluator": "exact", "verdict": "fail"}, format="json")
    assert first.status_code == 201 and first.json()["version"] == 1
    changed = api.post(
        url, {"evaluator": "exact", "verdict": "pass", "version": 1, "note": "fine"}, format="json"
    )
    assert changed.status_code == 200, changed.json()
    assert (changed.json()["version"], changed.json()["verdict"]) == (2, "pass")

    # Someone who read version 1 saves after that change: refused, nothing overwritten.
    late = api.post(url, {"evaluator": "exact", "verdict": "fail", "version": 1}, format="json")
    assert late.status_code == 409
    assert "changed since you read it (it is at version 2, not 1)" in late.json()["detail"]
    [stored] = api.get(url).json()["labels"]
    assert (stored["verdict"], stored["note"], stored["version"]) == ("pass", "fine", 2)
    # A score without a verdict is judged by the evaluator's pass mark.
    scored = api.post(url, {"evaluator": "length", "score": 0.2}, format="json")
    assert scored.status_code == 201 and scored.json()["verdict"] == "fail"


def test_bad_labels_are_400s_naming_the_field_and_missing_things_404s(api_project, api):  # noqa: F811
    run = execute("qa")
    other = execute("qa-v2")
    ids = item_ids(api, run.id)
    url = f"/api/runs/{run.id}/labels/"
    base = {"item": ids["q0"], "evaluator": "exact", "verdict": "fail"}

    cases = [
        ({"evaluator": "relevance"}, "evaluator", "has no evaluator 'relevance' (it has: exact"),
        ({"score": 1.7}, "score", "score: 1.7 is outside 0..1"),
        ({"verdict": "maybe"}, "verdict", '"maybe" is not a valid choice'),
        ({"verdict": None}, "verdict", "give 'pass' or 'fail' (or a corrected score)"),
        ({"item": None}, "item", "may not be null"),
        ({"expectedOutput": {"a": "nul\u0000"}}, "expectedOutput", "NUL"),
    ]
    for change, field, message in cases:
        reply = api.post(url, {**base, **change}, format="json")
        assert reply.status_code == 400, (change, reply.json())
        assert list(reply.json()) == [field], reply.json()
        assert message in reply.json()[field][0], reply.json()

    missing = api.post(url, {**base, "item": 999_999_999}, format="json")
    assert missing.status_code == 404
    assert f"run {run.id} has no item with id 999999999" in missing.json()["detail"]
    another_runs_item = item_ids(api, other.id)["q0"]
    assert api.post(url, {**base, "item": another_runs_item}, format="json").status_code == 404
    assert api.get(f"/api/runs/{run.id}/items/{another_runs_item}/labels/").status_code == 404
    assert api.post("/api/runs/nosuchrun/labels/", base, format="json").status_code == 404
    assert not Label.objects.exists()


def test_a_run_still_running_cannot_be_labelled(api_project, api):  # noqa: F811
    started = api.post("/api/runs/", {"file": "experiments/slow.cobalt.py"}, format="json")
    run_id = started.json()["id"]
    deadline = time.monotonic() + DEADLINE
    while api.get(f"/api/runs/{run_id}/").json()["status"] != "running":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    item = next(iter(item_ids(api, run_id).values()))

    reply = api.post(
        f"/api/runs/{run_id}/items/{item}/labels/", {"evaluator": "ok", "verdict": "fail"}
    )
    assert reply.status_code == 409
    assert (
        f"run {run_id} is still running: label its items once it has finished"
        in (reply.json()["detail"])
    )
    assert api.post(f"/api/runs/{run_id}/cancel/").status_code in (200, 202)
    assert not Label.objects.exists()


def test_reading_needs_no_login_on_loopback_but_writing_does_and_team_mode_needs_it(
    api_project,  # noqa: F811
    api,  # noqa: F811
    settings,
):
    run = execute("qa")
    item = item_ids(api, run.id)["q0"]
    anonymous = APIClient(HTTP_HOST="127.0.0.1")
    assert anonymous.get(f"/api/runs/{run.id}/labels/").status_code == 200
    for url, body in (
        (f"/api/runs/{run.id}/labels/", {"item": item, "evaluator": "exact", "verdict": "fail"}),
        (f"/api/runs/{run.id}/items/{item}/labels/", {"evaluator": "exact", "verdict": "fail"}),
        (f"/api/runs/{run.id}/items/{item}/add-to-dataset/", {"file": "datasets/r.jsonl"}),
    ):
        reply = anonymous.post(url, body, format="json")
        assert reply.status_code == 401, url
        assert "Authorization: Token" in reply.json()["detail"]
    settings.TEAM_MODE = True
    assert anonymous.get(f"/api/runs/{run.id}/labels/").status_code == 401
    assert api.get(f"/api/runs/{run.id}/labels/").status_code == 200
    assert not Label.objects.exists()
    assert not (api_project.path / "datasets").exists()


def test_a_reviewed_item_is_added_to_a_dataset_once_and_only_inside_the_project(api_project, api):  # noqa: F811
    run = execute("qa")
    ids = item_ids(api, run.id)
    api.post(
        f"/api/runs/{run.id}/items/{ids['q1']}/labels/",
        {"evaluator": "exact", "verdict": "pass", "note": "both", "expectedOutput": "yes"},
        format="json",
    )
    url = f"/api/runs/{run.id}/items/{ids['q1']}/add-to-dataset/"

    added = api.post(url, {"file": "datasets/reviewed.jsonl", "evaluator": "exact"}, format="json")
    assert added.status_code == 201, added.json()
    assert {k: added.json()[k] for k in ("file", "line", "id")} == {
        "file": "datasets/reviewed.jsonl",
        "line": 1,
        "id": "q1",
    }
    written = (api_project.path / "datasets" / "reviewed.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in written] == [
        {
            "id": "q1",
            "input": "question 1",
            "expected_output": "yes",
            "metadata": {
                "reviewNote": "both",
                "reviewer": "alice",
                "verdict": "pass",
                "fromRun": run.id,
            },
        }
    ]

    again = api.post(url, {"file": "datasets/reviewed.jsonl"}, format="json")
    assert again.status_code == 409
    assert "already has an item with id 'q1'; nothing was written" in again.json()["detail"]
    for path, message in (
        ("../outside.jsonl", "resolves outside the project folder"),
        ("/tmp/elsewhere.jsonl", "resolves outside the project folder"),
        ("datasets/reviewed.csv", "is not a .jsonl file"),
    ):
        refused = api.post(url, {"file": path}, format="json")
        assert refused.status_code == 400, path
        assert message in refused.json()["file"][0]
    assert len((api_project.path / "datasets" / "reviewed.jsonl").read_text().splitlines()) == 1
    assert not (api_project.path.parent / "outside.jsonl").exists()
    missing = api.post(f"/api/runs/{run.id}/items/999999999/add-to-dataset/", {"file": "d.jsonl"})
    assert missing.status_code == 404


def test_label_answers_are_as_the_schema_documents(api_schema, team_api):  # noqa: F811
    run = execute("qa")
    item = Run.objects.get(id=run.id).items.get(item_key="q1")
    label = {"evaluator": "exact", "verdict": "pass", "expectedOutput": {"answer": "yes"}}
    calls = [
        ("/api/runs/{run_id}/labels/", "POST", {"run_id": run.id}, {**label, "item": item.id}),
        ("/api/runs/{run_id}/items/{number}/labels/", "POST", {"run_id": run.id}, label),
        ("/api/runs/{run_id}/items/{number}/labels/", "POST", {}, {**label, "version": 1}),
        ("/api/runs/{run_id}/labels/", "POST", {"run_id": run.id}, {**label, "score": 3}),
        ("/api/runs/{run_id}/labels/", "GET", {"run_id": run.id}, None),
        ("/api/runs/{run_id}/items/{number}/labels/", "GET", {}, None),
        ("/api/runs/{run_id}/", "GET", {"run_id": run.id}, None),
        ("/api/runs/{run_id}/items/", "GET", {"run_id": run.id}, None),
        ("/api/runs/{run_id}/items/{number}/add-to-dataset/", "POST", {}, {"file": "d.jsonl"}),
        ("/api/runs/{run_id}/items/{number}/add-to-dataset/", "POST", {}, {"file": "d.jsonl"}),
        ("/api/runs/{run_id}/items/{number}/add-to-dataset/", "POST", {}, {"file": "../x.jsonl"}),
    ]
    seen = []
    for path, method, parameters, body in calls:
        parameters = {"run_id": run.id, **parameters}
        if "{number}" in path:
            parameters["number"] = item.number
        arguments = {"path_parameters": parameters}
        if body is not None:
            arguments.update(body=body, media_type="application/json")
        case = api_schema[path][method].Case(**arguments)
        seen.append(case.call_and_validate(headers=team_api, checks=CHECKS).status_code)
    assert seen == [201, 200, 409, 400, 200, 200, 200, 200, 201, 409, 400]


def test_results_read_the_labels_once_per_run_not_per_item(django_assert_num_queries):
    from cobalt_app import labels, results
    from tests.test_pages import keys, make_run

    run = make_run("qa", keys=keys(30), scores={"k001": {"judge": 0.1}})
    # Without labels: one query more than before (the labels), whatever the item count.
    with django_assert_num_queries(4):  # labels, items, evaluations, traces
        entries = list(results.iter_item_entries(run))
    assert len(entries) == 30 and all(entry["labels"] == [] for entry in entries)

    for key in ("k001", "k017"):
        item = run.items.get(item_key=key)
        labels.label_save(
            run=run, item_id=item.id, evaluator="judge", reviewer="ana", verdict="pass"
        )
    # With labels: the labelled items and their evaluations are read once, for all of them.
    with django_assert_num_queries(6):
        entries = list(results.iter_item_entries(run))
    assert [e["key"] for e in entries if e["labels"]] == ["k001", "k017"]
    assert entries[1]["labels"][0]["disagrees"] is True
    # The header's counts share the same read; its judges' calibration reads the labels, the
    # experiment's runs, their labelled items and those items' evaluations once each.
    with django_assert_num_queries(10):
        document = json.loads("".join(results.results_document(run)))
    assert document["labels"]["disagreements"] == 1
