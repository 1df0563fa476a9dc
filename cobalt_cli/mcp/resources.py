"""Resources (`cobalt://config`, `cobalt://experiments`, `cobalt://latest-results`) and the
texts of the prompts."""

from __future__ import annotations

import os
from typing import Any

from cobalt.redaction import MASK, redact
from cobalt_cli.mcp.project import Project
from cobalt_cli.mcp.reports import run_overview


def config_resource(project: Project) -> dict[str, Any]:
    """Seed 003's config shape, built from the redacted configuration only."""
    from cobalt.config import parse_ttl
    from cobalt.run_settings import RUN_DEFAULTS
    from cobalt_app.providers import DEFAULT_KEY_VARS

    config = project.config()
    data = redact(config.data)
    judge = data.get("judge") or {}
    provider = judge.get("provider") or RUN_DEFAULTS.judge.provider
    variable = DEFAULT_KEY_VARS.get(provider, "")
    if judge.get("api_key"):
        key_source = "api_key in the configuration"
    elif variable and os.environ.get(variable):
        key_source = variable
    else:
        key_source = None
    ttl = parse_ttl((data.get("cache") or {}).get("ttl"))
    return {
        "projectDir": str(project.dir),
        "configFile": project.relative(config.path),
        "testDir": project.relative(config.test_dir),
        "outputDir": data.get("output_dir"),
        "concurrency": data.get("concurrency"),
        "timeout": int(float(data.get("timeout", RUN_DEFAULTS.timeout)) * 1000),
        "judge": {
            "provider": provider,
            "model": judge.get("model"),
            "baseUrl": judge.get("base_url"),  # redacted with the rest by `redact`
            "apiKey": MASK if key_source else None,
            "apiKeySource": key_source,
        },
        "cache": {
            "enabled": bool((data.get("cache") or {}).get("enabled", True)),
            "ttl": int(ttl * 1000) if ttl else None,
        },
        "ciMode": os.environ.get("CI", "").lower() in ("1", "true", "yes"),
        "thresholds": (data.get("ci") or {}).get("thresholds") or {},
        "tags": data.get("tags") or [],
        "plugins": data.get("plugins") or [],
        "mode": "team" if config.team_mode else "embedded",
        "database": data.get("database_url") or "embedded SQLite",
    }


def experiments_resource(project: Project) -> dict[str, Any]:
    from cobalt_app.discovery import discover

    config = project.config()
    files = discover(config)
    experiments = []
    for path in files:
        name = path.name
        for suffix in (".cobalt.py", ".experiment.py", ".py"):
            if name.endswith(suffix):
                name = name[: -len(suffix)]
                break
        experiments.append({"path": project.relative(path), "name": name})
    return {
        "testDir": project.relative(config.test_dir),
        "count": len(experiments),
        "experiments": experiments,
    }


def latest_results_resource(project: Project, limit: int = 50) -> dict[str, Any]:
    """The newest finished run of each experiment (seed 003)."""
    from cobalt_app.selectors import latest_runs

    results = [run_overview(run, project) for run in latest_runs(limit)]
    return {"count": len(results), "results": results}


IMPROVE_AGENT = """\
Analyze the latest cobalt results for the experiment {experiment!r}: read the resource \
cobalt://latest-results (or call cobalt_results with experiment={experiment!r} and then with \
the run id and status="failing", following `nextOffset` until every failing item is read) and \
identify the failing items — scores below {threshold}, errors and timeouts — with the \
evaluators' reasons. Read the experiment file (cobalt://experiments lists them) and \
the agent source code it imports. Suggest specific improvements to raise every evaluator \
above {threshold}, then apply them, run the experiment again with cobalt_run, and use \
cobalt_compare (previous run as runA, the new run as runB) to check that the failing items \
improved without new regressions. Repeat while it helps."""

GENERATE_TESTS = """\
Analyze the agent at {agent_file!r}: understand its purpose, its inputs and outputs, the \
prompts and APIs it uses, and its expected behaviour. Then call cobalt_generate with \
agentFile={agent_file!r} (add what you learned in `context`) to create a comprehensive \
experiment file covering normal cases, edge cases and adversarial inputs. Run the generated \
file with cobalt_run; if it fails to import or errors, fix the file and run it again. \
Finally present the scores and the weakest items."""

REGRESSION_CHECK = """\
Run the cobalt experiments{scope} with cobalt_run. For each new run, find the previous run of \
the same experiment (cobalt_results with experiment=<name> lists runs newest first) and call \
cobalt_compare with the previous run as runA and the new run as runB. Report every \
regression: the item, the evaluator, the score change, the two outputs and the judges' \
reasons. Say whether each new run passes its CI gate (the run's `gate`: what `cobalt run \
--ci` decides) and name its failed checks. If there are regressions, identify the root cause \
(a change in the agent, its prompt, the dataset or the evaluators) and propose a fix."""
