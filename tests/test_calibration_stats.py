"""The calibration statistics (cobalt/calibration.py) against known truths: seeded simulations
of label sets drawn with a known TPR, TNR and prevalence, and scikit-learn's κ."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import cohen_kappa_score

from cobalt.calibration import (
    NOT_ENOUGH,
    ONE_CLASS,
    agreement,
    certify,
    corrected_pass_rate,
    krippendorff_alpha,
    reviewer_agreement,
    wilson,
)

SETS = 1000
TPR, TNR, PREVALENCE = 0.9, 0.7, 0.6


def _draw(rng: np.random.Generator, n: int, prevalence: float = PREVALENCE):
    """`SETS` label sets of `n` items: human verdicts (the truth) and the judge's."""
    human = rng.random((SETS, n)) < prevalence
    judge = np.where(human, rng.random((SETS, n)) < TPR, rng.random((SETS, n)) >= TNR)
    return judge, human


def _true_kappa(prevalence: float) -> float:
    tp, fn = prevalence * TPR, prevalence * (1 - TPR)
    fp, tn = (1 - prevalence) * (1 - TNR), (1 - prevalence) * TNR
    observed = tp + tn
    chance = (tp + fn) * (tp + fp) + (fp + tn) * (fn + tn)
    return (observed - chance) / (1 - chance)


def test_the_kappa_interval_covers_the_true_kappa_in_about_95_percent_of_label_sets():
    judge, human = _draw(np.random.default_rng(20261127), 150)
    truth = _true_kappa(PREVALENCE)
    covered = 0
    for j, h in zip(judge, human, strict=True):
        result = agreement(j.tolist(), h.tolist())
        covered += result.kappa_low <= truth <= result.kappa_high
    coverage = covered / SETS
    print(f"κ interval coverage: {coverage:.3f} (true κ {truth:.3f})")
    assert 0.93 <= coverage <= 0.97


def test_the_corrected_pass_rate_covers_the_truth_where_the_raw_rate_does_not():
    rng = np.random.default_rng(7)
    labels_judge, labels_human = _draw(rng, 200)  # the calibration labels
    run_judge, _ = _draw(rng, 300)  # the run: 300 items judged, the truth is PREVALENCE
    raw_covered = corrected_covered = 0
    for index in range(SETS):
        calibration = agreement(labels_judge[index].tolist(), labels_human[index].tolist())
        passes = int(run_judge[index].sum())
        corrected = corrected_pass_rate(passes, 300, calibration, seed=index, draws=2000)
        corrected_covered += corrected.low <= PREVALENCE <= corrected.high
        low, high = wilson(passes, 300)
        raw_covered += low <= PREVALENCE <= high
    print(
        f"coverage of the true pass rate: corrected {corrected_covered / SETS:.3f}, raw {raw_covered / SETS:.3f}"
    )
    assert corrected_covered / SETS >= 0.93
    assert raw_covered / SETS < 0.5


def test_kappa_equals_scikit_learns_cohen_kappa_score():
    rng = np.random.default_rng(3)
    for size in (10, 37, 200):
        for prevalence in (0.1, 0.5, 0.9):
            judge, human = _draw(rng, size, prevalence)
            for j, h in zip(judge[:20], human[:20], strict=True):
                result = agreement(j.tolist(), h.tolist())
                if result.kappa is None:
                    assert len(set(h.tolist())) == 1
                    continue
                assert result.kappa == pytest.approx(cohen_kappa_score(h, j), abs=1e-9)


def test_a_handful_of_labels_gives_no_numbers_and_one_class_says_kappa_is_undefined():
    few = agreement([True, False, True], [True, False, False])
    assert few.state == NOT_ENOUGH and few.kappa is None and few.tpr.low is None
    one = agreement([True] * 15 + [False] * 5, [True] * 20)
    assert one.state == ONE_CLASS and one.kappa is None
    assert one.tpr.value == 0.75 and one.tnr.value is None
    assert "30 more 'fail' labels needed" in certify(one).summary


def test_the_certificate_counts_the_labels_each_class_still_needs():
    # 62 pass labels and 18 fail labels, a judge that agrees on all but a few.
    judge = [True] * 60 + [False] * 2 + [False] * 17 + [True]
    human = [True] * 62 + [False] * 18
    certificate = certify(agreement(judge, human))
    assert not certificate.calibrated
    assert certificate.summary == "not calibrated: 12 more 'fail' labels needed"
    assert certificate.needed == {"pass": 0, "fail": 12}
    judge = [True] * 60 + [False] * 2 + [False] * 29 + [True]
    human = [True] * 62 + [False] * 30
    assert certify(agreement(judge, human)).calibrated


def test_a_judge_whose_rate_is_below_the_mark_is_told_labels_will_not_certify_it():
    human = [True] * 40 + [False] * 40
    judge = [True] * 40 + [True] * 16 + [False] * 24  # TNR 0.6
    certificate = certify(agreement(judge, human))
    assert not certificate.calibrated
    assert "TNR lower bound" in certificate.summary and "improve the judge" in certificate.summary


def test_a_judge_near_the_mark_is_told_how_many_more_labels_lift_its_lower_bound():
    human = [True] * 40 + [False] * 40
    judge = [True] * 40 + [True] * 5 + [False] * 35  # TNR 0.875, lower bound 0.74
    certificate = certify(agreement(judge, human))
    assert not certificate.calibrated and certificate.needed["fail"] > 0
    assert f"~{certificate.needed['fail']} more 'fail' labels needed" in certificate.summary


def test_reviewer_agreement_is_cohens_kappa_for_two_and_krippendorffs_alpha_for_more():
    rng = np.random.default_rng(5)
    first = (rng.random(40) < 0.5).tolist()
    second = [v if rng.random() < 0.8 else not v for v in first]
    two = reviewer_agreement(
        {"ann": dict(enumerate(first)), "bo": dict(enumerate(second))}  # type: ignore[arg-type]
    )
    assert two.method == "cohen_kappa"
    assert two.value == pytest.approx(cohen_kappa_score(first, second), abs=1e-9)
    assert two.disagreements == sum(a != b for a, b in zip(first, second, strict=True))
    # Krippendorff's (2011) worked example reduced to two values: α for complete agreement is 1.
    assert krippendorff_alpha([[True, True], [False, False, False], [True, True, True]]) == 1.0
    # A textbook case: 2 raters, 4 units, one disagreement, α = 1 - (7 · 1) / (2 · 4 · 4 / 1).
    units = [[True, True], [True, False], [False, False], [True, True]]
    assert krippendorff_alpha(units) == pytest.approx(1 - 7 * 1 / (5 * 3), abs=1e-12)
    three = reviewer_agreement({name: dict(enumerate(first)) for name in ("a", "b", "c")})  # type: ignore[arg-type]
    assert three.method == "krippendorff_alpha" and three.value == pytest.approx(1.0)
    alone = reviewer_agreement({"ann": dict(enumerate(first))})  # type: ignore[arg-type]
    assert alone.value is None and "one reviewer" in alone.state


def test_the_wilson_interval_is_scipys_without_importing_it():
    from scipy import stats

    for successes, total, confidence in [
        (0, 10, 0.95),
        (62, 80, 0.95),
        (45, 300, 0.95),
        (7, 20, 0.9),
    ]:
        expected = stats.binomtest(successes, total).proportion_ci(
            confidence_level=confidence, method="wilson"
        )
        low, high = wilson(successes, total, confidence)
        assert low == pytest.approx(expected.low, abs=1e-12)
        assert high == pytest.approx(expected.high, abs=1e-12)
