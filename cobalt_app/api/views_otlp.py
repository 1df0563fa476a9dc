"""`POST /v1/traces`: the OTLP/HTTP receiver on `cobalt serve` (see `otlp`).

Who may send: anyone from loopback while the server runs embedded on loopback (as for reads,
`security.anonymous_reads_allowed`); otherwise an API token (`Authorization: Token <key>`, or
`Bearer <key>`, the header OpenTelemetry exporters are given with `OTEL_EXPORTER_OTLP_HEADERS`),
else 401. Not a login session: exporters have none, and a browser's session must not write
spans without a CSRF token.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from rest_framework.authentication import TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed

from cobalt_app import otlp
from cobalt_app.api.permissions import HOW_TO_AUTHENTICATE
from cobalt_app.security import anonymous_reads_allowed


def _authorised(request: HttpRequest) -> bool:
    if anonymous_reads_allowed(request):
        return True
    scheme, _, key = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    if scheme.lower() not in ("token", "bearer") or not key.strip():
        return False
    try:
        TokenAuthentication().authenticate_credentials(key.strip())
    except AuthenticationFailed:
        return False
    return True


def _body(request: HttpRequest) -> bytes:
    """The body, also when sent chunked (Node.js's exporter does): Django reads only
    Content-Length bytes, the server (gunicorn) ends a chunked body's stream itself."""
    if not request.META.get("CONTENT_LENGTH") and request.META.get("wsgi.input_terminated"):
        return request.META["wsgi.input"].read(otlp.MAX_BYTES + 1)
    return request.read(otlp.MAX_BYTES + 1)


@csrf_exempt
@require_POST
def traces(request: HttpRequest) -> HttpResponse:
    if not _authorised(request):
        response = HttpResponse(HOW_TO_AUTHENTICATE, status=401, content_type="text/plain")
        response["WWW-Authenticate"] = "Token"
        return response
    declared = request.META.get("CONTENT_LENGTH") or "0"
    if declared.isdigit() and int(declared) > otlp.MAX_BYTES:
        return HttpResponse(
            f"the request body is over {otlp.MAX_BYTES} bytes; export smaller batches",
            status=413,
            content_type="text/plain",
        )
    body = _body(request)
    if len(body) > otlp.MAX_BYTES:
        return HttpResponse(
            f"the request body is over {otlp.MAX_BYTES} bytes; export smaller batches",
            status=413,
            content_type="text/plain",
        )
    answer = otlp.answer(
        body,
        request.META.get("CONTENT_TYPE", ""),
        request.META.get("HTTP_CONTENT_ENCODING", ""),
    )
    response = HttpResponse(answer.body, status=answer.status, content_type=answer.content_type)
    for name, value in answer.headers.items():
        response[name] = value
    return response
