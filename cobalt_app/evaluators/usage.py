"""The judge usage of one evaluation whose library calls the model on its own (autoevals,
DeepEval, Ragas): every call it makes through Cobalt adds its tokens and cost to the
evaluation running in this task, and whatever the library raises becomes an evaluation error
that still carries them.

asyncio tasks copy the context and share the same `Usage` object, so a library that fans out
its calls still adds up into the one evaluation.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from cobalt_app.evaluators.base import EvaluationError
from cobalt_app.pricing import estimate_cost, unpriced

KEPT_TURNS = 4  # as many as a stored judge call keeps (`storable.judge_call`)


@dataclass
class Usage:
    tokens: int = 0
    cost: float = 0.0
    calls: int = 0
    hits: int = 0  # calls answered from the judge cache
    unpriced: str = ""  # a model that spent tokens and has no price
    # The first prompts and replies of the library's chat calls ("Show judge call").
    turns: list[dict[str, Any]] = field(default_factory=list)
    chats: int = 0  # chat calls heard (`turns` keeps the first KEPT_TURNS)

    def heard(self, prompt: str, reply: str) -> None:
        """One chat call's prompt and reply, kept while fewer than KEPT_TURNS are."""
        self.chats += 1
        if len(self.turns) < KEPT_TURNS:
            self.turns.append({"prompt": prompt, "reply": reply})

    def add(self, model: str, input_tokens: int, output_tokens: int) -> None:
        """A call's tokens, priced."""
        tokens = input_tokens + output_tokens
        self.spent(model, tokens, estimate_cost(model, input_tokens, output_tokens))

    def spent(self, model: str, tokens: int, cost: float) -> None:
        """Tokens whose cost is already known (embeddings)."""
        self.tokens += tokens
        self.cost += cost
        self.unpriced = self.unpriced or unpriced(model, tokens)

    def error(self, message: str) -> EvaluationError:
        return EvaluationError(
            message, tokens=self.tokens, cost=self.cost, unpriced_model=self.unpriced
        )


_current: contextvars.ContextVar[Usage] = contextvars.ContextVar("cobalt_evaluation_usage")


def current() -> Usage:
    """The usage of the evaluation running in this task (a throwaway one outside any)."""
    return _current.get(Usage())


@contextlib.contextmanager
def counted(
    label: str,
    *,
    told: tuple[type[BaseException], ...] = (EvaluationError,),
    usage: Usage | None = None,
) -> Iterator[Usage]:
    """Count the calls made inside (into `usage`, or a new one); an exception becomes an
    `EvaluationError` carrying that usage: `label: message` for the `told` kinds (they already
    say what went wrong), `label failed: Type: message` for any other."""
    usage = Usage() if usage is None else usage
    token = _current.set(usage)
    try:
        yield usage
    except told as exc:
        raise usage.error(f"{label}: {exc}") from exc
    except Exception as exc:
        message = str(exc).strip() or type(exc).__name__
        raise usage.error(f"{label} failed: {type(exc).__name__}: {message}") from exc
    finally:
        _current.reset(token)
