"""schemathesis against the generated OpenAPI schema, through the real WSGI application.

Team mode (every call needs authentication) with a real token: no 5xx, every status code,
content type, header and body as documented, and authentication is never ignored. Bounded:
a fixed number of generated cases per operation, plus documented calls on real runs.
"""

from __future__ import annotations

import pytest
import schemathesis
from django.core.wsgi import get_wsgi_application
from hypothesis import HealthCheck, settings
from schemathesis import checks

from tests.test_api import api_project, execute, token, user  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]

CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_headers_conformance,
    checks.response_schema_conformance,
    checks.ignored_auth,
]
EXAMPLES_PER_OPERATION = 30


@pytest.fixture
def team_api(api_project, settings, token):  # noqa: F811
    """Team mode, loopback host names (schemathesis' WSGI client sends `Host: localhost`)."""
    settings.TEAM_MODE = True
    settings.ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
    # schemathesis' WSGI client reads the body as sent: no gzip (GZipMiddleware answers it)
    return {"Authorization": f"Token {token}", "Accept-Encoding": "identity"}


@pytest.fixture
def api_schema(team_api):
    return schemathesis.openapi.from_wsgi(
        "/api/schema/?format=json", get_wsgi_application(), headers=team_api
    )


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(
    max_examples=EXAMPLES_PER_OPERATION,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_generated_requests_get_documented_answers(case, team_api):
    case.call_and_validate(headers=team_api, checks=CHECKS)


def test_documented_answers_on_real_runs(api_schema, team_api):
    run = execute("qa")
    other = execute("qa-v2")
    calls = [
        ("/api/runs/", "GET", {}, {"name": "qa", "page_size": 1}),
        ("/api/runs/{run_id}/", "GET", {"run_id": run.id}, {}),
        ("/api/runs/{run_id}/", "GET", {"run_id": "missing"}, {}),
        ("/api/runs/{run_id}/items/", "GET", {"run_id": run.id}, {"page_size": 3}),
        ("/api/runs/{run_id}/items/", "GET", {"run_id": run.id}, {"status": "error"}),
        ("/api/runs/{run_id}/cancel/", "POST", {"run_id": run.id}, {}),
        ("/api/compare/", "GET", {}, {"a": run.id, "b": other.id}),
        ("/api/trends/", "GET", {}, {"experiment": "qa"}),
        ("/api/experiments/", "GET", {}, {}),
        ("/api/config/", "GET", {}, {}),
    ]
    seen = []
    for path, method, path_parameters, query in calls:
        operation = api_schema[path][method]
        case = operation.Case(path_parameters=path_parameters, query=query)
        response = case.call_and_validate(headers=team_api, checks=CHECKS)
        seen.append(response.status_code)
    assert seen == [200, 200, 404, 200, 200, 409, 200, 200, 200, 200]

    start = api_schema["/api/runs/"]["POST"].Case(
        body={"file": "experiments/qa.cobalt.py"}, media_type="application/json"
    )
    assert start.call_and_validate(headers=team_api, checks=CHECKS).status_code == 202
