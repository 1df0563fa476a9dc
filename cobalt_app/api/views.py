"""REST API views: parse the request, call a selector or service, respond."""

from __future__ import annotations

import re
from typing import Any

from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponsePermanentRedirect, JsonResponse
from django.urls import resolve
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.utils import OpenApiResponse, extend_schema
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework import exceptions, generics, status
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.reverse import reverse
from rest_framework.views import APIView
from rest_framework.views import exception_handler as drf_exception_handler

from cobalt.config import active_config
from cobalt.errors import CobaltError
from cobalt.redaction import redact
from cobalt_app import calibration, label_datasets, labels, launcher
from cobalt_app.api import jobs, serializers
from cobalt_app.api import selectors as api_selectors
from cobalt_app.api.filters import ItemFilter, RunFilter
from cobalt_app.api.item_address import MOVED, PARAMETERS, located
from cobalt_app.api.permissions import HOW_TO_AUTHENTICATE
from cobalt_app.compare_strip import verdict_strip
from cobalt_app.liveness import settle, settled
from cobalt_app.models import ItemResult, Run
from cobalt_app.results import iter_item_entries, run_header
from cobalt_app.selectors import compare_runs, run_get, run_items, run_list

# gunicorn's default `limit_request_line`, kept by `cobalt serve` and the compose `web` service.
REQUEST_LINE_MAX = 4094

ERRORS = {
    400: OpenApiResponse(description="Invalid input: field → messages."),
    401: OpenApiResponse(serializers.ErrorSerializer, description=HOW_TO_AUTHENTICATE),
    403: OpenApiResponse(serializers.ErrorSerializer, description="Not allowed."),
    404: OpenApiResponse(serializers.ErrorSerializer, description="No such run or page."),
}


def errors(*codes: int) -> dict[int, OpenApiResponse]:
    return {code: ERRORS[code] for code in (401, 403, *codes)}


NO_NUL = "^[^\\u0000]*$"  # Django refuses text with a NUL character (a 400, never stored)


def document_server_limits(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """A schema hook (SPECTACULAR_SETTINGS) documenting what every operation refuses before
    its view runs: a 414 for a request line the server (gunicorn) will not read, and text
    with a NUL character in a query parameter or a request body (a 400)."""
    too_long = {
        "description": f"The request line (method, path and query) is longer than "
        f"{REQUEST_LINE_MAX} bytes: the server (gunicorn) refuses it before the API reads it."
    }
    bodies: set[str] = set()
    for operations in result.get("paths", {}).values():
        for operation in operations.values():
            operation.setdefault("responses", {})["414"] = too_long
            for parameter in operation.get("parameters", []):
                _refuse_nul(parameter.get("schema", {}))
            for content in operation.get("requestBody", {}).get("content", {}).values():
                bodies.add(content.get("schema", {}).get("$ref", "").rsplit("/", 1)[-1])
    components = result.get("components", {}).get("schemas", {})
    for name in bodies & set(components):
        for field in components[name].get("properties", {}).values():
            _refuse_nul(field)
            _refuse_nul(field.get("items", {}))
    return result


def _refuse_nul(schema: dict[str, Any]) -> None:
    if schema.get("type") == "string" and not {"enum", "format", "pattern"} & set(schema):
        schema["pattern"] = NO_NUL


class CobaltProblem(exceptions.APIException):
    """A user's error (`CobaltError`) as the API answers it: `{"detail": message}` with the
    error's status (404 not found, 409 conflict, 500 a misconfigured project, ...)."""

    default_code = "error"

    def __init__(self, exc: CobaltError) -> None:
        super().__init__(str(exc))
        self.status_code = exc.http_status


# The API's name of a field a `LabelError` message starts with.
LABEL_FIELDS = {"expected_output": "expectedOutput"}


def problem_field(exc: CobaltError) -> str:
    """The request field a 400 is about: the error's own, else (a refused label) the field its
    message starts with."""
    if exc.field:
        return exc.field
    named = re.match(r"[A-Za-z_]+", str(exc)) if isinstance(exc, labels.LabelError) else None
    field = named.group(0) if named else ""
    return LABEL_FIELDS.get(field, field) or "non_field_errors"


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's handler, after the API's one catch of the user's errors: a `CobaltError` answers
    its `http_status` with its message (a 400 under the field it is about). Anything else is
    DRF's, or a bug: a 500 with its traceback in the log."""
    if isinstance(exc, CobaltError):
        if exc.http_status == status.HTTP_400_BAD_REQUEST:
            exc = exceptions.ValidationError({problem_field(exc): [str(exc)]})
        else:
            exc = CobaltProblem(exc)
    return drf_exception_handler(exc, context)


class ExplainAuthentication:
    """An anonymous caller who may not proceed is told how to authenticate (401)."""

    def permission_denied(self, request: Request, message: str | None = None, code=None):
        if request.authenticators and not request.successful_authenticator:
            raise exceptions.NotAuthenticated(HOW_TO_AUTHENTICATE)
        super().permission_denied(request, message=message, code=code)


class CobaltAPIView(ExplainAuthentication, APIView):
    pass


class SchemaView(ExplainAuthentication, SpectacularAPIView):
    pass


class DocsView(ExplainAuthentication, SpectacularSwaggerView):
    pass


NOT_FOUND = "api-not-found"  # the name of the catch-all route below /api/


@csrf_exempt  # it changes nothing: a POST gets this JSON 404, not the CSRF failure page
def endpoint_not_found(request: HttpRequest) -> HttpResponse:
    """Any other path under /api/, whatever the method. A GET of an endpoint without its
    trailing slash is redirected to it (as Django's APPEND_SLASH would)."""
    path = request.path
    hint = ""
    if not path.endswith("/") and resolve(f"{path}/").url_name != NOT_FOUND:
        if request.method in ("GET", "HEAD"):
            query = request.META.get("QUERY_STRING", "")
            return HttpResponsePermanentRedirect(f"{path}/" + (f"?{query}" if query else ""))
        hint = f" (API paths end with a slash: {path}/)"
    return JsonResponse(
        {"detail": f"no API endpoint at {path}{hint}; the endpoints are listed at /api/docs/"},
        status=404,
    )


class Pagination(PageNumberPagination):
    """`page_size` must be a whole number from 1 to 500: anything else is a 400, never a
    silent default."""

    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500

    def get_page_size(self, request: Request) -> int:
        given = request.query_params.get(self.page_size_query_param)
        if given is None:
            return self.page_size
        try:
            size = int(given)
        except ValueError:
            size = 0
        if not 1 <= size <= self.max_page_size:
            raise exceptions.ValidationError(
                {
                    self.page_size_query_param: [
                        f"must be a whole number from 1 to {self.max_page_size}, not {given!r}"
                    ]
                }
            )
        return size

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"] = {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": self.max_page_size,
                    "default": self.page_size,
                }
            elif parameter["name"] == self.page_query_param:
                parameter["schema"] = {"type": "integer", "minimum": 1}  # page 0 is a 404
        return parameters


class KnownCount:
    """A queryset whose row count is already known: every item row of a run is counted in
    `Run.total_items`, so paging through 100,000 items needs no COUNT(*)."""

    ordered = True

    def __init__(self, queryset: QuerySet, count: int) -> None:
        self.queryset = queryset
        self.total = count

    def count(self) -> int:
        return self.total

    def __getitem__(self, index: Any) -> Any:
        return self.queryset[index]


def run_detail(run: Run) -> dict[str, Any]:
    return {
        **run_header(run),
        "progress": {
            "totalItems": run.total_items,
            "finishedItems": run.finished_items,
            "startedAt": run.started_at,
            "finishedAt": run.finished_at,
        },
        "failure": run.failure,
        "labels": labels.label_summary(run),
        "calibration": calibration.calibration_json(run),
    }


class RunListView(CobaltAPIView, generics.ListAPIView):
    serializer_class = serializers.RunSerializer
    filterset_class = RunFilter
    pagination_class = Pagination

    def get_queryset(self) -> QuerySet[Run]:
        return run_list(limit=None)

    def paginate_queryset(self, queryset: QuerySet[Run]) -> list[Run]:
        return settle(super().paginate_queryset(queryset) or [])

    @extend_schema(
        summary="List runs, newest first",
        operation_id="runs_list",
        responses={200: serializers.RunSerializer(many=True), **errors(400, 404)},
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    @extend_schema(
        summary="Start a run of an experiment file",
        request=serializers.StartRunSerializer,
        responses={202: serializers.StartedRunSerializer, **errors(400)},
    )
    def post(self, request: Request) -> Response:
        config = active_config()
        form = serializers.StartRunSerializer(data=request.data, context={"config": config})
        form.is_valid(raise_exception=True)
        data = form.validated_data
        experiment = data["experiment"]
        budget = {k: data.get(k) for k in ("maxLlmCalls", "maxToolCalls", "maxTokens", "maxCost")}
        run_id = jobs.start_run(
            experiment,
            config,
            concurrency=data.get("concurrency"),
            tags=data["tags"],
            budget=budget,
        )
        run = run_get(run_id)
        body = {
            "id": run.id,
            "name": run.name,
            "file": run.file or launcher.relative_file(config, experiment),
            "status": run.status,
            "url": reverse("api-run-detail", args=[run.id], request=request),
        }
        return Response(
            serializers.StartedRunSerializer(body).data, status=status.HTTP_202_ACCEPTED
        )


class RunDetailView(CobaltAPIView):
    @extend_schema(
        summary="A run: the results-file header (config, summary) and progress",
        responses={200: serializers.RunDetailSerializer, **errors(404)},
    )
    def get(self, request: Request, run_id: str) -> Response:
        run = settled(run_get(run_id))
        return Response(serializers.RunDetailSerializer(run_detail(run)).data)


class RunCancelView(CobaltAPIView):
    @extend_schema(
        summary="Cancel a queued or running run",
        request=None,
        responses={
            200: serializers.RunDetailSerializer,
            202: OpenApiResponse(
                serializers.RunDetailSerializer, description="Cancelling; not finished yet."
            ),
            409: OpenApiResponse(serializers.ErrorSerializer, description="Already finished."),
            **errors(404),
        },
    )
    def post(self, request: Request, run_id: str) -> Response:
        run = jobs.cancel_run(run_id)  # already finished: a 409 (`RunAlreadyFinished`)
        code = status.HTTP_200_OK if run.is_finished else status.HTTP_202_ACCEPTED
        return Response(serializers.RunDetailSerializer(run_detail(run)).data, status=code)


class RunItemsView(CobaltAPIView, generics.ListAPIView):
    serializer_class = serializers.ItemSerializer
    filterset_class = ItemFilter
    pagination_class = Pagination

    def get_queryset(self) -> QuerySet[ItemResult]:
        if getattr(self, "swagger_fake_view", False):  # drf-spectacular inspecting the view
            return ItemResult.objects.none()
        self.run = run_get(self.kwargs["run_id"])
        return run_items(self.run)

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        queryset = self.filter_queryset(self.get_queryset())
        ids = queryset.values_list("id", flat=True)
        if not any(request.query_params.get(name) for name in ItemFilter.base_filters):
            ids = KnownCount(ids, self.run.total_items)
        page = self.paginate_queryset(ids)
        # Entries are already in the results-file shape ItemSerializer documents.
        entries = iter_item_entries(self.run, ids=page, with_id=True)
        return self.get_paginated_response(list(entries))

    @extend_schema(
        summary="A run's item results (paginated, filterable)",
        operation_id="runs_items_list",
        responses={200: serializers.ItemSerializer(many=True), **errors(400, 404)},
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)


class CompareView(CobaltAPIView):
    @extend_schema(
        summary="Compare two runs: per-evaluator deltas, items regressed and improved",
        parameters=[serializers.CompareQuerySerializer],
        responses={200: serializers.CompareSerializer, **errors(400, 404)},
    )
    def get(self, request: Request) -> Response:
        query = serializers.CompareQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        a = run_get(query.validated_data["a"])
        b = run_get(query.validated_data["b"])
        diff = compare_runs(
            a, b, top=query.validated_data["top"], alpha=query.validated_data["alpha"]
        )
        strip = verdict_strip(a, [(b, diff)])
        return Response(serializers.CompareSerializer({"strip": strip, **diff}).data)


class TrendsView(CobaltAPIView):
    @extend_schema(
        summary="Scores over time per experiment, from the stored run summaries",
        parameters=[serializers.TrendsQuerySerializer],
        responses={200: serializers.TrendsSerializer, **errors(400)},
    )
    def get(self, request: Request) -> Response:
        query = serializers.TrendsQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        series = api_selectors.trend_series(**query.validated_data)
        return Response(serializers.TrendsSerializer({"series": series}).data)


class ExperimentsView(CobaltAPIView):
    @extend_schema(
        summary="Experiment files under the test directory and what they register",
        responses={200: serializers.ExperimentsSerializer, **errors()},
    )
    def get(self, request: Request) -> Response:
        body = api_selectors.experiment_catalogue(active_config())
        return Response(serializers.ExperimentsSerializer(body).data)


class ConfigView(CobaltAPIView):
    @extend_schema(
        summary="The project's configuration, secrets redacted",
        responses={200: serializers.ConfigSerializer, **errors()},
    )
    def get(self, request: Request) -> Response:
        config = active_config()
        body = {
            "projectDir": str(config.project_dir),
            "configFile": str(config.path) if config.path else None,
            "sources": list(config.sources),
            "teamMode": config.team_mode,
            "config": redact(config.data),
        }
        return Response(serializers.ConfigSerializer(body).data)


# Human labels -------------------------------------------------------------------------------

CONFLICT = OpenApiResponse(
    serializers.ErrorSerializer,
    description="The run is still running, or the label changed since the version sent.",
)


def _list_labels(request: Request, run_id: str, item_id: int | None = None) -> Response:
    run = run_get(run_id)
    query = serializers.LabelQuerySerializer(data=request.query_params.dict())
    query.is_valid(raise_exception=True)
    rows = labels.label_list(run, item_id=item_id, **query.validated_data)
    body = {"count": len(rows), "labels": [row.as_json() for row in rows]}
    return Response(serializers.LabelListSerializer(body).data)


def _save_label(request: Request, run_id: str, item_id: int | None = None) -> Response:
    run = settled(run_get(run_id))
    form_class = serializers.LabelInputSerializer
    if item_id is not None:
        form_class = serializers.ItemLabelInputSerializer
    form = form_class(data=request.data)
    form.is_valid(raise_exception=True)
    data = form.validated_data
    item_id = data["item"] if item_id is None else item_id
    label = labels.label_save(
        run=run,
        item_id=item_id,
        evaluator=data["evaluator"],
        reviewer=request.user.get_username(),
        verdict=data.get("verdict"),
        score=data.get("score"),
        note=data.get("note", ""),
        expected_output=data.get("expectedOutput", labels.UNSET),
        version=data.get("version"),
    )
    row = labels.saved_row(run, item_id, label)
    code = status.HTTP_201_CREATED if label.version == 1 else status.HTTP_200_OK
    return Response(serializers.LabelSerializer(row.as_json()).data, status=code)


SAVED = {
    200: OpenApiResponse(serializers.LabelSerializer, description="Changed."),
    201: OpenApiResponse(serializers.LabelSerializer, description="Created."),
    409: CONFLICT,
}


class RunLabelsView(CobaltAPIView):
    @extend_schema(
        summary="People's labels of a run's items, in item order",
        operation_id="runs_labels_list",
        parameters=[serializers.LabelQuerySerializer],
        responses={200: serializers.LabelListSerializer, **errors(400, 404)},
    )
    def get(self, request: Request, run_id: str) -> Response:
        return _list_labels(request, run_id)

    @extend_schema(
        summary="Label an item of a finished run (the reviewer is you)",
        operation_id="runs_labels_create",
        request=serializers.LabelInputSerializer,
        responses={**SAVED, **errors(400, 404)},
    )
    def post(self, request: Request, run_id: str) -> Response:
        return _save_label(request, run_id)


class ItemLabelsView(CobaltAPIView):
    @extend_schema(
        summary="People's labels of one item of a run",
        operation_id="runs_items_labels_list",
        parameters=[serializers.LabelQuerySerializer, *PARAMETERS],
        responses={200: serializers.LabelListSerializer, **MOVED, **errors(400, 404)},
    )
    def get(self, request: Request, run_id: str, number: int) -> Response | HttpResponse:
        item_id, moved = located(request, run_get(run_id), number)
        return moved or _list_labels(request, run_id, item_id)

    @extend_schema(
        summary="Label this item of a finished run (the reviewer is you)",
        operation_id="runs_items_labels_create",
        parameters=PARAMETERS,
        request=serializers.ItemLabelInputSerializer,
        responses={**SAVED, **errors(400, 404)},
    )
    def post(self, request: Request, run_id: str, number: int) -> Response:
        item_id, _ = located(request, run_get(run_id), number)
        return _save_label(request, run_id, item_id)


class AddToDatasetView(CobaltAPIView):
    @extend_schema(
        summary="Append the item to a JSON Lines dataset of the project, as reviewed",
        description="The line is the item keyed by its item key, with your label's corrected "
        "expected output (else the item's own) and the review in `metadata`. The file must be "
        "a .jsonl file inside the project; it is created when missing and only appended to.",
        parameters=PARAMETERS,
        request=serializers.AddToDatasetSerializer,
        responses={
            201: serializers.AddedToDatasetSerializer,
            409: OpenApiResponse(
                serializers.ErrorSerializer,
                description="The file already has this item's id, or the run is still running.",
            ),
            **errors(400, 404),
        },
    )
    def post(self, request: Request, run_id: str, number: int) -> Response:
        run = run_get(run_id)
        item_id, _ = located(request, run, number)
        form = serializers.AddToDatasetSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        added = label_datasets.add_to_dataset(
            run=run,
            item_id=item_id,
            path=form.validated_data["file"],
            reviewer=request.user.get_username(),
            evaluator=form.validated_data.get("evaluator"),
        )
        return Response(
            serializers.AddedToDatasetSerializer(added).data, status=status.HTTP_201_CREATED
        )
