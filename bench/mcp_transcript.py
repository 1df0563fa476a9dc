"""A coding agent's MCP session on a realistic experiment, printed as a transcript.

A 300-item ticket-routing experiment whose agent gets 60 scattered tickets wrong (and writes
long answers): cobalt_run → read every failing item (cobalt_results, paged) → fix the agent →
cobalt_run → cobalt_compare → cancel a long run. Every response's size is printed in tokens
(at one per three bytes of the JSON the client received, as the server counts) against the
server's budget. The judge LLM is the fake provider of the tests.

    python bench/mcp_transcript.py [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.fake_provider import FakeProvider  # noqa: E402

BUDGET = 20_000
ITEMS = 300

CONFIG = 'test_dir = "experiments"\n\n[mcp]\nresult_tokens = 20000\n'

EXPERIMENT = f"""\
from agents.router import route
from cobalt import Dataset, Evaluator, experiment

TEAMS = ["billing", "shipping", "accounts"]
dataset = Dataset(items=[
    {{"id": f"ticket-{{n:03d}}", "input": f"ticket {{n}}: a question about {{TEAMS[n % 3]}}",
      "number": n, "expected": TEAMS[n % 3]}}
    for n in range({ITEMS})
])


def right_team(ctx):
    team = ctx.output["team"]
    good = team == ctx.item["expected"]
    return {{"score": float(good), "reason": f"routed to {{team}}, expected {{ctx.item['expected']}}"}}


evaluators = [
    Evaluator(name="right-team", type="function", fn=right_team),
    Evaluator(name="tone", prompt="Reply: {{{{output}}}} [[score:0.9]] Rate the tone from 0 to 1."),
]


@experiment("ticket-routing", dataset, evaluators=evaluators, concurrency=20)
def run(ctx):
    return route(ctx.item["number"], ctx.item["input"])
"""

AGENT = """\
TEAMS = ["billing", "shipping", "accounts"]


def route(number, text):
    team = TEAMS[number % 3]
    if number % 5 == 2:  # BUG: these tickets go to the wrong team
        team = TEAMS[(number + 1) % 3]
    reply = f"Thanks for your message about {team}. " + "Here is what happens next. " * 40
    return {"team": team, "reply": reply}
"""

LONG_EXPERIMENT = """\
from openai import AsyncOpenAI
from cobalt import Dataset, Evaluator, experiment

client = AsyncOpenAI()


def answered(ctx):
    return {"score": 1.0, "reason": "answered"}


@experiment("long-run", Dataset(items=[{"id": f"q{n}", "input": f"question {n}"} for n in range(200)]),
            evaluators=[Evaluator(name="answered", type="function", fn=answered)], concurrency=2)
async def run(ctx):
    messages = [{"role": "user", "content": "ECHO: " + ctx.item["input"]}]
    reply = await client.chat.completions.create(model="fake", messages=messages)
    return reply.choices[0].message.content
"""


def size(result: Any) -> int:
    return len(result.model_dump_json(by_alias=True, exclude_none=True).encode()) // 3


sizes: list[tuple[str, int]] = []


def show(title: str, payload: object = None) -> None:
    print(f"\n>>> {title}" + (f" {json.dumps(payload)}" if payload is not None else ""))


def reply(result: Any, step: str, limit: int = 14) -> None:
    tokens = size(result)
    sizes.append((step, tokens))
    lines = result.content[0].text.splitlines() if result.content else []
    for line in lines[:limit]:
        print(f"<<< {line[:160]}")
    if len(lines) > limit:
        print(f"<<< … ({len(lines) - limit} more lines)")
    flag = "" if tokens <= BUDGET else "  OVER BUDGET"
    print(f"    [{tokens:,} tokens{' · error' if result.is_error else ''}]{flag}")


async def call(session: ClientSession, tool: str, arguments: dict[str, Any], step: str) -> Any:
    show(f"tools/call {tool}", arguments)
    result = await session.call_tool(tool, arguments)
    reply(result, step)
    return result


async def read_failures(session: ClientSession, run_id: str) -> int:
    """Every failing item, a page at a time."""
    arguments: dict[str, Any] | None = {"runId": run_id, "status": "failing", "limit": 25}
    read = 0
    while arguments is not None:
        page = await call(session, "cobalt_results", arguments, "cobalt_results failing page")
        read += page.structured_content["page"]["returned"]
        following = page.structured_content["page"]["nextOffset"]
        arguments = {**arguments, "offset": following} if following is not None else None
    return read


async def cancel_long_run(session: ClientSession, provider: FakeProvider) -> None:
    provider.latency = 0.2
    before = provider.request_count("/v1/chat")
    five = anyio.Event()

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        if value >= 5:
            five.set()

    async def long_call() -> None:
        await session.call_tool("cobalt_run", {"filter": "long-run"}, progress_callback=on_progress)

    show("tools/call cobalt_run", {"filter": "long-run"})
    async with anyio.create_task_group() as group:
        group.start_soon(long_call)
        await five.wait()
        print("(5 of 200 items done: the client cancels the call — notifications/cancelled)")
        group.cancel_scope.cancel()
    cancelled_at = time.perf_counter()
    while True:
        listing = await session.call_tool("cobalt_results", {"experiment": "long-run", "limit": 1})
        if listing.structured_content["runs"][0]["status"] == "cancelled":
            break
        await anyio.sleep(0.05)
    print(f"(run cancelled and finalised {time.perf_counter() - cancelled_at:.2f}s later)")
    calls = provider.request_count("/v1/chat") - before
    run_id = listing.structured_content["runs"][0]["id"]
    done = await call(session, "cobalt_results", {"runId": run_id}, "cobalt_results cancelled")
    counts = done.structured_content["itemCounts"]
    print(f"    ({counts['passing']} items ran, {counts['notRun']} cancelled; {calls} agent calls)")
    provider.latency = 0.0


async def transcript(project: Path, env: dict[str, str], provider: FakeProvider) -> None:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "cobalt_cli", "mcp"], cwd=str(project), env=env
    )
    with (project / "mcp-server.log").open("w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            started = time.perf_counter()
            init = await session.initialize()
            show("initialize")
            print(f"<<< server {init.server_info.name} {init.server_info.version}")
            tools = await session.list_tools()
            show("tools/list")
            for tool in tools.tools:
                print(f"<<< {tool.name}({', '.join(tool.input_schema['properties'])})")

            first = await call(
                session, "cobalt_run", {"filter": "ticket-routing"}, "cobalt_run (60 failing)"
            )
            document = first.structured_content["runs"][0]
            counts = document["itemCounts"]
            print(
                f"    ({counts['failingShown']} of {counts['failing']} failing items and "
                f"{counts['shown'] - counts['failingShown']} of {counts['passing']} passing ones "
                "in the structured content)"
            )
            read = await read_failures(session, document["id"])
            print(f"    (read {read} failing items in pages)")

            agent = project / "agents" / "router.py"
            agent.write_text(agent.read_text().replace("if number % 5 == 2:", "if False:"))
            print("\n(the agent is fixed: agents/router.py no longer misroutes)")
            second = await call(
                session, "cobalt_run", {"filter": "ticket-routing"}, "cobalt_run (fixed)"
            )
            run_b = second.structured_content["runs"][0]["id"]
            await call(
                session, "cobalt_compare", {"runA": document["id"], "runB": run_b}, "cobalt_compare"
            )
            await cancel_long_run(session, provider)
            print(f"\n(session took {time.perf_counter() - started:.1f}s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="Keep the project folder.")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="cobalt-mcp-transcript-"))
    (folder / "cobalt.toml").write_text(CONFIG)
    (folder / "experiments").mkdir()
    (folder / "agents").mkdir()
    (folder / "experiments" / "tickets.cobalt.py").write_text(EXPERIMENT)
    (folder / "experiments" / "long.cobalt.py").write_text(LONG_EXPERIMENT)
    (folder / "agents" / "__init__.py").write_text("")  # a regular package, like the SDK's
    (folder / "agents" / "router.py").write_text(AGENT)
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
        print(f"(project {folder}: {ITEMS} tickets, 60 misrouted; budget {BUDGET:,} tokens)")
        try:
            anyio.run(transcript, folder, env, provider)
        finally:
            if args.keep:
                print(f"\nproject kept at {folder}")
            else:
                shutil.rmtree(folder, ignore_errors=True)
    print("\nResponse sizes (tokens, budget 20,000):")
    for step, tokens in sizes:
        print(f"  {tokens:>7,}  {step}")
    over = [step for step, tokens in sizes if tokens > BUDGET]
    print("all within budget" if not over else f"OVER BUDGET: {over}")
    sys.exit(1 if over else 0)


if __name__ == "__main__":
    main()
