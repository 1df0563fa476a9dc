"""Project configuration: `cobalt.toml` or `cobalt.config.py`, overridden by `COBALT_*` variables.

The configuration file is searched from the current folder upward; the folder that holds it
is the *project folder* (experiment files, datasets and `.cobalt/` live there). With no file,
the current folder is the project folder and the defaults apply.

This module imports nothing from Django: settings are built from it.
"""

from __future__ import annotations

import copy
import difflib
import importlib.util
import os
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cobalt.errors import ConfigError
from cobalt.results_file import FORMATS as RESULTS_FORMATS
from cobalt.run_settings import RUN_DEFAULTS as RUN

CONFIG_FILENAMES = ("cobalt.toml", "cobalt.config.py")
RAN_HERE = ".cobalt"  # what `cobalt run` leaves in a folder: where Cobalt ran is a project

# The run settings' defaults live in `cobalt/run_settings.py` (RUN); the rest are the project's.
DEFAULTS: dict[str, Any] = {
    "test_dir": "experiments",
    "test_match": ["**/*.cobalt.py", "**/*.experiment.py"],
    "output_dir": ".cobalt",
    "judge": RUN.judge.as_dict(),
    "simulator": {},  # the simulated user's model (provider, model, base_url): the judge's
    "concurrency": RUN.concurrency,
    "timeout": RUN.timeout,
    "timeout_grace": RUN.timeout_grace,
    "cache": RUN.cache.as_dict(),
    "ci": {},
    "dashboard": {"host": "127.0.0.1", "port": 4000, "open": False},
    "database_url": None,
    "broker_url": None,
    "rate_limits": dict(RUN.rate_limits),
    "webhooks": [],
    "plugins": [],
    "env": {},
    "trace": RUN.trace.as_dict(),
    "calibration": RUN.calibration.as_dict(),
    "receiver": RUN.receiver.as_dict(),
    "targets": {},  # [targets.NAME]: HTTP targets (cobalt/http_target.py), checked when used
    "budget": RUN.budget.as_dict(),
    # The original's setting (`reporters: ['cli', 'json']`): the terminal reporter of a run
    # started without --reporter (`terminal_reporter`).
    "reporters": [],
}

# What each table may hold; a key Cobalt does not know is a mistake (`concurency = 3` would
# otherwise leave concurrency at 5 without a word). `ci`, `webhooks`, `replay` and
# `rate_limits` check their own keys; `env` and `prices` hold names of the user's choosing.
TABLE_SETTINGS: dict[str, tuple[str, ...]] = {
    "judge": tuple(RUN.judge.as_dict()),
    "simulator": ("provider", "model", "base_url", "api_key_env"),
    "cache": tuple(RUN.cache.as_dict()),
    "dashboard": ("host", "port", "open"),
    "trace": tuple(RUN.trace.as_dict()),
    "calibration": tuple(RUN.calibration.as_dict()),
    "receiver": tuple(RUN.receiver.as_dict()),
    "budget": tuple(RUN.budget.as_dict()),
    "mcp": ("result_tokens",),
    "results": ("format", "compress", "large_run"),  # cobalt/results_file.py
    # Dataset platforms (cobalt/remote.py), when their variables are not set:
    "langfuse": ("public_key", "secret_key", "host"),
    "langsmith": ("api_key", "endpoint"),
    "braintrust": ("api_key", "api_url"),
    "basalt": ("api_key", "api_url"),
    "retention": ("runs", "traces", "recordings", "keep_last", "baselines"),
}
SETTINGS = tuple(dict.fromkeys([*DEFAULTS, "prices", "replay", "intercept", *TABLE_SETTINGS]))
SETTING_HINTS: dict[str, str] = {}
# `reporters`: console (the original's cli) and json are `cobalt run --reporter` names; the
# original's json file is the results file and its html report the dashboard, both always there.
REPORTER_NAMES = ("console", "cli", "json", "html")

# Environment variables that override configuration keys (dotted paths).
ENV_OVERRIDES: dict[str, tuple[str, type]] = {
    "COBALT_TEST_DIR": ("test_dir", str),
    "COBALT_OUTPUT_DIR": ("output_dir", str),
    "COBALT_CONCURRENCY": ("concurrency", int),
    "COBALT_TIMEOUT": ("timeout", float),
    "COBALT_JUDGE_PROVIDER": ("judge.provider", str),
    "COBALT_JUDGE_MODEL": ("judge.model", str),
    "COBALT_JUDGE_BASE_URL": ("judge.base_url", str),
    "COBALT_CACHE_ENABLED": ("cache.enabled", bool),
    "COBALT_CACHE_TTL": ("cache.ttl", str),
    "COBALT_DATABASE_URL": ("database_url", str),
    "COBALT_BROKER_URL": ("broker_url", str),
}

TTL_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
TTL_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class NoProjectError(ConfigError):
    """No cobalt.toml or cobalt.config.py in the folder or above it."""


@dataclass(frozen=True)
class Config:
    """The resolved configuration of one project."""

    data: dict[str, Any]
    project_dir: Path
    path: Path | None = None
    sources: tuple[str, ...] = field(default_factory=tuple)

    def __getitem__(self, key: str) -> Any:
        return self.get(key)

    def get(self, dotted: str, default: Any = None) -> Any:
        node: Any = self.data
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    @property
    def test_dir(self) -> Path:
        return (self.project_dir / self.data["test_dir"]).resolve()

    @property
    def output_dir(self) -> Path:
        return (self.project_dir / self.data["output_dir"]).resolve()

    @property
    def results_dir(self) -> Path:
        return self.output_dir / "results"

    @property
    def team_mode(self) -> bool:
        return bool(self.data.get("broker_url"))


def define_config(config: dict[str, Any] | None = None, /, **kwargs: Any) -> dict[str, Any]:
    """Declare the configuration in `cobalt.config.py`: `config = define_config(test_dir=...)`."""
    merged = dict(config or {})
    merged.update(kwargs)
    _validate(merged, source="define_config()")
    return merged


def terminal_reporter(config: Config) -> str:
    """The reporter of a run started without `--reporter`: JSON lines when `reporters` asks
    for json without the console (cli); the console otherwise."""
    chosen = config.get("reporters") or []
    if "json" in chosen and not {"console", "cli"} & set(chosen):
        return "json"
    return "console"


def parse_ttl(value: str | int | float | None) -> float | None:
    """`"7d"`, `"12h"`, `"30m"`, `3600` → seconds; None or 0 means no expiry."""
    if value in (None, "", 0):
        return None
    if isinstance(value, int | float):
        return float(value)
    match = TTL_PATTERN.match(str(value))
    if not match:
        raise ConfigError(f"cache.ttl: {value!r} is not a duration; use e.g. '7d', '12h', '30m'.")
    return float(match.group(1)) * TTL_UNITS[match.group(2)]


def parse_age(value: Any, *, key: str) -> float:
    """A retention age, the TTL rule with its unit required: `"30d"`, `"12h"`, `"2w"`, `"90m"`
    (minutes), `"45s"` → seconds. A bare `30` is refused: read as seconds, it would delete
    nearly everything. The ConfigError names `key` (an option or a setting)."""
    match = TTL_PATTERN.match(value) if isinstance(value, str) else None
    if match is None or not match.group(2):
        bare = match is not None or _is_number(value)  # a number without its unit
        hint = f" (a unit is needed: '{value}d' for days?)" if bare else ""
        raise ConfigError(f"{key}: {value!r} is not an age; use e.g. 30d, 12h, 2w{hint}")
    return float(match.group(1)) * TTL_UNITS[match.group(2)]


def find_config_file(start: Path) -> Path | None:
    for folder in (start, *start.parents):
        for name in CONFIG_FILENAMES:
            candidate = folder / name
            if candidate.is_file():
                return candidate
    return None


def find_project(start: Path) -> tuple[Path, Path | None] | None:
    """The nearest folder at or above `start` that is a project, and its configuration file:
    a folder holding cobalt.toml or cobalt.config.py, or where Cobalt ran (`.cobalt/`, a
    project without configuration: `cobalt run` worked there, so `serve` and `mcp` do too).
    None outside any project."""
    for folder in (start, *start.parents):
        for name in CONFIG_FILENAMES:
            if (folder / name).is_file():
                return folder, folder / name
        if (folder / RAN_HERE).is_dir():
            return folder, None
    return None


def find_project_dir(path: str | Path) -> Path | None:
    """The project holding `path` (a file or a folder), see `find_project`; None outside
    any project."""
    found = find_project(Path(path).resolve())
    return None if found is None else found[0]


def load_config(
    cwd: str | Path | None = None,
    *,
    near: str | Path | None = None,
    require_project: bool = False,
) -> Config:
    """Find and read the project's configuration, apply `COBALT_*` overrides and defaults.

    The project is named by `cwd` or COBALT_PROJECT_DIR (that folder, even without a
    configuration file), else it is the one holding `near` (a file about to run), else the
    one found from the current folder upward (`find_project`). Found from the current folder,
    a folder with no project at or above it is one only without `require_project`.
    """
    named = cwd or os.environ.get("COBALT_PROJECT_DIR") or (near and find_project_dir(near))
    start = Path(named or os.getcwd()).resolve()
    if named:
        path = find_config_file(start)
    else:
        found = find_project(start)
        path = found[1] if found else None
        if found is None and require_project:
            raise NoProjectError(
                f"no Cobalt project here: no {' or '.join(CONFIG_FILENAMES)} or {RAN_HERE}/ "
                f"in {start} or a folder above it. `cobalt init` makes this folder a project "
                "(or cd into one, or set COBALT_PROJECT_DIR)."
            )
        start = found[0] if found else start
    data = copy.deepcopy(DEFAULTS)
    sources = ["defaults"]
    if path is not None:
        _merge(data, _read_file(path))
        sources.append(str(path))
        project_dir = path.parent
    else:
        project_dir = start
    overrides = _env_overrides()
    for dotted, value in overrides.items():
        _set_dotted(data, dotted, value)
    if overrides:
        sources.append("environment")
    _validate(data, source=str(path) if path else "defaults")
    return Config(data=data, project_dir=project_dir, path=path, sources=tuple(sources))


_active: Config | None = None


def active_config() -> Config:
    """The configuration of the project this process works in (loaded once)."""
    global _active
    if _active is None:
        _active = load_config()
    return _active


def set_active_config(config: Config | None) -> None:
    global _active
    _active = config


def _read_file(path: Path) -> dict[str, Any]:
    if path.suffix == ".toml":
        try:
            with path.open("rb") as fh:
                return tomllib.load(fh)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: invalid TOML ({exc}).") from exc
    spec = importlib.util.spec_from_file_location("cobalt_user_config", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise ConfigError(f"{path}: failed to load ({type(exc).__name__}: {exc}).") from exc
    config = getattr(module, "config", None)
    if config is None:
        raise ConfigError(f"{path}: define `config = define_config(...)` at module level.")
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: `config` must be the result of define_config(...).")
    return config


def _env_overrides() -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, (dotted, kind) in ENV_OVERRIDES.items():
        raw = os.environ.get(name)
        if raw is None or raw == "":
            continue
        try:
            if kind is bool:
                values[dotted] = raw.strip().lower() in ("1", "true", "yes", "on")
            else:
                values[dotted] = kind(raw)
        except ValueError as exc:
            raise ConfigError(f"{name}={raw!r}: expected a {kind.__name__}.") from exc
    return values


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    node = data
    *parents, last = dotted.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


@dataclass(frozen=True)
class SettingRule:
    """One row of the validation table. When the setting at `key` (dotted) is present, it must
    pass `valid`, else the message is "{source}: `key` message" (`{value!r}` filled in); a
    table with rules of its own has a `check(value, source=...)` that raises its messages."""

    key: str
    valid: Callable[[Any], bool] | None = None
    message: str = ""
    check: Callable[..., None] | None = None


def _is_whole_at_least_1(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _is_seconds(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and not value <= 0


def _is_globs(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _is_provider(value: Any) -> bool:
    return value in (None, "openai", "anthropic")


def _is_paths(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(p, str) and p for p in value)


def _is_table(value: Any) -> bool:
    return isinstance(value, dict)


def _known_in(section: str) -> Callable[..., None]:
    def check(table: dict[str, Any], *, source: str) -> None:
        _check_known(table or {}, TABLE_SETTINGS[section], source=source, table_name=section)

    return check


def _check_cache_ttl(value: Any, *, source: str) -> None:
    try:
        parse_ttl(value)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def _check_prices(prices: dict[str, Any], *, source: str) -> None:
    for model, price in prices.items():
        if not _is_price(price):
            raise ConfigError(
                f"{source}: `prices.{model}` must be [input, output] or {{input = ..., output = "
                f"...}}: USD per million tokens, numbers of at least 0 (got {price!r})."
            )


WHOLE = "must be a whole number of at least 1 (got {value!r})."
PROVIDER = "must be 'openai' or 'anthropic' (got {value!r})."
# The validation table, checked in this order (the first problem is the one reported).
SETTING_RULES: tuple[SettingRule, ...] = (
    SettingRule("concurrency", _is_whole_at_least_1, WHOLE),
    SettingRule("timeout", _is_seconds, "must be a number of seconds above 0 (got {value!r})."),
    SettingRule(
        "timeout_grace", _is_seconds, "must be a number of seconds above 0 (got {value!r})."
    ),
    SettingRule("test_match", _is_globs, "must be a glob or a list of globs."),
    SettingRule(
        "reporters",
        lambda value: isinstance(value, list) and all(r in REPORTER_NAMES for r in value),
        "must be a list of: console (or cli), json, html (got {value!r}); "
        "`cobalt run --reporter` chooses for one run.",
    ),
    *(
        SettingRule(section, _is_table, "must be a table (a dict).")
        for section in (*TABLE_SETTINGS, "ci", "rate_limits", "env", "targets")
    ),
    *(SettingRule(section, check=_known_in(section)) for section in TABLE_SETTINGS),
    SettingRule("judge.provider", _is_provider, PROVIDER),
    SettingRule("simulator.provider", _is_provider, PROVIDER),
    SettingRule(
        "trace.enabled",
        lambda value: isinstance(value, bool),
        "must be true or false (got {value!r}).",
    ),
    SettingRule("trace.max_chars", _is_whole_at_least_1, WHOLE),
    SettingRule("calibration.min_labels", _is_whole_at_least_1, WHOLE),
    SettingRule(
        "receiver.port",
        lambda value: isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 65536,
        "must be a port number, or 0 for no receiver during runs (got {value!r}).",
    ),
    SettingRule(
        "receiver.grace",
        lambda value: _is_number(value) and value >= 0,
        "must be a number of seconds, 0 or more (got {value!r}).",
    ),
    SettingRule("receiver.retention_days", _is_whole_at_least_1, WHOLE),
    SettingRule(
        "calibration.min_rate",
        lambda value: _is_number(value) and 0 <= value <= 1,
        "must be a number from 0 to 1 (got {value!r}).",
    ),
    SettingRule("cache.ttl", check=_check_cache_ttl),
    # The tables with rules of their own (their checks are defined further down):
    SettingRule("ci", check=lambda value, *, source: check_ci(value, source=source)),
    SettingRule("webhooks", check=lambda value, *, source: check_webhooks(value, source=source)),
    SettingRule("replay", check=lambda value, *, source: check_replay(value, source=source)),
    SettingRule("budget", check=lambda value, *, source: check_budget_table(value, source=source)),
    SettingRule("intercept", check=lambda value, *, source: check_intercept(value, source=source)),
    SettingRule("results", check=lambda value, *, source: check_results(value, source=source)),
    SettingRule("retention", check=lambda value, *, source: check_retention(value, source=source)),
    SettingRule(
        "plugins",
        _is_paths,
        'must be a list of Python file paths, e.g. ["plugins/my_eval.py"].',
    ),
    SettingRule(
        "prices",
        _is_table,
        'must be a table of model = [input, output], e.g. "my-model" = [2.5, 10].',
    ),
    SettingRule("prices", check=_check_prices),
)


def _validate(data: dict[str, Any], *, source: str) -> None:
    _check_known(data, SETTINGS, source=source)
    for key in ("test_match", "reporters"):  # one glob (reporter) is a list of one
        if isinstance(data.get(key), str):
            data[key] = [data[key]]
    for rule in SETTING_RULES:
        found, value = _lookup(data, rule.key)
        if not found:
            continue
        if rule.check is not None:
            rule.check(value, source=source)
        elif rule.valid is not None and not rule.valid(value):
            raise ConfigError(f"{source}: `{rule.key}` {rule.message.format(value=value)}")


def _lookup(data: dict[str, Any], dotted: str) -> tuple[bool, Any]:
    """(whether the setting is present, its value); a table that is None counts as empty."""
    *tables, key = dotted.split(".")
    node: Any = data
    for table in tables:
        node = node.get(table) or {}
    return (key in node, node.get(key)) if isinstance(node, dict) else (False, None)


def _check_known(
    table: dict[str, Any], known: tuple[str, ...], *, source: str, table_name: str = ""
) -> None:
    """ConfigError for the first key of `table` that is not in `known`: where it is (the
    line, in a TOML file), the closest setting, and the settings there are."""
    for key in table:
        if key in known:
            continue
        dotted = f"{table_name}.{key}" if table_name else key
        snake = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", str(key)).lower()  # testDir → test_dir
        close = [snake] if snake in known else difflib.get_close_matches(str(key), known, n=1)
        if dotted in SETTING_HINTS:
            advice = SETTING_HINTS[dotted]
        elif close:
            advice = f"did you mean `{table_name + '.' if table_name else ''}{close[0]}`?"
        else:
            listed = f"the settings of [{table_name}]" if table_name else "the settings"
            advice = f"{listed} are {', '.join(known)}"
        where = source
        line = _line_of(source, str(key), table_name)
        if line:
            where = f"{source}, line {line}"
        raise ConfigError(f"{where}: `{dotted}` is not a Cobalt setting; {advice}")


def _line_of(source: str, key: str, table_name: str) -> int | None:
    """The line of a TOML file that sets `key` (under `[table_name]`, or dotted), if found."""
    if not source.endswith(".toml"):
        return None
    try:
        lines = Path(source).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    name = re.escape(key)
    bare = re.compile(rf"""^\s*["']?{name}["']?\s*=""")
    dotted = re.compile(rf"""^\s*{re.escape(table_name)}\s*\.\s*["']?{name}["']?\s*=""")
    header = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]")
    current = ""
    for number, text in enumerate(lines, 1):
        if found := header.match(text):
            current = found.group(1).strip()
            if not table_name and current.split(".")[0].strip("\"' ") == key:
                return number  # an unknown table: `[langfuze]`
            continue
        if (current == table_name and bare.match(text)) or (
            table_name and not current and dotted.match(text)
        ):
            return number
    return None


def _is_price(value: Any) -> bool:
    if isinstance(value, dict):
        keys_ok = set(value) <= {"input", "output"} and "input" in value
        value = [value.get("input"), value.get("output", 0)] if keys_ok else None
    return (
        isinstance(value, list) and len(value) == 2 and all(_is_number(v) and v >= 0 for v in value)
    )


# CI gates (`[ci]`, `[ci.thresholds.<evaluator>]`, `experiment(..., thresholds=...)`).
SCORE_METRICS = ("avg", "min", "max", "p50", "p95", "p99", "pass_rate", "pass_rate_corrected")
METRIC_ALIASES = {
    "passRate": "pass_rate",
    "minScore": "min_score",
    "passRateCorrected": "pass_rate_corrected",
}
LATENCY_METRICS = ("avg", "p50", "p95", "p99", "max")
COST_METRICS = ("total",)
CI_SETTINGS = ("fail_on_error", "max_error_rate", "max_regression")
WEBHOOK_EVENTS = ("run.completed", "run.failed", "ci.passed", "ci.failed")
WEBHOOK_KEYS = ("url", "events", "secret", "secret_env", "retries", "timeout")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value


def check_ci_settings(table: dict[str, Any], *, where: str) -> None:
    """`fail_on_error` (bool), `max_error_rate` and `max_regression` (0..1)."""
    if "fail_on_error" in table and not isinstance(table["fail_on_error"], bool):
        raise ConfigError(f"{where}.fail_on_error` must be true or false.")
    for key in ("max_error_rate", "max_regression"):
        if key in table and not (_is_number(table[key]) and 0 <= table[key] <= 1):
            raise ConfigError(f"{where}.{key}` must be a number from 0 to 1 (got {table[key]!r}).")


def check_thresholds(thresholds: Any, *, where: str, allow_settings: bool = False) -> None:
    """Validate a thresholds table: `{evaluator: {avg, min, ...}, "latency": {...}, "cost": {...}}`.

    `where` starts the message, e.g. "cobalt.toml: `ci.thresholds" (the key path is appended).
    With `allow_settings` (an experiment's own thresholds), `fail_on_error`, `max_error_rate`
    and `max_regression` may sit beside the tables.
    """
    if thresholds is None:
        return
    if not isinstance(thresholds, dict):
        raise ConfigError(f"{where}` must be a table of evaluator names to metrics.")
    for name, metrics in thresholds.items():
        if allow_settings and name in CI_SETTINGS:
            continue
        key = f"{where}.{name}"
        if not isinstance(metrics, dict):
            hint = f" (or one of {', '.join(CI_SETTINGS)})" if allow_settings else ""
            raise ConfigError(f"{key}` must be a table of metrics{hint}, e.g. {{avg = 0.8}}.")
        if name == "latency":
            allowed, unit = LATENCY_METRICS, "milliseconds, at least 0"
        elif name == "cost":
            allowed, unit = COST_METRICS, "USD, at least 0"
        else:
            allowed, unit = (*SCORE_METRICS, "min_score"), "a number from 0 to 1"
        for metric, value in metrics.items():
            canonical = METRIC_ALIASES.get(metric, metric)
            if canonical not in allowed:
                raise ConfigError(
                    f"{key}.{metric}` is not a known metric; use {', '.join(allowed)}."
                )
            ceiling = name in ("latency", "cost")
            valid = _is_number(value) and value >= 0 and (ceiling or value <= 1)
            if not valid:
                raise ConfigError(f"{key}.{metric}` must be {unit} (got {value!r}).")
    if allow_settings:
        check_ci_settings(thresholds, where=where)


def check_ci(ci: Any, *, source: str) -> None:
    if not isinstance(ci, dict):
        raise ConfigError(f"{source}: `ci` must be a table (a dict).")
    known = ("thresholds", "replay", "require_calibrated", "sweep", *CI_SETTINGS)
    for key in ci:
        if key not in known:
            raise ConfigError(f"{source}: `ci.{key}` is not a CI setting; use {', '.join(known)}.")
    if "replay" in ci and not isinstance(ci["replay"], bool):
        raise ConfigError(f"{source}: `ci.replay` must be true or false (got {ci['replay']!r}).")
    required = ci.get("require_calibrated", False)
    if not isinstance(required, bool) and not (
        isinstance(required, list) and all(isinstance(name, str) for name in required)
    ):
        raise ConfigError(
            f"{source}: `ci.require_calibrated` must be true, false or a list of evaluator "
            f'names, e.g. ["relevance"] (got {required!r}).'
        )
    check_ci_settings(ci, where=f"{source}: `ci")
    check_thresholds(ci.get("thresholds"), where=f"{source}: `ci.thresholds")
    if "sweep" in ci:
        check_sweep_gate(ci["sweep"], where=f"{source}: `ci.sweep")


SWEEP_GATES = ("not-worse-than-best", "candidate-beats-default")


def check_sweep_gate(table: Any, *, where: str) -> None:
    """`[ci.sweep]`: `require` (one of SWEEP_GATES), `variant` (the chosen one, default: the
    experiment's default variant), `candidate` (for candidate-beats-default), `alpha`."""
    if not isinstance(table, dict):
        raise ConfigError(f'{where}` must be a table, e.g. {{require = "not-worse-than-best"}}.')
    for key in table:
        if key not in ("require", "variant", "candidate", "alpha"):
            raise ConfigError(
                f"{where}.{key}` is not known; use require, variant, candidate, alpha."
            )
    if table.get("require") not in SWEEP_GATES:
        raise ConfigError(f"{where}.require` must be one of {', '.join(SWEEP_GATES)}.")
    for key in ("variant", "candidate"):
        if key in table and (not isinstance(table[key], str) or not table[key].strip()):
            raise ConfigError(f'{where}.{key}` must be a variant, e.g. "model=gpt-4o-mini".')
    if table["require"] == "candidate-beats-default" and "candidate" not in table:
        raise ConfigError(f"{where}.candidate` names the variant that must beat the default.")
    alpha = table.get("alpha", 0.05)
    if not _is_number(alpha) or not 0 < alpha <= 0.5:
        raise ConfigError(f"{where}.alpha` must be above 0 and at most 0.5 (got {alpha!r}).")


def check_webhooks(webhooks: Any, *, source: str) -> None:
    if not isinstance(webhooks, list):
        raise ConfigError(f"{source}: `webhooks` must be a list of tables ([[webhooks]] in TOML).")
    for index, hook in enumerate(webhooks):
        where = f"{source}: `webhooks[{index}]"
        if not isinstance(hook, dict):
            raise ConfigError(f"{where}` must be a table with a `url`.")
        for key in hook:
            if key not in WEBHOOK_KEYS:
                raise ConfigError(f"{where}.{key}` is not a webhook setting; use {WEBHOOK_KEYS}.")
        url = hook.get("url")
        if not isinstance(url, str) or not re.match(r"^https?://[^/\s]+", url):
            raise ConfigError(f"{where}.url` must be an http:// or https:// address.")
        events = hook.get("events", [])
        if not isinstance(events, list) or not all(e in WEBHOOK_EVENTS for e in events):
            raise ConfigError(
                f"{where}.events` must be a list of {', '.join(WEBHOOK_EVENTS)} (got {events!r})."
            )
        for key in ("secret", "secret_env"):
            if key in hook and not isinstance(hook[key], str):
                raise ConfigError(f"{where}.{key}` must be a string.")
        retries = hook.get("retries", 3)
        if not isinstance(retries, int) or isinstance(retries, bool) or not 0 <= retries <= 10:
            raise ConfigError(f"{where}.retries` must be a whole number from 0 to 10.")
        if "timeout" in hook and not (_is_number(hook["timeout"]) and hook["timeout"] > 0):
            raise ConfigError(f"{where}.timeout` must be a number of seconds above 0.")


def check_budget_table(budget: Any, *, source: str) -> None:
    """`[budget]`: `max_llm_calls`, `max_tool_calls`, `max_tokens`, `max_cost` per item."""
    from cobalt.run_settings import check_budget

    if not isinstance(budget, dict):
        raise ConfigError(f"{source}: `budget` must be a table (a dict).")
    for name, value in budget.items():
        try:
            check_budget(name, value, f"{source}: budget")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


def check_intercept(intercept: Any, *, source: str) -> None:
    """`[[intercept]]`: stubs for every experiment of the project (`cobalt.intercept`)."""
    from cobalt.intercept import as_stubs

    as_stubs(intercept, f"{source}: intercept")


def check_replay(replay: Any, *, source: str) -> None:
    """`[replay]` (`cobalt.run_settings.ReplayTable`): `ignore` (request body fields left out
    of matching, dotted paths), `allow_hosts` (reached live in `--replay`) and `hosts`."""
    if not isinstance(replay, dict):
        raise ConfigError(f"{source}: `replay` must be a table (a dict).")
    for key, value in replay.items():
        if key not in ("ignore", "hosts", "allow_hosts"):
            raise ConfigError(
                f"{source}: `replay.{key}` is not a replay setting; use ignore, allow_hosts."
            )
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            example = '["metadata.trace_id"]' if key == "ignore" else '["localhost"]'
            raise ConfigError(
                f"{source}: `replay.{key}` must be a list of strings, e.g. {example}."
            )


def check_results(results: dict[str, Any], *, source: str) -> None:
    """`[results]`: `format` ("auto", "json", "jsonl"), `compress` ("auto", true, false) and
    `large_run` (item results above which `auto` means JSON Lines, compressed)."""
    where = f"{source}: `results"
    if results.get("format", "auto") not in RESULTS_FORMATS:
        raise ConfigError(
            f"{where}.format` must be one of {', '.join(map(repr, RESULTS_FORMATS))} "
            f"(got {results['format']!r})."
        )
    compress = results.get("compress", "auto")
    if not (isinstance(compress, bool) or compress == "auto"):
        raise ConfigError(f"{where}.compress` must be true, false or 'auto' (got {compress!r}).")
    large = results.get("large_run", 0)
    if not isinstance(large, int) or isinstance(large, bool) or large < 0:
        raise ConfigError(f"{where}.large_run` must be a whole number of items (got {large!r}).")


RUN_ID_PATTERN = re.compile(r"^[0-9a-f]{4,32}$")


def check_retention(retention: dict[str, Any], *, source: str) -> None:
    """`[retention]`: an age per kind (`runs`, `traces`, `recordings`), `keep_last` (the newest
    N of each experiment are kept whatever their age) and `baselines` (run ids CI compares
    with, never deleted). Unknown keys were reported by `_check_known`."""
    for kind in ("runs", "traces", "recordings"):
        if kind in retention:
            parse_age(retention[kind], key=f"{source}: `retention.{kind}`")
    if "keep_last" in retention:
        value = retention["keep_last"]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(
                f"{source}: `retention.keep_last` must be a whole number of at least 1 "
                f"(got {value!r})."
            )
    baselines = retention.get("baselines", [])
    if not isinstance(baselines, list) or not all(
        isinstance(v, str) and RUN_ID_PATTERN.match(v) for v in baselines
    ):
        raise ConfigError(
            f"{source}: `retention.baselines` must be a list of run ids (or prefixes of at "
            f'least 4 characters), e.g. ["6051787dfa01"] (got {baselines!r}).'
        )
