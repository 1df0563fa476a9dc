"""Cobalt — Cypress for AI agents.

from cobalt import experiment, Evaluator, Dataset, define_config, load_config, span, tool, stub

This module is the roof: it re-exports the public API, the bottom floor's types and rules
(`cobalt.*`) and the doors above the engine (`experiment()` from `cobalt_cli.script`,
`assert_scores` from `cobalt_cli.assertions`). The names are imported on first use (PEP 562),
so `import cobalt` loads no engine, CLI or Django module, and `cobalt --help` and the commands
that only read history do not pay for the dataset loaders or OpenTelemetry. Code inside Cobalt
imports from the defining module, never from here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from cobalt.version import __version__ as __version__  # `cobalt.__version__`

if TYPE_CHECKING:
    from cobalt.config import define_config, load_config
    from cobalt.dataset import Dataset, DatasetError
    from cobalt.evaluator import EvalContext, EvalResult, Evaluator
    from cobalt.experiments import RunContext
    from cobalt.intercept import Stub, state, stub
    from cobalt.report import ExperimentReport
    from cobalt.results_file import load_results, read_results
    from cobalt.tracing import span, tool
    from cobalt_cli.assertions import assert_scores
    from cobalt_cli.script import experiment

_SOURCES = {
    "Dataset": "cobalt.dataset",
    "DatasetError": "cobalt.dataset",
    "EvalContext": "cobalt.evaluator",
    "EvalResult": "cobalt.evaluator",
    "Evaluator": "cobalt.evaluator",
    "ExperimentReport": "cobalt.report",
    "RunContext": "cobalt.experiments",
    "Stub": "cobalt.intercept",
    "assert_scores": "cobalt_cli.assertions",
    "define_config": "cobalt.config",
    "experiment": "cobalt_cli.script",
    "load_config": "cobalt.config",
    "load_results": "cobalt.results_file",
    "read_results": "cobalt.results_file",
    "span": "cobalt.tracing",
    "state": "cobalt.intercept",
    "stub": "cobalt.intercept",
    "tool": "cobalt.tracing",
}
__all__ = [
    "Dataset",
    "DatasetError",
    "EvalContext",
    "EvalResult",
    "Evaluator",
    "ExperimentReport",
    "RunContext",
    "Stub",
    "assert_scores",
    "define_config",
    "experiment",
    "load_config",
    "load_results",
    "read_results",
    "span",
    "state",
    "stub",
    "tool",
]


def __getattr__(name: str) -> Any:
    if name not in _SOURCES:
        raise AttributeError(f"module 'cobalt' has no attribute {name!r}")
    value = getattr(importlib.import_module(_SOURCES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_SOURCES])
