"""CLI commands of the API area: `cobalt createuser`, `cobalt token create|delete`."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

token_app = typer.Typer(
    help="API tokens for scripts: send `Authorization: Token <key>`.", no_args_is_help=True
)


def createuser(
    username: Annotated[str, typer.Argument(help="Login name.")],
    email: Annotated[str, typer.Option(help="E-mail address (optional).")] = "",
    admin: Annotated[
        bool, typer.Option("--admin", help="Also allow the Django admin (/admin/).")
    ] = False,
    password_stdin: Annotated[
        bool,
        typer.Option("--password-stdin", help="Read the password from standard input."),
    ] = False,
) -> None:
    """Create a user who can log in to the dashboard and get an API token."""
    from cobalt_cli.console import fail, out
    from cobalt_cli.project import setup

    setup()
    from django.core.exceptions import ValidationError

    from cobalt_app import accounts

    username = username.strip()
    if not username:
        raise fail("the user name is empty")
    if accounts.user_exists(username):
        raise fail(
            f"user {username!r} already exists; `cobalt token create {username}` gives a token"
        )
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = typer.prompt("Password", hide_input=True, confirmation_prompt=True)
    try:
        accounts.user_create(username, password=password, email=email, admin=admin)
    except ValidationError as exc:
        raise fail("password refused: " + " ".join(exc.messages)) from None
    role = "admin user" if admin else "user"
    out().print(f" Created {role} [bold]{username}[/]. Scripts: `cobalt token create {username}`.")


@token_app.command("create")
def token_create(
    username: Annotated[str, typer.Argument(help="The user the token acts as.")],
    rotate: Annotated[
        bool, typer.Option("--rotate", help="Replace the user's existing token with a new one.")
    ] = False,
) -> None:
    """Print the user's API token (created if needed). Only the key goes to standard output."""
    from cobalt_cli.console import err, fail
    from cobalt_cli.project import setup

    setup()
    from cobalt_app import accounts

    token = accounts.token_get_or_create(username, rotate=rotate)
    if token is None:
        raise fail(f"no active user {username!r}; create one with `cobalt createuser {username}`")
    key, created = token
    state = "new" if created else "existing"
    err().print(f"[dim]{state} token for {username}; send it as `Authorization: Token <key>`[/]")
    typer.echo(key)


@token_app.command("delete")
def token_delete(username: Annotated[str, typer.Argument(help="Whose token to revoke.")]) -> None:
    """Revoke the user's API token."""
    from cobalt_cli.console import fail, out
    from cobalt_cli.project import setup

    setup()
    from cobalt_app import accounts

    if not accounts.token_delete(username):
        raise fail(f"{username!r} has no token")
    out().print(f" Revoked the token of {username}.")


def register(app: typer.Typer) -> None:
    """Add this area's commands to the `cobalt` app."""
    app.command("createuser")(createuser)
    app.add_typer(token_app, name="token")
