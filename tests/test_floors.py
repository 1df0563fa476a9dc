"""The house in floors (issue 40): public types and pure rules at the bottom, the engine in the
middle, the doors on top, and no import circle.

- Floor 0, `cobalt.*` (every module but the package itself): types and pure rules. No Django,
  nothing of `cobalt_app` or `cobalt_cli`, not even inside a function.
- Floor 1, `cobalt_app.*` except `cobalt_app.api` (and the migrations), with the Django
  project's glue `cobalt_project.*`: the engine, storage, reads, pages.
- Floor 2, the doors: `cobalt_cli.*` (the CLI, MCP, the script-mode `experiment()`, the
  notebook progress, the pytest plugin, `assert_scores`), `cobalt_app.api.*`, and the URL and
  WSGI wiring of `cobalt_project`.
- `cobalt/__init__.py` is the roof: it re-exports the public API (the doors included) lazily,
  and nothing inside Cobalt imports from it.

An import may go down or stay on its floor, never up; module-level and function-level imports
count alike. The import graph (the roof, which no one imports, and `if TYPE_CHECKING:` imports
left out) has no circle.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("cobalt", "cobalt_app", "cobalt_cli", "cobalt_project")
ROOF = "cobalt"
FORBIDDEN_BELOW_THE_DOORS = ("cobalt_app", "cobalt_cli", "django", "rest_framework", "celery")


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    line: int
    in_function: bool
    type_checking: bool

    def __str__(self) -> str:
        where = "in a function" if self.in_function else "at module level"
        return f"{self.source}:{self.line} imports {self.target} ({where})"


def floor(module: str) -> int | None:
    """0, 1 or 2; None for the roof."""
    if module == ROOF:
        return None
    top = module.split(".")[0]
    if top == "cobalt":
        return 0
    if top == "cobalt_cli" or module == "cobalt_app.api" or module.startswith("cobalt_app.api."):
        return 2
    if module in ("cobalt_project.urls", "cobalt_project.wsgi"):
        return 2
    return 1


@cache
def modules() -> dict[str, Path]:
    """Every module of Cobalt's packages, by dotted name (a package by its own name)."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            if "migrations" in parts:
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def resolve(name: str) -> str | None:
    """The Cobalt module an import names: itself, or the longest known prefix (`cobalt_app.models`
    for `cobalt_app.models.Run`); None outside Cobalt."""
    known = modules()
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in known:
            return candidate
        parts.pop()
    return None


def imports_of(module: str, path: Path) -> list[Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[Import] = []

    def add(name: str, node: ast.stmt, in_function: bool, type_checking: bool) -> None:
        target = resolve(name)
        if target is not None and target != module:
            found.append(Import(module, target, node.lineno, in_function, type_checking))

    def visit(nodes: Iterable[ast.AST], in_function: bool, type_checking: bool) -> None:
        for child in nodes:
            if isinstance(child, ast.Import):
                for alias in child.names:
                    add(alias.name, child, in_function, type_checking)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                for alias in child.names:
                    submodule = f"{base}.{alias.name}"  # `from cobalt_app import launcher`
                    name = submodule if submodule in modules() else base
                    add(name, child, in_function, type_checking)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                visit(child.body, in_function, True)
                visit(child.orelse, in_function, type_checking)
            else:
                inner = in_function or isinstance(
                    child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
                )
                visit(ast.iter_child_nodes(child), inner, type_checking)

    visit(tree.body, False, False)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


@cache
def all_imports() -> tuple[Import, ...]:
    """Every import statement's edges, once each (`from x import a, b` is one edge to `x`)."""
    found = {i for module, path in modules().items() for i in imports_of(module, path)}
    return tuple(sorted(found, key=lambda i: (i.source, i.line, i.target)))


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COBALT_", "DJANGO_"))}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


# (a) what importing the bottom floor loads ------------------------------------------------


def test_importing_cobalt_and_every_bottom_floor_module_loads_no_engine_cli_or_django():
    bottom = sorted(m for m in modules() if floor(m) == 0)
    assert "cobalt.experiments" in bottom and "cobalt.redaction" in bottom
    done = run_python(
        f"""
        import importlib, sys
        import cobalt
        for name in {bottom!r}:
            importlib.import_module(name)
        loaded = sorted(
            m for m in sys.modules if m.split(".")[0] in {FORBIDDEN_BELOW_THE_DOORS!r}
        )
        print("LOADED", loaded)
        """
    )
    assert done.returncode == 0, done.stderr
    assert "LOADED []" in done.stdout, done.stdout


def test_the_roof_hands_out_every_public_name_on_first_use():
    done = run_python(
        """
        import sys
        import cobalt
        assert "cobalt_cli.script" not in sys.modules
        assert set(cobalt.__all__) <= set(dir(cobalt))
        from cobalt import experiment, Dataset
        assert experiment.__module__ == "cobalt_cli.script", experiment.__module__
        assert cobalt.experiment is experiment
        for name in cobalt.__all__:
            assert getattr(cobalt, name) is not None, name
        assert cobalt.__version__
        from cobalt.experiments import collecting
        with collecting() as found:
            called = experiment("called", Dataset(items=[{"id": "a"}]), lambda ctx: "x")
            here = sys._getframe().f_lineno - 1

            @experiment("decorated", Dataset(items=[{"id": "a"}]))
            def decorated(ctx):
                return "x"

        assert found == [called, decorated], found
        # where the user called it (here), not the door's file
        where = [(e.file, e.line) for e in found]
        assert where == [("<string>", here), ("<string>", here + 3)], (where, here)
        try:
            cobalt.no_such_name
        except AttributeError as exc:
            print("ERROR", exc)
        """
    )
    assert done.returncode == 0, done.stderr
    assert "ERROR module 'cobalt' has no attribute 'no_such_name'" in done.stdout


# (b) no import climbs --------------------------------------------------------------------------


def test_no_import_climbs_to_a_higher_floor():
    climbing = [
        f"{i} (floor {floor(i.source)} -> floor {floor(i.target)})"
        for i in all_imports()
        if i.source != ROOF and i.target != ROOF and floor(i.target) > floor(i.source)
    ]
    assert not climbing, "imports that climb:\n" + "\n".join(climbing)


def test_nothing_inside_cobalt_imports_the_roof():
    through_the_roof = [str(i) for i in all_imports() if i.target == ROOF]
    assert not through_the_roof, (
        "import from the defining module instead (`from cobalt.experiments import "
        "Experiment`):\n" + "\n".join(through_the_roof)
    )


def test_the_scan_sees_function_level_relative_and_type_checking_imports(tmp_path):
    scanned = {(i.source, i.target): i for i in all_imports()}
    door = scanned[("cobalt_cli.script", "cobalt_app.launcher")]
    assert door.in_function and not door.type_checking
    source = tmp_path / "probe.py"
    source.write_text(
        textwrap.dedent(
            """
            from typing import TYPE_CHECKING
            from .. import selectors
            from .lane import run_lane
            import cobalt_app.models as models
            if TYPE_CHECKING:
                from cobalt_cli.main import app

            def later():
                from cobalt_app import launcher, results
            """
        )
    )
    found = {
        (i.target, i.in_function, i.type_checking)
        for i in imports_of("cobalt_app.runs.probe", source)
    }
    assert found == {
        ("cobalt_app.selectors", False, False),
        ("cobalt_app.runs.lane", False, False),
        ("cobalt_app.models", False, False),
        ("cobalt_cli.main", False, True),
        ("cobalt_app.launcher", True, False),
        ("cobalt_app.results", True, False),
    }
    assert floor("cobalt_app.api.views") == 2 and floor("cobalt_app.views") == 1
    assert floor("cobalt.experiments") == 0 and floor(ROOF) is None


# (c) no circle ---------------------------------------------------------------------------------


def circles(edges: list[Import]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.source, set()).add(edge.target)
        graph.setdefault(edge.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                connect(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for node in sorted(graph):
            if node not in index:
                connect(node)
    finally:
        sys.setrecursionlimit(limit)
    return found


def test_the_import_graph_has_no_circle():
    edges = [i for i in all_imports() if i.target != ROOF and not i.type_checking]
    found = circles(edges)
    lines = []
    for component in found:
        members = set(component)
        lines.append(f"a circle of {len(component)} modules: {', '.join(component)}")
        lines += [
            f"    {edge}" for edge in edges if edge.source in members and edge.target in members
        ]
    assert not found, "\n".join(lines)
