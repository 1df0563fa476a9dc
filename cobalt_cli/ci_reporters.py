"""Reporters for machines and CI: JSON lines, minimal CI console, JUnit XML, GitHub Actions.

Run reporters (`run_started` / `item_finished` / `run_finished`) replace the console one;
the CI writers (`write_junit`, `github_annotations`, `step_summary`) turn a `CiOutcome` into
files and workflow commands. Every piece of user or agent text is escaped for its format.
"""

from __future__ import annotations

import json
import os
import re
import sys
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from rich.console import Console
from rich.markup import escape

from cobalt import usage_notes, verdict
from cobalt.gates import Check, fmt_number
from cobalt.run_settings import RunSettings
from cobalt.version import __version__
from cobalt_app import recordings
from cobalt_app.ci_verdict import CiOutcome, GateReport
from cobalt_app.results import iso
from cobalt_cli.reporter import steps_note

# Characters XML 1.0 cannot carry (ANSI escapes in a traceback would make the file invalid).
XML_INVALID = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
ITEM_LINES_SHOWN = 10
ERROR_CLASSES_SHOWN = 10


class JsonLinesReporter:
    """`--reporter json`: one JSON object per line on stdout, and nothing else there.

    `claim_stdout()` points `sys.stdout` at stderr for the rest of the process, so prints from
    experiment code and every other message land on stderr, keeping stdout parseable.
    """

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream or sys.stdout
        self.run_id: str | None = None
        self.marks: dict[str, float] = {}  # each evaluator's pass mark

    def claim_stdout(self) -> None:
        self.stream = sys.stdout
        sys.stdout = sys.stderr

    def emit(self, event: str, **fields: Any) -> None:
        line = json.dumps({"event": event, **fields}, ensure_ascii=False, default=str)
        self.stream.write(line + "\n")
        self.stream.flush()

    def banner(self) -> None:
        pass

    def stop_progress(self) -> None:
        pass

    def run_started(self, run: Any, experiment: Any) -> None:
        self.run_id = run.id
        config = run.config or {}
        self.marks = verdict.pass_marks(config.get("evaluators", []))
        self.emit(
            "run.started",
            timestamp=iso(),
            runId=run.id,
            name=run.name,
            file=run.file,
            tags=run.tags,
            totalItems=run.total_items,
            runs=RunSettings.from_run_config(config).runs,
            concurrency=config.get("concurrency"),
            timeout=config.get("timeout"),
            evaluators=[e.get("name") for e in config.get("evaluators", [])],
            replay=recordings.label(config.get("replay")),
        )

    def item_finished(self, outcome: Any, done: int, total: int) -> None:
        evaluations = {}
        for evaluation in outcome.evaluations:
            judged = verdict.evaluation_verdict(
                evaluation.score,
                self.marks.get(evaluation.evaluator),
                error=evaluation.status != "ok",
            )
            entry: dict[str, Any] = {
                "score": evaluation.score,
                "verdict": judged,
                "status": evaluation.status,
            }
            if evaluation.status == "ok":
                entry["reason"] = evaluation.reason
            else:
                entry["error"] = evaluation.error
            evaluations[evaluation.evaluator] = entry
        self.emit(
            "item.finished",
            runId=self.run_id,
            index=outcome.item_index,
            runIndex=outcome.run_index,
            key=outcome.item_key,
            status=outcome.status,
            verdict=verdict.item_verdict(
                (e["verdict"] for e in evaluations.values()),
                errored=outcome.status in ("error", "timeout"),
            ),
            error=outcome.error or None,
            latencyMs=outcome.latency_ms,
            tokens=outcome.tokens,
            cost=outcome.cost,
            evaluations=evaluations,
            done=done,
            total=total,
        )

    def run_finished(self, run: Any) -> None:
        self.emit(
            "run.finished",
            timestamp=iso(),
            runId=run.id,
            name=run.name,
            status=run.status,
            resultsPath=run.results_path or None,
            summary=run.summary,
        )


class CiConsoleReporter:
    """`--ci` on a console: a line per run and per failed item, nothing per passing item."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.failed_lines = 0

    def banner(self) -> None:
        self.console.print(f"cobalt v{__version__} · CI mode")

    def file_started(self, relative_path: str) -> None:
        pass

    def stop_progress(self) -> None:
        pass

    def run_started(self, run: Any, experiment: Any) -> None:
        self.failed_lines = 0
        evaluators = len((run.config or {}).get("evaluators", []))
        replayed = recordings.label((run.config or {}).get("replay"))
        self.console.print(
            f"▶ {escape(run.name)} · run {run.id} · {run.total_items} items × "
            f"{evaluators} evaluator{'s' * (evaluators != 1)}"
            + (f" · model calls {replayed}" if replayed else "")
        )

    def item_finished(self, outcome: Any, done: int, total: int) -> None:
        if outcome.status == "ok":
            return
        self.failed_lines += 1
        if self.failed_lines > ITEM_LINES_SHOWN:
            return
        first = (outcome.error or outcome.status).splitlines()[0]
        self.console.print(
            f"  ✗ item #{outcome.item_index + 1} {outcome.status}: {escape(first)}"
            + steps_note(outcome),
            soft_wrap=True,
        )

    def run_finished(self, run: Any) -> None:
        summary = run.summary or {}
        status = summary.get("itemStatus", {})
        scores = "  ".join(
            f"{escape(name)} {fmt_score(values.get('avg'))}"
            for name, values in summary.get("scores", {}).items()
        )
        hidden = self.failed_lines - ITEM_LINES_SHOWN
        if hidden > 0:
            self.console.print(f"  … and {hidden} more failed items")
        self.console.print(
            f"  {status.get('ok', 0)} ok, {status.get('error', 0)} errors, "
            f"{status.get('timeout', 0)} timeouts · {scores or 'no scores'}",
            soft_wrap=True,
        )


def fmt_score(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def print_outcome(console: Console, outcome: CiOutcome) -> None:
    """The gate verdict: each violation as `evaluator metric actual < threshold`."""
    console.print()
    for failure in outcome.import_failures:
        console.print(
            f"✗ {escape(failure.file)} failed to import: {escape(failure.error)}", soft_wrap=True
        )
    for problem in outcome.config_errors:
        console.print(f"✗ {escape(problem)}", soft_wrap=True)
    print_global_checks(console, outcome)
    for report in outcome.reports:
        checked = len(report.checks)
        if report.passed:
            console.print(f"✓ {escape(report.name)}: {checked} checks passed")
        else:
            failed = len(report.violations)
            console.print(f"✗ {escape(report.name)}: {failed} of {checked} checks failed")
            for check in report.violations:
                console.print(f"    {escape(check.line())}", soft_wrap=True)
            print_error_classes(console, report)
        for note in report.notes:
            console.print(f"    note: {escape(note)}", soft_wrap=True)
    code = outcome.exit_code
    if code == 0:
        count = len(outcome.reports)
        console.print(f"\nCI passed ({count} run{'s' * (count != 1)})")
    elif code == 1:
        count = len(outcome.violations)
        console.print(f"\nCI failed: {count} violation{'s' * (count != 1)} (exit 1)")
    else:
        console.print("\nCI failed: configuration or import errors (exit 2)")


def print_global_checks(console: Console, outcome: CiOutcome) -> None:
    """The configuration's own checks: each violation, and each sweep gate that held."""
    global_violations = [c for c in outcome.global_checks if not c.passed]
    if global_violations:
        console.print("✗ thresholds in the configuration:")
        for check in global_violations:
            console.print(f"    {escape(check.line())}", soft_wrap=True)
    for check in outcome.global_checks:
        if check.passed and check.kind == "sweep":  # a gate asked for by name: say it held
            console.print(f"✓ {escape(check.line())}", soft_wrap=True)


def print_error_classes(console: Console, report: GateReport) -> None:
    """Beside the failed checks: why evaluations errored (the first message of each cause)."""
    if not report.error_classes:
        return
    console.print("    evaluation errors, by cause:")
    for error_class in report.error_classes[:ERROR_CLASSES_SHOWN]:
        console.print(f"      {escape(shorten(error_class.line()))}", soft_wrap=True)
    hidden = len(report.error_classes) - ERROR_CLASSES_SHOWN
    if hidden > 0:
        console.print(f"      … and {hidden} more causes")


def shorten(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ---------------------------------------------------------------------------------------------
# JUnit XML


def xml_text(value: Any) -> str:
    return XML_INVALID.sub("\ufffd", str(value if value is not None else ""))


def _element(parent: ET.Element, tag: str, text: str | None = None, **attrs: Any) -> ET.Element:
    element = ET.SubElement(parent, tag, {k: xml_text(v) for k, v in attrs.items()})
    if text:
        element.text = xml_text(text)
    return element


def gate_names(report: GateReport) -> list[str]:
    """Test cases of a run: each evaluator, then every other gate that was checked."""
    names = list(report.evaluators)
    for check in report.checks:
        if check.gate not in names:
            names.append(check.gate)
    return names


def _testcase(
    suite: ET.Element, classname: str, name: str, checks: list[Check], *, notes: list[str]
) -> tuple[int, int]:
    case = _element(suite, "testcase", classname=classname, name=name, time="0")
    failed = [c for c in checks if not c.passed]
    if failed:
        _element(
            case,
            "failure",
            "\n".join(c.line() for c in failed),
            message="; ".join(c.line() for c in failed),
            type="threshold",
        )
    lines = [c.line() for c in checks] or ["no thresholds for this gate"]
    _element(case, "system-out", "\n".join([*lines, *notes]))
    return 1, int(bool(failed))


def junit_document(outcome: CiOutcome) -> ET.ElementTree:
    root = ET.Element("testsuites", {"name": "cobalt"})
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    suites = [_report_suite(root, report) for report in outcome.reports]
    if outcome.import_failures or outcome.config_errors or outcome.global_checks:
        suites.append(_setup_suite(root, outcome))
    for suite in suites:
        for key in totals:
            totals[key] += int(suite.get(key) or 0)
    for key, value in totals.items():
        root.set(key, str(value))
    ET.indent(root)
    return ET.ElementTree(root)


def _report_suite(root: ET.Element, report: Any) -> ET.Element:
    """A run's test suite: a test case per gate, then one per errored item."""
    duration = (report.summary.get("totalDurationMs") or 0) / 1000
    suite = _element(
        root,
        "testsuite",
        name=report.name,
        timestamp=iso(),
        time=f"{duration:.3f}",
        file=report.file,
    )
    properties = _element(suite, "properties")
    _element(properties, "property", name="run_id", value=report.run_id)
    if report.baseline_id:
        _element(properties, "property", name="baseline_run_id", value=report.baseline_id)
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    classname = f"cobalt.{report.name}"
    for gate in gate_names(report):
        checks = [c for c in report.checks if c.gate == gate]
        notes = [n for n in report.notes if n.startswith(f"{gate}:")]
        if gate in report.evaluators and (line := pass_line(gate, report.summary)):
            notes.append(line)
        notes += [c.line() for c in report.error_classes if c.evaluator == gate]
        tests, failures = _testcase(suite, classname, gate, checks, notes=notes)
        counts["tests"] += tests
        counts["failures"] += failures
    for item in report.errored_items:
        counts[_item_case(suite, report, classname, item)] += 1
        counts["tests"] += 1
    for key, value in counts.items():
        suite.set(key, str(value))
    return suite


def _item_case(suite: ET.Element, report: Any, classname: str, item: Any) -> str:
    """An errored item's test case: an error, or skipped (`fail_on_error = false`); which."""
    label = f"item #{item.index + 1}"
    if report.runs > 1:
        label += f" (run {item.run_index + 1})"
    case = _element(
        suite,
        "testcase",
        classname=f"{classname}.items",
        name=f"{label} [{item.key}]",
        time=f"{(item.latency_ms or 0) / 1000:.3f}",
    )
    message = (item.error or item.status).splitlines()[0] if item.error else item.status
    if report.settings.fail_on_error:
        _element(case, "error", item.traceback or item.error, message=message, type=item.status)
        return "errors"
    _element(case, "skipped", message=f"{message} (fail_on_error = false)")
    return "skipped"


def _setup_suite(root: ET.Element, outcome: CiOutcome) -> ET.Element:
    """`cobalt setup`: files that failed to import, configuration errors, global gates."""
    suite = _element(root, "testsuite", name="cobalt setup", timestamp=iso(), time="0")
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for failure in outcome.import_failures:
        case = _element(suite, "testcase", classname="cobalt.import", name=failure.file)
        text = failure.traceback or failure.error
        _element(case, "error", text, message=failure.error, type="ImportError")
        counts["tests"] += 1
        counts["errors"] += 1
    for problem in outcome.config_errors:
        case = _element(suite, "testcase", classname="cobalt.config", name="configuration")
        _element(case, "error", problem, message=problem, type="ConfigError")
        counts["tests"] += 1
        counts["errors"] += 1
    for gate in dict.fromkeys(c.gate for c in outcome.global_checks):
        checks = [c for c in outcome.global_checks if c.gate == gate]
        tests, failures = _testcase(suite, "cobalt.thresholds", gate, checks, notes=[])
        counts["tests"] += tests
        counts["failures"] += failures
    for key, value in counts.items():
        suite.set(key, str(value))
    return suite


def write_junit(path: Path, outcome: CiOutcome) -> Path:
    """Write the JUnit XML report (atomically: a reader never sees half a file)."""
    path = path.resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    junit_document(outcome).write(temporary, encoding="utf-8", xml_declaration=True)
    temporary.replace(path)
    return path


# ---------------------------------------------------------------------------------------------
# GitHub Actions: workflow commands and the job summary


def gh_data(text: str) -> str:
    return str(text).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def gh_property(text: str) -> str:
    return gh_data(text).replace(":", "%3A").replace(",", "%2C")


def gh_command(level: str, message: str, **properties: Any) -> str:
    props = ",".join(f"{k}={gh_property(v)}" for k, v in properties.items() if v not in (None, ""))
    return f"::{level}{' ' + props if props else ''}::{gh_data(message)}"


def repo_path(project_dir: Path, relative: str) -> str:
    """A project-relative file as GitHub wants it: relative to the checkout (GITHUB_WORKSPACE)."""
    if not relative:
        return ""
    path = (project_dir / relative).resolve()
    workspace = os.environ.get("GITHUB_WORKSPACE")
    if workspace:
        try:
            return path.relative_to(Path(workspace).resolve()).as_posix()
        except ValueError:
            pass
    return relative


def traceback_line(traceback_text: str, file: str) -> int | None:
    """The last line number the traceback reports inside `file`."""
    name = Path(file).name
    found = None
    for match in re.finditer(r'File "([^"]+)", line (\d+)', traceback_text or ""):
        if Path(match.group(1)).name == name:
            found = int(match.group(2))
    return found


def github_annotations(outcome: CiOutcome, project_dir: Path) -> list[str]:
    lines = _setup_annotations(outcome, project_dir)
    for report in outcome.reports:
        lines += _report_annotations(report, project_dir)
    return lines


def _setup_annotations(outcome: CiOutcome, project_dir: Path) -> list[str]:
    """Files that failed to import, configuration errors, failed global gates."""
    lines: list[str] = []
    for failure in outcome.import_failures:
        lines.append(
            gh_command(
                "error",
                f"{failure.file} failed to import: {failure.error}",
                file=repo_path(project_dir, failure.file),
                line=traceback_line(failure.traceback, failure.file),
                title="Cobalt: experiment file failed to import",
            )
        )
    for problem in outcome.config_errors:
        lines.append(gh_command("error", problem, title="Cobalt: configuration error"))
    for check in outcome.global_checks:
        if not check.passed:
            lines.append(gh_command("error", check.line(), title="Cobalt gate failed"))
    return lines


def _report_annotations(report: Any, project_dir: Path) -> list[str]:
    """A run's violated gates, notes, error classes, low pass rates and failed items."""
    lines: list[str] = []
    file = repo_path(project_dir, report.file)
    for check in report.violations:
        lines.append(
            gh_command(
                "error",
                f"{report.name}: {check.line()}",
                file=file,
                title=f"Cobalt gate failed: {report.name}",
            )
        )
    for note in report.notes:
        lines.append(gh_command("warning", f"{report.name}: {note}", file=file))
    if not report.passed:
        for error_class in report.error_classes[:ERROR_CLASSES_SHOWN]:
            lines.append(
                gh_command(
                    "error",
                    f"{report.name}: {shorten(error_class.line())}",
                    file=file,
                    title="Cobalt: evaluation errors",
                )
            )
    for name in report.evaluators:
        line = pass_line(name, report.summary, only_failing=True)
        if line:
            lines.append(
                gh_command(
                    "warning",
                    f"{report.name}: {line}",
                    file=file,
                    title="Cobalt: scores below the pass mark",
                )
            )
    if not report.settings.fail_on_error:
        for item in report.errored_items[:5]:
            first = (item.error or item.status).splitlines()[0]
            label = f"item #{item.index + 1} [{item.key}]"
            lines.append(
                gh_command(
                    "warning",
                    f"{report.name}: {label} {item.status}: {first}",
                    file=file,
                    title="Cobalt: item failed",
                )
            )
    return lines


def md(text: Any) -> str:
    """Untrusted text for a Markdown table cell: no HTML, no table breaks, no formatting."""
    value = str(text if text is not None else "")
    value = value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    value = re.sub(r"([\\`*_\[\]{}#!|~])", r"\\\1", value)
    return " ".join(value.split())


def step_summary(outcome: CiOutcome) -> str:
    """The Markdown appended to `$GITHUB_STEP_SUMMARY`."""
    code = outcome.exit_code
    title = "✅ Cobalt CI passed" if code == 0 else f"❌ Cobalt CI failed (exit {code})"
    out = [f"## {title}", ""]
    for failure in outcome.import_failures:
        out.append(f"- ❌ **{md(failure.file)}** failed to import: {md(failure.error)}")
    for problem in outcome.config_errors:
        out.append(f"- ❌ {md(problem)}")
    for check in outcome.global_checks:
        if not check.passed:
            out.append(f"- ❌ {md(check.line())}")
    if outcome.import_failures or outcome.config_errors or outcome.global_checks:
        out.append("")
    for report in outcome.reports:
        summary = report.summary
        status = summary.get("itemStatus", {})
        mark = "✅" if report.passed else "❌"
        out.append(f"### {mark} {md(report.name)} · run {md(report.run_id)}")
        out.append("")
        out.append(
            f"{summary.get('totalItems', 0)} items: {status.get('ok', 0)} ok, "
            f"{status.get('error', 0)} errors, {status.get('timeout', 0)} timeouts · "
            f"cost {usage_notes.cost_line(summary)}"
        )
        out.append("")
        out.append("| Evaluator | Avg | Min | P50 | P95 | Pass rate | Errors | Gate |")
        out.append("|---|---:|---:|---:|---:|---:|---:|:---:|")
        for name in report.evaluators:
            values = summary.get("scores", {}).get(name, {})
            failed = any(c.gate == name and not c.passed for c in report.checks)
            checked = any(c.gate == name for c in report.checks)
            gate = "❌" if failed else "✅" if checked else "—"
            out.append(
                f"| {md(name)} | {fmt_score(values.get('avg'))} | {fmt_score(values.get('min'))}"
                f" | {fmt_score(values.get('p50'))} | {fmt_score(values.get('p95'))}"
                f" | {_percent(values.get('passRate'))}{_mark_note(values)}"
                f" | {values.get('errors', 0)} | {gate} |"
            )
        out.append("")
        if report.violations:
            out.append("**Violations**")
            out.append("")
            out.extend(f"- {md(c.line())}" for c in report.violations)
            out.append("")
        if report.violations and report.error_classes:
            out.append("**Evaluation errors, by cause**")
            out.append("")
            shown = report.error_classes[:ERROR_CLASSES_SHOWN]
            out.extend(f"- {md(shorten(c.line()))}" for c in shown)
            out.append("")
        for note in report.notes:
            out.append(f"> {md(note)}")
        if report.notes:
            out.append("")
    return "\n".join(out) + "\n"


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{fmt_number(value * 100)}%"


def _mark_note(values: Mapping[str, Any]) -> str:
    """` (≥ 0.8)` beside a pass rate counted at a pass mark other than the default."""
    mark = verdict.pass_mark(values.get("passMark"))
    return "" if mark == verdict.DEFAULT_PASS_THRESHOLD else f" (≥ {fmt_number(mark)})"


def pass_line(name: str, summary: Mapping[str, Any], *, only_failing: bool = False) -> str:
    """`quality: 4 of 4 scores below its pass mark 0.8 (pass rate 0%)`, from the run's summary
    (`passRate` counts each evaluator's pass mark, `passMark`); "" when nothing was scored, or
    with `only_failing` when every score passed."""
    values = (summary.get("scores") or {}).get(name) or {}
    count, rate = int(values.get("count") or 0), values.get("passRate")
    if not count or rate is None:
        return ""
    below = round(count * (1 - rate))
    if only_failing and not below:
        return ""
    mark = fmt_number(verdict.pass_mark(values.get("passMark")))
    return (
        f"{name}: {below} of {count} scores below its pass mark {mark} (pass rate {_percent(rate)})"
    )


def append_step_summary(path: Path, outcome: CiOutcome) -> None:
    with path.open("a", encoding="utf-8") as fh:
        fh.write(step_summary(outcome))
