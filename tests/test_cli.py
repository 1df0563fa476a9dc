"""The real `cobalt` command in throwaway projects: init, run, history, compare, clean."""

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

from tests.conftest import cli_env

SECRET = "SECRET-0001"
REPO = Path(__file__).resolve().parent.parent


def test_init_creates_a_project_that_runs_offline(tmp_path, cobalt_cli):
    folder = tmp_path / "new"
    folder.mkdir()
    (folder / ".gitignore").write_text("node_modules/\n")
    result = cobalt_cli(folder, "init", env={"OPENAI_API_KEY": ""})
    assert result.returncode == 0, result.stderr
    for name in ("cobalt.toml", "experiments/example.cobalt.py", "datasets/example.jsonl"):
        assert (folder / name).is_file()
    # The new folder has no README: the configuration names the page of Cobalt's own docs.
    pointer = (folder / "cobalt.toml").read_text().splitlines()[0].split("What each does: ")[1]
    assert (REPO / pointer).is_file()
    assert (folder / ".gitignore").read_text() == "node_modules/\n.cobalt/\n"
    again = cobalt_cli(folder, "init")
    assert "kept" in again.stdout and (folder / ".gitignore").read_text().count(".cobalt/") == 1

    run = cobalt_cli(folder, "run", env={"OPENAI_API_KEY": ""})
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "example-qa" in out
    assert "Dataset: 8 items × 1 run × 2 evaluators" in out
    assert "✓ Item 1/8 — exact: 1.00 | mentions-answer: 1.00" in out
    assert "✗ Item 4/8 — exact: 0.00 | mentions-answer: 0.00" in out  # nothing passed
    assert "⚠ 4 items scored below 0.5 on 'exact' (#4, #5, #6, #8)" in out
    assert "Evaluator" in out and "P95" in out
    assert "Total items:    8" in out
    assert "Results saved to .cobalt/results/" in out
    run_id = out.split("Run ID: ")[1].split()[0]
    assert (folder / ".cobalt" / "history.db").is_file()
    (results_file,) = (folder / ".cobalt" / "results").glob(f"*_example-qa_{run_id}.json")
    data = json.loads(results_file.read_text())
    assert data["summary"]["scores"]["exact"]["avg"] == 0.5
    assert len(data["items"]) == 8


def write_experiment(project, name="qa", body_extra="", items=None, evaluators=None):
    items = items or [{"id": f"k{i}", "input": f"q{i}", "expected": f"a{i}"} for i in range(5)]
    project.write_jsonl("datasets/qa.jsonl", items)
    project.write(
        f"experiments/{name}.cobalt.py",
        f"""
        from cobalt import Dataset, Evaluator, experiment

        dataset = Dataset.from_file("datasets/qa.jsonl")
        {body_extra}

        @experiment("{name}", dataset, evaluators=[
            Evaluator(name="exact", type="exact-match", field="expected"),
        ], tags=["t1"])
        def run(ctx):
            return WRONG.get(ctx.item["id"], ctx.item["expected"]) if "WRONG" in globals() else ctx.item["expected"]
        """,
    )


def test_history_and_compare_match_items_by_key_not_position(project, cobalt_cli):
    write_experiment(project)
    first = cobalt_cli(project, "run")
    assert first.returncode == 0, first.stderr
    run_a = first.stdout.split("Run ID: ")[1].split()[0]
    # reorder the dataset and break one item: compare must follow keys, not positions
    items = [{"id": f"k{i}", "input": f"q{i}", "expected": f"a{i}"} for i in reversed(range(5))]
    write_experiment(project, items=items, body_extra='WRONG = {"k3": "nope"}')
    second = cobalt_cli(project, "run")
    run_b = second.stdout.split("Run ID: ")[1].split()[0]

    history = cobalt_cli(project, "history", "--limit", "5")
    assert history.returncode == 0
    lines = [line for line in history.stdout.splitlines() if "qa" in line]
    assert lines[0].split()[0] == run_b and lines[1].split()[0] == run_a
    assert "exact 0.80" in lines[0] and "exact 1.00" in lines[1]
    assert cobalt_cli(project, "history", "--tag", "nope").stdout.startswith("No runs yet")

    compare = cobalt_cli(project, "compare", run_a, run_b)
    assert compare.returncode == 0, compare.stderr
    out = compare.stdout
    assert "exact" in out and "-0.20" in out
    assert "Verdict: B neither wins nor loses; no significant change on exact." in out
    assert "Regressions (1)" in out
    assert "k3 · exact: 1.00 → 0.00" in out
    assert "Improvements (0)" in out
    assert cobalt_cli(project, "compare", run_a[:6], run_b[:6]).returncode == 0
    missing = cobalt_cli(project, "compare", run_a, "zzzzzzzz")
    assert missing.returncode == 2 and "no run with id 'zzzzzzzz'" in missing.stderr


def test_an_experiment_file_that_fails_to_import_is_named_and_fails_the_command(
    project, cobalt_cli
):
    write_experiment(project, name="good")
    project.write("experiments/broken.cobalt.py", "import not_a_module_anywhere\n")
    result = cobalt_cli(project, "run")
    assert result.returncode == 2
    assert "experiments/broken.cobalt.py failed to import" in result.stderr
    assert "ModuleNotFoundError" in result.stderr
    assert "Run ID:" in result.stdout  # the good file still ran


def test_an_items_error_names_the_line_of_the_project_that_raised_it(project, cobalt_cli):
    project.write("agents/__init__.py", "")
    project.write("agents/lookup.py", "def answer(question):\n    return CAPITALS[question]\n")
    project.write(
        "experiments/lookup.cobalt.py",
        """
        from agents.lookup import answer
        from cobalt import Dataset, experiment

        def run(ctx):
            return answer(ctx.item["input"])

        experiment("lookup", Dataset([{"id": "fr", "input": "France"}]), run)
        """,
    )
    result = cobalt_cli(project, "run")
    assert (
        "⚠ item #1 error: NameError: name 'CAPITALS' is not defined (at agents/lookup.py:2 in "
        "answer)\n"
    ) in result.stdout


def test_a_project_folder_hidden_by_an_installed_package_is_explained(project, cobalt_cli):
    # The OpenAI Agents SDK installs a package named `agents`: it wins over a folder `agents/`
    # without __init__.py, so `from agents.support import answer` fails.
    project.write("agents/support.py", "def answer(q):\n    return q\n")
    project.write("experiments/e.cobalt.py", "from agents.support import answer\n")
    result = cobalt_cli(project, "run")
    assert result.returncode == 2
    assert "the folder agents/ of this project is hidden by the installed package 'agents'" in (
        result.stderr
    )
    assert "add an empty agents/__init__.py" in result.stderr


def test_a_bad_dataset_names_the_file_and_line(project, cobalt_cli):
    project.write("datasets/bad.jsonl", '{"input": "ok"}\n{"input": broken}\n')
    project.write(
        "experiments/bad.cobalt.py",
        """
        from cobalt import Dataset, experiment
        experiment("bad", Dataset.from_file("datasets/bad.jsonl"), lambda ctx: "x")
        """,
    )
    result = cobalt_cli(project, "run")
    assert result.returncode == 2
    assert "datasets/bad.jsonl, line 2" in result.stderr


def test_filter_and_tag_select_experiments(project, cobalt_cli):
    write_experiment(project, name="alpha")
    write_experiment(project, name="beta")
    only_beta = cobalt_cli(project, "run", "--filter", "be*")
    assert " beta " in only_beta.stdout and " alpha " not in only_beta.stdout
    nothing = cobalt_cli(project, "run", "--filter", "gamma")
    assert nothing.returncode == 2 and "no experiment matched" in nothing.stderr
    by_tag = cobalt_cli(project, "run", "--tag", "t1", "experiments/alpha.cobalt.py")
    assert " alpha " in by_tag.stdout and " beta " not in by_tag.stdout


def test_options_override_runs_and_concurrency(project, cobalt_cli):
    write_experiment(project)
    result = cobalt_cli(project, "run", "--runs", "2", "--concurrency", "3")
    assert "Dataset: 5 items × 2 runs × 1 evaluator" in result.stdout
    assert "Concurrency: 3" in result.stdout
    assert "(run 2/2)" in result.stdout


def test_paths_outside_the_project_are_refused(project, cobalt_cli, tmp_path):
    outside = tmp_path / "elsewhere.cobalt.py"
    outside.write_text("raise SystemExit('must not run')\n")
    result = cobalt_cli(project, "run", str(outside))
    assert result.returncode == 2
    assert "outside the project folder" in result.stderr


def test_no_api_key_reaches_the_database_results_or_output(project, cobalt_cli):
    project.write("cobalt.toml", '[judge]\napi_key = "sk-config-SECRET-0003"\n')
    project.write_jsonl("datasets/qa.jsonl", [{"input": "q", "expected": "a"}])
    project.write(
        "experiments/judge.cobalt.py",
        """
        import os
        from cobalt import Dataset, Evaluator, experiment
        experiment("judge", Dataset.from_file("datasets/qa.jsonl"), lambda ctx: "a",
                   evaluators=[Evaluator(name="rel", prompt="{{input}} {{output}} [[score:0.5]]")])
        """,
    )
    result = cobalt_cli(project, "run")
    assert result.returncode == 0, result.stderr
    assert "rel: 0.50" in result.stdout
    blobs = [result.stdout, result.stderr]
    blobs += [p.read_text(errors="replace") for p in project.results_files()]
    for path in (project.path / ".cobalt").glob("history.db*"):
        blobs.append(path.read_bytes().decode("latin-1"))
    for blob in blobs:
        assert SECRET not in blob and "SECRET-0003" not in blob


def test_clean_removes_cache_and_results(project, cobalt_cli):
    project.write_jsonl("datasets/qa.jsonl", [{"input": "q"}])
    project.write(
        "experiments/j.cobalt.py",
        """
        from cobalt import Dataset, Evaluator, experiment
        experiment("j", Dataset.from_file("datasets/qa.jsonl"), lambda ctx: "a",
                   evaluators=[Evaluator(name="rel", prompt="{{output}}")])
        """,
    )
    assert cobalt_cli(project, "run").returncode == 0
    assert len(project.results_files()) == 1
    assert cobalt_cli(project, "clean").returncode == 2
    kept = cobalt_cli(project, "clean", "--cache", "--results", "--days", "1")
    assert "Deleted 0 cache entries" in kept.stdout and len(project.results_files()) == 1
    cleaned = cobalt_cli(project, "clean", "--cache", "--results")
    assert "Deleted 1 cache entries" in cleaned.stdout
    assert "Deleted 1 result files and 1 runs" in cleaned.stdout
    assert project.results_files() == []
    with sqlite3.connect(project.db_path) as db:
        assert db.execute("select count(*) from cobalt_app_run").fetchone() == (0,)


def test_running_an_experiment_file_directly_returns_a_report(project, fake_provider_server):
    project.write_jsonl("datasets/qa.jsonl", [{"id": "x", "input": "q", "expected": "a"}])
    project.write(
        "experiments/direct.cobalt.py",
        """
        from cobalt import Dataset, Evaluator, experiment

        report = experiment(
            "direct", Dataset.from_file("datasets/qa.jsonl"), lambda ctx: "a",
            evaluators=[Evaluator(name="exact", type="exact-match", field="expected")],
        )
        print("REPORT", report.id, report.statistics["exact"]["avg"], report.total_items)
        """,
    )
    result = subprocess.run(
        [sys.executable, "experiments/direct.cobalt.py"],
        cwd=project.path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("REPORT"))
    _, run_id, avg, total = line.split()
    assert (avg, total) == ("1.0", "1")
    assert f"Run ID: {run_id}" in result.stdout
    assert len(project.results_files()) == 1


def test_an_interrupted_run_keeps_its_items_and_resumes_only_the_missing_ones(project):
    import signal
    import time

    project.write(
        "experiments/slow.cobalt.py",
        """
        import asyncio
        from cobalt import Dataset, Evaluator, experiment

        @experiment("slow", Dataset(items=[{"id": i} for i in range(30)]), concurrency=2,
                    evaluators=[Evaluator(name="f", type="function", fn=lambda c: 1.0)])
        async def run(ctx):
            await asyncio.sleep(0.2)
            return "ok"
        """,
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "cobalt_cli", "run"],
        cwd=project.path,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def finished() -> int:
        if not project.db_path.exists():
            return 0
        with sqlite3.connect(project.db_path) as db:
            try:
                return db.execute(
                    "select count(*) from cobalt_app_itemresult where status = 'ok'"
                ).fetchone()[0]
            except sqlite3.OperationalError:
                return 0

    deadline = time.monotonic() + 60
    while finished() < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130
    assert "cobalt run --resume" in err
    with sqlite3.connect(project.db_path) as db:
        run_id, status = db.execute("select id, status from cobalt_app_run").fetchone()
        done_before = db.execute(
            "select count(*) from cobalt_app_itemresult where status = 'ok'"
        ).fetchone()[0]
    assert status == "cancelled" and 3 <= done_before < 30

    resumed = subprocess.run(
        [sys.executable, "-m", "cobalt_cli", "run", "--resume", run_id],
        cwd=project.path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.count("✓ Item") == 30 - done_before
    with sqlite3.connect(project.db_path) as db:
        assert db.execute("select status, finished_items from cobalt_app_run").fetchone() == (
            "completed",
            30,
        )
        assert db.execute("select count(*) from cobalt_app_evaluation").fetchone() == (30,)


def test_the_package_names_load_on_first_use():
    script = (
        "import sys, cobalt\n"
        "assert 'cobalt.dataset' not in sys.modules and 'opentelemetry' not in sys.modules\n"
        "from cobalt import experiment, Evaluator, span\n"
        "import cobalt.experiments\n"
        "assert callable(experiment) and cobalt.experiment is experiment, cobalt.experiment\n"
        "assert 'opentelemetry' in sys.modules\n"
        "print(sorted(cobalt.__all__))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "'experiment'" in done.stdout and "'span'" in done.stdout
