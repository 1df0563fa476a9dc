"""Signal or noise: intervals, paired tests and verdicts (known answers), then the real CLI.

The simulations are seeded, so each assertion is about a fixed set of draws and either always
passes or always fails; the bounds are the binomial 99.9% range around the nominal rate.
"""

import json
import math
import re
import sys
from pathlib import Path

import anyio
import httpx
import numpy as np
import pytest
from scipy import stats

from cobalt import significance
from cobalt.significance import (
    IMPROVED,
    INSUFFICIENT,
    NO_CHANGE,
    REGRESSED,
    mcnemar,
    mean_ci,
    mean_difference_ci,
    paired_compare,
    pass_at_k,
    pass_k_table,
)
from tests.conftest import cli_env, start_server


def keyed(values):
    return {f"item-{i:03d}": float(v) for i, v in enumerate(values)}


# --- paired comparison: known answers ---------------------------------------------------------


def test_every_score_dropping_by_a_tenth_over_200_items_is_a_regression_with_p_below_0_001():
    rng = np.random.default_rng(7)
    before = rng.uniform(0.3, 1.0, 200)
    result = paired_compare(keyed(before), keyed(before - 0.1))
    assert result["verdict"] == REGRESSED
    assert result["test"] == "wilcoxon" and result["kind"] == "score"
    assert result["pValue"] < 0.001
    assert result["n"] == 200
    assert result["delta"] == pytest.approx(-0.1)
    assert result["ci"]["low"] == pytest.approx(-0.1) and result["ci"]["high"] == pytest.approx(
        -0.1
    )


def test_a_noisy_drop_of_a_tenth_is_a_regression_and_its_interval_covers_it():
    rng = np.random.default_rng(8)
    before = rng.uniform(0.3, 1.0, 200)
    after = before - 0.1 + rng.normal(0, 0.1, 200)
    result = paired_compare(keyed(before), keyed(after))
    assert result["verdict"] == REGRESSED and result["pValue"] < 0.001
    assert result["ci"]["method"] == "bootstrap" and result["ci"]["level"] == 0.95
    assert result["ci"]["low"] < -0.1 + 0.02 and result["ci"]["high"] > -0.1 - 0.02
    assert result["ci"]["low"] < result["delta"] < result["ci"]["high"] < 0


def test_a_rise_is_an_improvement():
    rng = np.random.default_rng(9)
    before = rng.uniform(0.0, 0.7, 100)
    result = paired_compare(keyed(before), keyed(before + rng.uniform(0.05, 0.2, 100)))
    assert result["verdict"] == IMPROVED and result["delta"] > 0


def test_runs_from_the_same_distribution_show_no_significant_change_in_at_least_90_of_100_trials():
    rng = np.random.default_rng(2024)
    item_quality = rng.uniform(0.2, 0.9, (100, 200))
    a = np.clip(item_quality + rng.normal(0, 0.15, (100, 200)), 0, 1)
    b = np.clip(item_quality + rng.normal(0, 0.15, (100, 200)), 0, 1)
    verdicts = [paired_compare(keyed(a[t]), keyed(b[t]))["verdict"] for t in range(100)]
    assert verdicts.count(NO_CHANGE) >= 90, verdicts
    assert set(verdicts) <= {NO_CHANGE, REGRESSED, IMPROVED}


def test_pass_fail_runs_from_the_same_distribution_use_mcnemar_and_mostly_show_no_change():
    rng = np.random.default_rng(2025)
    p = rng.uniform(0.1, 0.9, (100, 200))
    a = (rng.uniform(size=(100, 200)) < p).astype(float)
    b = (rng.uniform(size=(100, 200)) < p).astype(float)
    results = [paired_compare(keyed(a[t]), keyed(b[t])) for t in range(100)]
    assert {r["test"] for r in results} == {"mcnemar"}
    assert sum(r["verdict"] == NO_CHANGE for r in results) >= 90


def test_mcnemar_matches_hand_computed_tables():
    # Exact: b=10 discordant one way, c=2 the other → 2·P(X ≤ 2), X ~ Bin(12, ½) = 2·79/4096.
    assert mcnemar(10, 2) == pytest.approx(2 * (1 + 12 + 66) / 4096)
    assert mcnemar(2, 10) == pytest.approx(158 / 4096)
    # Chi-square with continuity correction: (|30 − 12| − 1)² / 42 = 289/42 on 1 df.
    statistic = (abs(30 - 12) - 1) ** 2 / 42
    assert mcnemar(30, 12) == pytest.approx(math.erfc(math.sqrt(statistic / 2)))
    assert mcnemar(30, 12) == pytest.approx(0.008711, abs=1e-6)
    assert mcnemar(5, 5) == pytest.approx(1.0)
    assert mcnemar(0, 0) == 1.0
    with pytest.raises(ValueError):
        mcnemar(-1, 3)


def test_paired_compare_builds_the_mcnemar_table_from_pass_fail_items():
    # 50 pass→pass, 10 pass→fail, 2 fail→pass, 38 fail→fail.
    a = [1] * 50 + [1] * 10 + [0] * 2 + [0] * 38
    b = [1] * 50 + [0] * 10 + [1] * 2 + [0] * 38
    result = paired_compare(keyed(a), keyed(b))
    assert result["test"] == "mcnemar" and result["kind"] == "pass/fail"
    assert result["table"] == {"passPass": 50, "passFail": 10, "failPass": 2, "failFail": 38}
    assert result["pValue"] == pytest.approx(158 / 4096)
    assert result["delta"] == pytest.approx(-0.08)
    assert result["verdict"] == REGRESSED
    assert paired_compare(keyed(a), keyed(b), alpha=0.01)["verdict"] == NO_CHANGE


def test_items_present_in_only_one_run_are_counted_and_listed_not_dropped():
    a = {"shared-1": 0.5, "shared-2": 0.7, "shared-3": 0.2, "gone": 0.9}
    b = {"shared-1": 0.4, "shared-2": 0.6, "shared-3": 0.1, "new-1": 0.3, "new-2": 0.1}
    result = paired_compare(a, b)
    assert result["n"] == 3
    assert result["onlyInA"] == 1 and result["onlyInAKeys"] == ["gone"]
    assert result["onlyInB"] == 2 and result["onlyInBKeys"] == ["new-1", "new-2"]


def test_too_few_pairs_give_no_verdict_and_identical_runs_give_no_change():
    assert paired_compare({"x": 1.0}, {"x": 0.0})["verdict"] == INSUFFICIENT
    assert paired_compare({}, {"y": 1.0})["verdict"] == INSUFFICIENT
    same = keyed([0.3, 0.5, 0.8, 0.9])
    result = paired_compare(same, same)
    assert result["verdict"] == NO_CHANGE and result["pValue"] == 1.0
    assert result["ci"] == {"low": 0.0, "high": 0.0, "level": 0.95, "method": "exact"}


def test_the_bootstrap_interval_is_the_same_every_time():
    rng = np.random.default_rng(3)
    a, b = keyed(rng.uniform(size=80)), keyed(rng.uniform(size=80))
    assert paired_compare(a, b)["ci"] == paired_compare(a, b)["ci"]


def test_bad_significance_levels_are_refused_with_a_clear_message():
    for bad in (0, 0.7, -0.1, "abc", float("nan")):
        with pytest.raises(ValueError, match="significance level"):
            significance.check_alpha(bad)
    assert significance.check_alpha("0.01") == 0.01


# --- confidence intervals ---------------------------------------------------------------------


def test_t_and_wilson_intervals_match_scipy():
    data = [0.1, 0.5, 0.9, 0.3, 0.65]
    ci = mean_ci(data)
    low, high = stats.t.interval(0.95, 4, loc=np.mean(data), scale=stats.sem(data))
    assert ci["method"] == "t" and (ci["low"], ci["high"]) == pytest.approx((low, high))
    ci = mean_ci([1, 1, 1, 0, 1, 0, 1])
    expected = stats.binomtest(5, 7).proportion_ci(0.95, method="wilson")
    assert ci["method"] == "wilson"
    assert (ci["low"], ci["high"]) == pytest.approx((expected.low, expected.high))
    assert mean_ci([0.4]) is None
    assert mean_ci([0.5, 0.5, 0.5])["low"] == 0.5


def test_the_t_interval_covers_the_true_mean_about_95_percent_of_the_time():
    rng = np.random.default_rng(11)
    alpha_, beta_ = 2.0, 5.0
    true_mean = alpha_ / (alpha_ + beta_)
    samples = rng.beta(alpha_, beta_, (2000, 30))
    covered = 0
    for sample in samples:
        ci = mean_ci(sample)
        covered += ci["low"] <= true_mean <= ci["high"]
    assert 0.93 <= covered / 2000 <= 0.97, covered


def test_the_wilson_interval_covers_the_true_pass_rate_about_95_percent_of_the_time():
    rng = np.random.default_rng(12)
    samples = (rng.uniform(size=(2000, 40)) < 0.3).astype(float)
    covered = sum((ci := mean_ci(sample))["low"] <= 0.3 <= ci["high"] for sample in samples)
    assert 0.92 <= covered / 2000 <= 0.98, covered


def test_the_paired_bootstrap_interval_covers_the_true_difference_about_95_percent_of_the_time():
    rng = np.random.default_rng(13)
    differences = rng.normal(-0.05, 0.2, (300, 80))
    covered = 0
    for sample in differences:
        ci = mean_difference_ci(sample)
        covered += ci["low"] <= -0.05 <= ci["high"]
    assert 0.91 <= covered / 300 <= 0.98, covered


def test_large_comparisons_use_the_t_interval():
    rng = np.random.default_rng(14)
    ci = mean_difference_ci(rng.normal(0.1, 0.2, significance.BOOTSTRAP_MAX_PAIRS + 1))
    assert ci["method"] == "t" and ci["low"] < 0.1 < ci["high"]


# --- repetitions --------------------------------------------------------------------------------


def test_pass_at_k_and_pass_hat_k_have_their_known_values():
    # One pass in three trials: pass@1 1/3, pass@2 = 1 − C(2,2)/C(3,2) = 2/3, pass@3 = 1.
    assert pass_at_k(1, 3, 1) == pytest.approx((1 / 3, 1 / 3))
    assert pass_at_k(1, 3, 2) == pytest.approx((2 / 3, 0.0))
    assert pass_at_k(1, 3, 3) == pytest.approx((1.0, 0.0))
    # Two of three: pass^2 = C(2,2)/C(3,2) = 1/3.
    assert pass_at_k(2, 3, 2) == pytest.approx((1.0, 1 / 3))
    with pytest.raises(ValueError):
        pass_at_k(1, 3, 4)
    # Four items of three trials, by (passes, trials): 1/3, 2/3, 3/3 and 0/3.
    table = pass_k_table({(1, 3): 1, (2, 3): 1, (3, 3): 1, (0, 3): 1}, 3)
    assert table["k"] == 3
    assert table["passAtK"]["3"] == pytest.approx(0.75)
    assert table["passHatK"]["3"] == pytest.approx(0.25)
    assert table["passAtK"]["1"] == pytest.approx(0.5)
    doubled = pass_k_table({(1, 3): 2, (2, 3): 2, (3, 3): 2, (0, 3): 2}, 3)
    assert doubled == {**table, "items": {"1": 8, "2": 8, "3": 8}}  # the same averages
    assert pass_k_table({}, 2) is None


def test_run_statistics_count_each_item_once_in_the_interval():
    by_item = {
        "a": {"quality": [0.2, 0.4, 0.6], "exact": [1, 1, 0]},
        "b": {"quality": [0.8, 0.8, 0.8], "exact": [1, 1, 1]},
        "c": {"quality": [0.5], "exact": [0]},
    }
    result = significance.run_statistics(by_item.items(), ["quality", "exact", "absent"], runs=3)
    assert result["scores"]["quality"].tolist() == [0.2, 0.4, 0.6, 0.8, 0.8, 0.8, 0.5]
    assert result["scores"]["absent"].size == 0
    assert result["ci95"]["quality"]["n"] == 3
    assert result["ci95"]["quality"]["mean"] == pytest.approx((0.4 + 0.8 + 0.5) / 3)
    assert result["ci95"]["absent"] is None
    assert "quality" not in result["passAtK"]
    exact = result["passAtK"]["exact"]
    assert exact["items"] == {"1": 3, "2": 2, "3": 2}
    assert exact["passHatK"]["3"] == pytest.approx(0.5)
    items = result["repetitions"]["items"]
    assert set(items) == {"a", "b"}  # "c" ran once
    assert items["a"]["quality"] == pytest.approx(
        {"mean": 0.4, "stddev": math.sqrt(0.08 / 3), "min": 0.2, "max": 0.6, "n": 3}
    )
    assert significance.run_statistics([("a", {"q": [0.5]})], ["q"])["repetitions"] is None
    mixed = [("a", {"q": [1.0, 0.0]}), ("b", {"q": [0.5, 1.0]})]
    assert significance.run_statistics(mixed, ["q"], runs=2)["passAtK"] == {}  # not pass/fail


# --- the real command -----------------------------------------------------------------------

NOISY = """
import os
import random

from cobalt import Dataset, Evaluator, experiment

SHIFT = float(os.environ.get("SHIFT", "0"))
SEED = os.environ.get("SEED", "0")

dataset = Dataset(items=[{"id": f"q{i}", "base": 0.3 + 0.4 * ((i * 37) % 100) / 100} for i in range(200)])


def agent(ctx):
    rng = random.Random(f"{SEED}-{ctx.item['id']}-{ctx.run_index}")
    return {"output": min(1.0, max(0.0, ctx.item["base"] + SHIFT + rng.gauss(0, 0.1)))}


evaluators = [
    Evaluator(name="quality", type="function", fn=lambda ctx: {"score": ctx.output}),
    Evaluator(name="passed", type="function", fn=lambda ctx: {"score": float(ctx.output >= 0.5)}),
]

experiment("noisy", dataset, agent, evaluators=evaluators, runs=int(os.environ.get("RUNS", "1")))
"""


def run_id_of(result):
    for line in result.stdout.splitlines():
        if "Run ID:" in line:
            return line.split("Run ID:")[1].strip()
    for line in result.stdout.splitlines():
        if "· run " in line:
            return line.split("· run ")[1].split()[0]
    raise AssertionError(f"no run id in:\n{result.stdout}\n{result.stderr}")


@pytest.fixture
def noisy(project):
    project.write("experiments/noisy.cobalt.py", NOISY)
    return project


def test_compare_prints_each_evaluators_delta_interval_p_value_and_verdict(noisy, cobalt_cli):
    base = cobalt_cli(noisy, "run", "-q", env={"SEED": "1"})
    assert base.returncode == 0, base.stderr
    worse = cobalt_cli(noisy, "run", "-q", env={"SEED": "2", "SHIFT": "-0.1"})
    same = cobalt_cli(noisy, "run", "-q", env={"SEED": "3"})
    a, b, c = run_id_of(base), run_id_of(worse), run_id_of(same)

    result = cobalt_cli(noisy, "compare", a, b)
    assert result.returncode == 0, result.stderr
    tests = [
        line.split()
        for line in result.stdout.splitlines()
        if "wilcoxon" in line or "mcnemar" in line
    ]
    rows = {row[0]: row for row in tests}
    assert "95% CI" in result.stdout and "Verdict" in result.stdout
    quality = rows["quality"]
    # quality  200  -0.1xx  [-0.1xx,  -0.0xx]  <0.001  wilcoxon  regressed
    assert quality[1] == "200" and quality[-1] == "regressed" and quality[-2] == "wilcoxon"
    assert quality[-3] == "<0.001"
    delta = float(quality[2])
    low, high = float(quality[3].strip("[,")), float(quality[4].strip("]"))
    assert -0.13 < low < delta < high < -0.07
    assert rows["passed"][-2:] == ["mcnemar", "regressed"]

    noise = cobalt_cli(noisy, "compare", a, c, "--alpha", "0.01")
    assert "99% CI" in noise.stdout and "α = 0.01" in noise.stdout
    verdicts = [
        line for line in noise.stdout.splitlines() if "wilcoxon" in line or "mcnemar" in line
    ]
    assert len(verdicts) == 2 and all(
        v.rstrip().endswith("no significant change") for v in verdicts
    )

    bad = cobalt_cli(noisy, "compare", a, c, "--alpha", "1.5")
    assert bad.returncode == 2 and "--alpha" in bad.stderr and "at most 0.5" in bad.stderr


def test_the_significance_gate_passes_on_noise_and_fails_on_a_real_regression(noisy, cobalt_cli):
    assert cobalt_cli(noisy, "run", "-q", env={"SEED": "1"}).returncode == 0
    gate = ("run", "--ci", "--baseline", "latest", "--significance", "0.05")

    # Seed 2 scores a little lower by chance: the plain baseline gate fails on that noise ...
    plain = cobalt_cli(noisy, "run", "--ci", "--baseline", "latest", env={"SEED": "2"})
    assert plain.returncode == 1, plain.stdout
    # ... the significance gate does not.
    noise = cobalt_cli(noisy, *gate, env={"SEED": "2"})
    assert noise.returncode == 0, noise.stdout + noise.stderr
    assert "no significant change at α 0.05" in noise.stdout

    real = cobalt_cli(noisy, *gate, env={"SEED": "3", "SHIFT": "-0.1"})
    assert real.returncode == 1, real.stdout + real.stderr
    assert re.search(
        r"quality significant regression: Δ -0\.(08|09|1)\d* \[-0\.\d+, -0\.\d+\], "
        r"p < 0\.001 \(wilcoxon, 200 items\) → regressed at α 0\.05 vs run \w+",
        real.stdout,
    ), real.stdout
    assert "passed significant regression" in real.stdout

    # Thresholds still fail the gate, whatever the test says.
    noisy.write("cobalt.toml", 'test_dir = "experiments"\n[ci.thresholds.quality]\navg = 0.9\n')
    threshold = cobalt_cli(noisy, *gate, env={"SEED": "4"})
    assert threshold.returncode == 1 and "quality avg" in threshold.stdout

    misuse = cobalt_cli(noisy, "run", "--significance", "0.05")
    assert misuse.returncode == 2 and "--significance needs --ci and --baseline" in misuse.stderr
    out_of_range = cobalt_cli(noisy, "run", "--ci", "--baseline", "latest", "--significance", "2")
    assert out_of_range.returncode == 2 and "at most 0.5" in out_of_range.stderr


def test_repeated_runs_report_intervals_and_pass_at_k(noisy, cobalt_cli):
    result = cobalt_cli(noisy, "run", env={"SEED": "5", "RUNS": "3"})
    assert result.returncode == 0, result.stderr
    assert "95% CI" in result.stdout
    assert "passed: pass@3 " in result.stdout and "pass^3 " in result.stdout
    (path,) = noisy.results_files()
    summary = json.loads(path.read_text())["summary"]
    quality = summary["scores"]["quality"]
    assert quality["ci95"]["n"] == 200 and quality["ci95"]["method"] == "t"
    assert quality["ci95"]["low"] < quality["avg"] < quality["ci95"]["high"]
    table = summary["scores"]["passed"]["passAtK"]
    assert table["k"] == 3
    assert table["passAtK"]["3"] >= table["passAtK"]["1"] >= table["passHatK"]["3"]
    assert table["passAtK"]["1"] == pytest.approx(summary["scores"]["passed"]["avg"])
    items = summary["repetitions"]["items"]
    assert len(items) == 200 and summary["repetitions"]["runs"] == 3
    spread = items["q0"]["quality"]
    assert spread["n"] == 3 and spread["min"] <= spread["mean"] <= spread["max"]


# --- every door shows the same test ---------------------------------------------------------

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def mcp_compare(project, run_a, run_b):
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(
        command=sys.executable, args=["-m", "cobalt_cli", "mcp"], cwd=project.path, env=cli_env()
    )
    found = {}

    async def main():
        with anyio.fail_after(90):
            async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                found["result"] = await session.call_tool(
                    "cobalt_compare", {"runA": run_a, "runB": run_b}
                )

    anyio.run(main)
    return found["result"]


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs /usr/bin/chromium")
def test_the_cli_api_mcp_tool_and_pages_show_the_same_test_and_flaky_marks(noisy, cobalt_cli):
    from playwright.sync_api import sync_playwright

    a = run_id_of(cobalt_cli(noisy, "run", "-q", env={"SEED": "1"}))
    b = run_id_of(cobalt_cli(noisy, "run", "-q", env={"SEED": "2", "SHIFT": "-0.05"}))
    cli = cobalt_cli(noisy, "compare", a, b)
    cli_rows = {
        row[0]: row
        for row in (line.split() for line in cli.stdout.splitlines())
        if "wilcoxon" in row or "mcnemar" in row
    }
    flaky = json.loads(cobalt_cli(noisy, "flaky", "noisy", "--json", "--limit", "200").stdout)
    flaky_keys = {item["key"] for item in flaky["flaky"]}
    assert flaky_keys  # items near the pass mark flipped between the two runs

    tool = mcp_compare(noisy, a, b)
    assert not tool.is_error
    server, url = start_server(noisy)
    try:
        api = httpx.get(f"{url}/api/compare/", params={"a": a, "b": b}, timeout=30).json()
        assert api["alpha"] == 0.05
        for name in ("quality", "passed"):
            entry = api["significance"][name]
            assert tool.structured_content["significance"][name] == entry
            row = cli_rows[name]
            assert row[1] == str(entry["n"]) == "200"
            assert row[2] == f"{entry['delta']:+.3f}"
            assert row[3] == f"[{entry['ci']['low']:+.3f},"
            assert row[4] == f"{entry['ci']['high']:+.3f}]"
            test_at = row.index(entry["test"])
            assert " ".join(row[test_at + 1 :]) == entry["verdict"]
            text = "\n".join(block.text for block in tool.content if block.type == "text")
            assert f"paired test: {significance.describe_result(entry)}" in text
        assert api["significance"]["quality"]["verdict"] == REGRESSED

        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page()
            page.set_default_timeout(15_000)
            page.goto(f"{url}/compare/?a={a}&b={b}")
            quality = page.locator("table.deltas tbody tr", has_text="quality").inner_text()
            entry = api["significance"]["quality"]
            assert "regressed" in quality
            assert f"[{entry['ci']['low']:+.3f}, {entry['ci']['high']:+.3f}]" in quality
            assert f"{entry['delta']:+.3f}" in quality

            page.goto(f"{url}/runs/{b}/")
            ci = httpx.get(f"{url}/api/runs/{b}/", timeout=30).json()
            api_ci = ci["summary"]["scores"]["quality"]["ci95"]
            scores = page.locator("table.scores tbody tr", has_text="quality").inner_text()
            assert f"{api_ci['low']:.2f}–{api_ci['high']:.2f}" in scores
            rows = page.locator("table.items-table tbody tr")
            marked, shown = set(), set()
            for i in range(rows.count()):
                row = rows.nth(i)
                key = row.locator("code.key").inner_text()
                shown.add(key)
                mark = row.locator("a.flaky-mark")
                if mark.count():
                    assert mark.inner_text() == "flaky"
                    assert "flipped 1× in 2 observations" in mark.get_attribute("title")
                    marked.add(key)
            assert shown and marked == flaky_keys & shown
            assert "cobalt flaky noisy" in page.locator("#flaky-help").inner_text()
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_the_fast_t_quantiles_match_scipy():
    from scipy.special import stdtrit

    from cobalt.significance import t_quantile

    for df in (1, 2, 5, 10, 29, 30, 31, 45, 100, 1000, 50_000):
        for p in (0.9, 0.95, 0.975, 0.995):
            assert t_quantile(df, p) == pytest.approx(float(stdtrit(df, p)), rel=1e-6, abs=1e-6)
