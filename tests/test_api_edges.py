"""The API's edges (issue 14, findings 10 and 11): the experiment listing never imports a file
from outside the project; unknown paths, odd query values and long URLs get documented JSON
answers. Through the real URL configuration and middleware (Django's test client, CSRF
checks on), and `cobalt serve` for what gunicorn answers itself.
"""

from __future__ import annotations

import httpx
import pytest
from django.test import Client

from cobalt_app.models import Run
from tests.conftest import start_server
from tests.test_api import api, api_project, execute, token, user  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db(transaction=True)

IMPORTED_MARKER = "imported-from-outside.txt"


def outside_experiment(tmp_path, project) -> None:
    """`experiments/escape.cobalt.py`, a symlink to a file outside the project that leaves a
    marker when it is imported."""
    outside = tmp_path / "outside.cobalt.py"
    marker = tmp_path / IMPORTED_MARKER
    outside.write_text(
        f"open({str(marker)!r}, 'w').write('imported')\n"
        "from cobalt import Dataset, experiment\n"
        "experiment('escape', Dataset(items=[{'input': 1}]), lambda ctx: 1)\n"
    )
    (project.path / "experiments" / "escape.cobalt.py").symlink_to(outside)


def test_the_experiment_listing_never_imports_a_file_from_outside_the_project(
    api_project,  # noqa: F811
    api,  # noqa: F811
    tmp_path,
):
    outside_experiment(tmp_path, api_project)

    response = api.get("/api/experiments/")

    assert response.status_code == 200
    files = {f["file"]: f for f in response.json()["files"]}
    escape = files["experiments/escape.cobalt.py"]
    assert escape["experiments"] == []
    assert "resolves outside the project folder" in escape["error"]
    assert escape["error"].endswith("; it was not imported")
    assert not (tmp_path / IMPORTED_MARKER).exists()
    assert [e["name"] for e in files["experiments/qa.cobalt.py"]["experiments"]] == ["qa"]


def test_cobalt_run_refuses_an_experiment_file_that_leads_outside_the_project(
    project, cobalt_cli, tmp_path
):
    project.write(
        "experiments/inside.cobalt.py",
        "from cobalt import Dataset, experiment\n"
        "experiment('inside', Dataset(items=[{'input': 1}]), lambda ctx: 1)\n",
    )
    outside_experiment(tmp_path, project)

    done = cobalt_cli(project, "run")

    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "experiments/escape.cobalt.py failed to import" in output
    assert "resolves outside the project folder" in output
    assert not (tmp_path / IMPORTED_MARKER).exists()
    assert len(project.results_files()) == 1  # the file inside still ran


@pytest.mark.parametrize("method", ["get", "post", "put", "delete"])
@pytest.mark.parametrize("path", ["/api/nope/", "/api/runs/abc/nope/", "/api/nope"])
def test_unknown_api_paths_are_json_404s_for_every_method(api_project, method, path):  # noqa: F811
    client = Client(HTTP_HOST="127.0.0.1", enforce_csrf_checks=True)

    response = getattr(client, method)(path)

    assert response.status_code == 404, response.content[:200]
    assert response["Content-Type"] == "application/json"
    assert response.json()["detail"].startswith(f"no API endpoint at {path}")


def test_an_endpoint_without_its_slash_redirects_a_get_and_names_the_path_otherwise(
    api_project,  # noqa: F811
):
    client = Client(HTTP_HOST="127.0.0.1", enforce_csrf_checks=True)

    redirected = client.get("/api/runs", {"page_size": "2"})
    assert redirected.status_code == 301
    assert redirected["Location"] == "/api/runs/?page_size=2"

    posted = client.post("/api/runs", {"file": "experiments/qa.cobalt.py"})
    assert posted.status_code == 404
    assert posted.json()["detail"] == (
        "no API endpoint at /api/runs (API paths end with a slash: /api/runs/); "
        "the endpoints are listed at /api/docs/"
    )
    assert Run.objects.count() == 0


def test_a_post_without_csrf_token_on_a_session_is_a_json_403(api_project, user):  # noqa: F811
    client = Client(HTTP_HOST="127.0.0.1", enforce_csrf_checks=True)
    client.force_login(user)

    response = client.post("/api/runs/", {"file": "experiments/qa.cobalt.py"})

    assert response.status_code == 403
    assert response["Content-Type"] == "application/json"
    assert "CSRF" in response.json()["detail"]
    assert Run.objects.count() == 0


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"page_size": "null"}, "page_size"),
        ({"page_size": ""}, "page_size"),
        ({"page_size": "0"}, "page_size"),
        ({"page_size": "-3"}, "page_size"),
        ({"page_size": "501"}, "page_size"),
        ({"tag": "night\x00ly"}, "tag"),
        ({"name": "qa\x00"}, "name"),
    ],
)
def test_bad_list_parameters_are_400s_naming_the_parameter(api_project, api, query, field):  # noqa: F811
    execute("qa")

    response = api.get("/api/runs/", query)

    assert response.status_code == 400, response.content[:300]
    assert list(response.json()) == [field]


def test_bad_item_list_parameters_are_400s_too(api_project, api):  # noqa: F811
    run = execute("qa")

    for query, field in (
        ({"page_size": "null"}, "page_size"),
        ({"evaluator": "x\x00"}, "evaluator"),
    ):
        response = api.get(f"/api/runs/{run.id}/items/", query)
        assert response.status_code == 400, response.content[:300]
        assert list(response.json()) == [field]


def test_the_schema_documents_page_bounds_and_that_text_may_not_hold_nul(api_project, api):  # noqa: F811
    schema = api.get("/api/schema/?format=json").json()
    parameters = {
        p["name"]: p["schema"] for p in schema["paths"]["/api/runs/"]["get"]["parameters"]
    }
    assert parameters["page_size"] | {"default": 50} == {
        "type": "integer",
        "minimum": 1,
        "maximum": 500,
        "default": 50,
    }
    assert parameters["page"] == {"type": "integer", "minimum": 1}
    assert parameters["tag"]["pattern"] == parameters["name"]["pattern"] == "^[^\\u0000]*$"
    start = schema["components"]["schemas"]["StartRunRequest"]["properties"]
    assert start["file"]["pattern"] == start["tags"]["items"]["pattern"] == "^[^\\u0000]*$"


def test_a_request_line_too_long_for_the_server_is_a_documented_414(api_project, api):  # noqa: F811
    schema = api.get("/api/schema/?format=json").json()
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            assert "414" in operation["responses"], f"{method.upper()} {path}"

    server, url = start_server(api_project)
    try:
        response = httpx.get(f"{url}/api/runs/", params={"name": "x" * 8000})
    finally:
        server.terminate()
        server.wait(timeout=10)
    assert response.status_code == 414
