"""The root `cobalt` group: a command is built only when it runs.

Typer turns every command's signature into Click parameters up front (type hints,
converters, defaults: about 1 ms per command), and `cobalt --help` or `cobalt history` paid
for all of them. This group builds the one command given; its help lists the commands from
their docstrings without building any.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, MutableMapping
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup
from typer.main import (
    get_command_from_info,
    get_command_name,
    get_group_from_info,
    solve_typer_info_defaults,
)
from typer.models import TyperInfo


def group_of(commands: typer.Typer) -> type[TyperGroup]:
    """A root group class (`typer.Typer(cls=...)`) whose subcommands are those registered on
    `commands`, built on first use."""
    return type("CommandsOnDemand", (CommandsOnDemand,), {"source": commands})


class CommandsOnDemand(TyperGroup):
    source: typer.Typer

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self.commands = OnDemand(self.source)

    def invoke(self, ctx: Any) -> Any:
        """Run the command given; a user's error (`CobaltError`) it raises ends it with its
        message and exit code, here, once for every command (`console.user_errors`)."""
        from cobalt_cli.console import user_errors

        with user_errors():
            return super().invoke(ctx)

    def list_commands(self, ctx: Any) -> list[str]:
        return list(self.commands)  # the names alone: `.items()` would build every command

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        """The command list of `--help`: each name with the first line of its docstring."""
        listed = [
            (name, summary) for name in self.commands if not (summary := self._summary(name)).hidden
        ]
        if not listed:
            return
        limit = formatter.width - 6 - max(len(name) for name, _ in listed)
        with formatter.section("Commands"):
            formatter.write_dl([(name, cmd.get_short_help_str(limit)) for name, cmd in listed])

    def _summary(self, name: str) -> Any:
        """The command if it was built, else one without parameters for its line in the help
        (cheap to make)."""
        if name in self.commands.built:
            return self.commands[name]
        info = self.commands.infos[name]
        if isinstance(info, TyperInfo):
            solved = solve_typer_info_defaults(info)
            return TyperCommand(name=name, help=solved.help, hidden=solved.hidden)
        help_text = inspect.cleandoc(info.help) if info.help else inspect.getdoc(info.callback)
        return TyperCommand(
            name=name, help=help_text, short_help=info.short_help, hidden=info.hidden
        )


class OnDemand(MutableMapping):
    """Command name → Click command, made from its Typer registration when first looked up."""

    def __init__(self, source: typer.Typer) -> None:
        self.source = source
        self.infos: dict[str, Any] = {
            **{_command_name(info): info for info in source.registered_commands},
            **{_group_name(info): info for info in source.registered_groups},
        }
        self.built: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self.built:
            self.built[name] = self._build(self.infos[name])
        return self.built[name]

    def __setitem__(self, name: str, command: Any) -> None:
        self.infos.setdefault(name, None)
        self.built[name] = command

    def __delitem__(self, name: str) -> None:
        del self.infos[name]
        self.built.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(self.infos)

    def __len__(self) -> int:
        return len(self.infos)

    def _build(self, info: Any) -> Any:
        settings = {
            "pretty_exceptions_short": self.source.pretty_exceptions_short,
            "rich_markup_mode": self.source.rich_markup_mode,
        }
        if isinstance(info, TyperInfo):
            return get_group_from_info(
                info, suggest_commands=self.source.suggest_commands, **settings
            )
        return get_command_from_info(info, **settings)


def _command_name(info: Any) -> str:
    return info.name or get_command_name(info.callback.__name__)


def _group_name(info: Any) -> str:
    return solve_typer_info_defaults(info).name or ""
