"""`cobalt mcp` driven through the real protocol: the SDK's stdio client launches the server.

Every test starts `python -m cobalt_cli mcp` in a project folder, with the OpenAI SDK pointed at
the fake provider (whose `[[reply:...]]` marker scripts what `cobalt_generate`'s LLM answers).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from cobalt.experiments import RunContext
from cobalt_app import discovery
from cobalt_app.generate_render import render_experiment
from cobalt_app.generate_spec import GenerateError, parse_spec
from tests.conftest import Project, cli_env
from tests.support_agent import SUPPORT_AGENT, support_spec

CONFIG_KEY = "sk-config-SECRET-cfg9"
ENV_KEY = "sk-test-openai-SECRET-0001"
SESSION_TIMEOUT = 90


def scripted(spec: dict[str, Any] | str) -> str:
    """`context` text that makes the fake provider answer exactly this reply."""
    reply = spec if isinstance(spec, str) else json.dumps(spec)
    assert "]]" not in reply, "the fake provider's marker ends at the first ]]"
    return f"A support agent for an online shop. [[reply:{reply}]]"


Scenario = Callable[[ClientSession], Awaitable[None]]


@contextlib.asynccontextmanager
async def mcp_session(
    folder: Path, env: dict[str, str], errlog_path: Path, python: str = sys.executable
) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=python, args=["-m", "cobalt_cli", "mcp"], cwd=str(folder), env=env
    )
    with errlog_path.open("a") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session


def run_session(
    project: Project, fake, scenario: Scenario, *, python: str = sys.executable, **env: str
) -> str:
    """Run a scenario against a fresh `cobalt mcp` (started by `python`: another virtualenv's
    for another version of the mcp SDK); returns what the server wrote to stderr."""
    variables = {
        "OPENAI_BASE_URL": fake.openai_base_url,
        "OPENAI_API_KEY": ENV_KEY,
        **env,
    }
    environment = {k: v for k, v in cli_env(variables).items() if v != ""}
    errlog_path = project.path.parent / "mcp-server.log"

    async def main() -> None:
        with anyio.fail_after(SESSION_TIMEOUT):
            async with mcp_session(project.path, environment, errlog_path, python) as session:
                await scenario(session)

    anyio.run(main)
    return errlog_path.read_text()


def text_of(result) -> str:
    return "\n".join(block.text for block in result.content if block.type == "text")


@pytest.fixture
def initialised(project: Project, cobalt_cli) -> Project:
    """A project folder after `cobalt init` (the offline example experiment)."""
    done = cobalt_cli(project, "init")
    assert done.returncode == 0, done.stderr
    return project


@pytest.fixture
def mcp_python() -> str:
    """The interpreter that runs `cobalt mcp` (tests/test_mcp_sdk1.py: one with mcp 1.x)."""
    return sys.executable


def test_a_session_lists_every_tool_resource_and_prompt(
    initialised, fake_provider_server, mcp_python
):
    async def scenario(session: ClientSession) -> None:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        assert set(tools) == {
            "cobalt_run",
            "cobalt_results",
            "cobalt_compare",
            "cobalt_labels",
            "cobalt_judge_disagreements",
            "cobalt_pairwise",
            "cobalt_generate",
            "cobalt_sweep",
        }
        assert tools["cobalt_compare"].input_schema["required"] == ["runA", "runB"]
        assert tools["cobalt_generate"].input_schema["required"] == ["agentFile"]
        assert set(tools["cobalt_run"].input_schema["properties"]) == {
            "file",
            "filter",
            "concurrency",
            "replay",
            "maxLlmCalls",
            "maxToolCalls",
            "maxTokens",
            "maxCost",
            "project",
        }
        assert tools["cobalt_results"].annotations.read_only_hint is True
        assert tools["cobalt_labels"].annotations.read_only_hint is True
        assert tools["cobalt_labels"].input_schema["required"] == ["runId"]
        for tool in tools.values():
            assert tool.input_schema["additionalProperties"] is False
            assert tool.output_schema["type"] == "object"
        assert {"runs", "loadErrors", "modules"} <= set(
            tools["cobalt_run"].output_schema["required"]
        )
        assert "regressionsPage" in tools["cobalt_compare"].output_schema["properties"]
        assert {"status", "evaluator", "maxScore", "offset", "limit"} <= set(
            tools["cobalt_results"].input_schema["properties"]
        )

        resources = {str(r.uri) for r in (await session.list_resources()).resources}
        assert resources == {"cobalt://config", "cobalt://experiments", "cobalt://latest-results"}
        experiments = json.loads(
            (await session.read_resource("cobalt://experiments")).contents[0].text
        )
        assert experiments == {
            "testDir": "experiments",
            "count": 1,
            "experiments": [{"path": "experiments/example.cobalt.py", "name": "example"}],
        }
        latest = json.loads(
            (await session.read_resource("cobalt://latest-results")).contents[0].text
        )
        assert latest == {"count": 0, "results": []}
        config = json.loads((await session.read_resource("cobalt://config")).contents[0].text)
        assert config["judge"]["apiKey"] == "***"
        assert config["judge"]["apiKeySource"] == "OPENAI_API_KEY"
        assert (config["testDir"], config["concurrency"], config["timeout"]) == (
            "experiments",
            5,
            30_000,
        )

        prompts = {p.name for p in (await session.list_prompts()).prompts}
        assert prompts == {"improve-agent", "generate-tests", "regression-check"}
        improve = await session.get_prompt(
            "improve-agent", {"experiment": "example-qa", "threshold": "0.9"}
        )
        text = improve.messages[0].content.text
        assert "'example-qa'" in text and "above 0.9" in text and "cobalt_compare" in text
        generate = await session.get_prompt("generate-tests", {"agentFile": "agents/bot.py"})
        assert "cobalt_generate with agentFile='agents/bot.py'" in generate.messages[0].content.text
        regression = await session.get_prompt("regression-check", {})
        assert "cobalt_compare" in regression.messages[0].content.text
        assert "CI gate (the run's `gate`" in regression.messages[0].content.text
        with pytest.raises(Exception, match="threshold must be a number"):
            await session.get_prompt("improve-agent", {"experiment": "x", "threshold": "high"})

    run_session(initialised, fake_provider_server, scenario, python=mcp_python)


def test_cobalt_run_streams_progress_and_returns_the_results_file(
    initialised, fake_provider_server, mcp_python
):
    progress: list[tuple[float, float | None, str | None]] = []
    seen: dict[str, Any] = {}

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, total, message))

    async def scenario(session: ClientSession) -> None:
        result = await session.call_tool(
            "cobalt_run", {"file": "experiments/example.cobalt.py"}, progress_callback=on_progress
        )
        assert not result.is_error, text_of(result)
        seen["run"] = result
        run_id = result.structured_content["runs"][0]["id"]

        listing = await session.call_tool("cobalt_results", {"limit": 5})
        assert [r["id"] for r in listing.structured_content["runs"]] == [run_id]
        assert listing.structured_content["runs"][0]["avgScore"] == pytest.approx(0.5)
        one = await session.call_tool("cobalt_results", {"runId": run_id[:6]})
        assert one.structured_content["items"] == result.structured_content["runs"][0]["items"]
        missing = await session.call_tool("cobalt_results", {"runId": "no-such-run"})
        assert missing.is_error and "no run with id 'no-such-run'" in text_of(missing)
        short = await session.call_tool("cobalt_results", {"runId": run_id[:2]})
        assert short.is_error and "a prefix needs at least 4 characters" in text_of(short)

        latest = json.loads(
            (await session.read_resource("cobalt://latest-results")).contents[0].text
        )
        assert latest["count"] == 1
        entry = latest["results"][0]
        assert (entry["id"], entry["total"], entry["completed"], entry["failed"]) == (
            run_id,
            8,
            8,
            0,
        )
        assert entry["scores"]["exact"] == {"avg": 0.5, "min": 0.0, "max": 1.0}

    run_session(initialised, fake_provider_server, scenario, python=mcp_python)

    assert [value for value, _, _ in progress] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert {total for _, total, _ in progress} == {8}
    assert all("item" in message and "exact" in message for _, _, message in progress)

    result = seen["run"]
    (structured,) = result.structured_content["runs"]
    (results_file,) = initialised.results_files()
    on_disk = json.loads(results_file.read_text())
    assert structured["id"] == on_disk["id"]
    assert structured["summary"] == on_disk["summary"]
    failing = [item for item in structured["items"] if item.pop("problems", None)]
    assert [item["key"] for item in failing] == [
        item["key"] for item in on_disk["items"] if item["evaluations"]["exact"]["score"] < 0.5
    ]
    assert structured["items"] == on_disk["items"]
    assert structured["itemCounts"] == {
        "total": 8,
        "failing": 4,
        "passing": 4,
        "notRun": 0,
        "shown": 8,
        "failingShown": 4,
    }
    assert structured["omitted"] is None
    assert structured["resultsFile"] == f".cobalt/results/{results_file.name}"
    (summary,) = [block.text for block in result.content]  # the data is sent once
    assert "4 of 8 items failing" in summary
    assert "capital-canada" in summary and "'Toronto'" in summary
    assert "capital-france" not in summary


CAPITALS_EXPERIMENT = """\
from agents.capitals import answer
from cobalt import Dataset, Evaluator, experiment

dataset = Dataset(items=[
    {"id": "france", "input": "Capital of France?", "expected": "Paris"},
    {"id": "japan", "input": "Capital of Japan?", "expected": "Tokyo"},
])


def correct(ctx):
    found = ctx.item["expected"].lower() in str(ctx.output).lower()
    return {"score": float(found), "reason": "right city" if found else "wrong city"}


evaluators = [
    Evaluator(name="correct", type="function", fn=correct),
    Evaluator(name="judge", prompt="Question: {{input}}\\nAnswer: {{output}}"),
]


@experiment("capitals", dataset, evaluators=evaluators)
def run(ctx):
    print("agent chatter on stdout", ctx.item["id"])  # must not corrupt the protocol
    return answer(ctx.item["input"])
"""

CAPITALS_AGENT = """\
ANSWERS = {{"france": "Paris [[score:0.9]]", "japan": "{japan}"}}


def answer(question):
    for country, city in ANSWERS.items():
        if country in question.lower():
            return city
    return "unknown"
"""


def test_an_edited_agent_is_reimported_and_compare_explains_the_change(
    project, fake_provider_server
):
    project.write("experiments/capitals.cobalt.py", CAPITALS_EXPERIMENT)
    project.write("agents/__init__.py", "")  # a regular package: the Agents SDK is `agents` too
    agent = project.write("agents/capitals.py", CAPITALS_AGENT.format(japan="Tokyo [[score:0.8]]"))
    seen: dict[str, Any] = {}

    async def scenario(session: ClientSession) -> None:
        first = await session.call_tool("cobalt_run", {"filter": "capitals"})
        assert not first.is_error, text_of(first)
        agent.write_text(CAPITALS_AGENT.format(japan="Kyoto, surely [[score:0.2]]"))
        second = await session.call_tool("cobalt_run", {"filter": "capitals"})
        assert not second.is_error, text_of(second)
        run_a = first.structured_content["runs"][0]["id"]
        run_b = second.structured_content["runs"][0]["id"]
        diff = await session.call_tool("cobalt_compare", {"runA": run_a, "runB": run_b})
        assert not diff.is_error, text_of(diff)
        seen.update(second=second, diff=diff)

    stderr = run_session(project, fake_provider_server, scenario)

    # Printed by two runner threads at once: the words are there, however the writes interleave.
    assert stderr.count("agent chatter on stdout") == 4
    assert stderr.count("japan") >= 2 and stderr.count("france") >= 2
    (second,) = seen["second"].structured_content["runs"]
    outputs = {i["key"]: i["output"]["output"] for i in second["items"]}
    assert outputs["japan"] == "Kyoto, surely [[score:0.2]]"  # the edited module, not a stale one
    diff = seen["diff"].structured_content
    assert diff["evaluators"]["correct"]["delta"] == pytest.approx(-0.5)
    assert diff["evaluators"]["judge"]["delta"] == pytest.approx(-0.3)
    assert diff["improvements"] == []
    by_evaluator = {row["evaluator"]: row for row in diff["regressions"]}
    assert set(by_evaluator) == {"correct", "judge"}
    judge = by_evaluator["judge"]
    assert (judge["key"], judge["a"], judge["b"]) == ("japan", 0.8, 0.2)
    assert judge["outputA"] == "Tokyo [[score:0.8]]"
    assert judge["outputB"] == "Kyoto, surely [[score:0.2]]"
    assert judge["reasonB"] == "fake judge: scripted score"
    assert judge["input"]["input"] == "Capital of Japan?"
    assert by_evaluator["correct"]["reasonA"] == "right city"
    assert by_evaluator["correct"]["reasonB"] == "wrong city"
    assert "Regressed: japan · correct 1.00 → 0.00" in seen["diff"].content[0].text


def test_a_runner_error_names_the_project_line_to_fix(initialised, fake_provider_server):
    example = initialised.path / "experiments" / "example.cobalt.py"
    source = example.read_text()
    broken = 'output = answr(ctx.item["input"])'
    example.write_text(source.replace('output = answer(ctx.item["input"])', broken))
    line = source.splitlines().index('    output = answer(ctx.item["input"])') + 1
    seen: dict[str, Any] = {}

    async def scenario(session: ClientSession) -> None:
        seen["run"] = await session.call_tool("cobalt_run", {})

    run_session(initialised, fake_provider_server, scenario)
    text = text_of(seen["run"]).splitlines()
    assert text[3:5] == [
        "  - #1 capital-france: error: NameError: name 'answr' is not defined",
        f"      at experiments/example.cobalt.py:{line} in run: {broken}",
    ]
    assert "^^^^^" not in "\n".join(text)  # no carets, no repeated exception line


def test_a_run_says_whether_it_passes_the_ci_gate(initialised, fake_provider_server, cobalt_cli):
    seen: dict[str, Any] = {}

    async def scenario(session: ClientSession) -> None:
        seen["default"] = await session.call_tool("cobalt_run", {})
        config = initialised.path / "cobalt.toml"
        text = config.read_text().replace("# [ci.thresholds.exact]\n# avg = 0.8", "")
        config.write_text(text + "[ci.thresholds.exact]\navg = 0.8\n")
        seen["gated"] = await session.call_tool("cobalt_run", {})
        run_id = seen["gated"].structured_content["runs"][0]["id"]
        seen["read"] = await session.call_tool("cobalt_results", {"runId": run_id})

    run_session(initialised, fake_provider_server, scenario)
    default = seen["default"].structured_content["runs"][0]["gate"]
    assert default == {"passed": True, "checks": 4, "violations": []}
    assert text_of(seen["default"]).splitlines()[1] == (
        "CI gate (cobalt run --ci, no baseline): passes its 4 checks."
    )
    gated = seen["gated"].structured_content["runs"][0]["gate"]
    assert gated == {"passed": False, "checks": 5, "violations": ["exact avg 0.5 < 0.8"]}
    assert text_of(seen["gated"]).splitlines()[1] == (
        "CI gate (cobalt run --ci, no baseline): FAILS: exact avg 0.5 < 0.8."
    )
    assert seen["read"].structured_content["gate"] == gated
    ci = cobalt_cli(initialised, "run", "--ci")  # the same verdict as the command's
    assert ci.returncode == 1 and "exact avg 0.5 < 0.8" in ci.stdout


def test_a_page_of_failing_items_lists_them_in_its_text(initialised, fake_provider_server):
    seen: dict[str, Any] = {}

    async def scenario(session: ClientSession) -> None:
        run = await session.call_tool("cobalt_run", {})
        run_id = run.structured_content["runs"][0]["id"]
        seen["page"] = await session.call_tool(
            "cobalt_results", {"runId": run_id, "status": "failing", "limit": 3}
        )

    run_session(initialised, fake_provider_server, scenario)
    lines = text_of(seen["page"]).splitlines()
    assert lines[0].endswith(
        "items 1–3 of 4 matching (status=failing); 1 more: call cobalt_results again with offset 3."
    )
    assert lines[1:] == [
        "  - #4 capital-canada: exact 0.00 — output differs from expected 'Ottawa'; "
        "mentions-answer 0.00 — answer missing | output: 'Toronto'",
        "  - #5 capital-australia: exact 0.00 — output differs from expected 'Canberra'; "
        "mentions-answer 0.00 — answer missing | output: 'Sydney'",
        "  - #6 capital-brazil: exact 0.00 — output differs from expected 'Brasília'; "
        'mentions-answer 0.00 — answer missing | output: "I don\'t know"',
    ]


def test_config_resource_and_logs_never_show_an_api_key(initialised, fake_provider_server):
    config = initialised.path / "cobalt.toml"
    config.write_text(f'{config.read_text()}\n[judge]\napi_key = "{CONFIG_KEY}"\n')
    seen: dict[str, str] = {}

    async def scenario(session: ClientSession) -> None:
        seen["config"] = (await session.read_resource("cobalt://config")).contents[0].text
        run = await session.call_tool("cobalt_run", {})
        assert not run.is_error, text_of(run)
        seen["run"] = text_of(run)

    stderr = run_session(initialised, fake_provider_server, scenario, OPENAI_API_KEY="")

    assert "SECRET" not in seen["config"]
    data = json.loads(seen["config"])
    assert data["judge"] == {
        "provider": "openai",
        "model": "gpt-4o-mini",
        "baseUrl": None,
        "apiKey": "***",
        "apiKeySource": "api_key in the configuration",
    }
    assert data["cache"] == {"enabled": True, "ttl": 7 * 24 * 3600 * 1000}
    assert "SECRET" not in seen["run"]
    assert "cobalt mcp serving" in stderr and "SECRET" not in stderr
    for path in initialised.results_files():
        assert "SECRET" not in path.read_text()


def test_file_arguments_outside_the_project_are_refused(
    initialised, fake_provider_server, tmp_path, mcp_python
):
    outside = tmp_path / "outside.cobalt.py"
    outside.write_text("open('PWNED', 'w').write('imported')\n")
    (initialised.path / "escape.cobalt.py").symlink_to(outside)
    initialised.write("experiments/broken.cobalt.py", "raise RuntimeError('boom at import')\n")
    refusals: list[str] = []

    async def scenario(session: ClientSession) -> None:
        for arguments in (
            {"file": "../outside.cobalt.py"},
            {"file": str(outside)},
            {"file": "/etc/passwd"},
            {"file": "escape.cobalt.py"},
        ):
            result = await session.call_tool("cobalt_run", arguments)
            assert result.is_error, arguments
            refusals.append(text_of(result))
        for arguments in (
            {"agentFile": "../outside.cobalt.py"},
            {"agentFile": "/etc/passwd"},
            {"agentFile": "experiments/example.cobalt.py", "outputFile": "../x.cobalt.py"},
        ):
            result = await session.call_tool("cobalt_generate", arguments)
            assert result.is_error, arguments
            refusals.append(text_of(result))

        wrong_suffix = await session.call_tool(
            "cobalt_generate",
            {"agentFile": "experiments/example.cobalt.py", "outputFile": "experiments/x.txt"},
        )
        assert "must end with .cobalt.py or .experiment.py" in text_of(wrong_suffix)
        missing = await session.call_tool("cobalt_run", {"file": "experiments/nope.cobalt.py"})
        assert missing.is_error and "does not exist" in text_of(missing)
        broken = await session.call_tool("cobalt_run", {"file": "experiments/broken.cobalt.py"})
        assert broken.is_error
        assert "failed to import: RuntimeError: boom at import" in text_of(broken)
        # An argument the schema refuses: one line saying which and why, no pydantic report.
        bad_argument = await session.call_tool("cobalt_run", {"concurrency": 0})
        assert bad_argument.is_error and text_of(bad_argument) == (
            "Error executing tool cobalt_run: concurrency: input should be greater than or "
            "equal to 1 (got 0)"
        )
        unknown = await session.call_tool("cobalt_run", {"fiel": "experiments/example.cobalt.py"})
        assert unknown.is_error and text_of(unknown) == (
            "Error executing tool cobalt_run: fiel is not an argument; the arguments are: "
            "file, filter, concurrency, replay, maxLlmCalls, maxToolCalls, maxTokens, maxCost, "
            "project"
        )
        status = await session.call_tool("cobalt_results", {"runId": "x", "status": "failed"})
        assert text_of(status) == (
            "Error executing tool cobalt_results: status: input should be 'failing', 'passing', "
            "'ok', 'error', 'timeout', 'cancelled' or 'pending' (got 'failed')"
        )
        half = await session.call_tool("cobalt_compare", {"runA": "x"})
        assert text_of(half) == "Error executing tool cobalt_compare: runB is required"
        paging_a_list = await session.call_tool("cobalt_results", {"status": "failing"})
        assert paging_a_list.is_error and "give runId" in text_of(paging_a_list)

        # The server is still there and still works.
        assert len((await session.list_tools()).tools) == 8
        example = await session.call_tool("cobalt_run", {"file": "experiments/example.cobalt.py"})
        assert not example.is_error
        assert example.structured_content["runs"][0]["name"] == "example-qa"
        assert "broken.cobalt.py failed to import" not in text_of(example)

    run_session(initialised, fake_provider_server, scenario, python=mcp_python)

    for message in refusals:
        assert "resolves outside the project folder" in message
        assert "only files inside the project can be used" in message
    assert not (initialised.path / "PWNED").exists() and not (tmp_path / "PWNED").exists()
    assert not (tmp_path / "x.cobalt.py").exists()


def test_generate_writes_an_experiment_that_cobalt_run_runs(
    initialised, fake_provider_server, cobalt_cli
):
    initialised.write("agents/__init__.py", "")  # a regular package: the Agents SDK is `agents` too
    initialised.write("agents/support.py", SUPPORT_AGENT)
    fake_provider_server.reset()
    arguments = {
        "agentFile": "agents/support.py",
        "datasetSize": 5,
        "runOneItem": True,
        "context": scripted(support_spec()),
    }
    progress: list[float] = []
    seen: dict[str, Any] = {}

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    async def scenario(session: ClientSession) -> None:
        generated = await session.call_tool("cobalt_generate", arguments)
        assert not generated.is_error, text_of(generated)
        seen["generated"] = generated
        again = await session.call_tool("cobalt_generate", arguments)
        assert again.is_error
        assert "experiments/support.cobalt.py already exists; pass overwrite: true" in text_of(
            again
        )
        replaced = await session.call_tool(
            "cobalt_generate", {**arguments, "overwrite": True, "runOneItem": False}
        )
        assert not replaced.is_error and replaced.structured_content["overwritten"] is True
        run = await session.call_tool(
            "cobalt_run", {"file": "experiments/support.cobalt.py"}, progress_callback=on_progress
        )
        assert not run.is_error, text_of(run)
        seen["run"] = run

    run_session(initialised, fake_provider_server, scenario)

    data = seen["generated"].structured_content
    assert data["path"] == "experiments/support.cobalt.py"
    assert (data["name"], data["function"], data["itemCount"]) == ("support-agent", "answer", 5)
    assert data["categories"] == {"normal": 3, "edge": 1, "adversarial": 1}
    assert [e["name"] for e in data["evaluators"]] == ["helpfulness", "mentions-answer", "concise"]
    assert data["trial"]["status"] == "ok"
    assert data["trial"]["output"] == "You can ask for a refund within 30 days of delivery."
    assert data["trial"]["evaluations"]["mentions-answer"]["score"] == 1.0
    assert "Wrote experiments/support.cobalt.py (new)" in seen["generated"].content[0].text

    prompts = [
        message["content"]
        for request in fake_provider_server.requests
        if request["path"].endswith("/chat/completions")
        for message in request["json"]["messages"]
        if "Design a Cobalt experiment" in str(message["content"])
    ]
    assert len(prompts) == 2  # the first generation and the overwrite
    assert "def answer(question: str) -> str" in prompts[0]
    assert "POLICIES = {" in prompts[0]  # the agent's source
    assert arguments["context"] in prompts[0]  # the developer's notes, verbatim

    assert progress == [1, 2, 3, 4, 5]
    assert "All items passed" in seen["run"].content[0].text

    done = cobalt_cli(initialised, "run", "experiments/support.cobalt.py")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "support-agent" in done.stdout
    latest = json.loads(initialised.results_files()[-1].read_text())
    assert latest["name"] == "support-agent" and len(latest["items"]) == 5
    assert {i["key"] for i in latest["items"]} == {i["id"] for i in support_spec()["items"]}


def test_generate_explains_an_unusable_llm_reply(initialised, fake_provider_server):
    initialised.write("agents/support.py", SUPPORT_AGENT)
    no_field = support_spec()
    del no_field["items"][3]["expected_output"]
    cases = {
        "this is prose, not JSON": "the LLM did not reply with the JSON spec",
        json.dumps(support_spec(function="respond")): "calls function 'respond', which the agent",
        json.dumps(no_field): "spec.items[3] (empty-question) has none",
        json.dumps(support_spec(items=[{"id": "x", "category": "weird", "input": "hi"}])): (
            "spec.items[0].category: 'weird' is not one of"
        ),
    }
    messages: dict[str, str] = {}

    async def scenario(session: ClientSession) -> None:
        for reply in cases:
            result = await session.call_tool(
                "cobalt_generate", {"agentFile": "agents/support.py", "context": scripted(reply)}
            )
            assert result.is_error
            messages[reply] = text_of(result)

    run_session(initialised, fake_provider_server, scenario)

    for reply, expected in cases.items():
        assert expected in messages[reply]
    assert not (initialised.path / "experiments" / "support.cobalt.py").exists()

    async def without_key(session: ClientSession) -> None:
        result = await session.call_tool(
            "cobalt_generate",
            {"agentFile": "agents/support.py", "context": scripted(support_spec())},
        )
        assert result.is_error
        messages["key"] = text_of(result)

    run_session(initialised, fake_provider_server, without_key, OPENAI_API_KEY="")
    assert "OPENAI_API_KEY is not set" in messages["key"]


def test_the_rendered_file_keeps_llm_text_out_of_the_code(project):
    agent = project.write(
        "agents/my-bot.py", "async def reply(text, *, tone='plain'):\n    return text\n"
    )
    hostile = "x'''\"\"\"\\\nimport os; os.system('touch PWNED')  # "
    spec = parse_spec(
        "```json\n"
        + json.dumps(
            {
                "name": "hostile",
                "description": hostile,
                "function": "reply",
                "arguments": {"text": "input", "tone": "style"},
                "items": [{"id": hostile, "category": "edge", "input": hostile, "style": "x"}],
                "evaluators": [
                    {"name": "judge", "type": "llm-judge", "prompt": hostile + "{{output}}"}
                ],
            }
        )
        + "\n```"
    )
    output = project.path / "experiments" / "hostile.cobalt.py"
    output.parent.mkdir()
    from cobalt_app.generate_spec import agent_functions

    functions = agent_functions(agent.read_text(), "agents/my-bot.py")
    output.write_text(
        render_experiment(
            spec,
            functions["reply"],
            agent_path=agent,
            output_path=output,
            project_dir=project.path,
        )
    )
    loaded = discovery.load_file(output, project.path)
    assert loaded.error is None, loaded.traceback
    (experiment,) = loaded.experiments
    assert experiment.dataset.items == spec["items"]
    assert experiment.evaluators[0].prompt == hostile + "{{output}}"
    assert experiment.is_async  # the agent function is async, so is the runner
    context = RunContext(item=spec["items"][0], index=0, run_index=0, item_key="k")
    assert asyncio.run(experiment.runner(context)) == hostile
    assert not (project.path / "PWNED").exists()
    with pytest.raises(GenerateError, match="no JSON object found|did not reply"):
        parse_spec("")


def test_generate_calls_its_llm_without_holding_up_runs(initialised, fake_provider, monkeypatch):
    initialised.write("agents/__init__.py", "")  # a regular package: the Agents SDK is `agents`
    initialised.write("agents/support.py", SUPPORT_AGENT)
    monkeypatch.setattr(fake_provider, "latency", 6.0)  # the LLM takes its time
    order: list[str] = []

    async def generate(session: ClientSession) -> None:
        arguments = {"agentFile": "agents/support.py", "context": scripted(support_spec())}
        generated = await session.call_tool("cobalt_generate", arguments)
        assert not generated.is_error, text_of(generated)
        order.append("generated")

    async def scenario(session: ClientSession) -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(generate, session)
            with anyio.fail_after(10):
                while not fake_provider.request_count("/v1/chat"):  # the LLM call is going
                    await anyio.sleep(0.02)
            run = await session.call_tool("cobalt_run", {"file": "experiments/example.cobalt.py"})
            assert not run.is_error, text_of(run)
            order.append("ran")

    run_session(initialised, fake_provider, scenario)

    assert order == ["ran", "generated"]


def test_cobalt_run_keeps_to_the_rule_every_door_applies(initialised, fake_provider_server):
    # The same rule as the CLI, the API and the workers (`discovery.runnable_file`): an
    # experiment file under the test directory whose name matches test_match.
    initialised.write("experiments/helper.py", "open('PWNED', 'w').write('imported')\n")
    initialised.write("scripts/side.cobalt.py", "open('PWNED', 'w').write('imported')\n")
    messages: dict[str, str] = {}

    async def scenario(session: ClientSession) -> None:
        for name in ("experiments/helper.py", "scripts/side.cobalt.py"):
            result = await session.call_tool("cobalt_run", {"file": name})
            assert result.is_error, name
            messages[name] = text_of(result)

    run_session(initialised, fake_provider_server, scenario)
    assert "is not an experiment file" in messages["experiments/helper.py"]
    assert "(test_match)" in messages["experiments/helper.py"]
    assert "is not under the test directory experiments/" in messages["scripts/side.cobalt.py"]
    assert not (initialised.path / "PWNED").exists()
