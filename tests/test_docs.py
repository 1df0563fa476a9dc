"""Every example of the documentation runs: the README and every page under docs/.

Per page, in document order, in one temporary project of its own (seeded with a
`cobalt.toml` and the datasets the examples read), the model providers being
tests/fake_provider.py:

- a ```python block runs (consecutive blocks in one process, each as its own script). One
  whose first line is a comment naming a file (`# plugins/keyword.py`) is written there
  instead, for the blocks after it. A run the examples start must have no errored item or
  evaluation;
- a ```toml block is read by the configuration reader (`load_config`), as a `cobalt.toml`
  (first line `# cobalt.toml`: it becomes the project's too; `# pyproject.toml`: only parsed);
- a ```json block parses (a JSON document, or JSON Lines);
- a ```console block is a shell transcript: each `$ ` command runs (one shell per block, so
  `cd` carries on to the next command, and the page's next transcript starts where it ended)
  and its output is compared with the lines shown under it. Run ids, durations, dates, the
  project's path and the order of a run's item lines may differ; a line `...` stands for
  any number of lines, `…` in a line for any text;
- every `cobalt ...` command of a ```bash block names a real command and real options.

The prose is checked too: `cobalt ...` commands in backticks, module paths, MCP tools and
their arguments, `/api/` paths.

A block whose previous non-blank line is `<!-- docs-test: skip -->` is left out (say why in
the page: it needs a network, a key, Docker...); after `<!-- docs-test: expect error "…" -->`
an item of its run may end with that error (the example shows it), and no other. Then the site builds with `mkdocs build
--strict`, and its generated references list everything the code has.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from cobalt.config import load_config
from cobalt.results_file import load_results
from cobalt_cli.scaffold import DATASET
from tests.conftest import REPO, cli_env

SKIP = "<!-- docs-test: skip -->"
EXPECT_ERROR = re.compile(r'<!-- docs-test: expect error "([^"]+)" -->')
PAGES = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])
RUNNABLE = ("python", "toml", "json", "console", "bash")
FILE_COMMENT = re.compile(r"^# ([\w./-]+\.(?:py|jsonl|json|csv|toml))\s*$")


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    expected_error: str = ""  # `<!-- docs-test: expect error "…" -->`: the example shows one

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def page_blocks(page: Path) -> list[Block]:
    """The fenced blocks of a page that run, skipped ones left out."""
    lines = page.read_text().splitlines()
    found, index = [], 0
    while index < len(lines):
        fence = re.match(r"^(```+)(\w*)", lines[index])
        if not fence:
            index += 1
            continue
        end = index + 1
        while end < len(lines) and not lines[end].startswith(fence.group(1)):
            end += 1
        before = [text for text in lines[:index] if text.strip()]
        skipped = bool(before) and before[-1].strip() == SKIP
        expected = EXPECT_ERROR.fullmatch(before[-1].strip()) if before else None
        if fence.group(2) in RUNNABLE and not skipped:
            text = "\n".join(lines[index + 1 : end])
            error = expected.group(1) if expected else ""
            found.append(Block(page, index + 1, fence.group(2), text, error))
        index = end + 1
    return found


# -- The project an example runs in ---------------------------------------------------------

SEED = {
    "cobalt.toml": 'test_dir = "experiments"\n',
    "datasets/qa.jsonl": "\n".join(
        json.dumps(item)
        for item in [
            {
                "id": "capital-france",
                "input": "What is the capital of France?",
                "expected_output": "Paris",
            },
            {
                "id": "capital-canada",
                "input": "What is the capital of Canada?",
                "expected_output": "Ottawa",
            },
        ]
    )
    + "\n",
    "datasets/example.jsonl": DATASET,  # the one `cobalt init` writes
}


def seed(folder: Path, ran: Path | None = None) -> Path:
    """A project: the SEED files, and a copy of the `.cobalt/` folder of a project where
    Cobalt ran, when given: its database is migrated (each page's project would otherwise
    migrate its own, ~0.4 s of CPU). The database, its WAL and key are copied whole."""
    for name, text in SEED.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    if ran is not None:
        shutil.copytree(ran, folder / ".cobalt")
    return folder


@pytest.fixture(scope="module")
def migrated_database(tmp_path_factory, fake_provider_server) -> Path:
    """The `.cobalt/` folder of a project where Cobalt ran once (its database migrated)."""
    folder = seed(tmp_path_factory.mktemp("template"))
    done = subprocess.run(
        [sys.executable, "-m", "cobalt_cli", "history"],
        cwd=folder,
        env=example_env(fake_provider_server),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return folder / ".cobalt"


def example_env(provider) -> dict[str, str]:
    """The environment of a reader's shell: the `cobalt` of this Python, keys set, the
    providers faked; output not a terminal (no COLUMNS: a log's layout, 120 wide)."""
    bin_dir = str(Path(sys.executable).parent)
    env = cli_env(
        {
            "OPENAI_BASE_URL": provider.openai_base_url,
            "ANTHROPIC_BASE_URL": provider.anthropic_base_url,
            "OPENAI_API_KEY": "sk-docs-test-openai-0001",
            "ANTHROPIC_API_KEY": "sk-ant-docs-test-0002",
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            "NO_COLOR": "1",
        }
    )
    return {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES")}


# Runs each block's file as `__main__`, in order, in one process; stops at the first failure.
PYTHON_RUNNER = """\
import runpy, sys, traceback
for path in sys.argv[1:]:
    print(f"@@block {path}", flush=True)
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            print(f"@@failed {path}: SystemExit({exc.code!r})", flush=True)
            sys.exit(1)
    except BaseException:
        traceback.print_exc(file=sys.stdout)
        print(f"@@failed {path}", flush=True)
        sys.exit(1)
"""


def run_python(blocks: list[Block], folder: Path, env: dict[str, str]) -> None:
    paths = []
    for block in blocks:
        path = folder / "docs_examples" / f"{block.page.stem}_{block.line}.py"
        path.parent.mkdir(exist_ok=True)
        path.write_text(f"# {block.where}\n{block.text}\n")
        paths.append(str(path))
    runner = folder / "docs_examples" / "run_blocks.py"
    runner.write_text(PYTHON_RUNNER)
    done = subprocess.run(
        [sys.executable, str(runner), *paths],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    failed = re.search(r"@@failed (\S+)", done.stdout)
    assert done.returncode == 0 and not failed, (
        f"the python example at {failed_where(failed, blocks)} failed:\n{done.stdout}{done.stderr}"
    )
    check_runs(folder, blocks, done.stdout)


def check_runs(folder: Path, blocks: list[Block], output: str) -> None:
    """No run of the examples has an item or an evaluation that errored: an example that
    "runs" while every item errors is a drifted example."""
    for path in sorted((folder / ".cobalt" / "results").glob("*.json*")):
        if path.name.startswith("checked-"):
            continue
        expected = [block.expected_error for block in blocks if block.expected_error]
        for item in load_results(path)["items"]:
            error = item.get("error") or ""
            shown = any(error.startswith(text) for text in expected)
            problems = [error] if item["status"] != "ok" and not shown else []
            problems += [
                f"{name}: {evaluation.get('error')}"
                for name, evaluation in item.get("evaluations", {}).items()
                if evaluation.get("verdict") == "error"
            ]
            assert not problems, (
                f"a run of the examples at {', '.join(b.where for b in blocks)} has errors: "
                f"item {item['key']}: {problems}\n{output}"
            )
        path.rename(path.with_name(f"checked-{path.name}"))


def failed_where(failed: re.Match | None, blocks: list[Block]) -> str:
    if failed is None:
        return ", ".join(block.where for block in blocks)
    stem_line = Path(failed.group(1).rstrip(":")).stem
    return next((b.where for b in blocks if f"{b.page.stem}_{b.line}" == stem_line), stem_line)


def check_toml(block: Block, folder: Path, project: Path) -> None:
    """A `cobalt.toml` is read by the configuration reader; one whose first line is
    `# cobalt.toml` also becomes the project's; another named file (`# pyproject.toml`) only
    has to be TOML."""
    first = block.text.splitlines()[0] if block.text else ""
    named = re.match(r"^# (\S+\.toml)\b", first)
    if named and named.group(1) != "cobalt.toml":
        try:
            tomllib.loads(block.text)
        except tomllib.TOMLDecodeError as exc:
            pytest.fail(f"the TOML example at {block.where}: {exc}")
        return
    if named:
        (project / "cobalt.toml").write_text(block.text + "\n")
    where = folder / "toml_examples" / str(block.line)
    where.mkdir(parents=True)
    (where / "cobalt.toml").write_text(block.text + "\n")
    try:
        load_config(where)
    except Exception as exc:
        pytest.fail(f"the TOML example at {block.where} is refused by the config reader: {exc}")


def check_json(block: Block) -> None:
    try:
        json.loads(block.text)
    except json.JSONDecodeError:
        for number, line in enumerate(block.text.splitlines(), 1):
            try:
                json.loads(line)
            except json.JSONDecodeError as exc:
                pytest.fail(f"the JSON example at {block.where}, line {number}: {exc}")


# -- Shell transcripts ----------------------------------------------------------------------


def transcript(block: Block) -> list[tuple[str, list[str]]]:
    """(command, the output lines shown under it) for each `$ ` line of a console block."""
    steps: list[tuple[str, list[str]]] = []
    for line in block.text.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line)
    return steps


def run_transcript(block: Block, folder: Path, cwd: Path, env: dict[str, str]) -> Path:
    """Run a console block's commands in `cwd`; return the folder the shell ended in (the
    next block of the page starts there, as a reader's terminal would)."""
    steps = transcript(block)
    script = "".join(
        f"echo '@@step {n}'\n{{ {command}\n}} 2>&1\n" for n, (command, _) in enumerate(steps)
    )
    done = subprocess.run(
        ["bash", "-c", script + 'echo "@@cwd $PWD"\n'],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    ended = re.search(r"^@@cwd (.*)$", done.stdout, flags=re.M)
    outputs = re.split(
        r"^@@step \d+\n", done.stdout[: ended.start() if ended else None], flags=re.M
    )[1:]
    assert len(outputs) == len(steps), (
        f"{block.where}: the shell stopped early:\n{done.stdout}{done.stderr}"
    )
    for (command, shown), actual in zip(steps, outputs, strict=True):
        problem = compare_output(shown, actual.splitlines(), folder)
        assert problem is None, f"{block.where}: `$ {command}`: {problem}\nits output:\n{actual}"
    return Path(ended.group(1)) if ended else cwd


VARYING = [
    (re.compile(r"(?<![0-9a-zA-Z])[0-9a-f]{12}(?![0-9a-zA-Z])"), "<run-id>"),
    (re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d[-:]\d\d[-:]\d\d(\.\d+)?Z?"), "<time>"),
    (re.compile(r"\b\d+(\.\d+)?(ms|s)\b"), "<duration>"),
]


def normalise(line: str, folder: Path) -> str:
    line = line.replace(str(folder.resolve()), "<project>").replace(str(folder), "<project>")
    for pattern, token in VARYING:
        line = pattern.sub(token, line)
    return line.rstrip()


def compare_output(shown: list[str], actual: list[str], folder: Path) -> str | None:
    """None when `actual` reads as `shown` does, else what differs."""
    want = in_item_order([normalise(line, folder) for line in shown])
    got = in_item_order([normalise(line, folder) for line in actual])
    while want and not want[-1]:
        want.pop()
    while got and not got[-1]:
        got.pop()
    pattern = "".join(line_pattern(line) for line in want)
    if re.fullmatch(pattern, "".join(f"{line}\n" for line in got), flags=re.S):
        return None
    diff = difflib.unified_diff(want, got, "the page", "the run", lineterm="", n=1)
    return "the output differs from the page:\n" + "\n".join(diff)


ITEM_LINE = re.compile(r"^\s+\S+ Item (\d+)/\d+\b")


def in_item_order(lines: list[str]) -> list[str]:
    """Consecutive `✓ Item 3/8 …` lines sorted by item number: items finish in the order
    their concurrent lanes get to them, which a page cannot pin down."""
    ordered: list[str] = []
    run: list[tuple[int, str]] = []
    for line in [*lines, ""]:
        found = ITEM_LINE.match(line)
        if found:
            run.append((int(found.group(1)), line))
            continue
        ordered += [text for _, text in sorted(run, key=lambda pair: pair[0])]
        run = []
        ordered.append(line)
    return ordered[:-1]


def line_pattern(line: str) -> str:
    if line.strip() in ("...", "…"):
        return r"(?:[^\n]*\n)*?"
    return (
        r"[ \t]*".join(
            ".*?".join(re.escape(part) for part in piece.split("…"))
            for piece in re.split(r"[ \t]+", line)
        )
        + r"[ \t]*\n"
    )


# -- `cobalt` lines of bash blocks ----------------------------------------------------------


def cobalt_calls(block: Block) -> list[list[str]]:
    """The `cobalt ...` commands of a bash block, as argument lists (comments left out)."""
    text = block.text.replace("\\\n", " ")
    calls = []
    for line in text.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", line)
        for part in re.split(r"&&|\|\||;|\||\$\(|\)", line):
            try:
                words = shlex.split(part)
            except ValueError:
                continue
            while words and "=" in words[0] and not words[0].startswith("-"):
                words = words[1:]  # VAR=value cobalt ...
            if words[:1] == ["cobalt"]:
                calls.append(words)
    return calls


def check_cobalt_call(words: list[str], block: Block, commands: dict[str, set[str]]) -> None:
    path = "cobalt"
    for word in words[1:]:
        if f"{path} {word}" in commands:
            path = f"{path} {word}"
        elif not word.startswith("-"):
            break
    assert path != "cobalt" or words[1:2] in ([], ["--version"], ["--help"]), (
        f"{block.where}: `{' '.join(words)}`: no such command"
    )
    for word in words[1:]:
        option = word.split("=")[0]
        if option.startswith("-") and option not in commands.get(path, set()) | {"--help"}:
            pytest.fail(f"{block.where}: `{' '.join(words)}`: `{path}` has no option {option}")


# -- The tests ------------------------------------------------------------------------------


def load_hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def hooks():
    return load_hooks()


@pytest.fixture(scope="module")
def commands(hooks) -> dict[str, set[str]]:
    return {path: set(hooks.cli_options(command)) for path, command in hooks.cli_commands()}


def runnable_pages() -> list[Path]:
    return [page for page in PAGES if page_blocks(page)]


@pytest.mark.parametrize("page", runnable_pages(), ids=lambda page: str(page.relative_to(REPO)))
def test_every_example_of_the_page_runs(
    page, tmp_path, fake_provider_server, commands, migrated_database
):
    folder = seed(tmp_path / "project", migrated_database)
    env = example_env(fake_provider_server)
    cwd, pending = folder, []
    for block in page_blocks(page):
        if block.lang == "python":
            named = FILE_COMMENT.match(block.text.splitlines()[0] if block.text else "")
            if named:
                (folder / named.group(1)).parent.mkdir(parents=True, exist_ok=True)
                (folder / named.group(1)).write_text(block.text + "\n")
            else:
                pending.append(block)
            continue
        if pending:
            run_python(pending, folder, env)
            pending = []
        if block.lang == "toml":
            check_toml(block, tmp_path, folder)
        elif block.lang == "json":
            check_json(block)
        elif block.lang == "console":
            cwd = run_transcript(block, folder, cwd, env)
        elif block.lang == "bash":
            for words in cobalt_calls(block):
                check_cobalt_call(words, block, commands)
    if pending:
        run_python(pending, folder, env)


def test_the_transcript_comparison_lets_ids_and_times_vary(tmp_path):
    shown = [
        "▶ qa · run 6051787dfa01 · 2 items",
        "...",
        "  Total time:     37ms",
        "saved to …/results",
    ]
    ran = [
        "▶ qa · run 86abf278e652 · 2 items",
        "  ✓ Item 1/2",
        "  ✓ Item 2/2",
        "  Total time:     1.2s",
        f"saved to {tmp_path}/.cobalt/results",
    ]
    assert compare_output(shown, ran, tmp_path) is None
    assert compare_output(shown, [*ran[:3], "  Total time:  x"], tmp_path) is not None
    assert compare_output(["exit 1"], ["exit 2"], tmp_path) is not None
    items = ["  ✓ Item 1/3 — a", "  ✗ Item 2/3 — b", "  ✓ Item 3/3 — c"]
    assert compare_output(items, [items[2], items[0], items[1]], tmp_path) is None
    assert compare_output(items, [items[0], items[0], items[1]], tmp_path) is not None


def test_a_skip_marker_leaves_the_next_block_out(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        f"{SKIP}\n\n```python\nraise SystemExit(1)\n```\n\n```toml\nconcurrency = 2\n```\n"
    )
    assert [block.lang for block in page_blocks(page)] == ["toml"]


def test_the_references_list_everything_the_code_has(hooks):
    from cobalt.config import SETTINGS, TABLE_SETTINGS
    from cobalt_app.evaluators import REGISTRY, known_types
    from cobalt_cli.main import commands as typer_commands
    from cobalt_cli.on_demand import OnDemand

    cli = hooks.cli_page()
    registered = list(OnDemand(typer_commands).infos)  # every command the app registers
    assert {"run", "init", "serve", "mcp", "labels"} <= set(registered)
    for name in registered:
        assert f"## `cobalt {name}`" in cli, name
    for path, command in hooks.cli_commands():
        for option in hooks.cli_options(command):
            assert f"`{option}`" in cli.split(f"## `{path}`")[1].split("\n## ")[0], (path, option)

    settings = hooks.settings_page()
    for key in SETTINGS:
        assert f"| `{key}` |" in settings, key
    for table, keys in TABLE_SETTINGS.items():
        for key in keys:
            assert f"| `{table}.{key}` |" in settings, (table, key)

    described = (REPO / "docs" / "concepts" / "evaluators.md").read_text()
    described = described.split("## The types")[1].split("\n\n")[1]  # its table of types
    table = set(re.findall(r"^\| `([a-z-]+)`(?: / `([a-z-]+)`)?[^|]*\|", described, re.M))
    assert {name for row in table for name in row if name} == set(known_types())

    evaluators = hooks.evaluators_page()
    for name in known_types():
        row = next(line for line in evaluators.splitlines() if line.startswith(f"| `{name}` |"))
        for option in REGISTRY[name].options:
            assert f"`{option}`" in row, (name, option)

    mcp = hooks.mcp_page()
    for tool in hooks.mcp_tools():
        assert f"## `{tool.name}`" in mcp
        for argument in tool.input_schema.get("properties", {}):
            assert f"| `{argument}` |" in mcp.split(f"## `{tool.name}`")[1], (tool.name, argument)
    assert len(hooks.mcp_tools()) >= 7

    api = hooks.rest_api_page()
    from django.urls import get_resolver

    routes = [str(p.pattern) for p in get_resolver().url_patterns]
    assert any(route.startswith("api/") for route in routes)
    for path in hooks.openapi_schema()["paths"]:
        assert f" {path}`" in api, path


def test_the_files_and_mcp_tools_the_pages_name_exist(hooks):
    """A module path (`cobalt_app/launcher.py`) or an MCP tool (`cobalt_results`) named on a
    page is one the code has: moved or renamed code fails here, not in a reader's hands."""
    tools = {tool.name for tool in hooks.mcp_tools()}
    packages = {"cobalt_app", "cobalt_cli", "cobalt_project"}
    path = re.compile(
        r"\b(?:cobalt|cobalt_app|cobalt_cli|cobalt_project|tests|bench|scripts)/[\w/.-]+\.(?:py|md|yml|toml)\b"
    )
    for page in PAGES:
        text = page.read_text()
        for named in path.findall(text):
            assert (REPO / named).exists(), f"{page.relative_to(REPO)} names {named}, which is gone"
        for name in set(re.findall(r"\bcobalt_[a-z_]+\b", text)) - packages:
            assert name in tools, (
                f"{page.relative_to(REPO)} names the MCP tool {name}: no such tool"
            )
        # A table of tools: the arguments of its second column are ones the tool declares.
        for tool, arguments in re.findall(r"^\| `(cobalt_[a-z_]+)` \| ([^|]+) \|", text, re.M):
            schema = next(x for x in hooks.mcp_tools() if x.name == tool).input_schema
            for argument in re.findall(r"`(\w+)[?=`]", re.sub(r"\([^)]*\)", "", arguments)):
                assert argument in schema["properties"], (page.name, tool, argument)


NOT_COMMANDS = {"cobalt setup", "cobalt ..."}  # a JUnit suite's name; "any command"


def test_the_commands_named_in_prose_exist(commands):
    """`cobalt clean --older-than 30d` in a sentence names a real command and real options
    (`[--x]`, `A|B` and placeholders read as in a usage line)."""
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S).replace("\n", " ")
        for span in set(re.findall(r"`(cobalt [^`]+)`", text)) - NOT_COMMANDS:
            words = re.sub(r"[\[\]|]", " ", span).split()
            block = Block(page, 0, "text", span)
            check_cobalt_call(words, block, commands)


def test_the_api_paths_the_pages_name_are_served(hooks):
    """Every `/api/...` path a page names is in the OpenAPI schema (or is the schema and its
    Swagger UI)."""

    def shape(path: str) -> str:
        return re.sub(r"<[^>]+>|\{[^}]+\}", "{}", path)

    served = {shape(path) for path in hooks.openapi_schema()["paths"]} | {"/api/docs/"}
    for page in PAGES:
        for path in set(re.findall(r"/api/[\w<>{} /-]*?/(?=[`?\s&)\"'|]|$)", page.read_text())):
            assert shape(path) in served, f"{page.relative_to(REPO)} names {path}: not served"


def test_the_site_builds_strict_with_no_warnings(tmp_path):
    env = {**cli_env(), "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    for page in ["index.html", "getting-started/index.html", "reference/cli/index.html"]:
        assert (tmp_path / "site" / page).is_file(), page
    assert (tmp_path / "site" / "reference" / "openapi.json").is_file()


def test_the_readme_is_a_front_door():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) < 200
    assert "pip install cobalt-agents" not in readme  # not published: never offered
    assert "docs/images/dashboard.png" in readme and (REPO / "docs/images/dashboard.png").is_file()
    for page in PAGES:
        assert not re.search(r"pip install '?cobalt-agents", page.read_text()), page
