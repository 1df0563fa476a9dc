"""`cobalt_judge_disagreements` and `cobalt_pairwise` through the real protocol: what a coding
agent reads to align a judge (the disagreements with the reviewers' notes, the agreement), and
a pairwise judge's win rate of one run over another."""

from __future__ import annotations

from mcp import ClientSession

from tests.conftest import Project
from tests.test_calibrate_cli import label, run, write
from tests.test_mcp import run_session, text_of


def test_an_agent_reads_a_judge_s_disagreements_and_a_pairwise_win_rate(
    project: Project, cobalt_cli, fake_provider_server
):
    write(project, prompt="[[pass_if_longer:100000]]", long_below=0)  # strict fails all
    run_a = run(cobalt_cli, project)
    label(cobalt_cli, project, run_a)  # q0–q4 pass: the judge disagrees on those five
    write(project, prompt="[[pass_if_longer:100000]]", long_below=6)
    run_b = run(cobalt_cli, project)
    seen = {}

    async def scenario(session: ClientSession) -> None:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        seen["tools"] = tools
        arguments = {"judge": "strict", "runId": run_a[:6]}
        seen["all"] = await session.call_tool("cobalt_judge_disagreements", arguments)
        seen["page"] = await session.call_tool(
            "cobalt_judge_disagreements", arguments | {"offset": 3, "limit": 1}
        )
        seen["unknown"] = await session.call_tool("cobalt_judge_disagreements", {"judge": "nope"})
        seen["pairwise"] = await session.call_tool(
            "cobalt_pairwise", {"runA": run_a, "runB": run_b, "judge": "longer"}
        )
        seen["prose"] = await session.call_tool(
            "cobalt_pairwise", {"runA": run_a, "runB": run_b, "judge": "chatty"}
        )

    run_session(project, fake_provider_server, scenario)

    tool = seen["tools"]["cobalt_judge_disagreements"]
    assert tool.annotations.read_only_hint is True and tool.input_schema["required"] == ["judge"]
    assert seen["tools"]["cobalt_pairwise"].annotations.read_only_hint is False
    found = seen["all"].structured_content
    assert found["run"] == run_a and found["labels"] == 10
    assert found["agreement"]["confusion"] == {"tp": 0, "fn": 5, "fp": 0, "tn": 5}
    assert [row["itemKey"] for row in found["disagreements"]] == ["q0", "q1", "q2", "q3", "q4"]
    first = found["disagreements"][0]
    assert (first["input"], first["output"], first["judgeReason"]) == (
        "question 0",
        "yes 0",
        "fake judge: longer passes",
    )
    assert (first["label"], first["reviewer"], first["note"]) == ("pass", "ana", "note 0")
    text = text_of(seen["all"])
    assert f"Judge strict on run {run_a} (qa): 10 current labels" in text
    assert "#1 q0: judge fail (fake judge: longer passes), ana says pass — note 0" in text
    assert "cobalt rejudge RUN --evaluator JUDGE --labelled" in text
    page = seen["page"].structured_content
    assert [row["itemKey"] for row in page["disagreements"]] == ["q3"]
    assert page["page"] == {"offset": 3, "returned": 1, "total": 5, "nextOffset": 4}
    assert seen["unknown"].is_error
    assert "known judges: chatty, first, longer, moody, strict" in text_of(seen["unknown"])

    pairwise = seen["pairwise"].structured_content
    assert (pairwise["wins"], pairwise["tied"], pairwise["losses"]) == (6, 6, 0)
    assert pairwise["winRate"] == 0.75 and pairwise["low"] < 0.75 < pairwise["high"]
    assert "B wins 6, ties 6, A wins 0; win rate of B 0.75" in text_of(seen["pairwise"])
    prose = seen["prose"].structured_content
    assert prose["winRate"] is None and prose["errors"] == 12
    assert "the pairwise judge 'chatty' did not answer JSON" in text_of(seen["prose"])
