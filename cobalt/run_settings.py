"""A run's settings, each with its default in one place.

The project's configuration (`cobalt/config.py`: its defaults come from here) and the
settings a run stores when it is created (`run.config`, the Run row's JSON) are read through
`RunSettings`: `RunSettings.from_config(config)` for the project's, and
`RunSettings.from_run_config(run.config)` for a run's. A setting missing (or None) takes the
default written below, and nowhere else.

This module is pure: no Django, no `cobalt_app`, no `cobalt_cli`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any


@dataclass(frozen=True)
class JudgeSettings:
    """`[judge]`: the model that scores outputs (LLM-judge evaluators, and the simulated
    user's unless `[simulator]` names another)."""

    provider: str = "openai"
    model: str = "gpt-4o-mini"
    api_key: str | None = None
    base_url: str | None = None
    max_retries: int = 3
    timeout: float = 60  # seconds per judge call

    @classmethod
    def from_config(cls, table: Mapping[str, Any] | None) -> JudgeSettings:
        return cls(**_given(cls, table))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class CacheSettings:
    """`[cache]`: judge and embedding calls answered from the cache, for `ttl`."""

    enabled: bool = True
    ttl: str = "7d"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TraceSettings:
    """`[trace]`: spans recorded per item, each input and output cut to `max_chars`."""

    enabled: bool = True
    max_chars: int = 2000

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ReceiverSettings:
    """`[receiver]`: the OTLP receiver `cobalt run` opens while an HTTP target runs (on
    127.0.0.1:`port`, OTLP/HTTP's standard port; 0 for none), how long it waits after the last
    item for the services' spans (`grace`, seconds), and how long production traces are kept
    (`retention_days`, by `cobalt clean`)."""

    port: int = 4318
    grace: float = 10.0
    retention_days: int = 30

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class CalibrationSettings:
    """`[calibration]`: a judge is calibrated with `min_labels` human labels of each class and
    both 95% lower bounds (true-positive, true-negative rate) at `min_rate`
    (cobalt/calibration.py)."""

    min_labels: int = 30
    min_rate: float = 0.80

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ReplayTable:
    """`[replay]`: how `--replay` matches a request with its recording (`ignore`: request body
    fields left out, dotted paths; `hosts`: kept for old configurations, every request is
    recorded now) and which hosts it lets through live (`allow_hosts`: a local vector
    database, a service the test starts itself; every other connection is answered from the
    recording or refused)."""

    ignore: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ()
    allow_hosts: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, table: Mapping[str, Any] | None) -> ReplayTable:
        return cls(**{k: tuple(v) for k, v in _given(cls, table).items()})

    def as_dict(self) -> dict[str, Any]:
        return {k: list(v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class BudgetSettings:
    """`[budget]` (or `experiment(..., max_tool_calls=...)`, `cobalt run --max-tool-calls`):
    per item, the agent's next model call, tool call or step past a limit raises inside it
    and the item is an error naming the budget (`cobalt_app.intercepts`). None: no limit."""

    max_llm_calls: int | None = None
    max_tool_calls: int | None = None
    max_tokens: int | None = None
    max_cost: float | None = None  # dollars, as priced in the trace

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def any(self) -> bool:
        # Asked for every item: the fields themselves, not `asdict`'s deep copy.
        return not (
            self.max_llm_calls is None
            and self.max_tool_calls is None
            and self.max_tokens is None
            and self.max_cost is None
        )


BUDGETS = tuple(f.name for f in fields(BudgetSettings))
# A run's stored settings (`run.config`): budget → key.
BUDGET_KEYS = {
    "max_llm_calls": "maxLlmCalls",
    "max_tool_calls": "maxToolCalls",
    "max_tokens": "maxTokens",
    "max_cost": "maxCost",
}


def check_budget(name: str, value: Any, where: str) -> None:
    """A budget is None or a number above 0 (a whole one but for `max_cost`)."""
    if value is None:
        return
    whole = name != "max_cost"
    kinds = int if whole else int | float
    if isinstance(value, bool) or not isinstance(value, kinds) or value <= 0:
        what = "a whole number above 0" if whole else "dollars above 0"
        raise ValueError(f"{where}: `{name}` must be {what}, not {value!r}.")


@dataclass(frozen=True)
class RunSettings:
    """How a run executes. The project sets the defaults of the first three and of the
    tables; an experiment (`experiment(..., concurrency=...)`) or a run's options override
    them; what a run was given is stored in `run.config` (camelCase keys where noted)."""

    runs: int = 1  # repetitions of each item
    concurrency: int = 5  # items in parallel
    timeout: float = 30  # seconds per item
    timeout_grace: float = 5  # seconds an item's code has to stop once its timeout passed
    judge: JudgeSettings = field(default_factory=JudgeSettings)
    cache: CacheSettings = field(default_factory=CacheSettings)
    trace: TraceSettings = field(default_factory=TraceSettings)
    calibration: CalibrationSettings = field(default_factory=CalibrationSettings)
    receiver: ReceiverSettings = field(default_factory=ReceiverSettings)
    recording: ReplayTable = field(default_factory=ReplayTable)  # `[replay]`
    budget: BudgetSettings = field(default_factory=BudgetSettings)
    rate_limits: dict[str, Any] = field(default_factory=dict)  # calls per minute, by provider
    # Only in a run's stored settings:
    repeat_flaky: int | None = None  # `--repeat-flaky N`
    replay: str | None = None  # the replay mode, None for a live run
    queue: str | None = None  # a team run's queue
    no_cache: bool = False  # `noCache`: a team run that bypasses the cache
    conversation: dict[str, Any] | None = None  # `{maxTurns, turnTimeout}`
    rejudge: dict[str, Any] | None = None  # a re-judge run's evaluators
    prior_duration_ms: float = 0.0  # `priorDurationMs`: time spent before a `--resume`

    @classmethod
    def from_config(cls, config: Any) -> RunSettings:
        """The project's settings: `config` is a `Config` or its data (anything with `.get`)."""
        return cls(
            **_given(cls, {key: config.get(key) for key in PROJECT_KEYS}),
            judge=JudgeSettings.from_config(config.get("judge")),
            cache=CacheSettings(**_given(CacheSettings, config.get("cache"))),
            trace=TraceSettings(**_given(TraceSettings, config.get("trace"))),
            calibration=CalibrationSettings(
                **_given(CalibrationSettings, config.get("calibration"))
            ),
            receiver=ReceiverSettings(**_given(ReceiverSettings, config.get("receiver"))),
            recording=ReplayTable.from_config(config.get("replay")),
            budget=BudgetSettings(**_given(BudgetSettings, config.get("budget"))),
        )

    @classmethod
    def from_run_config(cls, stored: Mapping[str, Any] | None) -> RunSettings:
        """A run's settings as stored in `run.config` when it was created."""
        stored = stored or {}
        values = {key: stored.get(name) for key, name in RUN_KEYS.items()}
        budget = {key: stored.get(name) for key, name in BUDGET_KEYS.items()}
        settings = cls(
            **{k: v for k, v in values.items() if v is not None},
            budget=BudgetSettings(**{k: v for k, v in budget.items() if v is not None}),
        )
        return settings._coerced()

    def _coerced(self) -> RunSettings:
        # JSON keeps what it was given; the engine counts in ints and seconds in floats
        # (as `int(run.config["concurrency"])` did at each call site).
        return replace(
            self,
            runs=int(self.runs),
            concurrency=int(self.concurrency),
            timeout=float(self.timeout),
            timeout_grace=float(self.timeout_grace),
            no_cache=bool(self.no_cache),
        )


RUN_DEFAULTS = RunSettings()  # every default, e.g. `RUN_DEFAULTS.judge.timeout`

ANTHROPIC_JUDGE_MODEL = "claude-haiku-4-5"


def default_judge_model(provider: str) -> str:
    """The model a judge (or the simulated user) of `provider` uses when none is configured."""
    return ANTHROPIC_JUDGE_MODEL if provider == "anthropic" else RUN_DEFAULTS.judge.model


# The project-level settings read from the configuration's top level.
PROJECT_KEYS = ("concurrency", "timeout", "timeout_grace", "rate_limits")
# A run's stored settings: field → key in `run.config`.
RUN_KEYS = {
    "runs": "runs",
    "concurrency": "concurrency",
    "timeout": "timeout",
    "timeout_grace": "timeoutGrace",
    "repeat_flaky": "repeat_flaky",
    "replay": "replay",
    "queue": "queue",
    "no_cache": "noCache",
    "conversation": "conversation",
    "rejudge": "rejudge",
    "prior_duration_ms": "priorDurationMs",
}


def _given(cls: type, table: Mapping[str, Any] | None) -> dict[str, Any]:
    """The values of `table` that name a field of `cls` and are not None (None: the default)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in (table or {}).items() if k in names and v is not None}
