import math

import pytest

from cobalt.stats import describe, percentile


def test_percentiles_interpolate_linearly_at_rank_p_times_n_minus_one():
    values = [0.1, 0.2, 0.4, 0.8]
    assert percentile(values, 50) == pytest.approx(0.3)
    assert percentile(values, 95) == pytest.approx(0.4 + 0.4 * 0.85)
    assert percentile(values, 0) == 0.1
    assert percentile(values, 100) == 0.8
    assert percentile([0.5], 99) == 0.5
    assert percentile([], 50) is None


def test_describe_gives_every_statistic_with_population_stddev():
    stats = describe([0.0, 0.5, 1.0, 1.0], errors=2)
    assert stats["avg"] == pytest.approx(0.625)
    assert stats["min"] == 0.0
    assert stats["max"] == 1.0
    assert stats["p50"] == pytest.approx(0.75)
    assert stats["p99"] == pytest.approx(1.0)
    assert stats["stddev"] == pytest.approx(math.sqrt(0.171875))
    assert stats["count"] == 4
    assert stats["errors"] == 2
    assert stats["passRate"] == 0.75


def test_describe_without_scores_reports_no_average_instead_of_zero():
    stats = describe([], errors=9)
    assert stats["avg"] is None
    assert stats["count"] == 0
    assert stats["errors"] == 9


SCORES = [1.0, 1.0, 1.0, 0.2]


@pytest.mark.django_db(transaction=True)
def test_a_runs_95_percent_interval_stays_inside_the_score_range(project):
    """The t-interval of [1, 1, 1, 0.2] is about [0.16, 1.44]: its top is cut to 1, the
    mean, its bottom and the other statistics are as computed."""
    from cobalt import Dataset, Evaluator
    from cobalt.config import load_config
    from cobalt.experiments import Experiment
    from cobalt_app import launcher

    dataset = Dataset(items=[{"id": str(i), "score": s} for i, s in enumerate(SCORES)])
    scored = Evaluator(name="s", type="function", fn=lambda ctx: ctx.item["score"])
    experiment = Experiment("ci", dataset, lambda ctx: "out", evaluators=[scored])

    (run,) = launcher.execute([experiment], load_config(project.path))

    summary = run.summary["scores"]["s"]
    ci = summary["ci95"]
    assert (ci["method"], ci["high"]) == ("t", 1.0)
    half = 3.182446305284 * math.sqrt(sum((s - 0.8) ** 2 for s in SCORES) / 3) / 2
    assert ci["low"] == pytest.approx(0.8 - half) and 0 < ci["low"] < 0.2
    assert ci["mean"] == pytest.approx(0.8) and summary["avg"] == pytest.approx(0.8)
    assert (summary["min"], summary["max"], summary["count"]) == (0.2, 1.0, 4)
