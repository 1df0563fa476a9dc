"""One rule for which file may run, the same at every door (`discovery.runnable_file`): an
experiment file inside the project, under its test directory, matching `test_match`. The
API's and the MCP server's cases are in test_api.py and test_mcp.py."""

from __future__ import annotations

import pytest

from cobalt import load_config

REFUSED = "open('PWNED', 'w').write('imported')\n"
EXPERIMENT = """
from cobalt import Dataset, experiment

experiment("fine", Dataset([{"input": "x"}]), lambda ctx: ctx.item["input"])
"""


@pytest.fixture
def files(project, tmp_path):
    project.write("experiments/fine.cobalt.py", EXPERIMENT)
    project.write("experiments/helper.py", REFUSED)
    project.write("scripts/side.cobalt.py", REFUSED)
    outside = tmp_path / "outside.cobalt.py"
    outside.write_text(REFUSED)
    return project, outside


def test_the_cli_refuses_files_the_rule_refuses(files, cobalt_cli):
    project, outside = files
    expected = {
        "experiments/helper.py": "is not an experiment file",
        "scripts/side.cobalt.py": "is not under the test directory experiments/",
        str(outside): "resolves outside the project folder",
    }
    for given, message in expected.items():
        result = cobalt_cli(project, "run", given)
        assert result.returncode == 2, (given, result.stdout, result.stderr)
        assert message in result.stderr, (given, result.stderr)
    assert not (project.path / "PWNED").exists()
    assert cobalt_cli(project, "run", "experiments/fine.cobalt.py").returncode == 0


@pytest.mark.django_db(transaction=True)
def test_a_worker_refuses_a_run_whose_file_the_rule_refuses(files):
    from cobalt_app import team, worker_runtime

    project, outside = files
    runtime = worker_runtime.Runtime(load_config(project.path), concurrency=1)
    expected = {
        "experiments/helper.py": "is not an experiment file",
        "scripts/side.cobalt.py": "is not under the test directory experiments/",
        str(outside): "resolves outside the project folder",
    }
    for given, message in expected.items():
        info = team.RunInfo("run-1", "fine", given, {})
        with pytest.raises(worker_runtime.ExperimentUnavailable, match=message):
            runtime.experiment(info)
    assert not (project.path / "PWNED").exists()
    info = team.RunInfo("run-1", "fine", "experiments/fine.cobalt.py", {})
    assert runtime.experiment(info).name == "fine"
