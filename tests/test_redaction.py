"""One redaction function for every door that shows configuration (issue 14, finding 4).

`/api/config/` through the real API views, the run configuration stored with a run by the
real engine, and the team commands as real subprocesses that cannot reach their broker.
"""

from __future__ import annotations

import json

import pytest

from cobalt.config import active_config, load_config, set_active_config
from cobalt.redaction import environment_secrets, redact
from cobalt_app import launcher
from cobalt_app.models import Run
from tests.conftest import free_port as closed_port
from tests.test_api import api, api_project, token, user  # noqa: F401 (fixtures)

SECRETS = [f"PW{n}-s3cr3t" for n in range(11)]

CONFIG = f"""
test_dir = "experiments"
broker_url = "redis://:{SECRETS[0]}@redis.internal:6379/0"
database_url = "postgres://cobalt:{SECRETS[1]}@db.internal:5432/cobalt"

[judge]
base_url = "https://judge:{SECRETS[2]}@llm.internal/v1?api-key={SECRETS[3]}&deployment=gpt"

[env]
LANGFUSE_HOST = "https://pk-lf-1:{SECRETS[4]}@langfuse.internal"
LANGFUSE_SECRET_KEY = "{SECRETS[5]}"

[langfuse]
host = "https://lf-user:{SECRETS[9]}@langfuse.internal"
secret_key = "{SECRETS[10]}"

[[webhooks]]
url = "https://hooks.slack.com/services/T0/B0/{SECRETS[6]}"
secret = "{SECRETS[7]}"
"""


@pytest.mark.parametrize(
    ("given", "shown"),
    [
        ("redis://:pw@host:6379/0", "redis://:***@host:6379/0"),
        ("rediss://default:pw@host", "rediss://default:***@host"),
        ("postgres://user:pw@db/cobalt", "postgres://user:***@db/cobalt"),
        ("postgresql://user:p@ss@db:5432/x", "postgresql://user:***@db:5432/x"),
        ("redis://:with/slash@host/0", "redis://:***@host/0"),
        ("postgres://bob@db/cobalt", "postgres://bob@db/cobalt"),
        ("https://ghp_token@github.com/o/r", "https://***@github.com/o/r"),
        ("https://x-access-token:ghp_1@github.com/o", "https://x-access-token:***@github.com/o"),
        ("https://h/v1?api-key=k&x=1", "https://h/v1?api-key=***&x=1"),
        ("https://h/?api_key=k&apikey=k&key=k", "https://h/?api_key=***&apikey=***&key=***"),
        (
            "https://h/?token=t&access_token=t&sig=s",
            "https://h/?token=***&access_token=***&sig=***",
        ),
        ("https://h/?signature=s&password=p", "https://h/?signature=***&password=***"),
        (
            "https://h/?client_secret=s&X-Amz-Credential=c",
            "https://h/?client_secret=***&X-Amz-Credential=***",
        ),
        ("https://h/?page=2&keyword=paris", "https://h/?page=2&keyword=paris"),
        ("https://h?api_key=k&b=1", "https://h?api_key=***&b=1"),
        ("redis://h:6379?password=pw", "redis://h:6379?password=***"),
        ("https://h#access_token=t", "https://h#access_token=***"),
        ("https://host:8080/users/@me", "https://host:8080/users/@me"),
        (
            "cannot reach the broker at redis://:pw@h:1/0: refused",
            "cannot reach the broker at redis://:***@h:1/0: refused",
        ),
    ],
)
def test_passwords_and_secret_query_values_are_hidden_in_any_url_form(given, shown):
    assert redact(given) == shown


@pytest.mark.parametrize(
    ("given", "shown"),
    [
        (
            "openai: HTTP 401: Incorrect API key provided: sk-test-SECRET-0001. See docs",
            "openai: HTTP 401: Incorrect API key provided: *** See docs",
        ),
        ("sent Authorization: Bearer abcdef123456", "sent Authorization: *** ***"),
        ("api_key=abc123456 and X-Api-Key: zyx98765", "api_key=*** and X-Api-Key: ***"),
        ("Password: hunter22, user bob", "Password: ***, user bob"),
        ("the call used MY-KEY-1234 twice", "the call used *** twice"),
        ("KeyError: missing_field at host:6379", "KeyError: missing_field at host:6379"),
        ("Rate the token: {{output}}", "Rate the token: {{output}}"),
    ],
)
def test_credentials_in_free_text_are_hidden_and_ordinary_text_is_not(given, shown):
    assert redact(given, secrets=["MY-KEY-1234"]) == shown


def test_keys_that_name_secrets_are_hidden_and_variable_names_and_counts_are_not():
    shown = redact(
        {
            "judge": {"api_key": "sk-1", "apiKey": "sk-2", "api_key_env": "MY_KEY"},
            "env": {"OPENAI_API_KEY": "sk-3", "X-Api-Key": "sk-4", "password": "pw"},
            "auth": {"token": "t", "max_tokens": 5, "keyword": "paris", "author": "me"},
            "empty_secret": "",
        }
    )
    assert shown == {
        "judge": {"api_key": "***", "apiKey": "***", "api_key_env": "MY_KEY"},
        "env": {"OPENAI_API_KEY": "***", "X-Api-Key": "***", "password": "***"},
        "auth": {"token": "***", "max_tokens": 5, "keyword": "***", "author": "***"},
        "empty_secret": "",
    }


@pytest.mark.parametrize(
    ("given", "shown"),
    [
        ("item failed: key=abc123 at host", "item failed: key=*** at host"),
        ("Google said: AIzaSyA1234567890abcdefghijklmnopq bad", "Google said: *** bad"),
        ("sk-ant-api03-abcdefgh and pk-lf-12345678", "*** and ***"),
        ("jwt eyJhbGciOiJIUzI1.eyJzdWIiOiIxMjM0.c2lnbmF0dXJl end", "jwt *** end"),
        (
            "GET https://h/v1?x-goog-api-key=k&auth=a&client_secret=c&signature=s&code=c&q=1",
            "GET https://h/v1?x-goog-api-key=***&auth=***&client_secret=***&signature=***&code=***&q=1",
        ),
        ('{"api_token": "t0k", "max_tokens": 5}', '{"api_token": "***", "max_tokens": 5}'),
        ("{'openai_api_key': 'abc'}", "{'openai_api_key': '***'}"),
        (r'{"args": "{\"token\": \"t0k\"}"}', r'{"args": "{\"token\": \"***\"}"}'),
        ("a basic arithmetic question", "a basic arithmetic question"),
        (
            "keyboard: qwerty, monkey=banana, tokens: 1234",
            "keyboard: qwerty, monkey=banana, tokens: 1234",
        ),
        ("used 1200 total_tokens (max_tokens=4096)", "used 1200 total_tokens (max_tokens=4096)"),
    ],
)
def test_shapes_and_named_values_in_text_are_hidden_and_words_and_counts_are_not(given, shown):
    assert redact(given) == shown


def test_only_strings_are_hidden_under_secret_names_so_usage_counts_stay_numbers():
    usage = {
        "token_usage": {"prompt_tokens": 12, "total_tokens": 20, "note": "n"},
        "tokens": 20,
        "max_tokens": 100,
        "X-Goog-Api-Key": "g",
        "headers": {"Cookie": "c", "Set-Cookie": "c", "Authorization": "a", "Signature": "s"},
        "keyboard": "qwerty",
        "monkey": "banana",
    }
    assert redact(usage) == {
        "token_usage": {"prompt_tokens": 12, "total_tokens": 20, "note": "***"},
        "tokens": 20,
        "max_tokens": 100,
        "X-Goog-Api-Key": "***",
        "headers": {
            "Cookie": "***",
            "Set-Cookie": "***",
            "Authorization": "***",
            "Signature": "***",
        },
        "keyboard": "qwerty",
        "monkey": "banana",
    }


def test_the_values_of_secret_environment_variables_are_read_from_the_environment_given():
    environ = {
        "OPENAI_API_KEY": "k-live-123456",
        "MY_DB_PASSWORD": "hunter2hunter2",
        "GITHUB_TOKEN": "gh-abcdefgh",
        "SHORT_TOKEN": "1",
        "HOME": "/home/someone-long",
        "MAX_TOKENS": "40964096",
        "TOKENIZERS_PARALLELISM": "false-ish-long",
        "PWD": "/work/project",
        "SSH_AUTH_SOCK": "/tmp/ssh-XYZ/agent.123",
        "XAUTHORITY": "~/.Xauthority",
    }
    found = environment_secrets(environ)
    assert found == ("hunter2hunter2", "k-live-123456", "gh-abcdefgh")
    text = "connect with k-live-123456 as /home/someone-long, pw hunter2hunter2"
    assert redact(text, secrets=found) == "connect with *** as /home/someone-long, pw ***"


def test_a_json_text_stays_valid_json_when_secrets_inside_it_are_hidden():
    body = json.dumps(
        {
            "reply": 'call with token=abc1\\" then https://h/?key=ab\\"c and sk-abcdefgh12',
            "args": json.dumps({"api_key": "v1v1", "n": 1, "token": 'a\\"b'}),
        }
    )
    hidden = redact(body)
    assert "abc1" not in hidden and "sk-abcdefgh12" not in hidden and "v1v1" not in hidden
    assert json.loads(hidden)["reply"].startswith("call with token=***")
    assert json.loads(json.loads(hidden)["args"])["api_key"] == "***"


@pytest.mark.django_db(transaction=True)
def test_the_config_endpoint_shows_no_password_key_or_token(api_project, api):  # noqa: F811
    api_project.write("cobalt.toml", CONFIG)
    set_active_config(load_config(api_project.path))
    response = api.get("/api/config/")
    assert response.status_code == 200
    text = response.content.decode()
    assert [s for s in SECRETS if s in text] == []
    config = response.json()["config"]
    assert config["broker_url"] == "redis://:***@redis.internal:6379/0"
    assert config["database_url"] == "postgres://cobalt:***@db.internal:5432/cobalt"
    assert config["judge"]["base_url"] == (
        "https://judge:***@llm.internal/v1?api-key=***&deployment=gpt"
    )
    assert config["env"] == {
        "LANGFUSE_HOST": "https://pk-lf-1:***@langfuse.internal",
        "LANGFUSE_SECRET_KEY": "***",
    }
    assert config["langfuse"] == {
        "host": "https://lf-user:***@langfuse.internal",
        "secret_key": "***",
    }
    assert config["webhooks"] == [{"url": "https://hooks.slack.com/…", "secret": "***"}]


JUDGED = """
from cobalt import Dataset, Evaluator, experiment

experiment(
    "judged",
    Dataset(items=[{"id": "a", "input": "2+2"}]),
    lambda ctx: "4",
    evaluators=[Evaluator(name="judge", prompt="Rate {{output}}", base_url="BASE_URL")],
)
"""


@pytest.mark.django_db(transaction=True)
def test_a_run_stores_its_evaluators_without_the_password_of_their_base_url(
    api_project,  # noqa: F811
    fake_provider,
):
    base_url = fake_provider.openai_base_url.replace("http://", f"http://judge:{SECRETS[8]}@")
    api_project.write("experiments/judged.cobalt.py", JUDGED.replace("BASE_URL", base_url))
    config = active_config()
    experiments, errors, _ = launcher.load_experiments(config, name_filter="judged")
    assert not errors
    (run,) = launcher.execute(experiments, config)
    stored = Run.objects.get(id=run.id)
    assert stored.status == "completed" and stored.summary["scores"]["judge"]["count"] == 1
    assert SECRETS[8] not in json.dumps(stored.config)
    assert stored.config["evaluators"][0]["base_url"].startswith("http://judge:***@127.0.0.1")


@pytest.mark.parametrize("command", [["workers"], ["worker", "--processes", "1"], ["run"]])
def test_team_commands_name_an_unreachable_broker_without_its_password(
    project, cobalt_cli, command
):
    project.write(
        "experiments/one.cobalt.py",
        "from cobalt import Dataset, experiment\n"
        'experiment("one", Dataset(items=[{"input": 1}]), lambda ctx: 1)\n',
    )
    broker = f"redis://:{SECRETS[0]}@127.0.0.1:{closed_port()}/0"
    done = cobalt_cli(project, *command, env={"COBALT_BROKER_URL": broker}, timeout=60)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert f"cannot reach the broker at redis://:***@127.0.0.1:{broker.rsplit(':', 1)[1]}" in (
        output
    )
    assert SECRETS[0] not in output


def test_the_debug_error_page_shows_settings_without_url_passwords(settings):
    """With COBALT_DEBUG=1 Django's error page lists the settings; Django hides `*_KEY`,
    `PASSWORD`…, not a password inside `BROKER_URL`."""
    import sys

    from django.test import RequestFactory
    from django.views.debug import technical_500_response

    settings.DEBUG = True
    settings.BROKER_URL = f"redis://:{SECRETS[0]}@redis.internal:6379/0"
    settings.CELERY_BROKER_URL = settings.BROKER_URL
    request = RequestFactory().get("/runs/", HTTP_HOST="127.0.0.1")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        page = technical_500_response(request, *sys.exc_info()).content.decode()

    assert "redis://:***@redis.internal:6379/0" in page
    assert SECRETS[0] not in page


def test_an_experiment_file_that_fails_to_import_is_reported_without_its_secrets(tmp_path):
    from cobalt_app.discovery import load_file

    path = tmp_path / "bad.cobalt.py"
    path.write_text(
        'KEY = "sk-proj-abcdefghijklmnop1234"\n'
        'raise RuntimeError(f"login failed with {KEY}; token=supersecretvalue123")\n'
    )
    loaded = load_file(path, tmp_path)
    assert loaded.error == "RuntimeError: login failed with ***; token=***"
    assert 'raise RuntimeError(f"login failed with {KEY}; token=***")' in loaded.traceback
    assert "supersecret" not in loaded.traceback and "sk-proj" not in loaded.traceback


@pytest.mark.parametrize(
    "value",
    [
        {"api_key": 'abc"defghij'},  # a quote inside the secret
        {"password": "p4ss\\word99"},  # a backslash
        {"body": json.dumps({"api_key": 'abcd"efghij', "n": "x"})},  # JSON inside JSON
        {"body": json.dumps({"token": "ab\\cd\nef", "n": "x"})},
    ],
)
def test_a_named_secret_with_escapes_in_a_json_text_is_hidden_whole(value):
    from cobalt.redaction import redact_text

    text = json.dumps(value)
    hidden = redact_text(text)
    assert json.loads(hidden)  # still JSON
    for fragment in ("defghij", "word99", "cd", "ef"):
        assert fragment not in hidden.replace('"n"', ""), hidden
