"""`Evaluator`: the declaration of how an agent's output is scored.

An evaluator is configuration; the engine (`cobalt_app.evaluators`) does the scoring. The
`type` selects the implementation; unknown types are checked when the experiment runs, so
plugins can add their own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

DEFAULT_TYPE = "llm-judge"


@dataclass(frozen=True)
class EvalResult:
    """What an evaluator returns: a score in 0..1 and an optional reason."""

    score: float
    reason: str | None = None


@dataclass(frozen=True)
class EvalContext:
    """What a function evaluator receives."""

    item: dict[str, Any]
    output: Any
    metadata: dict[str, Any] = field(default_factory=dict)
    latency_ms: float | None = None

    @property
    def input(self) -> Any:
        return self.item.get("input", self.item)


class Evaluator:
    """Scores an output. `Evaluator(name="exact", type="exact-match", field="expected_output")`."""

    def __init__(
        self,
        name: str,
        type: str = DEFAULT_TYPE,
        *,
        prompt: str | None = None,
        model: str | None = None,
        provider: str | None = None,
        fn: Callable[[EvalContext], Any] | None = None,
        field: str | None = None,
        threshold: float | None = None,
        base_url: str | None = None,
        api_key_env: str | None = None,
        **options: Any,
    ) -> None:
        if not isinstance(name, str) or not name.strip():
            raise ValueError("Evaluator needs a non-empty `name`.")
        self.name = name
        self.type = type or DEFAULT_TYPE
        self.prompt = prompt
        self.model = model
        self.provider = provider
        self.fn = fn
        self.field = field
        self.threshold = threshold
        self.base_url = base_url
        self.api_key_env = api_key_env
        self.options = options
        if self.type == "llm-judge" and not prompt:
            raise ValueError(f"Evaluator {name!r}: an llm-judge needs a `prompt`.")
        if self.type == "function" and not callable(fn):
            raise ValueError(f"Evaluator {name!r}: a function evaluator needs `fn=callable`.")

    def describe(self) -> dict[str, Any]:
        """A JSON-safe description (no callables, no secrets) stored with each run."""
        description: dict[str, Any] = {"name": self.name, "type": self.type}
        for key in ("model", "provider", "field", "threshold", "base_url", "api_key_env"):
            value = getattr(self, key)
            if value is not None:
                description[key] = value
        if self.prompt:
            description["prompt"] = self.prompt
        for key, value in self.options.items():
            if isinstance(value, str | int | float | bool | list | dict) or value is None:
                description[key] = value
        return description

    def __repr__(self) -> str:
        return f"Evaluator(name={self.name!r}, type={self.type!r})"
