"""`cobalt_labels` through the real protocol: a run's labels and disagreements, read-only,
paged and within the token budget."""

from __future__ import annotations

from mcp import ClientSession

from tests.conftest import Project
from tests.test_labels_cli import EXPERIMENT
from tests.test_mcp import run_session, text_of


def test_cobalt_labels_reads_a_runs_labels_and_its_disagreements(
    project: Project, cobalt_cli, fake_provider_server
):
    project.write("experiments/qa.cobalt.py", EXPERIMENT)
    ran = cobalt_cli(project, "run", "--quiet")
    assert ran.returncode == 0, ran.stderr
    run_id = ran.stdout.split("Run ID:")[1].split()[0]
    long_note = "because " * 1_000  # 8,000 characters: shortened to fit
    project.write_jsonl(
        "labels.jsonl",
        [
            {"run": run_id, "itemKey": "q0", "evaluator": "exact", "verdict": "pass"},
            {"run": run_id, "itemKey": "q1", "evaluator": "exact", "verdict": "pass"},
            {
                "run": run_id,
                "itemKey": "q2",
                "evaluator": "polite",
                "verdict": "fail",
                "note": long_note,
                "reviewer": "bo",
            },
        ],
    )
    imported = cobalt_cli(project, "labels", "import", "labels.jsonl", "--reviewer", "ana")
    assert imported.returncode == 0, imported.stderr
    seen = {}

    async def scenario(session: ClientSession) -> None:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        seen["tool"] = tools["cobalt_labels"]
        seen["all"] = await session.call_tool("cobalt_labels", {"runId": run_id[:6]})
        seen["disagreements"] = await session.call_tool(
            "cobalt_labels", {"runId": run_id, "disagreements": True}
        )
        seen["page"] = await session.call_tool(
            "cobalt_labels", {"runId": run_id, "limit": 1, "offset": 1}
        )
        seen["exact"] = await session.call_tool(
            "cobalt_labels", {"runId": run_id, "evaluator": "exact"}
        )
        seen["unknown"] = await session.call_tool(
            "cobalt_labels", {"runId": run_id, "evaluator": "nope"}
        )
        seen["missing"] = await session.call_tool("cobalt_labels", {"runId": "nosuchrun"})

    run_session(project, fake_provider_server, scenario)

    tool = seen["tool"]
    assert tool.annotations.read_only_hint is True
    assert tool.input_schema["required"] == ["runId"]
    assert {"summary", "labels", "page"} <= set(tool.output_schema["required"])

    everything = seen["all"].structured_content
    assert everything["summary"] == {
        "labels": 3,
        "stale": 0,
        "itemsLabelled": 3,
        "reviewers": ["ana", "bo"],
        "disagreements": 2,
    }
    assert [(r["itemKey"], r["reviewer"], r["disagrees"]) for r in everything["labels"]] == [
        ("q0", "ana", False),
        ("q1", "ana", True),
        ("q2", "bo", True),
    ]
    shortened = everything["labels"][2]
    assert len(shortened["note"]) < 2_100 and shortened["shortened"] == [
        "note: 8,000 characters, the first 2,000 kept"
    ]
    text = text_of(seen["all"])
    assert "3 labels on 3 items by ana, bo; 2 disagree with the judge." in text
    assert "#2 q1 · exact: ana says pass, the judge 0.00 fail" in text

    disagreements = seen["disagreements"].structured_content
    assert [r["itemKey"] for r in disagreements["labels"]] == ["q1", "q2"]
    assert disagreements["filter"] == {"evaluator": None, "disagreements": True}
    page = seen["page"].structured_content
    assert [r["itemKey"] for r in page["labels"]] == ["q1"]
    assert page["page"] == {"offset": 1, "returned": 1, "total": 3, "nextOffset": 2}
    assert "more with cobalt_labels offset=2" in text_of(seen["page"])
    assert [r["itemKey"] for r in seen["exact"].structured_content["labels"]] == ["q0", "q1"]
    assert seen["unknown"].is_error
    assert "has no evaluator 'nope' (it has: exact, polite)" in text_of(seen["unknown"])
    assert seen["missing"].is_error and "no run with id 'nosuchrun'" in text_of(seen["missing"])
