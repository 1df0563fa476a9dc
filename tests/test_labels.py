"""Human labels (cobalt_app/labels.py): what a label is attached to, when it reads stale, who
disagrees with the judge, the review queue's order, and every bad input refused by name."""

from __future__ import annotations

import math

import pytest

from cobalt_app import labels
from cobalt_app.labels import LabelConflict, LabelError, LabelNotFound, label_save, run_labels
from cobalt_app.models import ItemResult, Label, Run
from tests.test_pages import keys, make_run

pytestmark = pytest.mark.django_db


def item(run: Run, key: str, repetition: int = 0) -> ItemResult:
    return ItemResult.objects.get(run=run, item_key=key, run_index=repetition)


def save(run: Run, key: str, verdict: str = "fail", **fields) -> Label:
    fields.setdefault("evaluator", "judge")
    fields.setdefault("reviewer", "ana")
    return label_save(run=run, item_id=item(run, key).id, verdict=verdict, **fields)


def test_a_label_stays_with_its_output_in_later_runs_and_reads_stale_when_it_changed():
    first = make_run("qa", keys=keys(3), scores={"k000": {"judge": 0.9}})
    save(first, "k000", "fail", note="the answer is wrong", expected_output="Lyon")
    # The same outputs again (a re-judge, a replayed or cached run), but k000 now differs.
    same = make_run("qa", keys=keys(3))
    changed = make_run("qa", keys=keys(3), outputs={"k000": "a new answer"})
    other = make_run("other-experiment", keys=keys(3))

    [row] = run_labels(same)
    assert (row.item_index, row.stale, row.label.verdict) == (0, False, "fail")
    assert row.as_json()["expectedOutput"] == "Lyon"
    assert row.as_json()["labelledRun"] == first.id
    [stale] = run_labels(changed)
    assert stale.stale and not stale.disagrees
    assert run_labels(changed, stale=False) == []
    assert run_labels(other) == []


def test_several_reviewers_keep_their_own_labels_and_each_disagreement_is_listed():
    run = make_run("qa", keys=keys(2), scores={"k000": {"judge": 0.9}, "k001": {"judge": 0.1}})
    save(run, "k000", "fail", reviewer="ana")
    save(run, "k000", "pass", reviewer="ben")
    save(run, "k001", "fail", reviewer="ana")

    rows = run_labels(run)
    assert [(r.item_index, r.label.reviewer, r.label.verdict) for r in rows] == [
        (0, "ana", "fail"),
        (0, "ben", "pass"),
        (1, "ana", "fail"),
    ]
    [disagreement] = labels.label_list(run, disagrees=True)
    assert (disagreement.label.reviewer, disagreement.judge_score) == ("ana", 0.9)
    assert disagreement.as_json()["judgeVerdict"] == "pass"
    summary = labels.label_summary(run)
    assert summary == {
        "labels": 3,
        "stale": 0,
        "itemsLabelled": 2,
        "reviewers": ["ana", "ben"],
        "disagreements": 1,
    }


def test_a_disagreement_follows_the_evaluators_pass_threshold():
    run = make_run("qa", keys=keys(1), scores={"k000": {"judge": 0.6}})
    config = run.config
    for described in config["evaluators"]:
        described["pass_threshold"] = 0.8
    Run.objects.filter(id=run.id).update(config=config)
    run.refresh_from_db()
    save(run, "k000", "pass")
    [row] = run_labels(run)
    assert str(row.judge_verdict) == "fail" and row.disagrees
    # A corrected score without a verdict is judged by the same mark.
    label = save(run, "k000", None, reviewer="ben", score=0.7)
    assert label.verdict == "fail"


def test_saving_again_changes_the_label_and_a_stale_version_is_refused():
    run = make_run("qa", keys=keys(1))
    label = save(run, "k000", "fail")
    assert label.version == 1
    changed = save(run, "k000", "pass", version=1, note="on second thoughts")
    assert (changed.id, changed.version, changed.verdict) == (label.id, 2, "pass")
    with pytest.raises(LabelConflict, match=r"changed since you read it \(it is at version 2"):
        save(run, "k000", "fail", version=1, note="my edit")
    assert Label.objects.get(id=label.id).note == "on second thoughts"
    with pytest.raises(LabelConflict, match="changed since you read it"):
        save(run, "k000", "fail", reviewer="ben", version=3)
    assert Label.objects.count() == 1


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"evaluator": "relevance"}, r"evaluator: run \w+ has no evaluator 'relevance' \(it has"),
        ({"score": 1.7}, r"score: 1.7 is outside 0..1"),
        ({"score": math.nan}, r"score: nan is outside 0..1"),
        ({"score": "high"}, r"score: 'high' is not a number"),
        ({"verdict": "maybe"}, r"verdict: 'maybe' is not 'pass' or 'fail'"),
        ({"verdict": None}, r"verdict: give 'pass' or 'fail'"),
        ({"reviewer": "  "}, r"reviewer: a user name"),
        ({"expected_output": {1, 2}}, r"expected_output .*a corrected expected output"),
    ],
)
def test_a_bad_label_is_refused_by_name_and_nothing_is_stored(fields, message):
    run = make_run("qa", keys=keys(1))
    fields.setdefault("verdict", "fail")
    with pytest.raises(LabelError, match=message):
        save(run, "k000", **fields)
    assert not Label.objects.exists()


def test_an_unknown_item_and_a_running_run_are_refused():
    run = make_run("qa", keys=keys(2))
    with pytest.raises(LabelNotFound, match=rf"run {run.id} has no item with id 999999"):
        label_save(run=run, item_id=999999, evaluator="judge", reviewer="ana", verdict="fail")
    running = make_run("qa", keys=keys(2), finish=False)
    with pytest.raises(LabelConflict, match="is still running: label its items once it"):
        save(running, "k000")
    assert not Label.objects.exists()


def test_secrets_in_a_note_are_not_stored():
    run = make_run("qa", keys=keys(1))
    save(run, "k000", note="it leaked api_key=sk-live-abcdef123456 in the reply")
    assert "sk-live-abcdef123456" not in Label.objects.get().note


def test_the_review_queue_puts_failures_and_borderline_items_first_then_a_seeded_shuffle():
    scores = {key: {"judge": 1.0} for key in keys(12)}
    scores["k005"] = {"judge": 0.2}
    scores["k009"] = {"judge": 0.0}
    scores["k003"] = {"judge": 0.55}  # borderline: passes by less than 0.1
    run = make_run("qa", keys=keys(12), scores=scores)
    queue = labels.review_queue(run, "judge", reviewer="ana")
    ids = {i.item_key: i.id for i in ItemResult.objects.filter(run=run)}
    assert queue.item_ids[:3] == [ids["k009"], ids["k005"], ids["k003"]]
    rest = queue.item_ids[3:]
    assert sorted(rest) == sorted(set(ids.values()) - set(queue.item_ids[:3]))
    assert rest != sorted(rest)  # shuffled (this seed does not leave them in order)
    assert labels.review_queue(run, "judge", reviewer="ben").item_ids == queue.item_ids
    assert (queue.done, queue.total) == (0, 12)

    save(run, "k009", "fail")
    queue = labels.review_queue(run, "judge", reviewer="ana")
    assert (queue.done, queue.next_after(ids["k009"])) == (1, ids["k005"])
    assert labels.review_queue(run, "judge", reviewer="ben").done == 0
    with pytest.raises(LabelError, match="has no evaluator 'nope'"):
        labels.review_queue(run, "nope", reviewer="ana")


def test_the_output_hash_is_canonical():
    assert labels.output_hash({"a": 1, "b": [1, 2]}) == labels.output_hash({"b": [1, 2], "a": 1})
    assert labels.output_hash("Paris") != labels.output_hash("Paris ")
    assert labels.output_hash(None) != labels.output_hash("null ")
