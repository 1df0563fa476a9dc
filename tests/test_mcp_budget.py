"""Results of realistic size through the real protocol: every failing item reaches the client,
every result stays within the token budget, and paging fetches everything left out."""

from __future__ import annotations

from typing import Any

from mcp import ClientSession

from tests.test_mcp import run_session, text_of

BUDGET = 20_000  # tokens: the default `[mcp] result_tokens`

BULK_EXPERIMENT = """\
from agents.bulk import answer
from cobalt import Dataset, Evaluator, experiment

dataset = Dataset(items=[{{"id": f"item-{{i:03d}}", "input": i}} for i in range({count})])


def quality(ctx):
    good = ctx.output.startswith("good")
    return {{"score": 1.0 if good else 0.0, "reason": "fine" if good else "the agent said bad"}}


@experiment("bulk", dataset, evaluators=[Evaluator(name="quality", type="function", fn=quality)])
def run(ctx):
    return answer(ctx.item["input"])
"""

BULK_AGENT = """\
BROKEN = {broken}


def answer(number):
    return ("bad " if number in BROKEN else "good ") + "{filler}" * {repeat}
"""


def wire_tokens(result) -> int:
    """The result as the protocol sends it (compact JSON, UTF-8), in tokens at one per three
    bytes: measured on what the client received, not on what the server estimated."""
    return len(result.model_dump_json(by_alias=True, exclude_none=True).encode()) // 3


def write_bulk(project, count: int, broken: set[int], output_chars: int) -> None:
    project.write("experiments/bulk.cobalt.py", BULK_EXPERIMENT.format(count=count))
    project.write("agents/__init__.py", "")  # a regular package: the Agents SDK is `agents` too
    project.write(
        "agents/bulk.py",
        BULK_AGENT.format(broken=sorted(broken), filler="x", repeat=output_chars),
    )


def page_through(session_results: list[Any]) -> list[dict[str, Any]]:
    return [item for page in session_results for item in page.structured_content["items"]]


def test_every_late_failure_of_an_80_item_run_is_returned_within_budget(
    project, fake_provider_server
):
    late = set(range(60, 80))
    write_bulk(project, 80, late, output_chars=1_500)
    seen: dict[str, Any] = {}

    async def scenario(session: ClientSession) -> None:
        run = await session.call_tool("cobalt_run", {"filter": "bulk"})
        assert not run.is_error, text_of(run)
        (document,) = run.structured_content["runs"]
        pages = []
        for fetch in (document["omitted"] or {}).get("fetch", []):
            arguments = fetch["arguments"]
            while arguments is not None:
                page = await session.call_tool(fetch["tool"], arguments)
                assert not page.is_error, text_of(page)
                pages.append(page)
                following = page.structured_content["page"]["nextOffset"]
                arguments = following is not None and {**arguments, "offset": following} or None
        by_id = await session.call_tool("cobalt_results", {"runId": document["id"]})
        wrong_status = await session.call_tool(
            "cobalt_results", {"runId": document["id"], "status": "failed"}
        )
        wrong_evaluator = await session.call_tool(
            "cobalt_results", {"runId": document["id"], "evaluator": "qualty"}
        )
        seen.update(run=run, pages=pages, by_id=by_id, wrong=[wrong_status, wrong_evaluator])

    run_session(project, fake_provider_server, scenario)

    run, by_id = seen["run"], seen["by_id"]
    (document,) = run.structured_content["runs"]
    items = document["items"]
    assert all(isinstance(item, dict) for item in items)
    failing = {item["index"] for item in items if item.get("problems")}
    assert failing == late  # every failure, though they come last
    assert all(
        item["problems"] == ["quality 0.00 — the agent said bad"]
        for item in items
        if item.get("problems")
    )
    assert document["itemCounts"]["failing"] == 20 and document["itemCounts"]["failingShown"] == 20
    assert document["itemCounts"]["shown"] < 80  # the budget left passing items out
    assert document["omitted"]["failingItems"] == 0
    assert document["omitted"]["otherItems"] == 80 - document["itemCounts"]["shown"]
    assert wire_tokens(run) <= BUDGET and wire_tokens(by_id) <= BUDGET
    # By id: the same entries (its wrapper is smaller than cobalt_run's, so one more may fit).
    by_index = {item["index"]: item for item in by_id.structured_content["items"]}
    assert all(by_index[item["index"]] == item for item in items)
    assert {i for i, item in by_index.items() if item.get("problems")} == late
    assert len(run.content) == 1 and "20 of 80 items failing" in run.content[0].text
    assert "#61 item-060: quality 0.00" in run.content[0].text
    assert "Left out to stay within 20,000 tokens" in run.content[0].text

    fetched = page_through(seen["pages"])
    assert all(wire_tokens(page) <= BUDGET for page in seen["pages"])
    assert sorted(item["index"] for item in items + fetched) == list(range(80))
    wrong_status, wrong_evaluator = seen["wrong"]
    assert wrong_status.is_error and "'failing'" in text_of(wrong_status)
    assert wrong_evaluator.is_error
    assert "has no evaluator 'qualty' (it has: quality)" in text_of(wrong_evaluator)


def test_a_300_item_run_of_long_outputs_fits_and_paging_fetches_every_item(
    project, fake_provider_server
):
    scattered = {i for i in range(300) if i % 5 == 2}  # 60 failures spread over the run
    write_bulk(project, 300, scattered, output_chars=5_000)
    seen: dict[str, Any] = {"pages": [], "failing": [], "compare": []}

    async def scenario(session: ClientSession) -> None:
        run = await session.call_tool("cobalt_run", {"filter": "bulk"})
        assert not run.is_error, text_of(run)
        run_id = run.structured_content["runs"][0]["id"]
        arguments: dict[str, Any] | None = {"runId": run_id, "offset": 0}
        while arguments is not None:
            page = await session.call_tool("cobalt_results", arguments)
            assert not page.is_error, text_of(page)
            seen["pages"].append(page)
            following = page.structured_content["page"]["nextOffset"]
            arguments = following is not None and {**arguments, "offset": following} or None
        low = await session.call_tool(
            "cobalt_results",
            {"runId": run_id, "evaluator": "quality", "maxScore": 0.5, "limit": 7, "offset": 7},
        )
        seen.update(run=run, low=low)

        # Break every item that worked and fix every one that did not.
        write_bulk(project, 300, set(range(300)) - scattered, output_chars=5_000)
        again = await session.call_tool("cobalt_run", {"filter": "bulk"})
        assert not again.is_error, text_of(again)
        run_b = again.structured_content["runs"][0]["id"]
        for offset in (0, 230):
            diff = await session.call_tool(
                "cobalt_compare", {"runA": run_id, "runB": run_b, "offset": offset}
            )
            assert not diff.is_error, text_of(diff)
            seen["compare"].append(diff)
        seen["again"] = again

    run_session(project, fake_provider_server, scenario)

    (document,) = seen["run"].structured_content["runs"]
    assert wire_tokens(seen["run"]) <= BUDGET
    assert {i["index"] for i in document["items"] if i.get("problems")} == scattered
    assert document["omitted"]["fieldLimit"] < 5_000
    assert all(len(i["output"]["output"]) < 5_000 for i in document["items"])
    assert any(
        "output.output: 5,005 characters" in note
        for i in document["items"]
        for note in i["shortened"]
    )

    fetched = page_through(seen["pages"])
    assert len(seen["pages"]) > 1 and all(wire_tokens(p) <= BUDGET for p in seen["pages"])
    assert [item["index"] for item in fetched] == list(range(300))  # each item once, in order
    last = seen["pages"][-1].structured_content["page"]
    assert (last["matched"], last["nextOffset"]) == (300, None)

    low = seen["low"].structured_content
    assert [item["index"] for item in low["items"]] == sorted(scattered)[7:14]
    assert low["page"]["matched"] == 60 and low["page"]["nextOffset"] == 14

    first, last_page = (diff.structured_content for diff in seen["compare"])
    assert first["regressionCount"] == 240 and first["improvementCount"] == 60
    assert len(first["regressions"]) == 10 and first["regressionsPage"]["nextOffset"] == 10
    assert "1–10 of 240 regressions shown; more with cobalt_compare offset=10" in (
        seen["compare"][0].content[0].text
    )
    assert (
        len(last_page["regressions"]) == 10 and last_page["regressionsPage"]["nextOffset"] is None
    )
    assert last_page["improvements"] == [] and last_page["improvementsPage"]["total"] == 60
    assert all(wire_tokens(diff) <= BUDGET for diff in seen["compare"])


def test_the_budget_is_configurable_and_shared_by_the_runs_of_one_call(
    project, fake_provider_server
):
    write_bulk(project, 80, set(range(60, 80)), output_chars=1_500)
    project.write(
        "experiments/more.cobalt.py",
        BULK_EXPERIMENT.format(count=40).replace('"bulk"', '"more-bulk"'),
    )
    config = project.path / "cobalt.toml"
    config.write_text(config.read_text() + "\n[mcp]\nresult_tokens = 6500\n")
    seen: dict[str, Any] = {}

    async def scenario(session: ClientSession) -> None:
        seen["run"] = await session.call_tool("cobalt_run", {})
        config.write_text(config.read_text().replace("6500", "'lots'"))
        seen["refused"] = await session.call_tool("cobalt_results", {})

    run_session(project, fake_provider_server, scenario)

    run = seen["run"]
    assert not run.is_error, text_of(run)
    assert wire_tokens(run) <= 6_500
    documents = {doc["name"]: doc for doc in run.structured_content["runs"]}
    assert set(documents) == {"bulk", "more-bulk"}
    failing = {
        name: {item["index"] for item in doc["items"] if item.get("problems")}
        for name, doc in documents.items()
    }
    assert failing == {"bulk": set(range(60, 80)), "more-bulk": set()}
    assert all(doc["budgetTokens"] == 6_500 for doc in documents.values())
    assert "Left out to stay within 6,500 tokens" in text_of(run)
    refused = seen["refused"]
    assert refused.is_error and "`mcp.result_tokens` must be a whole number" in text_of(refused)
