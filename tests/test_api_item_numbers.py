"""The API addresses an item as the pages do: by its number (`/api/runs/<run>/items/17/`,
`?repeat=N` for a repetition); an old address by the item result's database id still works
(a GET is redirected, a POST is served where it was sent), and the schema documents both."""

from __future__ import annotations

import pytest

from tests.test_api import api, api_project, token, user  # noqa: F401 (fixtures)
from tests.test_api_schema import CHECKS, api_schema, team_api  # noqa: F401 (fixtures)
from tests.test_triage import make_run, support_items

pytestmark = pytest.mark.django_db(transaction=True)


def test_items_are_addressed_by_number_and_repeat(api):  # noqa: F811
    run = make_run(support_items(4), runs=2, scores={"t01#1": {"judge": 0.0}})
    first, second = (run.items.get(item_index=1, run_index=n) for n in (0, 1))

    item = api.get(f"/api/runs/{run.id}/items/2/").json()
    assert (item["id"], item["key"], item["index"], item["runIndex"]) == (first.id, "t01", 1, 0)
    repeat = api.get(f"/api/runs/{run.id}/items/2/", {"repeat": 2}).json()
    assert (repeat["id"], repeat["runIndex"]) == (second.id, 1)
    assert repeat["evaluations"]["judge"]["score"] == 0.0

    missing = api.get(f"/api/runs/{run.id}/items/99/")
    assert missing.status_code == 404
    assert missing.json()["detail"] == f"run {run.id} has no item #99"
    no_repeat = api.get(f"/api/runs/{run.id}/items/2/", {"repeat": 3})
    assert no_repeat.status_code == 404
    assert no_repeat.json()["detail"] == f"run {run.id} has no item #2 (repeat 3)"
    zero = api.get(f"/api/runs/{run.id}/items/2/", {"repeat": 0})
    assert zero.status_code == 400 and list(zero.json()) == ["repeat"]


def test_an_old_address_by_database_id_still_names_its_item(api):  # noqa: F811
    make_run(support_items(6))  # first: the next run's ids are all above its numbers (1–4)
    run = make_run(support_items(4), runs=2)
    second = run.items.get(item_index=1, run_index=1)
    assert second.id > 4

    old = api.get(f"/api/runs/{run.id}/items/{second.id}/", {"format": "json"})
    assert old.status_code == 301
    assert old["Location"] == f"/api/runs/{run.id}/items/2/?repeat=2&format=json"
    assert api.get(old["Location"]).json()["id"] == second.id
    old_labels = api.get(f"/api/runs/{run.id}/items/{second.id}/labels/")
    assert old_labels.status_code == 301
    assert old_labels["Location"] == f"/api/runs/{run.id}/items/2/labels/?repeat=2"

    # A POST to an old address is served there: a redirect would lose its body.
    saved = api.post(
        f"/api/runs/{run.id}/items/{second.id}/labels/",
        {"evaluator": "exact", "verdict": "fail"},
        format="json",
    )
    assert saved.status_code == 201, saved.json()
    assert (saved.json()["itemId"], saved.json()["item"]) == (second.id, 2)
    by_number = api.get(f"/api/runs/{run.id}/items/2/labels/", {"repeat": 2}).json()
    assert [row["id"] for row in by_number["labels"]] == [saved.json()["id"]]

    # An id of another run's item is no address of this run's.
    other = make_run(support_items(2))
    assert api.get(f"/api/runs/{other.id}/items/{second.id}/").status_code == 404
    assert api.get(f"/api/runs/{other.id}/items/{second.id}/labels/").status_code == 404


def test_item_addresses_answer_as_the_schema_documents(api_schema, team_api):  # noqa: F811
    make_run(support_items(6))
    run = make_run(support_items(3), runs=2)
    old = run.items.get(item_index=2, run_index=1).id
    calls = [
        ("/api/runs/{run_id}/items/{number}/", 3, {}),
        ("/api/runs/{run_id}/items/{number}/", 3, {"repeat": 2}),
        ("/api/runs/{run_id}/items/{number}/", 3, {"repeat": 0}),
        ("/api/runs/{run_id}/items/{number}/", 4, {}),
        ("/api/runs/{run_id}/items/{number}/", old, {}),
        ("/api/runs/{run_id}/items/{number}/labels/", old, {}),
    ]
    seen = []
    for path, number, query in calls:
        case = api_schema[path]["GET"].Case(
            path_parameters={"run_id": run.id, "number": number}, query=query
        )
        response = case.call_and_validate(headers=team_api, checks=CHECKS)
        seen.append(response.status_code)
    assert seen == [200, 200, 400, 404, 301, 301]


def test_an_address_that_is_no_item_number_is_a_json_404(api):  # noqa: F811
    for path in ("/api/runs/x/items/abc/", "/api/runs/%0Ax/items/abc/add-to-dataset/"):
        reply = api.post(path)
        assert reply.status_code == 404, path
        assert reply["Content-Type"] == "application/json", path  # a newline too
