"""`deepeval`: DeepEval's metrics by class name, their LLM being Cobalt's judge.

    Evaluator(name="correct", type="deepeval", metric="GEval",
              criteria="Is the answer correct?", evaluation_steps=["Compare with the facts"])
    Evaluator(name="faithful", type="deepeval", metric="FaithfulnessMetric",
              mapping={"retrieval_context": "documents"})

`mapping=` sends test-case fields (`input`, `actual_output`, `expected_output`, `context`,
`retrieval_context`, `tools_called`, `expected_tools`) from item fields, the output, metadata
or the trace (`metric_libraries`); unmapped fields come from their defaults (DEFAULTS). The
other keywords are the metric's own parameters (`threshold`, `criteria`, `include_reason`…).
The metric's prompts go through `ProviderHub` as judge calls (tokens and cost counted); a
metric that raises, or cannot parse its LLM's reply, is an evaluation error with DeepEval's
message. Install with `pip install 'cobalt-agents[deepeval]'`.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from typing import Any

from cobalt.evaluator import Evaluator
from cobalt_app.evaluators.base import EvalOutcome, EvalTarget, EvaluationError, register
from cobalt_app.evaluators.metric_libraries import (
    JUDGE_OPTIONS,
    Judge,
    build_problems,
    close_match,
    gather_inputs,
    import_library,
    judge_uses,
    mapping_of,
    own_params,
    scored,
    text_list,
    tool_call_list,
)

FIELDS = (
    "input",
    "actual_output",
    "expected_output",
    "context",
    "retrieval_context",
    "tools_called",
    "expected_tools",
)
DEFAULTS: dict[str, tuple[str, ...]] = {
    "input": ("input",),
    "actual_output": ("output",),
    "expected_output": ("expected_output",),
    "context": ("context",),
    "retrieval_context": (
        "retrieval_context",
        "metadata.retrieval_context",
        "trace.retrieved",
    ),
    "tools_called": ("metadata.tool_calls", "trace.tool_calls"),
    "expected_tools": ("expected_tools",),
}
OPTIONS = ("metric", "mapping", *JUDGE_OPTIONS)
# Parameters Cobalt sets itself: the judge is the model, the run is async and quiet.
RESERVED = ("model", "async_mode", "verbose_mode", "name", "system_one_model", "eval_mode")


def metric_class(name: Any) -> type:
    metrics = import_library("deepeval", "deepeval.metrics")
    known = sorted(
        n
        for n in dir(metrics)
        if inspect.isclass(getattr(metrics, n))
        and issubclass(getattr(metrics, n), metrics.BaseMetric)
        and n != "BaseMetric"
    )
    if not isinstance(name, str) or not name:
        raise EvaluationError(
            f'the deepeval evaluator needs `metric="<class name>"`; one of {", ".join(known)}'
        )
    if name not in known:
        raise EvaluationError(
            f"DeepEval has no single-turn metric {name!r}.{close_match(name, known)} "
            f"Its metrics: {', '.join(known)}"
        )
    return getattr(metrics, name)


def metric_params(evaluator: Evaluator, cls: type) -> dict[str, Any]:
    """The metric's own parameters: the evaluator's keywords that are not Cobalt's."""
    accepted = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    accepted = [p for p in accepted if p not in RESERVED and not p.startswith("_")]
    params = own_params(evaluator, accepted, f"DeepEval's {cls.__name__}", OPTIONS)
    if evaluator.threshold is not None:
        params["threshold"] = evaluator.threshold
    if isinstance(params.get("evaluation_params"), list):
        from deepeval.test_case import SingleTurnParams

        try:
            params["evaluation_params"] = [SingleTurnParams(p) for p in params["evaluation_params"]]
        except ValueError as exc:
            raise EvaluationError(
                f"`evaluation_params`: {exc}; use test-case fields: {', '.join(FIELDS)}"
            ) from None
    return params


def build_metric(evaluator: Evaluator, env: Any) -> tuple[Any, dict[str, Any]]:
    """(the metric object, its parameters) with Cobalt's judge as its model."""
    cls = metric_class(evaluator.options.get("metric"))
    params = metric_params(evaluator, cls)
    mapping_of(evaluator, FIELDS, "DeepEval")
    accepted = inspect.signature(cls.__init__).parameters
    ours = {
        "model": judge_model_class()(Judge(evaluator, env, "deepeval")),
        "async_mode": True,
        "verbose_mode": False,
        "name": evaluator.name,  # G-Eval's own name
    }
    keywords = dict(params, **{k: v for k, v in ours.items() if k in accepted})
    try:
        return cls(**keywords), params
    except Exception as exc:
        raise EvaluationError(
            f"DeepEval's {cls.__name__} refused its parameters: {type(exc).__name__}: {exc}"
        ) from exc


@functools.cache
def judge_model_class() -> type:
    """A `DeepEvalBaseLLM` whose every prompt is a Cobalt judge call (made once: DeepEval
    wraps each subclass's methods in its tracing when the class is created)."""
    from deepeval.models import DeepEvalBaseLLM

    class CobaltJudge(DeepEvalBaseLLM):
        def __init__(self, judge: Judge) -> None:
            self.judge = judge
            self.name = judge.model or "cobalt-judge"
            self.model = self

        def load_model(self) -> Any:
            return self

        def get_model_name(self) -> str:
            return self.name

        def generate(self, prompt: str, schema: Any = None) -> str:
            raise EvaluationError("DeepEval asked for a synchronous call; Cobalt runs async_mode")

        async def a_generate(self, prompt: str, schema: Any = None) -> str:
            return await self.judge.ask(str(prompt))

    return CobaltJudge


def llm_test_case(inputs: dict[str, Any]) -> Any:
    from deepeval.test_case import LLMTestCase, ToolCall

    fields: dict[str, Any] = {
        "input": str(inputs.get("input") or ""),
        "actual_output": str(inputs.get("actual_output") or ""),
    }
    if inputs.get("expected_output") not in (None, ""):
        fields["expected_output"] = str(inputs["expected_output"])
    for name in ("context", "retrieval_context"):
        if name in inputs:
            fields[name] = text_list(inputs[name], name)
    for name in ("tools_called", "expected_tools"):
        if name in inputs:
            fields[name] = [
                ToolCall(name=c["name"], input_parameters=arguments_dict(c["arguments"]))
                for c in tool_call_list(inputs[name], name)
            ]
    return LLMTestCase(**fields)


def arguments_dict(arguments: Any) -> dict[str, Any] | None:
    """DeepEval's `input_parameters` is a dict: other arguments are wrapped as `input`."""
    if arguments in (None, {}, ""):
        return None
    return arguments if isinstance(arguments, dict) else {"input": arguments}


def asks_a_model(evaluator: Evaluator) -> bool:
    cls = metric_class(evaluator.options.get("metric"))
    return "model" in inspect.signature(cls.__init__).parameters


@register(
    "deepeval",
    options=OPTIONS,
    providers=judge_uses("deepeval", asks_a_model),
    validate=build_problems(build_metric),
)
async def deepeval_evaluator(evaluator: Evaluator, target: EvalTarget, env: Any) -> EvalOutcome:
    # The first import takes seconds: off the event loop, where other items are running.
    await asyncio.to_thread(import_library, "deepeval", "deepeval.metrics")
    metric, params = build_metric(evaluator, env)
    mapping = mapping_of(evaluator, FIELDS, "DeepEval")
    inputs = gather_inputs(target, mapping, DEFAULTS)
    case = llm_test_case(inputs)
    if getattr(metric, "evaluation_params", False) is None:
        # G-Eval judges the test-case fields it is given; by default, those the item holds.
        from deepeval.test_case import SingleTurnParams

        metric.evaluation_params = [
            SingleTurnParams(name) for name in FIELDS if getattr(case, name, None)
        ]
    name = evaluator.options["metric"]

    async def measure() -> tuple[Any, str]:
        try:
            await metric.a_measure(case, _show_indicator=False)
        except KeyError as exc:  # DeepEval reads the keys of the JSON its prompt asked for
            raise EvaluationError(
                f"the judge's reply has no {exc.args[0]!r}, which DeepEval's prompt asked for "
                "(can the judge model answer in JSON?)"
            ) from exc
        if getattr(metric, "error", None):
            raise EvaluationError(str(metric.error))
        return metric.score, metric.reason or ""

    return await scored("deepeval", evaluator, env, name, params, inputs, measure)
