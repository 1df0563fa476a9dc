"""The shape of the code: small functions, and reads below the pages.

Ruff keeps each function's branches, statements and cyclomatic complexity down (C901,
PLR0912, PLR0915 in pyproject.toml); this scan adds the length: no function, from its `def`
to its last line, over MAX_LINES.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cobalt", "cobalt_app", "cobalt_cli")
MAX_LINES = 80

# The reads (and what they read) sit below the pages: none of them imports a page.
READS = ("selectors", "score_tables", "flaky", "ci_verdict")
PAGES = ("page_items", "page_compare", "page_selectors", "views", "views_review")


def source_files() -> list[Path]:
    return sorted(
        path
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if "migrations" not in path.relative_to(ROOT).parts
    )


def long_functions(path: Path, root: Path = ROOT) -> list[str]:
    """`file:line name (length)` of each function in `path` longer than MAX_LINES."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [
        f"{path.relative_to(root)}:{node.lineno} {node.name} ({length} lines)"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (length := node.end_lineno - node.lineno + 1) > MAX_LINES
    ]


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, at module level or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_the_scan_sees_the_sources():
    files = source_files()
    assert any(path.name == "config.py" for path in files)
    assert not any("migrations" in path.parts for path in files)


def test_no_function_is_longer_than_80_lines():
    offenders = [found for path in source_files() for found in long_functions(path)]
    assert not offenders, f"functions over {MAX_LINES} lines (split them):\n" + "\n".join(offenders)


def test_the_scan_finds_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    path = tmp_path / "probe.py"
    path.write_text(f"def short():\n    return 1\n\n\nasync def long():\n{body}\n")
    assert long_functions(path, tmp_path) == [f"probe.py:5 long ({MAX_LINES + 1} lines)"]


def test_the_reads_import_no_page():
    for name in READS:
        imported = imported_modules(ROOT / "cobalt_app" / f"{name}.py")
        pages = [f"cobalt_app.{page}" for page in PAGES if f"cobalt_app.{page}" in imported]
        assert not pages, f"cobalt_app/{name}.py imports {pages}: a read reaches up to a page"
