"""What people read: the terminal at 80 columns, item numbers from #1, token shapes, run ids."""

from __future__ import annotations

import asyncio
import io
import json
import time

import httpx
import pytest
from django.test import Client

from cobalt.wording import plural
from cobalt_app import exports
from cobalt_app.models import Run
from cobalt_app.pricing import agent_cost, agent_usage, estimate_cost, usage_problem
from cobalt_app.selectors import RunNotFound, run_get
from cobalt_cli.reporter import fmt_ms
from tests.conftest import served
from tests.test_pages import keys, make_run

# Three evaluators with realistic names, two repetitions (so the 95% CI column shows), a
# metadata usage shape Cobalt cannot read on every item, and one item nothing passes.
EXPERIMENT = """
from cobalt import Dataset, Evaluator, experiment

dataset = Dataset(items=[{"id": f"q{i}", "answer": "yes" if i != 2 else "no"} for i in range(4)])


@experiment(
    "narrow-terminal",
    dataset,
    runs=2,
    evaluators=[
        Evaluator(name="answer-correctness", type="function", fn=lambda ctx: float(ctx.output == "yes")),
        Evaluator(name="mentions-the-answer", type="contains", value="y"),
        Evaluator(name="polite", type="function", fn=lambda ctx: 1.0 if ctx.output == "yes" else 0.0),
    ],
)
def run(ctx):
    return {"output": ctx.item["answer"], "metadata": {"usage": {"prompt": 3}, "model": "gpt-4o"}}
"""


@pytest.fixture
def narrow_run(project, cobalt_cli):
    project.write("experiments/narrow.cobalt.py", EXPERIMENT)
    result = cobalt_cli(project, "run", env={"COLUMNS": "80"})
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_the_summary_fits_an_80_column_terminal(narrow_run):
    lines = narrow_run.splitlines()
    summary = lines[next(i for i, line in enumerate(lines) if "Results: " in line) :]
    summary = summary[: next(i for i, line in enumerate(summary) if "Results saved" in line)]
    assert max(len(line) for line in summary) <= 80, max(summary, key=len)
    header = next(line for line in lines if "Evaluator" in line)
    assert header.split() == ["Evaluator", "Avg", "95%", "CI", "Min", "Max", "P50", "P95", "Errors"]
    for name in ("answer-correctness", "mentions-the-answer", "polite"):
        (row,) = [line for line in lines if line.strip().startswith(name + " ")]
        assert len(row.split()) == 8, row  # one line per evaluator: nothing wrapped


def test_an_item_that_passed_no_evaluator_is_marked_failed(narrow_run):
    assert "✗ Item 3/4 (run 1/2) — answer-correctness: 0.00 | mentions-the-answer: 0.00" in (
        narrow_run
    )
    assert "✓ Item 1/4 (run 1/2) — answer-correctness: 1.00" in narrow_run


def test_warnings_count_items_not_repetitions_and_number_them_from_one(narrow_run):
    assert "⚠ 1 item scored below 0.5 on 'answer-correctness' (#3)" in narrow_run
    assert "Total items:    8  (8 ok, 0 errors, 0 timeouts)" in narrow_run


def test_an_unreadable_usage_shape_is_a_warning_not_a_silent_zero(narrow_run):
    text = " ".join(narrow_run.split())
    assert (
        "⚠ 8 items reported token usage Cobalt cannot read (metadata.usage = {'prompt': 3}); "
        "tokens and cost count them as 0. Accepted: `tokens` as a number" in text
    )


def test_the_closing_hint_gives_the_run_page_on_the_dashboard(narrow_run):
    run_id = narrow_run.split("Run ID: ")[1].split()[0]
    assert f"Dashboard: `cobalt serve`, then http://127.0.0.1:4000/runs/{run_id}/" in narrow_run


def test_the_closing_hint_gives_the_address_the_projects_dashboard_really_listens_on(
    project, cobalt_cli
):
    # `cobalt serve --port 0` listens on a port of its own choosing: the run's line names it
    # (it said 4000 whatever the dashboard's port); once it stops, the line says how to start one.
    project.write("experiments/narrow.cobalt.py", EXPERIMENT)
    with served(project) as url:
        assert not url.endswith(":4000")
        assert httpx.get(f"{url}/healthz/", timeout=60).status_code == 200  # its workers are up
        shown = cobalt_cli(project, "run").stdout
        run_id = shown.split("Run ID: ")[1].split()[0]
        assert f" Dashboard: {url}/runs/{run_id}/\n" in shown
        page = httpx.get(f"{url}/runs/{run_id}/", timeout=60)
        assert page.status_code == 200 and run_id in page.text
    shown = cobalt_cli(project, "run").stdout
    run_id = shown.split("Run ID: ")[1].split()[0]
    assert f"Dashboard: `cobalt serve`, then http://127.0.0.1:4000/runs/{run_id}/" in shown


def test_durations_from_one_second_are_in_seconds_and_plurals_agree():
    assert [fmt_ms(v) for v in (None, 12, 999, 1000, 1234, 65_000)] == [
        "—",
        "12ms",
        "999ms",
        "1.0s",
        "1.2s",
        "65.0s",
    ]
    assert [plural(n, "error") for n in (0, 1, 2)] == ["0 errors", "1 error", "2 errors"]


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ({"tokens": {"input": 1000, "output": 500}}, (1000, 500, 1500)),  # the original's shape
        ({"tokens": 42}, (0, 0, 42)),
        ({"usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}, (10, 5, 15)),
        ({"usage": {"input_tokens": 7, "output_tokens": 3}}, (7, 3, 10)),
        ({"input_tokens": 2, "output_tokens": 1}, (2, 1, 3)),
        ({"input": "a question", "output": "an answer"}, (0, 0, 0)),  # not token counts
    ],
)
def test_every_documented_usage_shape_is_counted(metadata, expected):
    assert agent_usage(metadata) == expected
    assert usage_problem(metadata) is None


def test_the_original_token_shape_is_priced():
    metadata = {"model": "gpt-4o", "tokens": {"input": 1_000_000, "output": 100_000}}
    assert agent_cost(metadata) == pytest.approx(estimate_cost("gpt-4o", 1_000_000, 100_000))
    assert agent_cost(metadata) == pytest.approx(3.5)


@pytest.mark.parametrize(
    ("metadata", "field"),
    [
        ({"tokens": -5}, "metadata.tokens = -5"),
        ({"tokens": float("nan")}, "metadata.tokens = nan"),
        ({"tokens": "many"}, "metadata.tokens = 'many'"),
        ({"tokens": {"in": 3}}, "metadata.tokens = {'in': 3}"),
        ({"usage": {"foo": 3}}, "metadata.usage = {'foo': 3}"),
        ({"usage": 12}, "metadata.usage = 12"),
    ],
)
def test_an_unrecognised_usage_shape_is_named_and_counts_nothing(metadata, field):
    assert usage_problem(metadata) == field
    assert agent_usage(metadata) == (0, 0, 0)
    assert agent_cost({**metadata, "model": "gpt-4o"}) == 0.0


def test_an_ambiguous_run_id_prefix_lists_the_candidates(db):
    for suffix, name in (("aa11", "first"), ("bb22", "second")):
        Run.objects.create(id=f"abcd{suffix}0000", name=name)
    with pytest.raises(RunNotFound) as raised:
        run_get("abcd")
    message = str(raised.value)
    assert message.startswith("run id 'abcd' is ambiguous: it starts abcdbb220000 (second, ")
    assert "abcdaa110000 (first, " in message
    assert message.endswith("Give more characters")
    assert run_get("abcda").name == "first"


def test_people_see_items_from_one_while_the_results_file_counts_from_zero(db):
    run = make_run(keys=keys(2))
    markdown = "".join(exports.export(run, "md"))
    first_row = next(line for line in markdown.splitlines() if "| k000 |" in line)
    assert first_row.startswith("| #1 | k000 |")
    document = json.loads("".join(exports.export(run, "json")))
    assert [entry["index"] for entry in document["items"]] == [0, 1]

    item = run.items.get(item_index=0)
    page = Client().get(f"/runs/{run.id}/items/{item.number}/").content.decode()
    assert "Item #1" in page and "Item #0" not in page
    listing = Client().get(f"/runs/{run.id}/?view=all").content.decode()  # every item
    assert ">#1</a>" in listing and ">#0</a>" not in listing


def test_item_lines_are_written_together_in_order_none_held_back():
    # Where the output is not a terminal, the lines of items finishing on a loop are written
    # together (not a system call each): every one, in order, within FLUSH_EVERY; an
    # interruption (`stop_progress`) writes those waiting at once.
    from rich.console import Console

    from cobalt_app.engine import ItemOutcome
    from cobalt_cli.reporter import ConsoleReporter

    class Writes(list):
        def write(self, text):
            self.append(text)

    def outcome(index):
        return ItemOutcome(
            id=index, item_index=index, run_index=0, item_key=str(index), status="ok", latency_ms=1
        )

    reporter = ConsoleReporter(Console(file=io.StringIO()))
    reporter.items_in_dataset = 300
    reporter.output = writes = Writes()

    async def finish(first, last, *, interrupted=False):
        for index in range(first, last):
            reporter.item_finished(outcome(index), index + 1, 300)
        if interrupted:
            reporter.stop_progress()
        deadline = time.monotonic() + 5
        while "".join(writes).count("\n") < last:  # the last lines: written by the loop's timer
            assert time.monotonic() < deadline, "lines held back"
            await asyncio.sleep(0.01)

    asyncio.run(finish(0, 250))
    assert len(writes) <= 5
    asyncio.run(finish(250, 300, interrupted=True))
    lines = "".join(writes).splitlines()
    assert lines == [f"  ✓ Item {i + 1}/300 — no evaluators  1ms" for i in range(300)]
