"""Dashboard users and their API tokens (`cobalt createuser`, `cobalt token`)."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from rest_framework.authtoken.models import Token


def user_exists(username: str) -> bool:
    return get_user_model().objects.filter(username=username).exists()


def user_create(username: str, *, password: str, email: str = "", admin: bool = False) -> None:
    """A user who can log in; `admin` also opens the Django admin. Raises Django's
    `ValidationError` when the password validators refuse the password."""
    user = get_user_model()(username=username, email=email, is_staff=admin, is_superuser=admin)
    validate_password(password, user)
    user.set_password(password)
    user.save()


def token_get_or_create(username: str, *, rotate: bool = False) -> tuple[str, bool] | None:
    """(key, whether it is new) of the active user's API token, a new one if `rotate`;
    None without such a user."""
    user = get_user_model().objects.filter(username=username, is_active=True).first()
    if user is None:
        return None
    if rotate:
        Token.objects.filter(user=user).delete()
    token, created = Token.objects.get_or_create(user=user)
    return token.key, created


def token_delete(username: str) -> bool:
    """Revoke the user's API token; False when there was none."""
    deleted, _ = Token.objects.filter(user__username=username).delete()
    return bool(deleted)
