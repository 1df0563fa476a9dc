"""One error family, caught once per door: a user's error (`CobaltError`) is its message and
its exit code or status; anything else is a bug, shown as a traceback (exit 1, a 500, a tool
error naming the exception), never as a usage message."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from cobalt.config import ConfigError
from cobalt.errors import CobaltError, ConflictError, NotFoundError
from cobalt_cli.mcp.sdk import ToolError
from tests.conftest import cli_env

EXPERIMENT = """\
from cobalt import Dataset, Evaluator, experiment

experiment(
    "qa",
    Dataset.from_items([{"input": "q", "expected_output": "a"}]),
    lambda ctx: "a",
    evaluators=[Evaluator(name="exact", type="exact_match")],
)
"""

# `cobalt run` with one of Cobalt's own functions broken by a `KeyError`, as a bug would be
# (patched once Django is up, where the command would call it).
BROKEN_RUN = """\
import sys

import cobalt_cli.main as main

real_setup = main.setup


def setup(**kwargs):
    config = real_setup(**kwargs)
    from cobalt_app import launcher

    def broken(*args, **kw):
        return {{}}["{key}"]

    setattr(launcher, "{function}", broken)
    return config


main.setup = setup
sys.argv = ["cobalt", *sys.argv[1:]]
main.main()
"""


def test_every_user_facing_error_is_one_of_the_family():
    from cobalt.dataset import DatasetError
    from cobalt_app.api.jobs import RunAlreadyFinished, StartFailed
    from cobalt_app.ci_verdict import BaselineError
    from cobalt_app.discovery import FileRefused, PathNotFound
    from cobalt_app.exports import ExportError
    from cobalt_app.flaky import UnknownExperiment
    from cobalt_app.generate_spec import GenerateError
    from cobalt_app.label_datasets import DatasetRefused, ItemAlreadyInDataset
    from cobalt_app.label_files import LabelFileError
    from cobalt_app.labels import LabelConflict, LabelError, LabelNotFound
    from cobalt_app.launcher import ResumeError
    from cobalt_app.plugins import PluginError
    from cobalt_app.preflight import PreflightError
    from cobalt_app.providers import MissingApiKey, ProviderError
    from cobalt_app.rejudge import RejudgeError
    from cobalt_app.runs import TeamModeError
    from cobalt_app.security import ServeExposureError
    from cobalt_app.selectors import RunNotFound
    from cobalt_app.services import RunBusy
    from cobalt_app.worker_runtime import ExperimentUnavailable
    from cobalt_cli.commands_recordings import ReplayOptionError

    family = [
        ConfigError, DatasetError, ExportError, FileRefused, GenerateError, LabelError,
        LabelFileError, DatasetRefused, PluginError, PreflightError, ProviderError,
        MissingApiKey, RejudgeError, ReplayOptionError, ResumeError, ServeExposureError,
        StartFailed, TeamModeError, ExperimentUnavailable,
    ]  # fmt: skip
    not_found = [RunNotFound, UnknownExperiment, BaselineError, LabelNotFound, PathNotFound]
    conflicts = [RunBusy, RunAlreadyFinished, LabelConflict, ItemAlreadyInDataset]
    for error in family + not_found + conflicts:
        assert issubclass(error, CobaltError), error
    for error in not_found:
        assert issubclass(error, NotFoundError) and error.http_status == 404, error
    for error in conflicts:
        assert issubclass(error, ConflictError) and error.http_status == 409, error
    assert PluginError.http_status == 500  # the API's caller cannot fix the project's plugins
    assert LabelConflict.exit_code == 1 and RunBusy.exit_code == 2
    assert not issubclass(RunNotFound, LookupError)  # no `except LookupError` catches a bug


# The CLI -----------------------------------------------------------------------------------


@pytest.fixture
def runnable(project):
    project.write("experiments/qa.cobalt.py", EXPERIMENT)
    return project


@pytest.mark.parametrize("function", ["load_experiments", "execute"])
def test_a_bug_in_cobalt_run_is_a_traceback_and_exit_1_not_a_usage_error(runnable, function):
    script = BROKEN_RUN.format(key="cobalt-bug", function=function)
    done = subprocess.run(
        [sys.executable, "-c", script, "run"],
        cwd=runnable.path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "Traceback (most recent call last)" in done.stderr
    assert "KeyError: 'cobalt-bug'" in done.stderr
    assert not [line for line in done.stderr.splitlines() if line.startswith("error:")]


def test_a_users_error_is_its_message_and_exit_2_without_a_traceback(runnable, cobalt_cli):
    done = cobalt_cli(runnable, "run", "--resume", "nosuchrun")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "error: no run" in done.stderr and "nosuchrun" in done.stderr
    assert "Traceback" not in done.stderr
    done = cobalt_cli(runnable, "compare", "nosuchrun", "nosuchrun2")
    assert done.returncode == 2 and "error: no run" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_database_that_does_not_answer_is_a_message_not_a_traceback(project, cobalt_cli):
    # Nothing listens on the port: the command says so before any query (and hides the password).
    from tests.conftest import free_port

    url = f"postgresql://cobalt:s3cret-pw@127.0.0.1:{free_port()}/cobalt"
    done = cobalt_cli(project, "history", env={"COBALT_DATABASE_URL": url})
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "error: could not open the database: connection failed" in done.stderr
    assert "Traceback" not in done.stderr and "s3cret-pw" not in done.stderr


def test_the_error_classes_exit_code_is_the_commands(runnable):
    """The CLI's one catch turns any `CobaltError` into its message and its `exit_code`."""
    import typer
    from typer.testing import CliRunner

    from cobalt_cli import on_demand

    class Refused(ConflictError):
        exit_code = 1

    commands = typer.Typer()

    @commands.command()
    def refuse(kind: str) -> None:
        if kind == "usage":
            raise CobaltError("you asked for something wrong")
        if kind == "conflict":
            raise Refused("it changed meanwhile")
        raise KeyError(kind)

    app = typer.Typer(cls=on_demand.group_of(commands))
    app.callback()(lambda: None)
    runner = CliRunner()
    usage = runner.invoke(app, ["refuse", "usage"])
    assert usage.exit_code == 2 and "error: you asked for something wrong" in usage.output
    conflict = runner.invoke(app, ["refuse", "conflict"])
    assert conflict.exit_code == 1 and "error: it changed meanwhile" in conflict.output
    bug = runner.invoke(app, ["refuse", "bug"])
    assert bug.exit_code == 1 and isinstance(bug.exception, KeyError)


# The API -----------------------------------------------------------------------------------


@pytest.fixture
def api(db, settings) -> APIClient:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    user = get_user_model().objects.create_user("alice", password="correct-horse-battery")
    client = APIClient(HTTP_HOST="127.0.0.1", raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


def test_the_api_answers_a_users_error_with_its_status_and_a_bug_with_500(api, monkeypatch):
    missing = api.get("/api/runs/nosuchrun/")
    assert missing.status_code == 404 and "nosuchrun" in missing.json()["detail"]

    from cobalt_app.api import views

    def conflict(*args, **kwargs):
        raise ConflictError("the run is busy")

    monkeypatch.setattr(views, "run_get", conflict)
    busy = api.get("/api/runs/anyrun/")
    assert busy.status_code == 409 and busy.json() == {"detail": "the run is busy"}

    def refused(*args, **kwargs):
        error = CobaltError("file: not an experiment file")
        error.field = "file"
        raise error

    monkeypatch.setattr(views, "run_get", refused)
    bad = api.get("/api/runs/anyrun/")
    assert bad.status_code == 400 and bad.json() == {"file": ["file: not an experiment file"]}

    def bug(*args, **kwargs):
        return {}["cobalt-bug"]

    monkeypatch.setattr(views, "run_get", bug)
    broken = api.get("/api/runs/anyrun/")
    assert broken.status_code == 500
    assert "cobalt-bug" not in broken.content.decode()  # no usage message made of a bug


# MCP ---------------------------------------------------------------------------------------


def test_an_mcp_tool_says_a_users_error_and_names_a_bugs_exception(caplog):
    from cobalt_cli.mcp.errors import tool_errors

    caplog.set_level(logging.INFO, logger="cobalt.mcp")
    with pytest.raises(ToolError) as refused, tool_errors("cobalt_run"):
        raise ConfigError("cobalt.toml: concurrency must be at least 1")
    assert str(refused.value) == "configuration error: cobalt.toml: concurrency must be at least 1"
    assert [r.exc_info for r in caplog.records] == [None]  # logged without a traceback
    caplog.clear()
    with pytest.raises(ToolError) as bug, tool_errors("cobalt_run"):
        {}["cobalt-bug"]  # noqa: B018 - a bug
    assert str(bug.value) == "KeyError: 'cobalt-bug'"
    assert caplog.records[0].exc_info is not None  # logged with its traceback
