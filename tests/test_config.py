import os

import pytest

from cobalt import define_config, load_config
from cobalt.config import ConfigError, parse_ttl
from cobalt.redaction import redact


def test_it_uses_defaults_without_a_config_file(tmp_path):
    config = load_config(tmp_path)
    assert config.path is None
    assert config.project_dir == tmp_path.resolve()
    assert config["test_dir"] == "experiments"
    assert config["concurrency"] == 5
    assert config.get("judge.model") == "gpt-4o-mini"
    assert config.get("cache.ttl") == "7d"


def test_it_reads_cobalt_toml_found_in_a_parent_folder(tmp_path):
    (tmp_path / "cobalt.toml").write_text(
        'test_dir = "evals"\nconcurrency = 9\n[judge]\nmodel = "gpt-4.1"\n[ci.thresholds.exact]\navg = 0.8\n'
    )
    nested = tmp_path / "a" / "b"
    nested.mkdir(parents=True)
    config = load_config(nested)
    assert config.path == tmp_path / "cobalt.toml"
    assert config.project_dir == tmp_path
    assert config.test_dir == (tmp_path / "evals").resolve()
    assert config["concurrency"] == 9
    assert config.get("judge.model") == "gpt-4.1"
    assert config.get("judge.provider") == "openai"  # defaults kept under a partial table
    assert config.get("ci.thresholds.exact.avg") == 0.8


def test_it_reads_cobalt_config_py_with_define_config(tmp_path):
    (tmp_path / "cobalt.config.py").write_text(
        "from cobalt import define_config\n"
        "config = define_config(timeout=12, judge={'provider': 'anthropic', 'model': 'claude-haiku-4-5'})\n"
    )
    config = load_config(tmp_path)
    assert config["timeout"] == 12
    assert config.get("judge.provider") == "anthropic"


def test_environment_variables_override_the_file(tmp_path, monkeypatch):
    (tmp_path / "cobalt.toml").write_text("concurrency = 3\n")
    monkeypatch.setenv("COBALT_CONCURRENCY", "17")
    monkeypatch.setenv("COBALT_JUDGE_MODEL", "gpt-5-mini")
    monkeypatch.setenv("COBALT_CACHE_ENABLED", "false")
    config = load_config(tmp_path)
    assert config["concurrency"] == 17
    assert config.get("judge.model") == "gpt-5-mini"
    assert config.get("cache.enabled") is False
    assert "environment" in config.sources


def test_a_bad_value_names_the_file_and_the_key(tmp_path):
    (tmp_path / "cobalt.toml").write_text("concurrency = 0\n")
    with pytest.raises(ConfigError) as error:
        load_config(tmp_path)
    assert "cobalt.toml" in str(error.value)
    assert "`concurrency`" in str(error.value)


def test_invalid_toml_is_reported_with_the_file(tmp_path):
    (tmp_path / "cobalt.toml").write_text("concurrency = = 3\n")
    with pytest.raises(ConfigError, match="cobalt.toml: invalid TOML"):
        load_config(tmp_path)


def test_a_config_py_that_raises_is_reported(tmp_path):
    (tmp_path / "cobalt.config.py").write_text("raise RuntimeError('nope')\n")
    with pytest.raises(ConfigError, match="cobalt.config.py: failed to load .*nope"):
        load_config(tmp_path)


def test_an_invalid_env_override_names_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("COBALT_CONCURRENCY", "many")
    with pytest.raises(ConfigError, match="COBALT_CONCURRENCY"):
        load_config(tmp_path)


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        (
            'test_dir = "experiments"\nconcurency = 3\n',
            "cobalt.toml, line 2: `concurency` is not a Cobalt setting; did you mean "
            "`concurrency`?",
        ),
        (
            '[judge]\nmodel = "gpt-4o"\n\n[cache]\nttl = "1d"\nenabeld = false\n',
            "cobalt.toml, line 6: `cache.enabeld` is not a Cobalt setting; did you mean "
            "`cache.enabled`?",
        ),
        (
            'judge.modle = "gpt-4o"\n',
            "cobalt.toml, line 1: `judge.modle` is not a Cobalt setting; did you mean "
            "`judge.model`?",
        ),
        ('testDir = "evals"\n', "`testDir` is not a Cobalt setting; did you mean `test_dir`?"),
        ('reporters = ["cli", "junit"]\n', "`reporters` must be a list of: console (or cli)"),
        ("[dashboard]\ncolour = 1\n", "the settings of [dashboard] are host, port, open"),
        ('langfuse = "pk-lf"\n', "`langfuse` must be a table"),
        (
            'test_dir = "x"\n\n[langfuze]\nhost = "h"\n',
            "cobalt.toml, line 3: `langfuze` is not a Cobalt setting; did you mean `langfuse`?",
        ),
    ],
)
def test_a_setting_cobalt_does_not_know_is_refused_with_its_line_and_the_closest_name(
    tmp_path, toml, message
):
    (tmp_path / "cobalt.toml").write_text(toml)
    with pytest.raises(ConfigError) as error:
        load_config(tmp_path)
    assert message in str(error.value)


def test_every_documented_setting_is_known(tmp_path):
    (tmp_path / "cobalt.toml").write_text(
        'test_dir = "evals"\ntest_match = ["*.py"]\noutput_dir = ".c"\nconcurrency = 2\n'
        'timeout = 5\nplugins = []\ndatabase_url = "postgres://db/x"\n'
        'broker_url = "redis://r/0"\nwebhooks = []\n'
        '[judge]\nprovider = "openai"\nmodel = "m"\nbase_url = "http://l/v1"\n'
        "max_retries = 1\ntimeout = 9\n"
        '[simulator]\nprovider = "anthropic"\nmodel = "m"\napi_key_env = "K"\n'
        '[cache]\nenabled = false\nttl = "1d"\n[dashboard]\nhost = "0.0.0.0"\nport = 1\n'
        "open = true\n[trace]\nenabled = false\nmax_chars = 9\n[mcp]\nresult_tokens = 9000\n"
        '[replay]\nignore = ["a.b"]\n[ci]\nfail_on_error = true\n[prices]\n"my-model" = [1, 2]\n'
        '[rate_limits]\nopenai = 60\n[env]\nANY_NAME = "x"\n'
        '[langfuse]\npublic_key = "p"\nsecret_key = "s"\nhost = "https://h"\n'
        '[langsmith]\napi_key = "k"\nendpoint = "https://h"\n'
        '[braintrust]\napi_key = "k"\napi_url = "https://h"\n'
        '[basalt]\napi_key = "k"\napi_url = "https://h"\n'
    )
    config = load_config(tmp_path)
    assert config.get("judge.max_retries") == 1 and config.get("basalt.api_url") == "https://h"


def test_define_config_refuses_an_unknown_setting():
    with pytest.raises(ConfigError, match="`concurency` is not a Cobalt setting"):
        define_config(concurency=2)


def test_define_config_validates_and_returns_a_dict():
    assert define_config(concurrency=2)["concurrency"] == 2
    with pytest.raises(ConfigError, match="timeout"):
        define_config(timeout=-1)


@pytest.mark.parametrize(
    ("value", "seconds"), [("7d", 604800), ("12h", 43200), ("30m", 1800), ("45", 45), (60, 60)]
)
def test_ttl_durations_parse(value, seconds):
    assert parse_ttl(value) == seconds


def test_redaction_hides_keys_and_database_passwords(tmp_path):
    (tmp_path / "cobalt.toml").write_text(
        'database_url = "postgres://bob:hunter2@db/cobalt"\n[judge]\napi_key = "sk-live-123"\n'
    )
    shown = str(redact(load_config(tmp_path).data))
    assert "sk-live-123" not in shown
    assert "hunter2" not in shown
    assert "bob" in shown
    assert os.environ.get("COBALT_CONCURRENCY") is None


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"concurrency": 0}, "`concurrency` must be a whole number of at least 1 (got 0)."),
        ({"concurrency": True}, "`concurrency` must be a whole number of at least 1 (got True)."),
        ({"concurrency": 2.5}, "`concurrency` must be a whole number of at least 1 (got 2.5)."),
        ({"timeout": 0}, "`timeout` must be a number of seconds above 0 (got 0)."),
        ({"timeout": "9"}, "`timeout` must be a number of seconds above 0 (got '9')."),
        ({"timeout": False}, "`timeout` must be a number of seconds above 0 (got False)."),
        ({"test_match": 3}, "`test_match` must be a glob or a list of globs."),
        ({"test_match": ["a", 1]}, "`test_match` must be a glob or a list of globs."),
        ({"judge": "gpt"}, "`judge` must be a table (a dict)."),
        ({"rate_limits": []}, "`rate_limits` must be a table (a dict)."),
        ({"ci": 1}, "`ci` must be a table (a dict)."),
        ({"env": "x"}, "`env` must be a table (a dict)."),
        (
            {"judge": {"provider": "mistral"}},
            "`judge.provider` must be 'openai' or 'anthropic' (got 'mistral').",
        ),
        (
            {"simulator": {"provider": 1}},
            "`simulator.provider` must be 'openai' or 'anthropic' (got 1).",
        ),
        ({"trace": {"enabled": 1}}, "`trace.enabled` must be true or false (got 1)."),
        (
            {"trace": {"max_chars": 0}},
            "`trace.max_chars` must be a whole number of at least 1 (got 0).",
        ),
        (
            {"cache": {"ttl": "soon"}},
            "cache.ttl: 'soon' is not a duration; use e.g. '7d', '12h', '30m'.",
        ),
        (
            {"plugins": "a.py"},
            '`plugins` must be a list of Python file paths, e.g. ["plugins/my_eval.py"].',
        ),
        (
            {"plugins": [""]},
            '`plugins` must be a list of Python file paths, e.g. ["plugins/my_eval.py"].',
        ),
        (
            {"prices": [1, 2]},
            '`prices` must be a table of model = [input, output], e.g. "my-model" = [2.5, 10].',
        ),
        (
            {"prices": {"m": [1]}},
            "`prices.m` must be [input, output] or {input = ..., output = ...}: USD per million "
            "tokens, numbers of at least 0 (got [1]).",
        ),
        ({"ci": {"nope": 1}}, "`ci.nope` is not a CI setting"),
        ({"webhooks": {}}, "`webhooks` must be a list of tables ([[webhooks]] in TOML)."),
        ({"replay": {"hosts": "x"}}, "`replay.hosts` must be a list of strings"),
        (
            {"replay": {"allow_hosts": "localhost"}},
            '`replay.allow_hosts` must be a list of strings, e.g. ["localhost"]',
        ),
        (
            {"replay": {"allow": ["x"]}},
            "`replay.allow` is not a replay setting; use ignore, allow_hosts.",
        ),
        ({"results": {"format": "xml"}}, "`results.format` must be one of"),
        ({"retention": {"keep_last": 0}}, "`retention.keep_last` must be a whole number"),
        ({"judge": {"modle": "m"}}, "`judge.modle` is not a Cobalt setting; did you mean"),
    ],
)
def test_each_invalid_setting_gives_its_message(settings, message):
    with pytest.raises(ConfigError) as error:
        define_config(settings)
    assert str(error.value).startswith("define_config()")
    assert message in str(error.value)


def test_the_first_invalid_setting_in_the_table_is_the_one_reported():
    """Several mistakes: the message names the first setting in the order they are checked."""
    settings = {
        "prices": 1,
        "plugins": 1,
        "trace": {"enabled": 1},
        "judge": {"provider": "x"},
        "env": 1,
        "test_match": 1,
        "timeout": 0,
        "concurrency": 0,
    }
    order = ["concurrency", "timeout", "test_match", "env", "judge.provider", "trace.enabled"]
    for key in order:
        with pytest.raises(ConfigError, match=f"`{key}`"):
            define_config(settings)
        top = key.split(".")[0]
        settings.pop(top) if "." not in key else settings[top].clear()
    with pytest.raises(ConfigError, match="`plugins`"):
        define_config(settings)
    settings.pop("plugins")
    with pytest.raises(ConfigError, match="`prices`"):
        define_config(settings)


def test_a_glob_becomes_a_list_of_globs():
    assert define_config(test_match="*.py")["test_match"] == ["*.py"]


def test_run_settings_hold_the_defaults_the_configuration_uses(tmp_path):
    from cobalt.run_settings import RunSettings

    defaults, config = RunSettings(), load_config(tmp_path)
    assert (defaults.concurrency, defaults.timeout, defaults.runs) == (5, 30, 1)
    assert config["concurrency"] == defaults.concurrency
    assert config["timeout"] == defaults.timeout
    assert config["judge"] == defaults.judge.as_dict()
    assert RunSettings.from_config(config) == defaults
    stored = RunSettings.from_run_config({"concurrency": 3, "runs": 2, "noCache": True})
    assert (stored.concurrency, stored.timeout, stored.runs, stored.no_cache) == (3, 30, 2, True)
    assert RunSettings.from_run_config(None) == RunSettings()
