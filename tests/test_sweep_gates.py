"""`[ci.sweep]` through the real `cobalt run --ci`: both forms of the gate, each passing and
each failing, with the exit code and the line that says why."""

from __future__ import annotations

import pytest

from cobalt.gates import check_sweep

# Thirty questions; `good` answers all, `close` misses one, `bad` misses every other one.
GATE_FILE = """
import cobalt
from cobalt import Dataset, Evaluator

MISSES = {"good": set(), "close": {0}, "bad": set(range(0, 30, 2))}

cobalt.experiment(
    "gates", Dataset(items=[{"id": f"q{i:02d}", "n": i} for i in range(30)]),
    lambda ctx: "no" if ctx.item["n"] in MISSES[ctx.variant["level"]] else "yes",
    evaluators=[Evaluator(name="yes", type="function", fn=lambda c: float(c.output == "yes"))],
    variants={"level": ["good", "close", "bad"]},
    default_variant={"level": "close"},
)
"""


@pytest.mark.parametrize(
    ("gate", "code", "says"),
    [
        (
            'require = "not-worse-than-best"',  # the default, `close`: one item apart
            0,
            "✓ sweep gates not worse than best: passed: level=close vs best level=good: "
            "Δ -0.033, Holm p 1 at α 0.05 → not significantly worse",
        ),
        (
            'require = "not-worse-than-best"\nvariant = "level=bad"',
            1,
            "sweep gates not worse than best: FAILED: level=bad vs best level=good: Δ -0.500, "
            "Holm p 0.000122 at α 0.05 → worse than the best",
        ),
        (
            'require = "candidate-beats-default"\nvariant = "level=bad"\ncandidate = "level=good"',
            0,
            "✓ sweep gates candidate beats default: passed: level=good vs default level=bad: "
            "Δ +0.500, p 6.1e-05 (mcnemar, 30 items)",
        ),
        (
            'require = "candidate-beats-default"\ncandidate = "level=good"',  # vs `close`
            1,
            "sweep gates candidate beats default: FAILED: level=good vs default level=close: "
            "Δ +0.033, p 1 (mcnemar, 30 items)",
        ),
    ],
    ids=["not-worse-passes", "not-worse-fails", "beats-passes", "beats-fails"],
)
def test_cobalt_run_ci_gates_a_sweep(project, cobalt_cli, gate, code, says):
    project.write("experiments/gates.cobalt.py", GATE_FILE)
    project.write("cobalt.toml", f'test_dir = "experiments"\n[ci.sweep]\n{gate}\n')
    done = cobalt_cli(project, "run", "--ci")
    assert done.returncode == code, done.stdout + done.stderr
    assert says in " ".join(done.stdout.split()), done.stdout
    assert ("CI passed (3 runs)" if code == 0 else "CI failed: 1 violation (exit 1)") in done.stdout


def test_a_chosen_variant_without_any_score_is_not_called_not_worse():
    result = {
        "name": "qa",
        "best": "model=a",
        "variants": [
            {"label": "model=a", "isBest": True, "meanScore": 0.9, "vsBest": None},
            {"label": "model=b", "isBest": False, "meanScore": None, "vsBest": None, "errors": 20},
        ],
    }
    check = check_sweep({"require": "not-worse-than-best"}, result, "model=b", {})
    assert not check.passed
    assert (
        check.line()
        == "sweep qa not worse than best: FAILED: model=b has no score (20 items errored)"
    )


def test_the_gates_alpha_decides_not_the_analysis_default():
    row = {"label": "b", "isBest": False, "meanScore": 0.8,
           "vsBest": {"delta": -0.1, "pHolm": 0.03, "verdict": "worse than the best"}}  # fmt: skip
    result = {"name": "qa", "best": "a", "variants": [row]}
    strict = check_sweep({"require": "not-worse-than-best", "alpha": 0.01}, result, "b", {})
    assert strict.passed and "at α 0.01 → not significantly worse" in strict.line()
    assert not check_sweep({"require": "not-worse-than-best"}, result, "b", {}).passed
