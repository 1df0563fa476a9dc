"""Flaky items: flip rates and score variance over a hand-built history, `cobalt flaky`,
`--repeat-flaky`."""

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from cobalt import Dataset, Evaluator, experiment, load_config
from cobalt.experiments import collecting
from cobalt_app import flaky, launcher, results, services
from cobalt_app.engine import ItemOutcome
from cobalt_app.evaluators import EvalOutcome
from cobalt_app.flaky import Observation, item_flakiness
from cobalt_app.models import ItemResult, Run

KEYS = ("k1", "k2", "k3", "k4")


def define(name="hist", runs=1, runner=None):
    with collecting() as found:
        experiment(
            name,
            Dataset(items=[{"id": key, "input": key} for key in KEYS]),
            runner or (lambda ctx: ctx.item["input"]),
            evaluators=[Evaluator(name="score", type="function", fn=lambda ctx: {"score": 1.0})],
            runs=runs,
        )
    return found[0]


def record_run(outcomes, *, minutes, runs=1, parent=None):
    """A run of `hist` whose items had the given outcomes: key → [score or "error", ...]."""
    run = services.run_create(
        experiment=define(runs=runs), settings={"runs": runs, "concurrency": 1, "timeout": 30}
    )
    now = timezone.now()
    batch = []
    for snapshot in services.item_snapshots(run.id):
        verdict = outcomes[snapshot.item_key][snapshot.run_index]
        outcome = ItemOutcome(
            id=snapshot.id,
            item_index=snapshot.item_index,
            run_index=snapshot.run_index,
            item_key=snapshot.item_key,
            status="error" if verdict == "error" else "ok",
            output=None if verdict == "error" else snapshot.item_key,
            error="RuntimeError: boom" if verdict == "error" else "",
            latency_ms=5.0,
            started_at=now,
            finished_at=now,
        )
        if verdict != "error":
            outcome.evaluations = [EvalOutcome("score", verdict)]
        batch.append(outcome)
    services.record_item_outcomes(run.id, batch)
    Run.objects.filter(id=run.id).update(
        created_at=now - timedelta(minutes=100 - minutes), parent=parent
    )
    return results.run_finalise(run.id)


@pytest.fixture
def history(transactional_db):
    """k1: P F P P · k2: P P P F · k3: F F F F · k4: P E P P (E: the item errored)."""
    first = record_run({"k1": [0.9], "k2": [0.8], "k3": [0.2], "k4": [1.0]}, minutes=1)
    second = record_run({"k1": [0.3], "k2": [0.8], "k3": [0.1], "k4": ["error"]}, minutes=2)
    third = record_run(
        {"k1": [0.9, 0.9], "k2": [0.8, 0.4], "k3": [0.2, 0.1], "k4": [1.0, 1.0]},
        minutes=3,
        runs=2,
    )
    return first, second, third


# --- the computation --------------------------------------------------------------------------


def obs(key, status="ok", run="r1", run_index=0, **scores):
    return Observation(run, run_index, key, 0, status, scores)


def test_flip_rate_counts_verdict_changes_between_consecutive_observations():
    observations = [
        obs("a", score=0.9),
        obs("a", score=0.2, run="r2"),
        obs("a", score=0.7, run="r3"),
        obs("a", score=0.8, run="r3", run_index=1),
        obs("b", score=0.9),
        obs("b", score=0.9, run="r2"),
    ]
    found = item_flakiness(observations)
    a, b = found["a"], found["b"]
    assert (a.observations, a.passes, a.fails, a.flips) == (4, 3, 1, 2)
    assert a.flip_rate == pytest.approx(2 / 3) and a.pass_rate == 0.75 and a.runs == 3
    assert a.variance["score"] == pytest.approx(0.0725)  # mean 0.65: (.0625+.2025+.0025+.0225)/4
    assert a.flaky
    assert (b.flips, b.flip_rate, b.variance["score"], b.flaky) == (0, 0.0, 0.0, False)


def test_an_errored_item_is_a_fail_and_an_unscored_one_has_no_verdict():
    found = item_flakiness(
        [
            obs("a", score=0.9),
            obs("a", status="timeout", run="r2"),
            obs("a", run="r3"),  # evaluator errors only: no verdict
            obs("a", score=0.9, run="r4"),
        ]
    )["a"]
    assert (found.observations, found.errors, found.flips, found.runs) == (3, 1, 2, 4)


def test_every_evaluator_must_pass_and_the_pass_score_is_adjustable():
    observations = [obs("a", x=0.9, y=0.6), obs("a", run="r2", x=0.9, y=0.4)]
    assert item_flakiness(observations)["a"].flips == 1
    assert item_flakiness(observations, pass_score=0.3)["a"].flips == 0
    noisy = item_flakiness(observations, pass_score=0.3, min_stddev=0.1)["a"]
    assert noisy.flaky and noisy.max_variance == ("y", pytest.approx(0.01))


# --- the stored history -----------------------------------------------------------------------


def test_flip_rates_over_a_hand_built_history(history):
    report = flaky.flaky_report("hist")
    assert report.run_ids == [run.id for run in history]
    by_key = {item.key: item for item in report.items}
    k1, k2, k3, k4 = (by_key[k] for k in KEYS)
    assert (k1.observations, k1.flips, k1.flip_rate, k1.pass_rate) == (4, 2, 2 / 3, 0.75)
    assert k1.variance["score"] == pytest.approx(0.0675)  # 0.9 0.3 0.9 0.9
    assert (k2.flips, k2.flip_rate, k2.pass_rate) == (1, 1 / 3, 0.75)
    assert (k3.flips, k3.pass_rate, k3.flaky) == (0, 0.0, False)
    assert (k4.flips, k4.errors, k4.fails, k4.variance["score"]) == (2, 1, 1, 0.0)
    assert k1.runs == k2.runs == 3
    # Ranked: flip rate, then flips, then variance (k1 beats k4 on variance).
    assert [item.key for item in report.flaky] == ["k1", "k4", "k2"]
    data = report.to_dict(limit=2)
    assert data["flakyCount"] == 3 and [i["key"] for i in data["flaky"]] == ["k1", "k4"]
    assert data["flaky"][0]["flipRate"] == pytest.approx(2 / 3)


def test_the_window_of_runs_and_the_until_run_bound_the_history(history, django_assert_num_queries):
    first, second, third = history
    last_two = {item.key: item for item in flaky.flaky_report("hist", last=2).items}
    assert (last_two["k1"].observations, last_two["k1"].flips) == (3, 1)  # F P P
    assert (last_two["k2"].flips, last_two["k4"].flips) == (1, 1)
    until = {item.key: item for item in flaky.flaky_report("hist", until=second).items}
    assert until["k1"].observations == 2 and until["k2"].flips == 0
    with django_assert_num_queries(1):  # the run page pays one query for its marks
        marks = flaky.flaky_marks(second, ["k1", "k2", "k3"])
    assert set(marks) == {"k1"} and marks["k1"].summary.startswith("flipped 1× in 2 observations")
    assert flaky.flaky_marks(second, []) == {}


def test_rejudged_and_unfinished_runs_are_not_history(history):
    record_run({"k1": [0.0], "k2": [0.0], "k3": [0.9], "k4": [0.0]}, minutes=4, parent=history[2])
    Run.objects.create(name="hist", status=Run.Status.RUNNING)
    report = flaky.flaky_report("hist")
    assert report.run_ids == [run.id for run in history]


def test_an_unknown_experiment_is_named_with_a_suggestion(history):
    with pytest.raises(flaky.UnknownExperiment, match="no runs of an experiment named 'hsit'"):
        flaky.check_experiment("hsit")
    with pytest.raises(flaky.UnknownExperiment, match="did you mean 'hist'"):
        flaky.check_experiment("hist2")
    flaky.check_experiment("hist")
    assert flaky.flaky_report("never-ran").items == []


def test_repeat_flaky_runs_only_the_flaky_items_n_times(history, project):
    assert flaky.repetitions("hist", list(KEYS), 1, 3) == [3, 3, 1, 3]
    assert flaky.repetitions("hist", list(KEYS), 2, None) == [2, 2, 2, 2]
    assert flaky.repetitions("never-ran", list(KEYS), 1, 3) == [1, 1, 1, 1]

    config = load_config(project.path)
    (run,) = launcher.execute([define()], config, overrides={"repeat_flaky": 4})
    repetitions = {
        key: sorted(
            ItemResult.objects.filter(run=run, item_key=key).values_list("run_index", flat=True)
        )
        for key in KEYS
    }
    assert repetitions == {"k1": [0, 1, 2, 3], "k2": [0, 1, 2, 3], "k3": [0], "k4": [0, 1, 2, 3]}
    run.refresh_from_db()
    assert run.total_items == 13 and run.finished_items == 13 and run.status == "completed"
    assert run.config["repeat_flaky"] == 4
    repeated = run.summary["repetitions"]["items"]
    assert set(repeated) == {"k1", "k2", "k4"} and repeated["k1"]["score"]["n"] == 4


# --- the real command -----------------------------------------------------------------------

FLIPPER = """
import os

from cobalt import Dataset, Evaluator, experiment

SEED = int(os.environ.get("SEED", "0"))
items = [{"id": "steady", "input": "s"}, {"id": "coin", "input": "c"}, {"id": "broken", "input": "b"}]


def agent(ctx):
    if ctx.item["id"] == "steady":
        return 1.0
    if ctx.item["id"] == "coin":
        return float((SEED + ctx.run_index) % 2)
    return 0.0


experiment(
    "flipper",
    Dataset(items=items),
    agent,
    evaluators=[Evaluator(name="ok", type="function", fn=lambda ctx: {"score": ctx.output})],
)
"""


def test_cobalt_flaky_lists_the_items_that_flip_and_repeat_flaky_reruns_them(project, cobalt_cli):
    project.write("experiments/flipper.cobalt.py", FLIPPER)
    for seed in ("1", "2", "3"):
        assert cobalt_cli(project, "run", "-q", env={"SEED": seed}).returncode == 0

    listed = cobalt_cli(project, "flaky", "flipper")
    assert listed.returncode == 0, listed.stderr
    assert "flipper: 1 flaky of 3 items over the last 3 runs" in listed.stdout
    rows = [line.split() for line in listed.stdout.splitlines() if line.strip().startswith("coin")]
    # Key, item, flip rate, flips, observations, pass rate, errors, score sd (evaluator)
    assert rows == [["coin", "#2", "1.00", "2", "3", "0.67", "0", "0.47", "(ok)"]]
    assert "steady" not in listed.stdout and "broken" not in listed.stdout
    assert "--repeat-flaky" in listed.stdout

    data = json.loads(cobalt_cli(project, "flaky", "flipper", "--json").stdout)
    assert data["flakyCount"] == 1 and data["flaky"][0]["key"] == "coin"
    assert data["flaky"][0]["flips"] == 2 and len(data["runs"]) == 3

    one_run = cobalt_cli(project, "flaky", "flipper", "--last", "1")
    assert "0 flaky of 3 items over the last 1 run " in one_run.stdout
    assert "No item changed its verdict" in one_run.stdout

    repeated = cobalt_cli(project, "run", "--repeat-flaky", "4", env={"SEED": "4"})
    assert repeated.returncode == 0, repeated.stderr
    assert "3 items × 1 run × 1 evaluator + 3 repetitions of flaky items" in repeated.stdout
    newest = max(project.results_files(), key=lambda p: p.stat().st_mtime)
    entries = json.loads(newest.read_text())["items"]
    by_key = {}
    for entry in entries:
        by_key.setdefault(entry["key"], []).append(entry["runIndex"])
    assert by_key == {"steady": [0], "coin": [0, 1, 2, 3], "broken": [0]}
    # Across its four repetitions the coin flipped three times.
    after = json.loads(cobalt_cli(project, "flaky", "flipper", "--json", "--last", "1").stdout)
    assert after["flaky"][0]["flips"] == 3 and after["flaky"][0]["observations"] == 4

    unknown = cobalt_cli(project, "flaky", "fliper")
    assert unknown.returncode == 2 and "did you mean 'flipper'" in unknown.stderr
    misuse = cobalt_cli(project, "run", "--repeat-flaky", "3", "--resume", "abcd")
    assert misuse.returncode == 2 and "--repeat-flaky plans a new run" in misuse.stderr
