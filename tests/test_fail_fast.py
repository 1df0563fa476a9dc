"""Fail fast: what can be checked before a run starts stops it before the agent is called, and
a runner that forgot its `return` is an evaluation error, never a score of 0."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cobalt import Dataset, Evaluator, experiment, load_config
from cobalt.experiments import collecting
from cobalt_app import evaluators, preflight
from cobalt_app.ci_verdict import error_cause
from cobalt_app.engine import NOTHING_RETURNED
from cobalt_app.models import Evaluation, ItemResult, Run
from tests.conftest import cli_env
from tests.helpers import define, execute

# The agent calls the (fake) provider through the official SDK, with its own key: any agent
# call shows up in `fake_provider.requests`, whatever the judges' keys are.
AGENT_EXPERIMENT = """\
import os

from openai import OpenAI

from cobalt import Dataset, Evaluator, experiment

client = OpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key="agent-key", max_retries=0)
dataset = Dataset(items=[{"id": "q1", "input": "Paris", "expected_output": "Paris"}])


def agent(question):
    messages = [{"role": "user", "content": "ECHO: " + question}]
    return client.chat.completions.create(model="agent", messages=messages).choices[0].message.content


experiment(
    "agent",
    dataset,
    lambda ctx: agent(ctx.item["input"]),
    evaluators=[
        EVALUATOR,
    ],
)
"""
FILE = "experiments/agent.cobalt.py"
EXPERIMENT_AT = f"{FILE}:{AGENT_EXPERIMENT.splitlines().index('experiment(') + 1}"
EVALUATOR_AT = f"{FILE}:{AGENT_EXPERIMENT.splitlines().index('        EVALUATOR,') + 1}"
NO_KEY = {"OPENAI_API_KEY": "", "ANTHROPIC_API_KEY": ""}

REFUSED = {
    "unknown-type": (
        'Evaluator(name="exact", type="exact_match")',
        {},
        "evaluator 'exact': unknown evaluator type 'exact_match'. Did you mean 'exact-match'?",
    ),
    "misspelt-option": (
        'Evaluator(name="polite", type="contains", value="Paris", case_sensitve=False)',
        {},
        "evaluator 'polite': the contains evaluator has no option `case_sensitve=`. Did you mean "
        "`case_sensitive=`? Its options: name, type, timeout, pass_threshold, per_turn, case_sensitive, "
        "field, value",
    ),
    "misspelt-pattern": (
        'Evaluator(name="city", type="regex", patern="^P")',
        {},
        "evaluator 'city': the regex evaluator has no option `patern=`. Did you mean `pattern=`?",
    ),
    "misspelt-type-keyword": (
        'Evaluator(name="judge", prompt="Rate {{output}}", typ="llm-judge")',
        {},
        "evaluator 'judge': the llm-judge evaluator has no option `typ=`. Did you mean `type=`?",
    ),
    "judge-key": (
        'Evaluator(name="judge", prompt="Rate {{output}}")',
        NO_KEY,
        "evaluator 'judge': OPENAI_API_KEY is not set: the llm-judge 'judge' calls the openai "
        "API. Set OPENAI_API_KEY in your environment (`export OPENAI_API_KEY=...`, or a CI "
        "secret), not in cobalt.toml: it is committed.",
    ),
    "anthropic-judge-key": (
        'Evaluator(name="claude", prompt="Rate {{output}}", provider="anthropic")',
        NO_KEY,
        "evaluator 'claude': ANTHROPIC_API_KEY is not set: the llm-judge 'claude' calls the "
        "anthropic API. Set ANTHROPIC_API_KEY",
    ),
    "similarity-key": (
        'Evaluator(name="close", type="similarity")',
        NO_KEY,
        "evaluator 'close': OPENAI_API_KEY is not set: the similarity evaluator 'close' calls "
        "the openai API",
    ),
    "autoevals-key": (
        'Evaluator(name="facts", type="autoevals", autoeval="Factuality")',
        NO_KEY,
        "evaluator 'facts': OPENAI_API_KEY is not set: the autoevals evaluator 'facts' "
        "(Factuality) calls the openai API",
    ),
    "own-key-variable": (
        'Evaluator(name="judge", prompt="Rate {{output}}", api_key_env="TEAM_JUDGE_KEY")',
        {},
        "evaluator 'judge': TEAM_JUDGE_KEY is not set: the llm-judge 'judge' calls the openai "
        "API. Set TEAM_JUDGE_KEY",
    ),
}


def write_agent(project, evaluator: str) -> None:
    project.write(FILE, AGENT_EXPERIMENT.replace("EVALUATOR", evaluator))


def test_the_agent_experiment_calls_the_agent_when_nothing_is_wrong(
    project, cobalt_cli, fake_provider
):
    write_agent(project, 'Evaluator(name="exact", type="exact-match", case_sensitive=False)')
    result = cobalt_cli(project, "run", "--ci", env=NO_KEY)
    assert result.returncode == 0, result.stdout + result.stderr
    (request,) = fake_provider.requests
    assert request["json"]["model"] == "agent"


@pytest.mark.parametrize(("evaluator", "env", "message"), REFUSED.values(), ids=REFUSED)
def test_a_run_that_cannot_succeed_stops_before_the_agent_is_called(
    project, cobalt_cli, fake_provider, evaluator, env, message
):
    write_agent(project, evaluator)
    result = cobalt_cli(project, "run", env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    stderr = " ".join(result.stderr.split())  # unwrapped
    assert f"experiment 'agent' ({EXPERIMENT_AT}) cannot start:" in stderr
    assert f"{EVALUATOR_AT}: {message}" in stderr
    assert "Nothing ran and no agent was called" in stderr
    assert fake_provider.request_count() == 0
    assert project.results_files() == []


def test_a_typ_keyword_without_a_prompt_fails_at_the_evaluator_line(
    project, cobalt_cli, fake_provider
):
    write_agent(project, 'Evaluator(name="exact", typ="exact-match")')
    result = cobalt_cli(project, "run")
    assert result.returncode == 2
    stderr = " ".join(result.stderr.split())
    line = EVALUATOR_AT.rsplit(":", 1)[1]
    assert (
        f"{FILE} failed to import: ValueError: Evaluator 'exact' at agent.cobalt.py:{line}: an "
        "llm-judge needs a `prompt`. (llm-judge is the default type: did you mean `type=` "
        "instead of `typ=`?)"
    ) in stderr
    assert fake_provider.request_count() == 0


def test_ci_mode_reports_every_problem_as_a_setup_error(project, cobalt_cli, fake_provider):
    project.write(
        FILE,
        AGENT_EXPERIMENT.replace(
            "EVALUATOR",
            'Evaluator(name="exact", type="exact_match"),\n'
            '        Evaluator(name="judge", prompt="Rate {{output}}")',
        ),
    )
    junit = project.path / "junit.xml"
    result = cobalt_cli(project, "run", "--ci", "--junit", str(junit), env=NO_KEY)
    assert result.returncode == 2, result.stdout + result.stderr
    stdout = " ".join(result.stdout.split())
    line = int(EVALUATOR_AT.rsplit(":", 1)[1])
    assert (
        f"✗ {FILE}:{line}: evaluator 'exact' of experiment 'agent' ({EXPERIMENT_AT}): unknown "
        "evaluator type 'exact_match'. Did you mean 'exact-match'?"
    ) in stdout
    assert (
        f"✗ {FILE}:{line + 1}: evaluator 'judge' of experiment 'agent' ({EXPERIMENT_AT}): "
        "OPENAI_API_KEY is not set"
    ) in stdout
    assert "CI failed: configuration or import errors (exit 2)" in stdout
    assert "unknown evaluator type 'exact_match'" in junit.read_text()
    assert fake_provider.request_count() == 0


def test_running_the_file_directly_stops_before_the_agent_is_called(project, fake_provider):
    write_agent(project, 'Evaluator(name="polite", type="contains", value="P", case_sensitve=0)')
    env = cli_env(
        {"OPENAI_BASE_URL": fake_provider.openai_base_url, "OPENAI_API_KEY": "sk-test-0001"}
    )
    result = subprocess.run(
        [sys.executable, FILE],
        cwd=project.path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"error: experiment 'agent' ({EXPERIMENT_AT}) cannot start:" in result.stderr
    assert f"{EVALUATOR_AT}: evaluator 'polite': the contains evaluator has no option" in (
        result.stderr
    )
    assert "Traceback" not in result.stderr
    assert fake_provider.request_count() == 0


# ---------------------------------------------------------------------- what is not refused


def problems_of(project, *evaluator_list: Evaluator, config_text: str | None = None) -> list[str]:
    if config_text:
        project.write("cobalt.toml", config_text)
    with collecting() as found:
        experiment("checked", Dataset(items=[{"x": 1}]), lambda ctx: 1, evaluators=evaluator_list)
    return [p.message for p in preflight.problems(found, load_config(project.path))]


def test_evaluators_that_need_no_key_pass_without_one(project, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    local_judge = "http://127.0.0.1:11434/v1"
    assert (
        problems_of(
            project,
            Evaluator("exact", "exact-match", field="expected_output", case_sensitive=False),
            Evaluator("fn", "function", fn=lambda ctx: 1.0),
            Evaluator("local-sim", "similarity", provider="local", threshold=0.5),
            Evaluator("lev", "autoevals", autoeval="Levenshtein", expected="answer"),
            Evaluator(
                "emb", "autoevals", autoeval="EmbeddingSimilarity", embedding_provider="local"
            ),
            Evaluator("ollama", prompt="{{output}}", model="llama3", base_url=local_judge),
        )
        == []
    )
    # An OpenAI-compatible server configured for every judge needs no key either.
    config_text = f'test_dir = "experiments"\n[judge]\nbase_url = "{local_judge}"\n'
    assert problems_of(project, Evaluator("j", prompt="{{output}}"), config_text=config_text) == []


def test_a_key_under_judge_in_the_config_counts(project, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    config_text = 'test_dir = "experiments"\n[judge]\napi_key = "sk-from-config"\n'
    assert problems_of(project, Evaluator("j", prompt="{{output}}"), config_text=config_text) == []


def test_team_mode_leaves_the_keys_to_the_workers(project, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with collecting() as found:
        experiment(
            "checked",
            Dataset(items=[{"x": 1}]),
            lambda ctx: 1,
            evaluators=[Evaluator("j", prompt="{{output}}"), Evaluator("e", "exact_match")],
        )
    config = load_config(project.path)
    config.data["broker_url"] = "redis://workers.example:6379/0"
    (problem,) = preflight.problems(found, config)
    assert problem.evaluator == "e" and "unknown evaluator type" in problem.message


def test_every_option_a_builtin_reads_is_declared():
    """A type that reads an option it does not declare would refuse its own users."""
    import re
    from pathlib import Path

    evaluators.known_types()  # loads the built-ins
    source = Path(evaluators.__file__).parent
    read = re.compile(r'(?:evaluator\.options|options)\.get\(\s*"(\w+)"|option\(evaluator, "(\w+)"')
    for path in source.glob("*.py"):
        for match in read.finditer(path.read_text()):
            name = match.group(1) or match.group(2)
            declared = [t for t in evaluators.REGISTRY.values() if name in t.options]
            assert declared or name in evaluators.COMMON_OPTIONS, (
                f"{path.name} reads the option {name!r}, which no type declares"
            )


def test_a_plugin_type_accepts_exactly_the_options_it_declares(project, monkeypatch):
    async def keyword(evaluator, target, env):
        raise AssertionError("not called by the preflight")

    monkeypatch.setitem(evaluators.REGISTRY, "keyword", None)
    evaluators.register("keyword", options=["keyword", "field"])(keyword)
    assert problems_of(project, Evaluator("kw", "keyword", keyword="paris")) == []
    (message,) = problems_of(project, Evaluator("kw", "keyword", keywrod="paris"))
    assert message == (
        "the keyword evaluator has no option `keywrod=`. Did you mean `keyword=`? "
        "Its options: name, type, timeout, pass_threshold, per_turn, field, keyword (a plugin type "
        "declares them: "
        "`register(..., options=[...])`)"
    )


pytestmark_db = pytest.mark.django_db(transaction=True)


@pytestmark_db
def test_the_api_refuses_to_start_a_run_that_cannot_succeed(project, fake_provider, monkeypatch):
    from cobalt_app.api import jobs

    monkeypatch.delenv("OPENAI_API_KEY")
    with collecting() as found:
        experiment(
            "api-run",
            Dataset(items=[{"x": 1}]),
            lambda ctx: pytest.fail("the agent was called"),
            evaluators=[Evaluator("judge", prompt="{{output}}")],
        )
    with pytest.raises(jobs.StartFailed, match="OPENAI_API_KEY is not set: the llm-judge"):
        jobs.start_run(found[0], load_config(project.path))
    assert not Run.objects.exists()
    assert fake_provider.request_count() == 0


# ---------------------------------------------------------------------- a forgotten return


@pytestmark_db
@pytest.mark.parametrize("returned", [None, {"output": None, "metadata": {"model": "m"}}])
def test_a_runner_that_returns_nothing_is_an_evaluation_error_for_every_evaluator(
    project, returned
):
    def forgot_to_return(ctx):
        ctx.item["input"].upper()
        return returned

    evaluator_list = [
        Evaluator("exact", "exact-match", field="expected_output"),
        Evaluator("fn", "function", fn=lambda ctx: 1.0),
        Evaluator("latency", "latency", max_ms=60_000),
    ]
    items = [{"id": "a", "input": "x", "expected_output": "x"}]
    definition = define(
        "forgetful", Dataset(items=items), forgot_to_return, evaluators=evaluator_list
    )
    (run,) = execute(project, definition)
    assert ItemResult.objects.get(run=run).status == "ok"
    rows = Evaluation.objects.filter(run=run).order_by("evaluator")
    assert [(e.evaluator, e.status, e.score, e.error) for e in rows] == [
        (name, "error", None, NOTHING_RETURNED) for name in ("exact", "fn", "latency")
    ]
    assert "the runner returned nothing" in NOTHING_RETURNED and "`return`" in NOTHING_RETURNED
    run.refresh_from_db()
    assert run.summary["scores"]["exact"]["errors"] == 1
    assert run.summary["scores"]["exact"]["avg"] is None


# ---------------------------------------------------------------------- --ci error causes

ERRORS_EXPERIMENT = """\
from cobalt import Dataset, Evaluator, experiment


def lookup(ctx):
    return ctx.item[ctx.item["ask"]]


def flaky(ctx):
    if ctx.item["id"] == "c":
        raise TimeoutError("the scorer took 12 s")
    return 1.0


experiment(
    "causes",
    Dataset(items=[{"id": k, "ask": "ref_" + k} for k in "abc"]),
    lambda ctx: ctx.item["id"],
    evaluators=[
        Evaluator(name="lookup", type="function", fn=lookup),
        Evaluator(name="flaky", type="function", fn=flaky),
        Evaluator(name="forgot", type="function", fn=lambda ctx: None),
    ],
)
"""


def test_error_causes_ignore_the_particulars_of_a_message():
    assert error_cause("the function raised KeyError: 'ref_a'") == error_cause(
        "the function raised KeyError: 'ref_b'\nTraceback ..."
    )
    assert error_cause("openai: HTTP 500 (InternalServerError).") == error_cause(
        "openai: HTTP 503 (InternalServerError)."
    )
    assert error_cause("the judge did not answer JSON twice") != error_cause(
        "OPENAI_API_KEY is not set"
    )


def test_ci_prints_the_first_message_of_every_evaluation_error_cause(project, cobalt_cli, tmp_path):
    project.write("experiments/causes.cobalt.py", ERRORS_EXPERIMENT)
    summary = tmp_path / "summary.md"
    result = cobalt_cli(
        project,
        "run",
        "--ci",
        env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)},
    )
    assert result.returncode == 1, result.stdout + result.stderr
    lines = [line.strip() for line in result.stdout.splitlines()]
    start = lines.index("evaluation errors, by cause:")
    assert lines[start - 3 : start] == [
        "lookup errors 3 > 0",
        "flaky errors 1 > 0",
        "forgot errors 3 > 0",
    ]
    assert lines[start + 1 : start + 4] == [
        "lookup: 3 evaluation errors, first: the function raised KeyError: 'ref_a'",
        "forgot: 3 evaluation errors, first: the function returned NoneType; return a dict "
        "with a score, an EvalResult, a float or a bool",
        "flaky: 1 evaluation error, first: the function raised TimeoutError: the scorer took 12 s",
    ]
    assert "title=Cobalt%3A evaluation errors::causes: lookup: 3 evaluation errors" in (
        result.stdout
    )
    assert "**Evaluation errors, by cause**" in summary.read_text()


def test_a_rejudge_whose_judge_key_is_missing_stops_before_any_judge_call(
    project, cobalt_cli, fake_provider
):
    write_agent(project, 'Evaluator(name="judge", prompt="Rate {{output}}")')
    first = cobalt_cli(project, "run")
    assert first.returncode == 0, first.stdout + first.stderr
    run_id = json.loads(project.results_files()[0].read_text())["id"]
    calls = fake_provider.request_count()

    result = cobalt_cli(project, "rejudge", run_id, env=NO_KEY)
    assert result.returncode == 2, result.stdout + result.stderr
    stderr = " ".join(result.stderr.split())
    assert f"{EVALUATOR_AT}: evaluator 'judge': OPENAI_API_KEY is not set" in stderr
    assert fake_provider.request_count() == calls
    assert len(project.results_files()) == 1


def test_an_import_error_is_shown_from_the_users_own_line(project):
    from cobalt_app import discovery

    path = project.write(
        "experiments/broken.cobalt.py",
        "from cobalt import Dataset\n\n\ndef load():\n    return Dataset(items=[{'id': 1}, {'id': 1}])\n"
        "\n\ndataset = load()\n",
    )
    loaded = discovery.load_file(path, project.path)
    lines = loaded.traceback.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert lines[1] == f'  File "{path}", line 8, in <module>'  # not importlib's, not Cobalt's
    assert f'  File "{path}", line 5, in load' in lines
    # A CobaltError's message says what to do: Cobalt's frames below the user's add nothing.
    last = lines.index(f'  File "{path}", line 5, in load')
    assert "File" not in "".join(lines[last + 1 :])  # the user's line is the last frame
    assert "cobalt/dataset.py" not in loaded.traceback
    assert lines[-1].startswith("cobalt.dataset.DatasetError: item at index 1 has the id 1")


def test_a_file_that_does_not_parse_is_shown_by_its_own_line_without_importlib(project):
    from cobalt_app import discovery

    path = project.write("experiments/typo.cobalt.py", "x = 1\n\n\ndef answer(q)\n    return q\n")
    loaded = discovery.load_file(path, project.path)
    assert loaded.error == "SyntaxError: expected ':' (typo.cobalt.py, line 4)"
    assert loaded.traceback.splitlines() == [
        f'  File "{path}", line 4',
        "    def answer(q)",
        "                 ^",
        "SyntaxError: expected ':'",
    ]


def test_an_error_is_placed_at_the_projects_last_frame_not_a_library_in_its_virtualenv(tmp_path):
    from cobalt_app.tracebacks import raised_at

    text = (
        "Traceback (most recent call last):\n"
        f'  File "{tmp_path}/experiments/qa.cobalt.py", line 9, in run\n'
        "    return ask(q)\n"
        "    ^^^^^^^^^^^^^\n"
        f'  File "{tmp_path}/.venv/lib/python3.11/site-packages/openai/_client.py", line 4, in ask\n'
        "    raise RateLimitError(...)\n"
        "openai.RateLimitError: 429\n"
    )
    found = raised_at(text, tmp_path)
    assert found == ("experiments/qa.cobalt.py:9 in run", "return ask(q)")
    elsewhere = raised_at(text, tmp_path / "other")  # no frame of that project: the last one
    assert elsewhere.where.endswith("site-packages/openai/_client.py:4 in ask")
    assert raised_at("", tmp_path) is None


def test_the_harness_is_cobalt_and_the_standard_library_not_the_packages_installed_in_it():
    import sysconfig

    from cobalt_app import engine
    from cobalt_app.tracebacks import is_harness

    stdlib = sysconfig.get_paths()["stdlib"]
    assert is_harness(engine.__file__)
    assert is_harness(f"{stdlib}/concurrent/futures/thread.py")
    assert is_harness("<frozen importlib._bootstrap>")
    # Outside a virtualenv, site-packages sits below the standard library's folder.
    assert not is_harness(f"{stdlib}/site-packages/openai/_base_client.py")
    assert not is_harness("/usr/lib/python3/dist-packages/langchain/chains/base.py")
    assert not is_harness("/home/me/project/experiments/qa.cobalt.py")
