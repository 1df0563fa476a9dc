"""Cobalt — Cypress for AI agents.

from cobalt import experiment, Evaluator, Dataset, define_config, load_config, span, tool

The names are imported on first use (PEP 562), so `cobalt --help` and the commands that only
read history do not pay for the dataset loaders or OpenTelemetry.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cobalt.config import define_config, load_config
    from cobalt.dataset import Dataset, DatasetError
    from cobalt.evaluator import EvalContext, EvalResult, Evaluator
    from cobalt.experiments import RunContext, experiment
    from cobalt.report import ExperimentReport, assert_scores
    from cobalt.results_file import load_results, read_results
    from cobalt.tracing import span, tool

from cobalt.version import __version__

_SOURCES = {
    "Dataset": "cobalt.dataset",
    "DatasetError": "cobalt.dataset",
    "EvalContext": "cobalt.evaluator",
    "EvalResult": "cobalt.evaluator",
    "Evaluator": "cobalt.evaluator",
    "ExperimentReport": "cobalt.report",
    "RunContext": "cobalt.experiments",
    "assert_scores": "cobalt.report",
    "define_config": "cobalt.config",
    "experiment": "cobalt.experiments",
    "load_config": "cobalt.config",
    "load_results": "cobalt.results_file",
    "read_results": "cobalt.results_file",
    "span": "cobalt.tracing",
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
    "assert_scores",
    "define_config",
    "experiment",
    "load_config",
    "load_results",
    "read_results",
    "span",
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
