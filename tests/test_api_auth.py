"""Access control: every endpoint × {anonymous on loopback, anonymous in team mode, token,
wrong token, session}; CSRF, exposure rules, the login middleware, `cobalt serve` checks and
the `createuser` / `token` commands."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from rest_framework.test import APIClient

from cobalt_app import security
from cobalt_app.models import Run
from tests.test_api import api_project, execute, token, user  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "correct-horse-battery"
LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "[::1]"]

ENDPOINTS = [
    ("GET", "/api/runs/", 200),
    ("GET", "/api/runs/{run}/", 200),
    ("GET", "/api/runs/{run}/items/", 200),
    ("GET", "/api/compare/?a={run}&b={run}", 200),
    ("GET", "/api/trends/?experiment=qa", 200),
    ("GET", "/api/experiments/", 200),
    ("GET", "/api/config/", 200),
    ("GET", "/api/schema/?format=json", 200),
    ("POST", "/api/runs/", 202),
    ("POST", "/api/runs/{run}/cancel/", 409),  # the run has finished: allowed, but too late
]
KINDS = ["anonymous-loopback", "anonymous-team", "token", "wrong-token", "session"]


def expected_status(kind: str, method: str, allowed: int) -> int:
    if kind in ("token", "session"):
        return allowed
    if kind == "anonymous-loopback" and method == "GET":
        return allowed
    return 401


def client_for(kind: str, token_key: str, settings) -> APIClient:
    client = APIClient(HTTP_HOST="127.0.0.1")
    if kind == "anonymous-team":
        settings.TEAM_MODE = True
    elif kind == "token":
        client.credentials(HTTP_AUTHORIZATION=f"Token {token_key}")
    elif kind == "wrong-token":
        client.credentials(HTTP_AUTHORIZATION="Token " + "0" * 40)
    elif kind == "session":
        assert client.login(username="alice", password=PASSWORD)
    return client


@pytest.fixture
def loopback(settings, api_project):  # noqa: F811
    settings.ALLOWED_HOSTS = list(LOOPBACK_HOSTS)
    return api_project


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("method", "url", "allowed"), ENDPOINTS)
def test_access_matrix(loopback, token, settings, kind, method, url, allowed):  # noqa: F811
    run = execute("qa")
    client = client_for(kind, token, settings)
    path = url.format(run=run.id)
    if method == "GET":
        response = client.get(path)
    else:
        response = client.post(path, {"file": "experiments/qa.cobalt.py"}, format="json")
    want = expected_status(kind, method, allowed)
    assert response.status_code == want, (kind, method, path, response.content[:300])
    if want == 401:
        assert response["WWW-Authenticate"] == "Token"
        detail = response.json()["detail"]
        if kind == "wrong-token":
            assert detail == "Invalid token."
        else:
            assert "cobalt token create USER" in detail
    if method == "POST" and want == 401:
        assert Run.objects.count() == 1  # nothing was started


def test_a_session_post_needs_the_csrf_token(loopback, user):  # noqa: F811
    client = Client(HTTP_HOST="127.0.0.1", enforce_csrf_checks=True)
    assert client.login(username="alice", password=PASSWORD)
    body = {"file": "experiments/qa.cobalt.py"}
    refused = client.post("/api/runs/", body, content_type="application/json")
    assert refused.status_code == 403
    assert "CSRF" in refused.json()["detail"]
    client.get("/api/runs/")  # any page would do: it sets the csrftoken cookie on first use
    from django.middleware.csrf import _get_new_csrf_string

    csrf = _get_new_csrf_string()
    client.cookies["csrftoken"] = csrf
    accepted = client.post(
        "/api/runs/", body, content_type="application/json", HTTP_X_CSRFTOKEN=csrf
    )
    assert accepted.status_code == 202, accepted.content


@pytest.mark.parametrize(
    "exposure",
    ["served-on-all-interfaces", "public-allowed-host", "remote-client", "through-a-proxy"],
)
def test_anonymous_reads_need_login_once_anything_is_exposed(
    loopback, settings, monkeypatch, exposure
):
    extra = {}
    if exposure == "served-on-all-interfaces":
        monkeypatch.setenv("COBALT_SERVE_HOST", "0.0.0.0")
    elif exposure == "public-allowed-host":
        settings.ALLOWED_HOSTS = [*LOOPBACK_HOSTS, "cobalt.example.com"]
    elif exposure == "remote-client":
        extra["REMOTE_ADDR"] = "10.1.2.3"
    else:
        extra["HTTP_X_FORWARDED_FOR"] = "203.0.113.9"
    client = APIClient(HTTP_HOST="127.0.0.1")
    assert client.get("/api/runs/", **extra).status_code == 401
    assert client.get("/some/page/", **extra).status_code == 302
    monkeypatch.setenv("COBALT_SERVE_HOST", "::1")
    settings.ALLOWED_HOSTS = list(LOOPBACK_HOSTS)
    assert client.get("/api/runs/").status_code == 200


def test_team_mode_redirects_anonymous_pages_to_the_login_page(loopback, settings, user):  # noqa: F811
    settings.TEAM_MODE = True
    client = Client(HTTP_HOST="127.0.0.1")
    for path in ("/", "/runs/abc/?page=2", "/api/docs/"):
        response = client.get(path)
        assert response.status_code == 302, path
        assert response["Location"].startswith(f"{settings.LOGIN_URL}?next=")
    assert client.get("/").headers["Location"] == f"{settings.LOGIN_URL}?next=%2F"
    # The login page itself, static files and the JSON API are not redirected.
    assert client.get(settings.LOGIN_URL).status_code == 200
    assert client.get("/api/runs/").status_code == 401
    assert (
        client.get("/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui.css").status_code
        == 200
    )
    client.login(username="alice", password=PASSWORD)
    assert client.get("/api/docs/").status_code == 200
    assert client.get("/api/runs/").status_code == 200


def test_embedded_loopback_pages_need_no_login(loopback):
    client = Client(HTTP_HOST="127.0.0.1")
    assert client.get("/api/docs/").status_code == 200
    assert client.get("/no/such/page/").status_code == 404  # reached the URL resolver


def test_foreign_host_headers_are_refused(loopback, token):  # noqa: F811
    client = APIClient(HTTP_HOST="attacker.example")
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert client.get("/api/runs/").status_code == 400
    assert client.get("/api/config/").status_code == 400


# `cobalt serve` exposure checks ---------------------------------------------------------------


def test_serving_on_loopback_needs_nothing_and_is_recorded(loopback, monkeypatch):
    monkeypatch.delenv("COBALT_SERVE_HOST", raising=False)
    security.check_serve_exposure("127.0.0.1")
    assert security.serve_host() == "127.0.0.1"
    security.check_serve_exposure("localhost")
    assert security.serving_on_loopback()


def test_serving_on_a_network_address_refuses_without_allowed_hosts_and_users(loopback):
    with pytest.raises(security.ServeExposureError) as refused:
        security.check_serve_exposure("0.0.0.0")
    message = str(refused.value)
    assert "refusing to serve on 0.0.0.0" in message
    assert "set COBALT_ALLOWED_HOSTS" in message
    assert "cobalt createuser NAME" in message


def test_a_wildcard_allowed_host_is_refused(loopback, settings, user):  # noqa: F811
    settings.ALLOWED_HOSTS = ["*"]
    with pytest.raises(security.ServeExposureError, match="contains '\\*'"):
        security.check_serve_exposure("0.0.0.0")


def test_serving_on_a_network_address_with_hosts_and_a_user_is_allowed(
    loopback,
    settings,
    monkeypatch,
    user,  # noqa: F811
):
    monkeypatch.delenv("COBALT_SERVE_HOST", raising=False)
    settings.ALLOWED_HOSTS = ["cobalt.example.com"]
    with pytest.raises(security.ServeExposureError) as refused:
        user.set_unusable_password()
        user.save()
        security.check_serve_exposure("0.0.0.0")
    assert "COBALT_ALLOWED_HOSTS" not in str(refused.value)
    assert "no one can log in" in str(refused.value)
    user.set_password(PASSWORD)
    user.save()
    security.check_serve_exposure("0.0.0.0")
    assert security.serve_host() == "0.0.0.0"
    assert not security.serving_on_loopback()
    assert not security.anonymous_reads_allowed()


# `cobalt createuser` and `cobalt token` --------------------------------------------------------


def test_a_token_from_the_cli_opens_the_api(loopback, settings):
    from typer.testing import CliRunner

    from cobalt_cli.main import app

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    runner = CliRunner()
    created = runner.invoke(
        app, ["createuser", "erin", "--password-stdin"], input="s3cret-pass-1\n"
    )
    assert created.exit_code == 0, created.output
    issued = runner.invoke(app, ["token", "create", "erin"])
    assert issued.exit_code == 0, issued.output
    key = issued.stdout.strip().splitlines()[-1]
    settings.TEAM_MODE = True
    client = APIClient(HTTP_HOST="127.0.0.1")
    assert client.get("/api/runs/").status_code == 401
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert client.get("/api/runs/").status_code == 200
    assert runner.invoke(app, ["token", "delete", "erin"]).exit_code == 0
    assert client.get("/api/runs/").status_code == 401


def test_createuser_and_token_commands(project, cobalt_cli):
    created = cobalt_cli(
        project, "createuser", "carol", "--password-stdin", input="s3cret-pass-1\n"
    )
    assert created.returncode == 0, created.stderr
    assert "Created user carol" in created.stdout
    short = cobalt_cli(project, "createuser", "dave", "--password-stdin", input="abc\n")
    assert short.returncode == 2 and "password refused: This password is too short" in short.stderr

    first = cobalt_cli(project, "token", "create", "carol")
    assert first.returncode == 0, first.stderr
    key = first.stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{40}", key)
    rotated = cobalt_cli(project, "token", "create", "carol", "--rotate").stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{40}", rotated) and rotated != key
    missing = cobalt_cli(project, "token", "create", "nobody")
    assert missing.returncode == 2
    assert "no active user 'nobody'; create one with `cobalt createuser nobody`" in missing.stderr
