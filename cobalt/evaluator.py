"""`Evaluator`: the declaration of how an agent's output is scored.

An evaluator is configuration; the engine (`cobalt_app.evaluators`) does the scoring. The
`type` selects the implementation. Each type declares the options it reads; unknown types and
options are refused before a run starts (`cobalt_app.preflight`), once plugins, which can add
types, are loaded. `defined_at` remembers where the evaluator was written, for that message.
"""

from __future__ import annotations

import difflib
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cobalt.callers import in_call_path
from cobalt.redaction import redact

DEFAULT_TYPE = "llm-judge"
NAMED_OPTIONS = (
    "prompt",
    "model",
    "provider",
    "fn",
    "field",
    "threshold",
    "base_url",
    "api_key_env",
)


@dataclass(frozen=True)
class EvalResult:
    """What an evaluator returns: a score in 0..1 and an optional reason."""

    score: float
    reason: str | None = None


CONTEXT_KEYS = ("item", "input", "output", "metadata", "latency_ms", "context")


@dataclass(frozen=True)
class EvalContext(Mapping[str, Any]):
    """What a function evaluator receives; `context` holds the variables of its `context=`.

    Attributes (`ctx.output`) and, as the original's context was a plain object, a read-only
    mapping too (`ctx["item"]`, `{**ctx, "item": {...}}`), with the keys of CONTEXT_KEYS."""

    item: dict[str, Any]
    output: Any
    metadata: dict[str, Any] = field(default_factory=dict)
    latency_ms: float | None = None
    context: dict[str, Any] = field(default_factory=dict)

    @property
    def input(self) -> Any:
        return self.item.get("input", self.item)

    def __getitem__(self, key: str) -> Any:
        if key not in CONTEXT_KEYS:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(CONTEXT_KEYS)

    def __len__(self) -> int:
        return len(CONTEXT_KEYS)


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
        self.defined_at = _caller()
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"Evaluator at {self.where}: needs a non-empty `name`.")
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
            raise ValueError(
                f"Evaluator {name!r} at {self.where}: an llm-judge needs a `prompt`."
                + _type_hint(options)
            )
        if self.type == "function" and not callable(fn):
            raise ValueError(
                f"Evaluator {name!r} at {self.where}: a function evaluator needs `fn=callable`."
            )

    @classmethod
    def from_dict(cls, options: dict[str, Any], *, where: str = "evaluator") -> Evaluator:
        """The original's dict form: `{"name": "relevance", "type": "llm-judge", "prompt": ...}`.

        Keys are `Evaluator(...)` keywords (camelCase ones of the original too: `apiKeyEnv`,
        `baseUrl`, `chainOfThought`, `caseSensitive`...)."""
        keywords = {_snake(str(k)): v for k, v in options.items()}
        name = keywords.pop("name", None)
        if not isinstance(name, str) or not name.strip():
            raise ValueError(
                f"{where}: a dict evaluator needs a non-empty 'name', e.g. "
                '{"name": "exact", "type": "exact-match"}.'
            )
        return cls(name, **keywords)

    @property
    def where(self) -> str:
        """`qa.cobalt.py:12`: the file name and line of the `Evaluator(...)` call."""
        file, line = self.defined_at
        return f"{Path(file).name}:{line}"

    def given_options(self) -> list[str]:
        """The keywords this evaluator was given besides `name` and `type`."""
        named = [k for k in NAMED_OPTIONS if getattr(self, k) is not None]
        return named + list(self.options)

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
        return redact(description)  # a `base_url` may carry a password or `?api-key=`

    def __repr__(self) -> str:
        return f"Evaluator(name={self.name!r}, type={self.type!r})"


def _snake(key: str) -> str:
    """`apiKeyEnv` → `api_key_env` (the original's option names are camelCase)."""
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", key).lower()


def _caller() -> tuple[str, int]:
    """The file and line of the `Evaluator(...)` call, past `__init__` and the SDK's own
    frames (a dict evaluator points at its `experiment(...)` call)."""
    frame = sys._getframe(2)
    while frame.f_back is not None and in_call_path(frame):
        frame = frame.f_back
    return frame.f_code.co_filename, frame.f_lineno


def _type_hint(options: dict[str, Any]) -> str:
    """`typ="exact-match"` leaves the default type: say so, not only that a prompt is missing."""
    close = difflib.get_close_matches("type", list(options), n=1, cutoff=0.6)
    if not close:
        return ""
    return f" (llm-judge is the default type: did you mean `type=` instead of `{close[0]}=`?)"
