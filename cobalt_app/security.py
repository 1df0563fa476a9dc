"""Who may see and do what: loopback reads, login in team mode, exposure checks for `serve`.

Rules (DESIGN.md §10):

* Anonymous *reads* (pages and GET on the API) are allowed only in embedded mode, while the
  server listens on a loopback address, the allowed hosts are loopback names, and the request
  itself comes from loopback. Everything else needs a login (session) or an API token.
* Every write (start, cancel, delete) needs authentication, always.
* `cobalt serve --host 0.0.0.0` refuses to start unless allowed hosts are set explicitly and
  someone can log in.

`cobalt serve` calls `check_serve_exposure(host)` before serving: it raises
`ServeExposureError` (whose message says what to set) or records the host in
`COBALT_SERVE_HOST`, which the app reads on every request.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.utils.http import urlencode
from django.views.debug import SafeExceptionReporterFilter

from cobalt.errors import CobaltError
from cobalt.redaction import redact

SERVE_HOST_ENV = "COBALT_SERVE_HOST"
DEFAULT_SERVE_HOST = "127.0.0.1"
LOOPBACK_NAMES = {"localhost", "localhost.", "ip6-localhost"}
PROXY_HEADERS = ("HTTP_X_FORWARDED_FOR", "HTTP_FORWARDED", "HTTP_X_REAL_IP")

# Paths anonymous visitors may reach when a login is required: the login pages themselves,
# static files, the admin (it has its own login) and the JSON API (it answers 401 itself).
# The OTLP receiver (/v1/traces) answers 401 itself too.
LOGIN_EXEMPT_PREFIXES = (
    "/static/",
    "/admin/",
    "/accounts/",
    "/login",
    "/logout",
    "/favicon",
    "/v1/",
)
API_PREFIX = "/api/"
API_PAGES = ("/api/docs/",)


class ServeExposureError(CobaltError):
    """Serving on this address would expose Cobalt without the protections it needs."""


def is_loopback(host: str) -> bool:
    """`127.0.0.1`, `::1`, `[::1]`, `localhost` — a name or address only this machine reaches."""
    host = (host or "").strip().lower()
    if host.startswith("[") and "]" in host:
        host = host[1 : host.index("]")]
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def mark_serving(host: str) -> None:
    """Record the address `cobalt serve` listens on (inherited by server worker processes)."""
    os.environ[SERVE_HOST_ENV] = host


def serve_host() -> str:
    """The address the server listens on; unset means the loopback default of `cobalt serve`."""
    return os.environ.get(SERVE_HOST_ENV) or DEFAULT_SERVE_HOST


def team_mode() -> bool:
    return bool(getattr(settings, "TEAM_MODE", False))


def serving_on_loopback() -> bool:
    """Listening on loopback, and the allowed hosts are loopback names only.

    A public name in the allowed hosts means a reverse proxy may forward the network to a
    loopback listener, so it counts as exposed. (`testserver` is the name Django's test
    runner appends; no one reaches it over a network.)
    """
    return is_loopback(serve_host()) and all(is_loopback(h) for h in allowed_hosts())


def allowed_hosts() -> list[str]:
    """`ALLOWED_HOSTS` without the name Django's test runner appends."""
    return [h.lstrip(".") for h in settings.ALLOWED_HOSTS if h != "testserver"]


def anonymous_reads_allowed(request: HttpRequest | None = None) -> bool:
    """Embedded mode on loopback, asked from loopback and not through a proxy."""
    if team_mode() or not serving_on_loopback():
        return False
    if request is None:
        return True
    if any(header in request.META for header in PROXY_HEADERS):
        return False
    return is_loopback(request.META.get("REMOTE_ADDR", ""))


def login_required_for(request: HttpRequest) -> bool:
    """Does this request need a logged-in user (or a token, for the API) to be read?"""
    return not anonymous_reads_allowed(request)


def is_page_path(path: str) -> bool:
    """A page the login middleware guards (not the API, static files, admin or login)."""
    if path.startswith(API_PREFIX):
        return path.startswith(API_PAGES)
    login_url = str(settings.LOGIN_URL)
    return not (path.startswith(LOGIN_EXEMPT_PREFIXES) or path.startswith(login_url))


class LoginRequiredMiddleware:
    """Redirects anonymous page requests to the login page when a login is required.

    Place after `AuthenticationMiddleware`. The API answers anonymous requests itself (401).
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        user = getattr(request, "user", None)
        anonymous = user is None or not user.is_authenticated
        if anonymous and is_page_path(request.path) and login_required_for(request):
            query = urlencode({"next": request.get_full_path()})
            return redirect(f"{settings.LOGIN_URL}?{query}")
        return self.get_response(request)


def login_capable_users() -> int:
    """Active users who can authenticate: a usable password or an API token."""
    from django.contrib.auth import get_user_model
    from django.db.models import Q

    usable_password = ~Q(password="") & ~Q(password__startswith="!")
    users = get_user_model().objects.filter(is_active=True)
    return users.filter(usable_password | Q(auth_token__isnull=False)).distinct().count()


def exposure_problems(host: str) -> list[str]:
    """What is missing to serve safely on `host` (empty when fine). Needs Django set up."""
    if is_loopback(host):
        return []
    problems: list[str] = []
    hosts = allowed_hosts()
    if "*" in hosts:
        problems.append(
            "COBALT_ALLOWED_HOSTS contains '*', which accepts any Host header (DNS rebinding); "
            "list the names clients use, e.g. COBALT_ALLOWED_HOSTS=cobalt.example.com"
        )
    elif all(is_loopback(h) for h in hosts):
        problems.append(
            "no allowed hosts are set for a network address: set COBALT_ALLOWED_HOSTS to the "
            "names clients use, e.g. COBALT_ALLOWED_HOSTS=cobalt.example.com,10.0.0.5"
        )
    if login_capable_users() == 0:
        problems.append(
            "no one can log in: create a user with `cobalt createuser NAME` "
            "(scripts then get a token with `cobalt token create NAME`)"
        )
    return problems


def check_serve_exposure(host: str) -> None:
    """Refuse to serve on a non-loopback address without allowed hosts and a login.

    On success, records the host (`mark_serving`) so the app knows whether anonymous reads
    are allowed. Raises `ServeExposureError` with a message saying what to set.
    """
    problems = exposure_problems(host)
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise ServeExposureError(
            f"refusing to serve on {host}, which other machines can reach:\n{lines}\n"
            "Or serve on 127.0.0.1 (the default) for this machine only."
        )
    mark_serving(host)


class RedactingExceptionReporterFilter(SafeExceptionReporterFilter):
    """Django's error reports (the debug page with COBALT_DEBUG=1, error e-mails) show the
    settings: beyond the names Django hides, every URL's password and secret query values
    (`BROKER_URL = redis://:***@…`) go through `redact` like any other door."""

    def cleanse_setting(self, key: Any, value: Any) -> Any:
        cleansed = super().cleanse_setting(key, value)
        return redact(cleansed) if isinstance(cleansed, str) else cleansed
