"""Traces through the real `cobalt` command: a user's own tracer provider keeps its spans,
failing-item lines count the steps, `cobalt export` carries the trace."""

from __future__ import annotations

import json

from tests.helpers import run_id_of
from tests.trace_agents import USER_TRACING_EXPERIMENT, WEATHER_EXPERIMENT


def test_a_users_own_tracer_provider_still_receives_its_spans(project, cobalt_cli, tmp_path):
    spans_file = tmp_path / "spans.txt"
    project.write("cobalt.toml", 'test_dir = "experiments"\n')
    project.write("experiments/mine.cobalt.py", USER_TRACING_EXPERIMENT)
    done = cobalt_cli(
        project, "run", "experiments/mine.cobalt.py", env={"SPANS_FILE": str(spans_file)}
    )
    assert "Run ID" in done.stdout, done.stdout + done.stderr
    # The user's exporter got their own spans and the SDK calls, as before Cobalt was there.
    names = spans_file.read_text().split()
    assert names.count("my-agent") == 4
    assert names.count("ChatCompletion") == 7  # 2 per city, 1 for Atlantis (it failed)
    # And Cobalt captured the same steps per item, the user's span as the parent.
    (results_file,) = project.results_files()
    items = {i["key"]: i for i in json.loads(results_file.read_text())["items"]}
    paris = items["paris"]["trace"]
    assert [(s["kind"], s["name"], s["parent"]) for s in paris] == [
        ("other", "my-agent", None),
        ("llm", "ChatCompletion", 0),
        ("tool", "get_weather", 0),
        ("llm", "ChatCompletion", 0),
    ]
    assert items["paris"]["evaluations"]["tools"]["score"] == 1.0
    assert items["paris"]["evaluations"]["judge"]["score"] == 0.9  # its calls: not traced
    assert items["paris"]["tokens"] > 0 and items["paris"]["cost"] > 0


def test_failing_items_count_their_steps_and_export_carries_the_trace(project, cobalt_cli):
    project.write("cobalt.toml", 'test_dir = "experiments"\n')
    project.write("experiments/weather.cobalt.py", WEATHER_EXPERIMENT)
    done = cobalt_cli(project, "run", "experiments/weather.cobalt.py")
    failing = [line for line in done.stdout.splitlines() if "✗ Item" in line]
    # The model call, and the tool call it asked for (which raised: it has no result).
    assert len(failing) == 1 and failing[0].rstrip().endswith("· 2 steps"), done.stdout
    assert "RuntimeError: no weather station in Atlantis" in failing[0]
    run_id = run_id_of(done.stdout)

    exported = cobalt_cli(project, "export", run_id, "--format", "json")
    assert exported.returncode == 0, exported.stderr
    items = {i["key"]: i for i in json.loads(exported.stdout)["items"]}
    assert [s["kind"] for s in items["paris"]["trace"]] == ["llm", "tool", "llm"]
    call, tool = items["atlantis"]["trace"]
    assert (call["kind"], tool["kind"], tool["name"]) == ("llm", "tool", "get_weather")
    assert tool["status"] is None and tool["output"] is None  # it never answered
    markdown = cobalt_cli(project, "export", run_id, "--format", "md").stdout
    assert "| Steps |" in markdown
    assert "3 (llm, tool get_weather, llm)" in markdown

    # A re-judge scores the stored outputs again: tool-calls reads the stored trace.
    rejudged = cobalt_cli(project, "rejudge", run_id)
    assert rejudged.returncode == 0, rejudged.stdout + rejudged.stderr
    new_id = run_id_of(rejudged.stdout)
    again = json.loads(cobalt_cli(project, "export", new_id, "--format", "json").stdout)
    scores = {i["key"]: i["evaluations"].get("tools") for i in again["items"]}
    assert scores["paris"] == {
        "score": 1.0,
        "verdict": "pass",
        "reason": "1 tool call(s) match the 1 expected (strict)",
    }


LAZY_IMPORT_EXPERIMENT = """
import sys

from cobalt import Dataset, experiment

IMPORTED_AT_START = "anthropic" in sys.modules


@experiment("lazy", Dataset(items=[{"input": "Oslo"}]))
def run(ctx):
    import anthropic  # first imported here, after the run started

    client = anthropic.Anthropic()
    reply = client.messages.create(
        model="claude-3-5-haiku", max_tokens=20,
        messages=[{"role": "user", "content": f"ECHO: {ctx.item['input']}"}],
    )
    return {"output": reply.content[0].text, "metadata": {"importedAtStart": IMPORTED_AT_START}}
"""


def test_a_library_first_imported_inside_the_runner_is_traced(project, cobalt_cli):
    project.write("cobalt.toml", 'test_dir = "experiments"\n')
    project.write("experiments/lazy.cobalt.py", LAZY_IMPORT_EXPERIMENT)
    done = cobalt_cli(project, "run", "experiments/lazy.cobalt.py")
    (results_file,) = project.results_files()
    (item,) = json.loads(results_file.read_text())["items"]
    assert item["output"] == {"output": "Oslo", "metadata": {"importedAtStart": False}}, done.stdout
    assert [(s["kind"], s["model"]) for s in item["trace"]] == [("llm", "claude-3-5-haiku")]


def test_a_project_package_named_like_a_traced_library_is_left_alone(project, cobalt_cli):
    """`agents` is also the OpenAI Agents SDK's module name: a project's own `agents`
    package must import and run as before, its model calls still traced."""
    project.write("cobalt.toml", 'test_dir = "experiments"\n')
    project.write("agents/__init__.py", "")
    project.write(
        "agents/echo.py",
        "import openai\n\n"
        "def answer(text):\n"
        "    reply = openai.OpenAI().chat.completions.create(\n"
        '        model="gpt-4o", messages=[{"role": "user", "content": f"ECHO: {text}"}])\n'
        "    return reply.choices[0].message.content\n",
    )
    project.write(
        "experiments/mine.cobalt.py",
        "from agents.echo import answer\n"
        "from cobalt import Dataset, experiment\n\n"
        'experiment("mine", Dataset(items=[{"input": "hi"}, {"input": "ho"}]),\n'
        '           lambda ctx: answer(ctx.item["input"]))\n',
    )
    done = cobalt_cli(project, "run", "experiments/mine.cobalt.py")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "could not instrument" not in done.stderr
    (results_file,) = project.results_files()
    items = json.loads(results_file.read_text())["items"]
    assert sorted(i["output"]["output"] for i in items) == ["hi", "ho"]
    assert [[s["model"] for s in i["trace"]] for i in items] == [["gpt-4o"], ["gpt-4o"]]
