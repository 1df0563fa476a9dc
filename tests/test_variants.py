"""Variants: a prompt × model grid run as one sweep against the fake provider, ranked with
paired tests corrected by Holm, the Pareto front, the `[ci.sweep]` gate, the page (also in
headless Chromium, after the real `cobalt run --ci`), the API and the MCP tool."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from django.test import Client
from rest_framework.test import APIClient

from cobalt import Dataset, Evaluator, load_config, sweep_stats, variants
from cobalt.results_file import load_results
from cobalt.sweep_stats import VariantData
from cobalt_app import ci_verdict, sweeps
from cobalt_app.models import Run, Sweep
from cobalt_cli.mcp.project import Project as McpProject
from cobalt_cli.mcp.sweeps import cobalt_sweep_tool
from tests.conftest import cli_env, start_server
from tests.helpers import define, execute

GOOD, BAD = "Answer yes. [[reply:yes]]", "Answer no. [[reply:no]]"
# The small model gets every third question wrong (the fake provider's `[[model:...]]`).
HARD = " [[model:gpt-4o-mini=no]]"
ITEMS = [
    {"id": f"q{i:02d}", "input": f"question {i}" + HARD * (i % 3 == 0), "expected_output": "yes"}
    for i in range(20)
]
EXACT = Evaluator(name="exact", type="exact-match", field="expected_output")


async def ask(ctx):
    import openai

    async with openai.AsyncOpenAI() as client:
        reply = await client.chat.completions.create(
            model=ctx.variant["model"],
            messages=[
                {"role": "system", "content": ctx.variant["prompt"]},
                {"role": "user", "content": ctx.item["input"]},
            ],
        )
    return reply.choices[0].message.content


def grid_experiment(**options):
    return define(
        "qa",
        Dataset(items=ITEMS),
        ask,
        evaluators=[EXACT],
        variants={"model": ["gpt-4o-mini", "gpt-4o"], "prompt": [GOOD, BAD]},
        **options,
    )


# --- declaring ------------------------------------------------------------------------------


def test_a_grid_declares_every_combination_with_short_labels():
    declared = variants.declare("x", {"model": ["a", "b"], "prompt": [GOOD, BAD], "t": [0, 0.7]})
    assert len(declared) == 8
    assert declared[0].label == "model=a prompt#1 t=0"
    assert declared[-1].values == {"model": "b", "prompt": BAD, "t": 0.7}
    picked = variants.select(declared, variants.parse_selection(["model=b,prompt=#2"]))
    assert [v.label for v in picked] == ["model=b prompt#2 t=0", "model=b prompt#2 t=0.7"]


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({}, "empty grid"),
        ([], "empty list"),
        ({"model": []}, "non-empty list"),
        ([{"model": "a"}, {"model": "a"}], "declared twice"),
        ("gpt-4o", "must be a grid"),
    ],
)
def test_bad_variants_are_refused_saying_what_to_pass(given, says):
    with pytest.raises((ValueError, TypeError), match=says):
        define("bad", Dataset(items=ITEMS), ask, variants=given)


def test_a_default_variant_must_be_one_of_them():
    with pytest.raises(ValueError, match="matches none"):
        grid_experiment(default_variant={"model": "claude"})


# --- the statistics on constructed data ----------------------------------------------------


def test_holm_adjusts_step_down_and_keeps_order():
    assert sweep_stats.holm([0.01, 0.04, 0.03, None]) == pytest.approx([0.03, 0.06, 0.06, None])
    assert sweep_stats.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1


def test_the_pareto_front_keeps_only_undominated_variants():
    front = sweep_stats.pareto_front(
        {
            "best": (0.9, 1.0, 100),
            "cheap": (0.8, 0.1, 100),
            "dominated": (0.8, 0.5, 200),
            "tie-of-cheap": (0.8, 0.1, 100),
        }
    )
    assert front == {"best", "cheap", "tie-of-cheap"}


def _data(label: str, quality: np.ndarray, cost: float = 0.0) -> VariantData:
    keys = np.array([f"k{i:03d}".encode() for i in range(len(quality))])
    return VariantData(label, {}, label, "completed", keys, quality, (quality >= 0.5) * 1.0,
                       items=len(quality), cost=cost, latency_p50=100.0)  # fmt: skip


def test_the_ranking_says_which_differences_survive_holm():
    rng = np.random.default_rng(7)
    base = rng.uniform(0.5, 1.0, 200)
    result = sweep_stats.analyse(
        [
            _data("a", base, cost=1.0),
            _data("b", np.clip(base - 0.3, 0, 1), cost=0.1),  # clearly worse
            _data("c", base - np.r_[np.full(3, 0.05), np.zeros(197)], cost=0.5),  # 3 items
        ],
        default="b",
    )
    assert result["ranking"][0] == "a" and result["best"] == "a"
    rows = {r["label"]: r for r in result["variants"]}
    assert rows["b"]["vsBest"]["verdict"] == sweep_stats.WORSE
    assert rows["b"]["vsBest"]["pHolm"] < 0.05
    assert rows["c"]["vsBest"]["verdict"] == sweep_stats.SAME
    # Holm multiplies the smallest p by the number of tests (2), the next by 1, monotone.
    raw = sorted(r["vsBest"]["pValue"] for r in rows.values() if r["vsBest"])
    assert rows["b"]["vsBest"]["pHolm"] == pytest.approx(min(1.0, 2 * raw[0]))
    assert rows["b"]["pareto"] and rows["a"]["pareto"]  # cheapest, and best
    assert "Significantly worse after Holm" in result["verdict"] and "b" in result["verdict"]


# --- a sweep end to end, in process --------------------------------------------------------


@pytest.fixture
def swept(project, fake_provider, transactional_db):
    runs = execute(project, grid_experiment())
    return project, runs, Sweep.objects.get()


def test_a_grid_runs_as_one_sweep_gated_in_ci_and_read_by_every_door(swept):
    """One sweep (its four runs take most of this module's time), then each door reads it."""
    project, runs, sweep = swept
    assert len(runs) == 4 and {r.sweep_id for r in runs} == {sweep.id}
    assert Run.objects.filter(name="qa [model=gpt-4o prompt#2]").get().variant["values"] == {
        "model": "gpt-4o",
        "prompt": BAD,
    }
    result = sweeps.summary(sweep)
    assert result["complete"] and result["default"] == "model=gpt-4o-mini prompt#1"
    top, default, *rest = result["variants"]
    assert (top["label"], top["meanScore"]) == ("model=gpt-4o prompt#1", 1.0)
    assert (default["label"], default["meanScore"]) == ("model=gpt-4o-mini prompt#1", 0.65)
    # McNemar over 7 discordant items: p = 2 / 2**7, the smallest of three tests after Holm.
    assert default["vsBest"]["pHolm"] == pytest.approx(2 / 2**7)
    assert {r["vsBest"]["verdict"] for r in [default, *rest]} == {sweep_stats.WORSE}
    assert result["ignoredKeys"] == [] and top["pareto"]
    (written,) = (project.path / ".cobalt" / "results").glob("*_sweep_*.json")
    assert json.loads(written.read_text())["sweep"]["best"] == top["label"]
    header = load_results(Run.objects.get(id=runs[0].id).results_path)
    assert header["sweep"] == {"id": sweep.id, "variant": runs[0].variant}
    labels, rows, total = sweeps.matrix_rows(sweep, limit=5)
    assert total == 20 and len(rows) == 5 and len(labels) == 4
    assert {c["verdict"] for c in rows[0]["cells"]} == {"pass", "fail"}
    the_ci_gate_fails_when_the_default_is_significantly_worse(project, runs)
    the_page_api_and_mcp_tool_say_which_variant_is_best(project, sweep)


def the_ci_gate_fails_when_the_default_is_significantly_worse(project, runs):
    project.write(
        "cobalt.toml", 'test_dir = "experiments"\n[ci.sweep]\nrequire = "not-worse-than-best"\n'
    )  # the default variant: the first declared
    outcome = ci_verdict.gate_runs(runs, load_config(project.path))
    (check,) = [c for c in outcome.global_checks if c.kind == "sweep"]
    assert not check.passed and outcome.exit_code == 1 and "worse than the best" in check.line()
    project.write(
        "cobalt.toml",
        'test_dir = "experiments"\n[ci.sweep]\nrequire = "candidate-beats-default"\n'
        'candidate = "model=gpt-4o prompt#1"\n',
    )
    outcome = ci_verdict.gate_runs(runs, load_config(project.path))
    assert [c.passed for c in outcome.global_checks if c.kind == "sweep"] == [True]


def the_page_api_and_mcp_tool_say_which_variant_is_best(project, sweep):
    run_page = Client(HTTP_HOST="127.0.0.1").get(f"/runs/{sweep.runs.first().id}/")
    assert f'href="/sweeps/{sweep.id}/" id="run-sweep"' in run_page.content.decode()
    page = Client(HTTP_HOST="127.0.0.1").get(f"/sweeps/{sweep.id}/")
    html = page.content.decode()
    assert page.status_code == 200 and "Holm" in html and "★ Pareto" in html
    assert html.count('class="verdict-regressed"') == 3
    client = APIClient(HTTP_HOST="127.0.0.1")
    run = client.get(f"/api/runs/{sweep.runs.first().id}/").json()
    assert run["sweep"]["id"] == sweep.id and run["sweep"]["variant"]["label"]
    data = client.get(f"/api/sweeps/{sweep.id}/?limit=3").json()
    assert data["best"] == "model=gpt-4o prompt#1" and len(data["matrix"]["rows"]) == 3
    assert data["variants"][-1]["vsBest"]["significant"] is True
    csv = Client(HTTP_HOST="127.0.0.1").get(f"/sweeps/{sweep.id}/export.csv").content.decode()
    assert csv.splitlines()[0].startswith("rank,label,runId,meanScore")
    answer = cobalt_sweep_tool(McpProject(load_config(project.path)))
    assert "Best: model=gpt-4o prompt#1" in answer.content[0].text
    assert answer.structured_content["pareto"]


def test_a_variant_failing_on_every_item_says_why_and_spares_the_others(
    project, fake_provider, transactional_db
):
    def answer(ctx):
        if ctx.variant["model"] == "broken":
            raise RuntimeError("model 'broken' does not exist")
        return "yes"

    experiment = define(
        "fragile",
        Dataset(items=ITEMS[:6]),
        answer,
        evaluators=[EXACT],
        variants=[{"model": "ok", "seed": 1}, {"model": "ok", "seed": 2}, {"model": "broken"}],
    )
    execute(project, experiment)
    result = sweeps.summary(Sweep.objects.get())
    rows = {r["label"]: r for r in result["variants"]}
    assert rows["model=ok seed=1"]["meanScore"] == 1.0 and rows["model=ok seed=1"]["errors"] == 0
    assert rows["model=broken"]["meanScore"] is None and rows["model=broken"]["errors"] == 6
    assert "does not exist" in rows["model=broken"]["firstError"]
    assert "every item errored" in result["verdict"]
    page = Client(HTTP_HOST="127.0.0.1").get(f"/sweeps/{result['id']}/").content.decode()
    assert 'data-failed-variant="model=broken"' in page and "does not exist" in page
    assert '<small class="muted" data-failed-column="model=broken">6 of 6 items errored: ' in page
    # `seed` changes nothing the runner does: said so.
    assert result["ignoredKeys"] == ["seed"] and "Variant key(s) seed" in result["verdict"]


# --- the door: `cobalt run --ci`, `--resume`, the page in Chromium -------------------------

SWEEP_FILE = f"""
import cobalt
from cobalt import Dataset, Evaluator

items = {ITEMS!r}

async def ask(ctx):
    import openai
    async with openai.AsyncOpenAI() as client:
        reply = await client.chat.completions.create(
            model=ctx.variant["model"],
            messages=[{{"role": "system", "content": ctx.variant["prompt"]}},
                      {{"role": "user", "content": ctx.item["input"]}}],
        )
    return reply.choices[0].message.content

cobalt.experiment(
    "qa", Dataset(items=items), ask,
    evaluators=[Evaluator(name="exact", type="exact-match", field="expected_output")],
    variants={{"model": ["gpt-4o-mini", "gpt-4o"], "prompt": [{GOOD!r}, {BAD!r}]}},
    default_variant={{"model": "gpt-4o-mini", "prompt": {GOOD!r}}},
)
"""


def test_cobalt_run_ci_fails_and_the_page_ranks_in_chromium(project, fake_provider_server):
    from playwright.sync_api import sync_playwright

    project.write("experiments/sweep.cobalt.py", SWEEP_FILE)
    project.write(
        "cobalt.toml", 'test_dir = "experiments"\n[ci.sweep]\nrequire = "not-worse-than-best"\n'
    )
    env = cli_env(
        {"OPENAI_BASE_URL": fake_provider_server.openai_base_url, "OPENAI_API_KEY": "sk-test"}
    )
    done = subprocess.run(
        [sys.executable, "-m", "cobalt_cli", "run", "--ci", "--variants", "prompt=#1"],
        cwd=project.path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "not worse than best: FAILED" in done.stdout
    sweep_id = re.search(r"Sweep qa \((\w+)\)", done.stdout).group(1)
    server, url = start_server(project)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"]
            )
            page = browser.new_page()
            page.goto(f"{url}/sweeps/{sweep_id}/")
            ranking = page.locator("#ranking tbody tr")
            assert ranking.count() == 2
            assert "best" in ranking.nth(0).inner_text()
            assert "worse than the best" in ranking.nth(1).inner_text()
            page.wait_for_selector("canvas[data-chart='pareto'][data-drawn]")
            assert page.locator("#matrix tbody tr").count() == 20
            cells = page.locator("#matrix tbody tr").first.locator("td")
            assert "score-pass" in cells.nth(0).get_attribute("class")  # the best, first
            assert "score-fail" in cells.nth(1).get_attribute("class")  # q00 is hard for mini
            Path("test-artifacts").mkdir(exist_ok=True)
            page.screenshot(path="test-artifacts/sweep.png", full_page=True)
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)


GRID_FILE = """
import cobalt
from cobalt import Dataset, Evaluator

cobalt.experiment(
    "grid", Dataset(items=[{"id": f"g{i}", "n": i} for i in range(6)]),
    lambda ctx: str(ctx.item["n"] * ctx.variant["k"]),
    evaluators=[Evaluator(name="even", type="function",
                          fn=lambda c: float(int(c.output) % 2 == 0))],
    variants={"k": [1, 2, 3]},
)
"""


def test_an_interrupted_sweep_resumes_only_its_unfinished_variants(project, transactional_db):
    from cobalt_app import launcher
    from cobalt_app.models import ItemResult

    project.write("experiments/grid.cobalt.py", GRID_FILE)
    config = load_config(project.path)
    experiments, _, _ = launcher.load_experiments(config)
    first, second, third = launcher.execute(experiments, config)
    sweep = Sweep.objects.get()
    Run.objects.filter(id=second.id).delete()  # never started
    Run.objects.filter(id=third.id).update(status=Run.Status.CANCELLED)  # stopped half-way
    ItemResult.objects.filter(run_id=third.id, item_index__gte=3).update(status="cancelled")
    result = launcher.resume_sweep(config, sweep.id)
    runs = sweeps.variant_runs(sweep)
    assert [r.id for r in result.runs][0] == first.id and runs["k=3"].id == third.id
    assert runs["k=2"].id != second.id and runs["k=2"].sweep_id == sweep.id
    assert {r.status for r in runs.values()} == {"completed"}
    again = sweeps.summary(Sweep.objects.get())
    assert again["complete"] and [r["meanScore"] for r in again["variants"]][-1] < 1
    assert Sweep.objects.count() == 1


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ({"require": "best"}, "ci.sweep.require` must be one of not-worse-than-best"),
        ({"require": "candidate-beats-default"}, "ci.sweep.candidate` names the variant"),
        ({"require": "not-worse-than-best", "alpha": 2}, "ci.sweep.alpha` must be above 0"),
        ({"require": "not-worse-than-best", "varaint": "x"}, "ci.sweep.varaint` is not known"),
    ],
)
def test_a_bad_sweep_gate_is_refused_naming_the_setting(table, says):
    from cobalt.config import ConfigError, check_ci

    with pytest.raises(ConfigError, match=re.escape(says)):
        check_ci({"sweep": table}, source="cobalt.toml")
