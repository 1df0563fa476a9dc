"""DeepEval and Ragas metrics as Cobalt evaluators, through the fake provider: it answers the
JSON each metric's prompts ask for (`reply_when`, keyed on a phrase of the prompt)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import pytest

from cobalt import Dataset, Evaluator
from cobalt_app.models import Evaluation
from cobalt_app.preflight import PreflightError
from tests.helpers import define, execute, run_with

from .conftest import REPO, cli_env

pytest.importorskip("deepeval", reason="the `deepeval` extra is not installed")
pytest.importorskip("ragas", reason="the `ragas` extra is not installed")
pytestmark = pytest.mark.django_db(transaction=True)

GOOD = "Paris is the capital of France."
BAD = "Lyon is the capital of France."
ITEM = {
    "id": "q1",
    "input": "What is the capital of France?",
    "expected_output": "Paris",
    "documents": ["Paris is the capital and largest city of France."],
}
STEPS = ["Check that the answer names the right city", "Penalise any wrong fact"]


def run_metrics(project, evaluators, output, *, items=None, no_cache=False, runner=None):
    """The evaluations of `items` (ITEM) answered `output`, by (item index, evaluator)."""
    run = run_with(
        project,
        evaluators,
        runner or (lambda ctx: output),
        name="metrics",
        items=items or [ITEM],
        no_cache=no_cache,
    )
    evaluations = Evaluation.objects.filter(run=run).select_related("item")
    return {(e.item.item_index, e.evaluator): e for e in evaluations}


def chat_prompts(fake_provider):
    return [
        "\n".join(m["content"] for m in r["json"]["messages"])
        for r in fake_provider.requests
        if r["path"] == "/v1/chat/completions"
    ]


def script_geval(fake_provider):
    fake_provider.reply_when(
        ["Evaluation Steps:", f"Actual Output:\n{GOOD}"],
        {"score": 9, "reason": "It names Paris, the right city."},
    )
    fake_provider.reply_when(
        ["Evaluation Steps:", f"Actual Output:\n{BAD}"],
        {"score": 1, "reason": "Lyon is not the capital."},
    )


def script_deepeval_faithfulness(fake_provider):
    fake_provider.reply_when('"truths" key', {"truths": ["Paris is the capital of France."]})
    fake_provider.reply_when(
        '"claims" key', {"claims": ["Paris is the capital of France.", "It has 9 museums."]}
    )
    fake_provider.reply_when(
        "'verdicts' key",
        {"verdicts": [{"verdict": "yes"}, {"verdict": "no", "reason": "No museum count."}]},
    )
    fake_provider.reply_when(
        "Faithfulness Score:", {"reason": "The score is 0.50 because of the museum count."}
    )


def script_ragas_faithfulness(fake_provider):
    fake_provider.reply_when(
        ["StatementGeneratorOutput", "Now perform the same"],
        {"statements": ["Paris is the capital of France.", "It has 9 museums."]},
    )
    fake_provider.reply_when(
        ["NLIStatementOutput", "Now perform the same"],
        {
            "statements": [
                {"statement": "Paris is the capital of France.", "reason": "stated", "verdict": 1},
                {"statement": "It has 9 museums.", "reason": "not in the context", "verdict": 0},
            ]
        },
    )


def test_geval_with_evaluation_steps_scores_a_good_and_a_bad_answer_apart(project, fake_provider):
    script_geval(fake_provider)
    geval = Evaluator(
        "correct",
        "deepeval",
        metric="GEval",
        evaluation_steps=STEPS,
        evaluation_params=["input", "actual_output"],
        threshold=0.6,
    )
    items = [{**ITEM, "id": "good", "answer": GOOD}, {**ITEM, "id": "bad", "answer": BAD}]
    found = run_metrics(project, [geval], None, items=items, runner=lambda ctx: ctx.item["answer"])
    good, bad = found[(0, "correct")], found[(1, "correct")]
    assert (good.status, good.score, good.reason) == ("ok", 0.9, "It names Paris, the right city.")
    assert (bad.status, bad.score, bad.reason) == ("ok", 0.1, "Lyon is not the capital.")
    assert good.tokens > 0 and good.cost > 0  # judge tokens and cost, counted by Cobalt
    prompts = chat_prompts(fake_provider)
    assert len(prompts) == 2  # the steps are given: one scoring call per item
    assert all(STEPS[0] in p and "What is the capital of France?" in p for p in prompts)
    request = next(r for r in fake_provider.requests if r["path"] == "/v1/chat/completions")
    assert request["json"]["model"] == "gpt-4o-mini"  # the configured judge
    assert request["headers"]["authorization"] == "Bearer sk-test-openai-SECRET-0001"


def test_deepeval_faithfulness_reads_the_retrieval_context_through_the_mapping(
    project, fake_provider
):
    script_deepeval_faithfulness(fake_provider)
    faithful = Evaluator(
        "faithful",
        "deepeval",
        metric="FaithfulnessMetric",
        mapping={"retrieval_context": "documents"},
    )
    found = run_metrics(project, [faithful], "Paris is the capital of France. It has 9 museums.")
    result = found[(0, "faithful")]
    assert (result.status, result.score) == ("ok", 0.5), result.error
    assert result.reason == "The score is 0.50 because of the museum count."
    prompts = chat_prompts(fake_provider)
    assert len(prompts) == 4  # truths, claims, verdicts, reason
    truths = next(p for p in prompts if '"truths" key' in p)
    assert "Paris is the capital and largest city of France." in truths


def test_ragas_faithfulness_end_to_end(project, fake_provider):
    script_ragas_faithfulness(fake_provider)
    faithful = Evaluator(
        "faithful", "ragas", metric="faithfulness", mapping={"retrieved_contexts": "documents"}
    )
    found = run_metrics(project, [faithful], "Paris is the capital of France. It has 9 museums.")
    result = found[(0, "faithful")]
    assert (result.status, result.score) == ("ok", 0.5), result.error
    assert result.reason == "Ragas faithfulness = 0.500 (Ragas gives no reason)"
    assert result.tokens > 0
    prompts = chat_prompts(fake_provider)
    assert len(prompts) == 2
    assert "Paris is the capital and largest city of France." in prompts[1]
    assert "It has 9 museums." in prompts[0]


def test_ragas_answer_relevancy_embeds_through_cobalt(project, fake_provider):
    fake_provider.reply_when(
        "ResponseRelevanceOutput",
        {"question": "What is the capital of France?", "noncommittal": 0},
    )
    relevant = Evaluator("relevant", "ragas", metric="answer_relevancy", strictness=1)
    found = run_metrics(project, [relevant], GOOD)
    result = found[(0, "relevant")]
    assert result.status == "ok", result.error
    assert result.score == pytest.approx(1.0)  # the generated question is the item's input
    assert fake_provider.request_count("/v1/embeddings") >= 1


def test_tool_call_metrics_read_the_agents_tool_calls(project, fake_provider):
    import cobalt

    @cobalt.tool
    def search(q: str) -> str:
        return "Paris"

    def runner(ctx):
        search("capital")  # a tool step of the trace
        openai_shaped = [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "search", "arguments": '{"q": "capital"}'},
            }
        ]
        return {"output": GOOD, "metadata": {"calls": openai_shaped}}

    evaluators = [
        Evaluator(
            "ragas-tools",
            "ragas",
            metric="tool_call_accuracy",
            mapping={"tool_calls": "metadata.calls"},
        ),
        Evaluator(
            "deepeval-tools",
            "deepeval",
            metric="ToolCorrectnessMetric",
            mapping={"tools_called": "trace.tool_calls"},
        ),
    ]
    item = {**ITEM, "expected_tools": [{"name": "search", "arguments": {"q": "capital"}}]}
    found = run_metrics(project, evaluators, None, items=[item], runner=runner)
    for name in ("ragas-tools", "deepeval-tools"):
        assert (found[(0, name)].status, found[(0, name)].score) == ("ok", 1.0), found[
            (0, name)
        ].error
    wrong = {**item, "expected_tools": ["delete_account"]}
    found = run_metrics(project, evaluators, None, items=[wrong], runner=runner)
    for name in ("ragas-tools", "deepeval-tools"):
        assert (found[(0, name)].status, found[(0, name)].score) == ("ok", 0.0), found[
            (0, name)
        ].error


def test_metrics_that_call_no_model_make_no_request(project, fake_provider, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY")  # nor need a key
    evaluators = [
        Evaluator("de-exact", "deepeval", metric="ExactMatchMetric"),
        Evaluator("ragas-exact", "ragas", metric="exact_match"),
    ]
    item = {**ITEM, "expected_output": GOOD}
    found = run_metrics(project, evaluators, GOOD, items=[item])
    for name in ("de-exact", "ragas-exact"):
        assert (found[(0, name)].status, found[(0, name)].score) == ("ok", 1.0), found[
            (0, name)
        ].error
    found = run_metrics(project, evaluators, BAD, items=[item])
    assert found[(0, "de-exact")].score == found[(0, "ragas-exact")].score == 0.0
    assert fake_provider.request_count() == 0


def test_retrieved_documents_come_from_the_trace(project, fake_provider):
    import cobalt

    script_deepeval_faithfulness(fake_provider)
    script_ragas_faithfulness(fake_provider)

    def rag_agent(ctx):
        with cobalt.span("search", kind="retrieval", input=ctx.item["input"]) as step:
            step.output = ["Paris is the capital of France.", "France is in Europe."]
        return "Paris is the capital of France. It has 9 museums."

    evaluators = [
        Evaluator(
            "deepeval",
            "deepeval",
            metric="FaithfulnessMetric",
            mapping={"retrieval_context": "trace.retrieved"},
        ),
        Evaluator("ragas", "ragas", metric="faithfulness"),  # the trace is its last default
    ]
    found = run_metrics(project, evaluators, None, items=[ITEM], runner=rag_agent)
    assert (found[(0, "deepeval")].status, found[(0, "deepeval")].score) == ("ok", 0.5)
    assert (found[(0, "ragas")].status, found[(0, "ragas")].score) == ("ok", 0.5)
    prompts = chat_prompts(fake_provider)
    truths = next(p for p in prompts if '"truths" key' in p)
    assert "Paris is the capital of France.\n\nFrance is in Europe." in truths  # two documents
    nli = next(p for p in prompts if "NLIStatementOutput" in p and "Now perform" in p)
    assert "France is in Europe." in nli


def test_metric_calls_keep_to_the_shared_rate_budget(project, fake_provider):
    # 6 items, one G-Eval call each, at most 5 requests a second after a burst of 1.
    project.write(
        "cobalt.toml",
        'test_dir = "experiments"\n[rate_limits.openai]\nrequests_per_second = 5\n',
    )
    geval = Evaluator("correct", "deepeval", metric="GEval", evaluation_steps=STEPS)
    definition = define(
        "budgeted",
        Dataset(items=[{**ITEM, "id": f"q{i}"} for i in range(6)]),
        lambda ctx: f'Paris {ctx.index} [[reply:{{"score": 8, "reason": "ok"}}]]',
        evaluators=[geval],
        concurrency=6,
    )
    (run,) = execute(project, definition, no_cache=True)
    results = Evaluation.objects.filter(run=run)
    assert {e.score for e in results} == {0.8}, [(e.status, e.error) for e in results]
    times = sorted(r["time"] for r in fake_provider.requests if r["path"] == "/v1/chat/completions")
    assert len(times) == 6
    assert times[-1] - times[0] >= 5 * 0.2 * 0.95, times  # spaced by the budget, not at once


def test_an_unparseable_reply_is_an_evaluation_error_not_a_zero(project, fake_provider):
    fake_provider.reply_when("Evaluation Steps:", "I would say it is quite good.")
    fake_provider.reply_when("Now perform the same", "Sure! Here are some statements.")
    evaluators = [
        Evaluator("correct", "deepeval", metric="GEval", evaluation_steps=STEPS),
        Evaluator(
            "faithful", "ragas", metric="faithfulness", mapping={"retrieved_contexts": "documents"}
        ),
        # The fake's default reply is JSON, but not the JSON DeepEval's prompt asks for.
        Evaluator(
            "grounded",
            "deepeval",
            metric="FaithfulnessMetric",
            mapping={"retrieval_context": "documents"},
        ),
    ]
    found = run_metrics(project, evaluators, GOOD)
    deepeval_result, ragas_result = found[(0, "correct")], found[(0, "faithful")]
    assert deepeval_result.status == "error" and deepeval_result.score is None
    assert deepeval_result.error == (
        "GEval failed: ValueError: Evaluation LLM outputted an invalid JSON. Please use a better "
        "evaluation model."
    )
    grounded = found[(0, "grounded")]
    assert grounded.status == "error" and grounded.score is None
    # Truths and claims are asked at once: either reply is the first found wanting.
    assert re.search(
        r"the judge's reply has no '(truths|claims)', which DeepEval's prompt asked for",
        grounded.error,
    )
    assert ragas_result.status == "error" and ragas_result.score is None
    assert "RagasOutputParserException" in ragas_result.error
    assert ragas_result.tokens > 0  # what the failed calls spent still counts


def test_a_nan_score_is_an_evaluation_error(project, fake_provider):
    # No statements to check: Ragas' faithfulness is NaN.
    fake_provider.reply_when("StatementGeneratorOutput", {"statements": []})
    faithful = Evaluator(
        "faithful", "ragas", metric="faithfulness", mapping={"retrieved_contexts": "documents"}
    )
    result = run_metrics(project, [faithful], GOOD)[(0, "faithful")]
    assert result.status == "error" and result.score is None
    assert "NaN" in result.error


def test_results_are_cached_in_the_judge_cache(project, fake_provider):
    script_geval(fake_provider)
    script_ragas_faithfulness(fake_provider)
    evaluators = [
        Evaluator("correct", "deepeval", metric="GEval", evaluation_steps=STEPS),
        Evaluator(
            "faithful", "ragas", metric="faithfulness", mapping={"retrieved_contexts": "documents"}
        ),
    ]
    first = run_metrics(project, evaluators, GOOD)
    calls = len(chat_prompts(fake_provider))
    assert calls == 3 and not first[(0, "correct")].cached
    second = run_metrics(project, evaluators, GOOD)
    assert len(chat_prompts(fake_provider)) == calls  # no call on the rerun
    for name in ("correct", "faithful"):
        assert second[(0, name)].cached and second[(0, name)].tokens == 0
        assert (second[(0, name)].score, second[(0, name)].reason) == (
            first[(0, name)].score,
            first[(0, name)].reason,
        )
    changed = Evaluator("correct", "deepeval", metric="GEval", evaluation_steps=[STEPS[0]])
    run_metrics(project, [changed], GOOD)  # another parameter: another key
    assert len(chat_prompts(fake_provider)) == calls + 1


@pytest.mark.parametrize(
    ("evaluator", "message"),
    [
        (
            Evaluator("m", "deepeval", metric="FaithfulnesMetric"),
            "DeepEval has no single-turn metric 'FaithfulnesMetric'. Did you mean "
            "'FaithfulnessMetric'?",
        ),
        (
            Evaluator("m", "deepeval", metric="GEval", critera="x"),
            "DeepEval's GEval has no parameter `critera=`. Did you mean 'criteria'?",
        ),
        (
            Evaluator("m", "deepeval", metric="GEval", criteria=" "),
            "DeepEval's GEval refused its parameters: ValueError: Criteria provided cannot be an "
            "empty string.",
        ),
        (
            Evaluator("m", "deepeval", metric="GEval", criteria="c", mapping={"output": "x"}),
            "`mapping` names 'output', which is no DeepEval test-case field.",
        ),
        (
            Evaluator("m", "ragas", metric="faithfulnes"),
            "Ragas has no metric 'faithfulnes'. Did you mean 'faithfulness'?",
        ),
        (
            Evaluator("m", "ragas", metric="answer_relevancy", strictnes=2),
            "Ragas' AnswerRelevancy has no parameter `strictnes=`. Did you mean 'strictness'?",
        ),
    ],
)
def test_a_wrong_definition_stops_the_run_before_the_agent_is_called(
    project, fake_provider, evaluator, message
):
    called = []
    with pytest.raises(PreflightError) as refused:
        run_metrics(project, [evaluator], GOOD, runner=lambda ctx: called.append(1) or GOOD)
    assert message in str(refused.value)
    assert called == [] and fake_provider.request_count() == 0


def test_a_missing_key_names_the_variable_and_the_metric(project, fake_provider, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY")
    faithful = Evaluator("faithful", "ragas", metric="faithfulness")
    with pytest.raises(PreflightError) as refused:
        run_metrics(project, [faithful], GOOD)
    assert "OPENAI_API_KEY is not set: the ragas evaluator 'faithful' (faithfulness)" in str(
        refused.value
    )
    assert fake_provider.request_count() == 0


def test_a_missing_input_is_an_evaluation_error_naming_it(project, fake_provider):
    faithful = Evaluator("faithful", "ragas", metric="faithfulness")  # no documents mapped
    result = run_metrics(project, [faithful], GOOD)[(0, "faithful")]
    assert result.status == "error"
    assert (
        'faithfulness needs retrieved_contexts, which the item does not give; map them with mapping={"retrieved_contexts"'
        in result.error
    )
    missing = Evaluator(
        "faithful", "deepeval", metric="FaithfulnessMetric", mapping={"retrieval_context": "docs"}
    )
    result = run_metrics(project, [missing], GOOD)[(0, "faithful")]
    assert result.status == "error" and "sends 'docs' to `retrieval_context`" in result.error
    assert fake_provider.request_count() == 0


BLOCKER = """
import sys

class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, Blocker())
"""


@pytest.mark.parametrize("library", ["deepeval", "ragas"])
def test_without_the_extra_the_run_stops_with_the_install_command(project, tmp_path, library):
    project.write(
        "experiments/rag.cobalt.py",
        f"""
        from cobalt import Dataset, Evaluator, experiment

        experiment(
            "rag",
            Dataset(items=[{{"input": "q", "documents": ["d"]}}]),
            lambda ctx: "a",
            evaluators=[Evaluator("m", "{library}", metric="faithfulness", criteria="c")],
        )
        """,
    )
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent(BLOCKER.format(blocked={library})))
    env = cli_env({"PYTHONPATH": f"{site}:{REPO}", "OPENAI_API_KEY": "sk-test"})
    result = subprocess.run(
        [sys.executable, "-m", "cobalt_cli", "run", "--no-cache"],
        cwd=project.path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert (
        f"the {library} evaluator needs the optional extra: pip install 'cobalt-agents[{library}]'"
        f" (missing Python module '{library}')" in output
    )
    assert "rag.cobalt.py" in output  # the file and line of the evaluator


GUARD = """
import pathlib
import socket

pathlib.Path({log!r} + ".active").touch()  # the guard is in place in the subprocess

allowed = {port}
real_connect = socket.socket.connect

def guarded(self, address):
    if not (isinstance(address, tuple) and address[1] == allowed):
        with open({log!r}, "a") as log:
            log.write(repr(address) + "\\n")
        raise OSError(f"network access blocked by the test: {{address!r}}")
    return real_connect(self, address)

socket.socket.connect = guarded
socket.socket.connect_ex = lambda self, address: guarded(self, address) or 0
real_getaddrinfo = socket.getaddrinfo

def getaddrinfo(host, *args, **kwargs):
    if host not in ("127.0.0.1", "localhost"):
        with open({log!r}, "a") as log:
            log.write("resolve " + repr(host) + "\\n")
    return real_getaddrinfo(host, *args, **kwargs)

socket.getaddrinfo = getaddrinfo
"""


def test_no_connection_but_to_the_provider_and_no_telemetry(project, fake_provider, tmp_path):
    script_geval(fake_provider)
    script_ragas_faithfulness(fake_provider)
    project.write(
        "experiments/rag.cobalt.py",
        f"""
        from cobalt import Dataset, Evaluator, experiment

        experiment(
            "rag",
            Dataset(items=[{json.dumps(ITEM)}]),
            lambda ctx: {GOOD!r},
            evaluators=[
                Evaluator("correct", "deepeval", metric="GEval", evaluation_steps={STEPS!r}),
                Evaluator("faithful", "ragas", metric="faithfulness",
                          mapping={{"retrieved_contexts": "documents"}}),
            ],
        )
        """,
    )
    log = tmp_path / "connections.log"
    site = tmp_path / "site"
    site.mkdir()
    port = int(fake_provider.url.rsplit(":", 1)[1])
    (site / "sitecustomize.py").write_text(GUARD.format(port=port, log=str(log)))
    env = cli_env(
        {
            "PYTHONPATH": f"{site}:{REPO}",
            "OPENAI_API_KEY": "sk-test",
            "OPENAI_BASE_URL": fake_provider.openai_base_url,
            "HOME": str(tmp_path),  # no user-level settings of the libraries
        }
    )
    result = subprocess.run(
        [sys.executable, "-m", "cobalt_cli", "run", "--no-cache"],
        cwd=project.path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "correct" in output and "faithful" in output
    assert (tmp_path / "connections.log.active").exists()
    assert not log.exists(), log.read_text()
    assert len(chat_prompts(fake_provider)) == 3  # both metrics did call the provider
    assert not (project.path / ".deepeval").exists()  # nothing of DeepEval's left behind


def test_the_cli_help_imports_neither_library():
    code = "import sys, runpy; sys.argv = ['cobalt', '--help']\n"
    code += "try:\n    runpy.run_module('cobalt_cli', run_name='__main__')\n"
    code += "except SystemExit:\n    pass\n"
    code += "print(sorted(m for m in sys.modules if m.split('.')[0] in ('deepeval', 'ragas', 'langchain_core')))"
    result = subprocess.run(
        [sys.executable, "-c", code], env=cli_env(), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"
