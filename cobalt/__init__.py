"""Cobalt — Cypress for AI agents.

from cobalt import experiment, Evaluator, Dataset, define_config, load_config, span, tool
"""

from cobalt.config import define_config, load_config
from cobalt.dataset import Dataset, DatasetError
from cobalt.evaluator import EvalContext, EvalResult, Evaluator
from cobalt.experiment import RunContext, experiment
from cobalt.report import ExperimentReport, assert_scores
from cobalt.tracing import span, tool

# The one place the version is set: the `cobalt-agents` distribution takes it from here
# ([tool.hatch.version] in pyproject.toml) and `cobalt --version` prints it.
__version__ = "0.1.0"

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
    "span",
    "tool",
]
