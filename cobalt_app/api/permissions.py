"""Who may call the API: see `cobalt_app.security` for the rules."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rest_framework.permissions import SAFE_METHODS, BasePermission

if TYPE_CHECKING:  # rest_framework.views imports the permission classes at import time
    from rest_framework.request import Request
    from rest_framework.views import APIView

from cobalt_app.security import anonymous_reads_allowed

HOW_TO_AUTHENTICATE = (
    "authentication required: send `Authorization: Token <key>` "
    "(create one with `cobalt token create USER`) or log in"
)


class CobaltAccess(BasePermission):
    """Logged-in users and token holders may do anything; anonymous callers may only read,
    and only from loopback while the server runs embedded on loopback."""

    message = HOW_TO_AUTHENTICATE

    def has_permission(self, request: Request, view: APIView) -> bool:
        if request.user and request.user.is_authenticated:
            return True
        return request.method in SAFE_METHODS and anonymous_reads_allowed(request)
