"""Cobalt — Cypress for AI agents.

from cobalt import experiment, Evaluator, Dataset, define_config, load_config
"""

from cobalt.config import define_config, load_config
from cobalt.dataset import Dataset, DatasetError
from cobalt.evaluator import EvalContext, EvalResult, Evaluator
from cobalt.experiment import RunContext, experiment
from cobalt.report import ExperimentReport

__version__ = "0.1.0"

__all__ = [
    "Dataset",
    "DatasetError",
    "EvalContext",
    "EvalResult",
    "Evaluator",
    "ExperimentReport",
    "RunContext",
    "define_config",
    "experiment",
    "load_config",
]
