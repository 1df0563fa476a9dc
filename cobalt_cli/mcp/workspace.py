"""Workspace mode: one server for every Cobalt project below a monorepo's root.

Started in a folder with no `cobalt.toml` at or above it but projects below it, `cobalt mcp`
serves them all. Each project is served by its own `cobalt mcp` child process, started in
its folder on first use and driven through the official MCP client: it keeps its own
database, configuration, confinement and module reloading, exactly as when the server is
started there. A call names its project (its folder relative to the root; needed only when
there are several); it is forwarded with its progress notifications, and cancelling it
cancels it in the child. When the workspace server stops, the children's stdin closes: they
cancel and finalise their runs as any `cobalt mcp` does.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.types import CallToolResult

from cobalt.config import CONFIG_FILENAMES, RAN_HERE
from cobalt_cli.mcp.sdk import (
    Context,
    ResourceError,
    ToolError,
    is_error,
    structured_content,
    tool_result,
)

log = logging.getLogger("cobalt.mcp")

SKIPPED_DIRS = {"node_modules", "site-packages", "dist-packages", "__pycache__", "__pypackages__"}
MAX_DEPTH = 6


def find_projects(root: Path) -> dict[str, Path]:
    """Project folders below `root` (relative name → folder); not below another project.
    A project holds a configuration file, or `.cobalt/` (Cobalt ran there)."""
    found: dict[str, Path] = {}

    def is_project(folder: Path) -> bool:
        return (folder / RAN_HERE).is_dir() or any(
            (folder / name).is_file() for name in CONFIG_FILENAMES
        )

    def walk(folder: Path, depth: int) -> None:
        if folder != root and is_project(folder):
            found[folder.relative_to(root).as_posix()] = folder
            return
        if depth >= MAX_DEPTH:
            return
        try:
            children = sorted(folder.iterdir())
        except OSError:
            return
        for child in children:
            hidden = child.name.startswith(".") or child.name in SKIPPED_DIRS
            if not hidden and child.is_dir() and not child.is_symlink():
                walk(child, depth + 1)

    walk(root, 0)
    return found


class Child:
    """The `cobalt mcp` serving one project of the workspace, and the client session to it."""

    def __init__(self, name: str, folder: Path) -> None:
        self.name = name
        self.folder = folder
        self.session: ClientSession | None = None
        self.failure: str | None = None
        self.ready = anyio.Event()
        self.closing = anyio.Event()
        self.started = False

    async def hold(self) -> None:
        """Start the child and keep its session open until the workspace closes."""
        params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "cobalt_cli", "mcp"],
            cwd=str(self.folder),
            env=dict(os.environ),
        )
        try:
            async with (
                stdio_client(params, errlog=sys.stderr) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                self.session = session
                self.ready.set()
                await self.closing.wait()
        except Exception as exc:
            log.exception("the server of project %s failed", self.name)
            self.failure = f"{type(exc).__name__}: {exc}"
        finally:
            self.session = None
            self.ready.set()


class Workspace:
    """The projects below `root`, each served by a child `cobalt mcp`."""

    def __init__(self, root: Path, projects: dict[str, Path]) -> None:
        self.root = root
        self.children = {name: Child(name, folder) for name, folder in projects.items()}
        self.group: anyio.abc.TaskGroup | None = None

    def choose(self, project: str | None) -> Child:
        names = ", ".join(self.children)
        if not project:
            if len(self.children) == 1:
                return next(iter(self.children.values()))
            raise ToolError(f"this workspace holds several projects; name one as project: {names}")
        wanted = Path(project.strip()).as_posix().removeprefix("./").rstrip("/")
        if wanted not in self.children:
            raise ToolError(f"no project {project!r} in this workspace; its projects: {names}")
        return self.children[wanted]

    async def session(self, child: Child) -> ClientSession:
        if not child.started:
            child.started = True
            assert self.group is not None, "the workspace serves from its lifespan"
            self.group.start_soon(child.hold)
        await child.ready.wait()
        if child.session is None:
            raise ToolError(f"the server of project {child.name} is not running: {child.failure}")
        return child.session

    @asynccontextmanager
    async def lifespan(self, server: Any) -> AsyncIterator[Workspace]:
        """The children live as long as the server's lifespan."""
        async with anyio.create_task_group() as group:
            self.group = group
            try:
                yield self
            finally:
                for child in self.children.values():
                    child.closing.set()
                    child.ready.set()

    async def call(
        self, ctx: Context, project: str | None, tool: str, arguments: dict[str, Any]
    ) -> CallToolResult:
        """A tool call forwarded to the project's server, with its progress."""
        child = self.choose(project)
        session = await self.session(child)

        async def progress(value: float, total: float | None, message: str | None) -> None:
            await ctx.report_progress(value, total, message)

        given = {key: value for key, value in arguments.items() if value is not None}
        result = await session.call_tool(tool, given, progress_callback=progress)
        if is_error(result):
            text = "\n".join(block.text for block in result.content if block.type == "text")
            raise ToolError(f"{child.name}: {text.removeprefix(f'Error executing tool {tool}: ')}")
        structured = {**(structured_content(result) or {}), "project": child.name}
        return tool_result(result.content, structured)

    async def resource(self, uri: str) -> str:
        """A resource of every project, by project."""
        projects: dict[str, Any] = {}
        for name, child in self.children.items():
            try:
                read = await (await self.session(child)).read_resource(uri)
                projects[name] = json.loads(read.contents[0].text)
            except Exception as exc:
                raise ResourceError(f"{uri} of project {name}: {exc}") from exc
        return json.dumps({"root": str(self.root), "projects": projects}, indent=1, default=str)
