"""Retention: `cobalt clean runs|traces|recordings`, the `[retention]` policy, the space given
back, and the runs that stay (still running, or compared with in CI). Real projects through
the real command; the team sweeper against PostgreSQL and Redis with a real worker."""

from __future__ import annotations

import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from tests import cli_zygote
from tests.conftest import Project, cli_env
from tests.team_harness import Team, wait_for

ITEMS = 20

# Outputs and trace steps of random text: nothing compresses away, so deleting them shows.
EXPERIMENT = """
import os

import cobalt
from cobalt import Dataset, Evaluator, experiment


@experiment("{name}", Dataset(items=[{{"id": f"i{{n}}"}} for n in range({items})]),
            evaluators=[Evaluator(name="ok", type="function", fn=lambda ctx: 1.0)])
def run(ctx):
    with cobalt.span("search", kind="retrieval", input=ctx.item["id"]) as step:
        step.output = os.urandom(900).hex()
    return os.urandom(6000).hex()
"""

SLOW = """
import time

from cobalt import Dataset, experiment


@experiment("slow", Dataset(items=[{"id": "only"}]), timeout=600)
def run(ctx):
    time.sleep(300)
    return "late"
"""

RECORDING_AGENT = """
from openai import OpenAI

from cobalt import Dataset, experiment

client = OpenAI()


@experiment("echo", Dataset.from_file("datasets/words.jsonl"))
def run(ctx):
    reply = client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "ECHO: " + ctx.item["id"]}]
    )
    return reply.choices[0].message.content
"""


def cobalt(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return cli_zygote.run(list(args), folder, cli_env())


def query(project: Project, sql: str, params: tuple = ()) -> list[tuple]:
    with sqlite3.connect(project.db_path) as db:
        return db.execute(sql, params).fetchall()


def runs_by_experiment(project: Project) -> dict[str, list[str]]:
    """Run ids per experiment, newest first."""
    rows = query(project, "SELECT name, id FROM cobalt_app_run ORDER BY name, created_at DESC")
    found: dict[str, list[str]] = {}
    for name, run_id in rows:
        found.setdefault(name, []).append(run_id)
    return found


def age_runs(project: Project, days: int, run_ids: list[str] | None = None) -> None:
    where = "" if run_ids is None else f"WHERE id IN ({','.join('?' * len(run_ids))})"
    query(
        project,
        "UPDATE cobalt_app_run SET created_at = "
        f"strftime('%Y-%m-%d %H:%M:%f', created_at, '-{days} days') {where}",
        tuple(run_ids or ()),
    )


def database_bytes(project: Project) -> int:
    files = (project.db_path, project.db_path.with_name("history.db-wal"))
    return sum(f.stat().st_size for f in files if f.exists())


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> Project:
    """Two experiments, three runs each (20 items with a trace step each), made once."""
    folder = tmp_path_factory.mktemp("history") / "proj"
    folder.mkdir()
    (folder / "cobalt.toml").write_text('test_dir = "experiments"\n')
    made = Project(folder)
    for name in ("alpha", "beta"):
        made.write(f"experiments/{name}.cobalt.py", EXPERIMENT.format(name=name, items=ITEMS))
    for _ in range(3):
        result = cobalt(folder, "run", "-q")
        assert result.returncode == 0, result.stdout + result.stderr
    failed = query(made, "SELECT error FROM cobalt_app_itemresult WHERE status != 'ok' LIMIT 1")
    assert not failed, failed
    query(made, "PRAGMA wal_checkpoint(TRUNCATE)")  # all of it in history.db, for the copies
    return made


@pytest.fixture
def project(history: Project, tmp_path: Path) -> Project:
    """A copy of `history` for one test, in `repo/proj` (its results files its own)."""
    copy = Project(tmp_path / "repo" / "proj")
    # Not SQLite's side files: they come and go as connections close (checkpointed above).
    shutil.copytree(history.path, copy.path, ignore=shutil.ignore_patterns("*.db-wal", "*.db-shm"))
    query(
        copy,
        "UPDATE cobalt_app_run SET results_path = replace(results_path, ?, ?)",
        (str(history.path), str(copy.path)),
    )
    return copy


def test_keep_last_keeps_each_experiments_newest_runs_and_the_file_shrinks(project: Project):
    before_runs = runs_by_experiment(project)
    query(project, "PRAGMA wal_checkpoint(TRUNCATE)")
    before = database_bytes(project)

    result = cobalt(project.path, "clean", "runs", "--keep-last", "1")

    assert result.returncode == 0, result.stderr
    assert (
        f"Deleted 4 runs: {4 * ITEMS} items, {4 * ITEMS} evaluations, {4 * ITEMS} traces, "
        "4 result files." in result.stdout
    )
    assert runs_by_experiment(project) == {name: ids[:1] for name, ids in before_runs.items()}
    kept_files = {p.name.rsplit("_", 1)[1].removesuffix(".json") for p in project.results_files()}
    assert kept_files == {before_runs["alpha"][0], before_runs["beta"][0]}
    assert query(project, "SELECT count(*) FROM cobalt_app_itemresult") == [(2 * ITEMS,)]
    after = database_bytes(project)
    assert after < before * 0.5, (before, after)
    assert "(VACUUM)" in result.stdout and "Gave back" in result.stdout


def test_a_dry_run_says_what_would_go_and_deletes_nothing(project: Project):
    query(project, "PRAGMA wal_checkpoint(TRUNCATE)")
    before = database_bytes(project)

    result = cobalt(project.path, "clean", "runs", "--keep-last", "1", "--dry-run")

    assert result.returncode == 0, result.stderr
    assert f"Would delete 4 runs: {4 * ITEMS} items" in result.stdout
    assert "Dry run: nothing was deleted." in result.stdout
    assert sum(len(ids) for ids in runs_by_experiment(project).values()) == 6
    assert len(project.results_files()) == 6
    assert database_bytes(project) == before


def test_runs_ci_compares_with_are_kept_and_named(project: Project):
    runs = runs_by_experiment(project)
    age_runs(project, 40)
    repo = project.path.parent  # the CI file of the repository around the project counts
    (repo / ".git").mkdir()
    workflow = repo / ".github" / "workflows" / "ci.yml"
    workflow.parent.mkdir(parents=True)
    workflow.write_text(f"run: cobalt run --ci --baseline {runs['alpha'][2][:8]} --junit r.xml\n")
    project.write(
        "cobalt.toml",
        f'test_dir = "experiments"\n[retention]\nbaselines = ["{runs["beta"][2]}"]\n',
    )

    result = cobalt(project.path, "clean", "runs", "--older-than", "30d")

    assert result.returncode == 0, result.stderr
    assert "Deleted 2 runs" in result.stdout
    assert runs_by_experiment(project) == {
        "alpha": [runs["alpha"][0], runs["alpha"][2]],
        "beta": [runs["beta"][0], runs["beta"][2]],
    }
    out = " ".join(result.stdout.split())
    assert "Kept 4 of the matching runs:" in out
    for name in ("alpha", "beta"):
        assert (
            f"{runs[name][0]} {name}: the newest completed run of '{name}', which "
            "`--baseline latest` compares with" in out
        )
    assert (
        f"{runs['alpha'][2]} alpha: named by `--baseline {runs['alpha'][2][:8]}` in "
        ".github/workflows/ci.yml" in out
    )
    assert f"{runs['beta'][2]} beta: named by `--baseline {runs['beta'][2]}` in [retention]" in out


def test_a_running_run_is_kept_and_the_vacuum_waits_for_it(project: Project):
    project.write("experiments/slow.cobalt.py", SLOW)
    slow = subprocess.Popen(
        [sys.executable, "-m", "cobalt_cli", "run", "experiments/slow.cobalt.py"],
        cwd=project.path,
        env=cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(
            lambda: query(project, "SELECT id FROM cobalt_app_run WHERE status = 'running'"),
            timeout=60,
            what="the slow run to start",
        )
        (slow_id,) = query(project, "SELECT id FROM cobalt_app_run WHERE name = 'slow'")[0]

        result = cobalt(project.path, "clean", "runs")

        assert result.returncode == 0, result.stderr
        assert "Deleted 4 runs" in result.stdout  # the newest of alpha and beta are baselines
        assert f"{slow_id}  slow: still running: a run is deleted once it has ended" in (
            result.stdout
        )
        assert (
            "Space not given back now: runs are in progress, and VACUUM would hold them up; the "
            "next clean gives it back." in " ".join(result.stdout.split())
        )
        assert query(project, "SELECT status FROM cobalt_app_run WHERE id = ?", (slow_id,)) == [
            ("running",)
        ]
    finally:
        slow.send_signal(signal.SIGTERM)
        slow.wait(30)


def test_traces_go_and_their_runs_stay(project: Project):
    runs = runs_by_experiment(project)

    result = cobalt(project.path, "clean", "traces", "--keep-last", "1", "-e", "alpha")

    assert result.returncode == 0, result.stderr
    assert f"Deleted {2 * ITEMS} traces of 2 runs." in result.stdout
    assert runs_by_experiment(project) == runs
    traced = query(
        project,
        "SELECT i.run_id, count(t.item_id) FROM cobalt_app_itemresult i "
        "LEFT JOIN cobalt_app_itemtrace t ON t.item_id = i.id GROUP BY i.run_id",
    )
    expected = {run_id: 0 for run_id in runs["alpha"][1:]}
    expected |= {run_id: ITEMS for run_id in [runs["alpha"][0], *runs["beta"]]}
    assert dict(traced) == expected


def test_clean_without_a_kind_applies_the_retention_policy(project: Project):
    runs = runs_by_experiment(project)
    age_runs(project, 40)
    age_runs(project, 60, [runs["alpha"][2], runs["beta"][2]])
    project.write(
        "cobalt.toml",
        'test_dir = "experiments"\n[retention]\nruns = "50d"\ntraces = "30d"\nkeep_last = 1\n',
    )

    result = cobalt(project.path, "clean")

    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())
    assert (
        "[retention] of cobalt.toml: runs older than 50d, except the 1 newest of each "
        "experiment; traces older than 30d, except the 1 newest of each experiment." in out
    )
    assert "Deleted 2 runs" in out and f"Deleted {2 * ITEMS} traces of 2 runs." in out
    assert runs_by_experiment(project) == {name: ids[:2] for name, ids in runs.items()}
    assert query(project, "SELECT count(*) FROM cobalt_app_itemtrace") == [(2 * ITEMS,)]


def test_a_deleted_runs_labels_stay_without_their_run(project: Project):
    old = runs_by_experiment(project)["alpha"][2]
    query(
        project,
        "INSERT INTO cobalt_app_label (experiment, item_key, output_hash, evaluator, reviewer, "
        "verdict, note, run_id, version, created_at, updated_at) VALUES ('alpha', 'i1', 'h', "
        "'ok', 'ana', 'pass', '', ?, 1, '2026-01-01 00:00:00', '2026-01-01 00:00:00')",
        (old,),
    )

    result = cobalt(project.path, "clean", "runs", "--keep-last", "2", "-e", "alpha")

    assert "Deleted 1 run:" in result.stdout
    assert "Kept 1 label given on these runs: a label belongs to its output" in " ".join(
        result.stdout.split()
    )
    assert query(project, "SELECT reviewer, run_id FROM cobalt_app_label") == [("ana", None)]


def test_recordings_go_by_recording_run_and_by_age(project: Project, cobalt_cli):
    project.write("experiments/echo.cobalt.py", RECORDING_AGENT)
    for words in (["a", "b", "c"], ["c", "d"]):
        project.write_jsonl("datasets/words.jsonl", [{"id": word} for word in words])
        recorded = cobalt_cli(project, "run", "--record", "experiments/echo.cobalt.py")
        assert recorded.returncode == 0, recorded.stdout + recorded.stderr

    def recorded() -> list[str]:
        return [key for (key,) in query(project, "SELECT item_key FROM cobalt_app_recording")]

    dry = cobalt(project.path, "clean", "recordings", "--keep-last", "1", "--dry-run")
    assert "Would delete 2 recordings." in dry.stdout and sorted(recorded()) == list("abcd")
    latest = cobalt(project.path, "clean", "recordings", "--keep-last", "1")
    assert "Deleted 2 recordings." in latest.stdout and sorted(recorded()) == ["c", "d"]
    query(
        project, "UPDATE cobalt_app_recording SET recorded_at = '2020-01-01' WHERE item_key = 'c'"
    )
    old = cobalt(project.path, "recordings", "clean", "--older-than", "30d", "-e", "echo")
    assert "Deleted 1 recording." in old.stdout and recorded() == ["d"]


def test_bad_ages_and_counts_are_refused_naming_the_option(project: Project):
    for args, message in (
        (["--older-than", "soon"], "--older-than: 'soon' is not an age; use e.g. 30d, 12h, 2w"),
        (
            ["--older-than", "30"],
            "--older-than: '30' is not an age; use e.g. 30d, 12h, 2w (a "
            "unit is needed: '30d' for days?)",
        ),
        (["--keep-last", "0"], "'--keep-last'"),
    ):
        result = cobalt(project.path, "clean", "runs", *args)
        assert result.returncode == 2 and message in " ".join(result.stderr.split()), args
    days = cobalt(project.path, "clean", "--days", "3")
    assert days.returncode == 2 and "--days goes with --cache or --results" in days.stderr
    nothing = cobalt(project.path, "clean")
    assert nothing.returncode == 2 and "nothing to clean" in nothing.stderr
    assert sum(len(ids) for ids in runs_by_experiment(project).values()) == 6


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (
            'runs = "90"',
            "`retention.runs`: '90' is not an age; use e.g. 30d, 12h, 2w (a unit "
            "is needed: '90d' for days?)",
        ),
        ("traces = 30", "`retention.traces`: 30 is not an age"),
        ('recordings = "soon"', "`retention.recordings`: 'soon' is not an age"),
        ("keep_last = 0", "`retention.keep_last` must be a whole number of at least 1 (got 0)"),
        ('keep_last = "5"', "`retention.keep_last` must be a whole number of at least 1"),
        ('baselines = "6051787dfa01"', "`retention.baselines` must be a list of run ids"),
        (
            "kep_last = 5",
            "line 3: `retention.kep_last` is not a Cobalt setting; did you mean "
            "`retention.keep_last`?",
        ),
    ],
)
def test_the_retention_settings_are_checked_naming_the_key(tmp_path, lines, message):
    from cobalt.config import ConfigError, load_config

    (tmp_path / "cobalt.toml").write_text(f'test_dir = "experiments"\n[retention]\n{lines}\n')
    with pytest.raises(ConfigError) as raised:
        load_config(tmp_path)
    assert message in str(raised.value)


def test_the_policy_reads_one_rule_per_kind(tmp_path):
    from cobalt.config import load_config
    from cobalt_app.retention import Rule, policy

    (tmp_path / "cobalt.toml").write_text(
        '[retention]\nruns = "90d"\ntraces = "2w"\nrecordings = "36h"\nkeep_last = 20\n'
    )
    assert policy(load_config(tmp_path)) == [
        Rule("runs", 90 * 86400, 20),
        Rule("traces", 14 * 86400, 20),
        Rule("recordings", 36 * 3600, 20),
    ]
    (tmp_path / "cobalt.toml").write_text('[retention]\ntraces = "30d"\nkeep_last = 5\n')
    assert policy(load_config(tmp_path)) == [Rule("traces", 30 * 86400, 5)]
    (tmp_path / "cobalt.toml").write_text("[retention]\nkeep_last = 5\n")
    assert policy(load_config(tmp_path)) == [Rule("runs", None, 5)]


@pytest.mark.timeout(240)
def test_the_team_sweeper_applies_the_policy_on_postgresql(team: Team):
    (team.folder / "cobalt.toml").write_text(
        'test_dir = "experiments"\n[retention]\nruns = "30d"\nkeep_last = 1\n'
    )
    team.write_experiment(items=3, call_agent=False)
    worker = team.start_worker()
    for _ in range(3):
        result = team.cli("run")
        assert result.returncode == 0, result.stdout + result.stderr
    runs = [r for (r,) in team.services.query("SELECT id FROM cobalt_app_run ORDER BY created_at")]

    by_hand = team.cli("clean", "runs", "--keep-last", "2")

    assert by_hand.returncode == 0, by_hand.stderr
    assert "Deleted 1 run: 3 items, 6 evaluations, 0 traces, 1 result file." in by_hand.stdout
    assert "(VACUUM (ANALYZE) of " in by_hand.stdout and "PostgreSQL tables" in by_hand.stdout

    # The sweeper took its turn when the worker started (nothing was old then) and waits an
    # hour for the next; an hour later, the runs have aged.
    client = team.services.redis()
    key = f"cobalt:retention:127.0.0.1/{team.services.database}"
    assert 3500 < client.ttl(key) <= 3600
    with psycopg.connect(team.services.database_url, autocommit=True) as db:
        db.execute("UPDATE cobalt_app_run SET created_at = created_at - interval '40 days'")
    client.delete(key)
    wait_for(
        lambda: team.services.query("SELECT id FROM cobalt_app_run") == [(runs[2],)],
        timeout=30,
        what="the sweeper to delete all but the newest run",
    )
    assert wait_for(
        lambda: (
            team.services.query(
                "SELECT last_vacuum IS NOT NULL FROM pg_stat_user_tables "
                "WHERE relname = 'cobalt_app_itemresult'"
            )
            == [(True,)]
        ),
        timeout=10,
        what="the item table to be vacuumed",
    )
    logged = (
        "retention: deleted 1 runs (3 items, 6 evaluations, 1 result files); kept 0 matching "
        "runs; VACUUM (ANALYZE) of "
    )
    wait_for(lambda: logged in worker.err(), timeout=10, what="the log line after the vacuum")
