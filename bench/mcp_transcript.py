"""A whole MCP session against `cobalt mcp`, printed as a transcript.

From a clean `cobalt init` folder: list tools → cobalt_run → cobalt_results → change the agent
and cobalt_run again → cobalt_compare of the two runs → cobalt_generate for an example agent →
cobalt_run of the generated file. The judge LLM is the fake provider of the tests (its
`[[reply:...]]` marker makes it return the generated spec).

    python bench/mcp_transcript.py [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.fake_provider import FakeProvider  # noqa: E402
from tests.support_agent import SUPPORT_AGENT, support_spec  # noqa: E402


def show(title: str, payload: object = None) -> None:
    print(f"\n>>> {title}")
    if payload is not None:
        print(f"    {json.dumps(payload)}")


def reply(text: str, limit: int = 40) -> None:
    lines = text.splitlines()
    for line in lines[:limit]:
        print(f"<<< {line}")
    if len(lines) > limit:
        print(f"<<< … ({len(lines) - limit} more lines)")


async def session_transcript(project: Path, env: dict[str, str]) -> None:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "cobalt_cli", "mcp"], cwd=str(project), env=env
    )
    with (project / "mcp-server.log").open("w") as errlog:
        await transcript_steps(project, params, errlog)


async def transcript_steps(project: Path, params: StdioServerParameters, errlog) -> None:
    async with stdio_client(params, errlog=errlog) as (read, write):  # noqa: SIM117
        async with ClientSession(read, write) as session:
            started = time.perf_counter()
            init = await session.initialize()
            show("initialize")
            reply(f"server {init.server_info.name} {init.server_info.version}")

            show("tools/list")
            tools = await session.list_tools()
            reply("\n".join(f"{t.name}: {t.description}" for t in tools.tools))

            progress: list[tuple[float, float | None, str | None]] = []

            async def on_progress(value: float, total: float | None, message: str | None) -> None:
                progress.append((value, total, message))

            arguments = {"file": "experiments/example.cobalt.py"}
            show("tools/call cobalt_run", arguments)
            first = await session.call_tool("cobalt_run", arguments, progress_callback=on_progress)
            await anyio.wait_all_tasks_blocked()  # progress callbacks run as their own tasks
            reply(f"[{len(progress)} progress notifications]")
            for value, total, message in progress[:3]:
                reply(f"  progress {value:g}/{total:g}: {message}")
            reply(first.content[0].text)
            run_a = first.structured_content["id"]
            reply(
                f"[structured content: results-file format, keys "
                f"{sorted(first.structured_content)}]"
            )

            show("tools/call cobalt_results", {"limit": 5})
            listing = await session.call_tool("cobalt_results", {"limit": 5})
            reply(listing.content[0].text)

            show("tools/call cobalt_results", {"runId": run_a})
            one = await session.call_tool("cobalt_results", {"runId": run_a})
            reply(one.content[0].text, limit=6)

            agent = project / "experiments" / "example.cobalt.py"
            source = agent.read_text()
            source = source.replace('"Toronto",  # a deliberate mistake', '"Ottawa",  # fixed')
            source = source.replace('"japan": "Tokyo"', '"japan": "Kyoto"')
            agent.write_text(source)
            print("\n(edited the example agent: Canada fixed, Japan broken)")

            progress.clear()
            show("tools/call cobalt_run", arguments)
            second = await session.call_tool("cobalt_run", arguments, progress_callback=on_progress)
            await anyio.wait_all_tasks_blocked()  # progress callbacks run as their own tasks
            reply(f"[{len(progress)} progress notifications]")
            reply(second.content[0].text)
            run_b = second.structured_content["id"]

            show("tools/call cobalt_compare", {"runA": run_a, "runB": run_b})
            diff = await session.call_tool("cobalt_compare", {"runA": run_a, "runB": run_b})
            reply(diff.content[0].text)

            (project / "agents").mkdir(exist_ok=True)
            (project / "agents" / "support.py").write_text(SUPPORT_AGENT)
            print("\n(wrote agents/support.py, a small support agent)")
            generate_arguments = {
                "agentFile": "agents/support.py",
                "datasetSize": 5,
                "runOneItem": True,
                "context": "Answers refund, shipping and password questions. "
                f"[[reply:{json.dumps(support_spec())}]]",
            }
            show(
                "tools/call cobalt_generate",
                {**generate_arguments, "context": "Answers refund, shipping … [[reply:<spec>]]"},
            )
            generated = await session.call_tool("cobalt_generate", generate_arguments)
            reply(generated.content[0].text)
            path = generated.structured_content["path"]
            print(f"\n--- {path} ---")
            print((project / path).read_text())
            print("---")

            progress.clear()
            show("tools/call cobalt_run", {"file": path})
            third = await session.call_tool(
                "cobalt_run", {"file": path}, progress_callback=on_progress
            )
            await anyio.wait_all_tasks_blocked()  # progress callbacks run as their own tasks
            reply(f"[{len(progress)} progress notifications]")
            reply(third.content[0].text)

            show("tools/call cobalt_run", {"file": "../outside.cobalt.py"})
            refused = await session.call_tool("cobalt_run", {"file": "../outside.cobalt.py"})
            reply(f"[isError={refused.is_error}] {refused.content[0].text}")

            show("resources/read cobalt://latest-results")
            latest = await session.read_resource("cobalt://latest-results")
            data = json.loads(latest.contents[0].text)
            reply(
                "\n".join(
                    f"{r['name']}: run {r['id']} avg {r['avgScore']:.2f}, "
                    f"{r['completed']}/{r['total']} completed"
                    for r in data["results"]
                )
            )
            print(f"\n(session took {time.perf_counter() - started:.1f}s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="Keep the project folder.")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="cobalt-mcp-transcript-"))
    with FakeProvider() as provider:
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("COBALT_", "OPENAI_", "ANTHROPIC_", "DJANGO_"))
        }
        env.update(
            OPENAI_BASE_URL=provider.openai_base_url,
            OPENAI_API_KEY="sk-transcript-key",
            PYTHONPATH=str(REPO),
        )
        print(f"$ cobalt init   (in {folder})")
        subprocess.run(
            [sys.executable, "-m", "cobalt_cli", "init"], cwd=folder, env=env, check=True
        )
        try:
            anyio.run(session_transcript, folder, env)
        finally:
            if args.keep:
                print(f"\nproject kept at {folder}")
            else:
                shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
