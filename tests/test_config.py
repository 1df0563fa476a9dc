import os

import pytest

from cobalt import define_config, load_config
from cobalt.config import ConfigError, parse_ttl


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
        '[judge]\napi_key = "sk-live-123"\ndatabase_url = "postgres://bob:hunter2@db/cobalt"\n'
    )
    shown = str(load_config(tmp_path).redacted())
    assert "sk-live-123" not in shown
    assert "hunter2" not in shown
    assert "bob" in shown
    assert os.environ.get("COBALT_CONCURRENCY") is None
