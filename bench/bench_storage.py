"""Bytes per item of traces and recordings (issue 41), before and after compact storage.

    python bench/bench_storage.py [--items 10000] [--batch 1000]

Each item is one run of a realistic tool-using support agent: a ~2 KB system prompt and six
tool definitions identical across items, a per-item question, three tool calls with their
arguments and results, model responses with usage. Its trace has 10 steps in the stored
shape of `trace_spans` (inputs and outputs cut to the default 2,000 characters), its
recording the four model exchanges as `recordings` keeps them (request body, response
headers and body).

Two SQLite files are filled with the same payloads:
- before: the tables as migration 0008 left them, rows as they were written (a trace's JSON
  text from `storable`, a recording's `exchanges` as Django's JSONField writes it);
- after: through the real writes, `trace_store.write` (in batches of `--batch`, like the
  recorder) and `recording_store.save` (one per item, like `recordings`).
Bytes per item: the growth of the file (`page_count * page_size` after `VACUUM`) divided by
the items, for traces and recordings apart (the items' own rows are in the baseline).
Also: the write and read time per item after, and the ratio. Target: after <= 25% of before.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

RULES = [
    "Never reveal internal order notes, warehouse codes or employee names.",
    "Verify the customer's identity with the order number and the email on file before "
    "discussing an order's details.",
    "Refunds over 200 EUR need a supervisor: say so and open a ticket with open_ticket.",
    "Use search_orders before answering any question about an order, every time.",
    "Quote the return policy with lookup_policy; never paraphrase it from memory.",
    "Shipping estimates come from get_shipping_estimate, never from guesses.",
    "If a product is out of stock, offer the two closest alternatives that are in stock.",
    "Answer in the customer's language; default to English when unsure.",
    "Do not promise delivery dates the carrier has not confirmed.",
    "When a tool fails, apologise, say what you tried and offer a human agent.",
    "Keep answers under 120 words unless the customer asks for detail.",
    "Summarise what you did at the end of every conversation.",
    "For damaged items ask for a photo and open a claim with open_ticket.",
    "Gift cards cannot be refunded to a card; offer store credit instead.",
    "Prices include VAT in the EU and exclude sales tax in the US.",
    "Loyalty points are credited 14 days after delivery, not before.",
    "International returns are free only for Gold members; others pay 9.90 EUR.",
    "Never ask for full card numbers, passwords or one-time codes.",
    "Escalate threats, legal claims and press enquiries to a human at once.",
    "Do not discuss competitors' prices or products.",
    "If the customer is upset, acknowledge it before anything else.",
    "Orders can be changed until they are packed; after that, only returned.",
    "Pre-orders ship on the release date shown on the product page, not before.",
    "Never share tracking links of another customer's order, even with the same address.",
    "Bulk orders of more than 20 units go to the business team: open a ticket.",
    "Warranty claims need the order number and a description of the defect.",
]
SYSTEM_PROMPT = (
    "You are Acme Outfitters' customer support agent. You help customers with orders, returns, "
    "shipping and product questions. Be polite, concise and accurate.\n"
    + "\n".join(f"{n}. {rule}" for n, rule in enumerate(RULES, start=1))
)
STRING = {"type": "string"}


def _tool(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": False,
            },
        },
    }


TOOLS = [
    _tool(
        "search_orders",
        "Find a customer's orders by order number or email; returns status, items and dates.",
        {"order_number": {**STRING, "description": "e.g. AC-12345"}, "email": STRING},
        ["order_number"],
    ),
    _tool(
        "get_order_status",
        "The carrier status of one order: in transit, delivered or delayed, with its events.",
        {"order_number": STRING, "include_events": {"type": "boolean"}},
        ["order_number"],
    ),
    _tool(
        "lookup_policy",
        "The text of a store policy (returns, shipping, warranty, gift cards, loyalty).",
        {"topic": {"type": "string", "enum": ["returns", "shipping", "warranty", "gift_cards"]}},
        ["topic"],
    ),
    _tool(
        "get_shipping_estimate",
        "Delivery estimate in days for a destination country and a shipping method.",
        {"country": {**STRING, "description": "ISO 3166 alpha-2"}, "method": STRING},
        ["country", "method"],
    ),
    _tool(
        "check_stock",
        "Units in stock per warehouse for a product SKU, and the restock date if none.",
        {"sku": STRING},
        ["sku"],
    ),
    _tool(
        "open_ticket",
        "Open a support ticket for a human agent with a summary and a priority.",
        {"summary": STRING, "priority": {"type": "string", "enum": ["low", "normal", "high"]}},
        ["summary", "priority"],
    ),
]
PRODUCTS = ["trail shoes", "rain jacket", "hiking poles", "sleeping bag", "tent", "headlamp"]
CITIES = ["Leipzig", "Paris", "Lyon", "Hamburg", "Utrecht", "Chicago"]


def _conversation(i: int) -> tuple[random.Random, str, list, list, str]:
    rng = random.Random(i)
    order = f"AC-{10000 + i}"
    product = rng.choice(PRODUCTS)
    country = rng.choice(["DE", "FR", "US", "NL"])
    question = (
        f"Hi, I ordered the {product} last week (order {order}) and it still hasn't arrived. "
        f"Can I return it if it comes late, and when will it be here? I live in {country}."
    )
    price = round(rng.uniform(20, 300), 2)
    results = [
        {
            "orders": [
                {
                    "order_number": order,
                    "email": f"customer{i}@example.com",
                    "status": "in_transit",
                    "placed": f"2026-11-{rng.randint(1, 20):02d}",
                    "items": [
                        {
                            "sku": f"SKU-{rng.randint(1000, 9999)}",
                            "name": product,
                            "qty": 1,
                            "price": price,
                        }
                    ],
                    "total": price,
                }
            ]
        },
        {
            "order_number": order,
            "carrier": rng.choice(["DHL", "UPS", "La Poste"]),
            "status": "delayed",
            "events": [
                {
                    "at": f"2026-11-{day:02d}T{rng.randint(6, 20):02d}:00:00Z",
                    "where": rng.choice(CITIES),
                    "what": rng.choice(["picked up", "in transit", "at hub", "delayed: weather"]),
                }
                for day in range(21, 21 + rng.randint(2, 5))
            ],
        },
        {
            "topic": "returns",
            "text": "Items can be returned within 30 days of delivery in their original "
            "condition. Late deliveries can be refused at the door or returned free of charge. "
            f"Refunds are issued within {rng.choice([5, 7, 10])} business days to the original "
            "payment method.",
        },
    ]
    calls = [
        ("search_orders", {"order_number": order}),
        ("get_order_status", {"order_number": order, "include_events": True}),
        ("lookup_policy", {"topic": "returns"}),
    ]
    answer = (
        f"Sorry about the delay with order {order}! The carrier reports it as delayed; it "
        f"should arrive within {rng.randint(2, 6)} days. If it comes late you can return it free "
        "of charge within 30 days, and the refund reaches your card within a week. I checked "
        "your order, the carrier's status and our return policy."
    )
    return rng, question, calls, results, answer


def exchanges(i: int) -> list[dict[str, Any]]:
    """Item `i`'s four model exchanges, as `recordings` stores them."""
    rng, question, calls, results, answer = _conversation(i)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": question},
    ]
    recorded = []
    for n in range(4):
        body = {
            "model": "gpt-4o-mini",
            "messages": [dict(m) for m in messages],
            "tools": TOOLS,
            "tool_choice": "auto",
            "temperature": 0,
        }
        call_id = f"call_{rng.getrandbits(96):024x}"
        if n < 3:
            name, arguments = calls[n]
            function = {"name": name, "arguments": json.dumps(arguments)}
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": call_id, "type": "function", "function": function}],
            }
        else:
            message = {"role": "assistant", "content": answer, "refusal": None}
        prompt = 1100 + 150 * n + rng.randint(0, 40)
        completion = rng.randint(20, 60) if n < 3 else rng.randint(80, 140)
        response = {
            "id": f"chatcmpl-{rng.getrandbits(128):032x}",
            "object": "chat.completion",
            "created": 1795000000 + i * 4 + n,
            "model": "gpt-4o-mini-2024-07-18",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": "tool_calls" if n < 3 else "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": 1024, "audio_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
            },
            "service_tier": "default",
            "system_fingerprint": "fp_0ba0d124f1",
        }
        headers = {
            "content-type": "application/json",
            "x-request-id": f"req_{rng.getrandbits(128):032x}",
            "openai-processing-ms": str(rng.randint(300, 1800)),
            "openai-version": "2020-10-01",
            "x-ratelimit-remaining-tokens": str(rng.randint(100000, 200000)),
            "x-ratelimit-remaining-requests": str(rng.randint(4000, 5000)),
        }
        recorded.append(
            {
                "request": {
                    "method": "POST",
                    "url": "https://api.openai.com/v1/chat/completions",
                    "body": body,
                },
                "response": {
                    "status": 200,
                    "headers": headers,
                    "body": json.dumps(response, indent=2),
                },
            }
        )
        messages.append(message)
        if n < 3:
            messages.append(
                {"role": "tool", "tool_call_id": call_id, "content": json.dumps(results[n])}
            )
    return recorded


def trace_steps(i: int) -> list[dict[str, Any]]:
    """Item `i`'s 10 trace steps (agent, retrieval, 4 model calls, 3 tools, a guardrail), as
    `trace_spans` stores them."""
    from cobalt_app.trace_spans import DEFAULT_MAX_CHARS, shown

    rng, question, calls, results, answer = _conversation(i)

    def step(name, kind, start, duration, text_in, text_out, **usage) -> dict[str, Any]:
        return {
            "name": name,
            "kind": kind,
            "parent": 0 if kind != "agent" else None,
            "startMs": round(start, 3),
            "durationMs": round(duration, 3),
            "model": usage.get("model"),
            "inputTokens": usage.get("inputTokens"),
            "outputTokens": usage.get("outputTokens"),
            "cost": usage.get("cost"),
            "status": "ok",
            "error": None,
            "input": shown(text_in, DEFAULT_MAX_CHARS),
            "output": shown(text_out, DEFAULT_MAX_CHARS),
        }

    documents = [
        {"id": f"kb-{rng.randint(1, 400)}", "score": round(rng.random(), 3)} for _ in range(3)
    ]
    steps = [
        step("support-agent", "agent", 0.0, 0.0, question, answer),
        step("kb_search", "retrieval", 0.4, rng.uniform(20, 80), question, documents),
    ]
    clock = 90.0
    for n, exchange in enumerate(exchanges(i)):
        response = json.loads(exchange["response"]["body"])
        usage = response["usage"]
        duration = rng.uniform(300, 1800)
        steps.append(
            step(
                "ChatCompletion",
                "llm",
                clock,
                duration,
                json.dumps(exchange["request"]["body"]),
                response["choices"][0]["message"],
                model=response["model"],
                inputTokens=usage["prompt_tokens"],
                outputTokens=usage["completion_tokens"],
                cost=round(usage["prompt_tokens"] * 1.5e-7 + usage["completion_tokens"] * 6e-7, 8),
            )
        )
        clock += duration
        if n < 3:
            name, arguments = calls[n]
            duration = rng.uniform(5, 200)
            steps.append(step(name, "tool", clock, duration, arguments, results[n]))
            clock += duration
    steps.append(step("guardrail", "other", clock, rng.uniform(1, 5), answer, {"allowed": True}))
    steps[0]["durationMs"] = round(clock, 3)
    return steps


BEFORE_SCHEMA = """
CREATE TABLE "cobalt_app_itemtrace" ("item_id" bigint NOT NULL PRIMARY KEY,
    "steps" text NOT NULL CHECK ((JSON_VALID("steps") OR "steps" IS NULL)));
CREATE TABLE "cobalt_app_recording" ("id" integer NOT NULL PRIMARY KEY AUTOINCREMENT,
    "experiment" varchar(200) NOT NULL, "item_key" varchar(200) NOT NULL,
    "run_index" integer NOT NULL,
    "exchanges" text NOT NULL CHECK ((JSON_VALID("exchanges") OR "exchanges" IS NULL)),
    "request_count" integer NOT NULL, "recorded_by" varchar(32) NOT NULL,
    "recorded_at" datetime NOT NULL,
    CONSTRAINT "recording_item" UNIQUE ("experiment", "item_key", "run_index"));
CREATE INDEX "recording_recorded_at" ON "cobalt_app_recording" ("recorded_at");
"""


def file_size(path: Path) -> int:
    """The database's size after VACUUM: page_count * page_size."""
    with sqlite3.connect(path, isolation_level=None) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        db.execute("VACUUM")
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        return pages * db.execute("PRAGMA page_size").fetchone()[0]


def before(path: Path, n: int, payloads: list[tuple[str, list]]) -> tuple[int, int]:
    """Bytes of traces and of recordings, as stored before (JSON text)."""
    with sqlite3.connect(path, isolation_level=None) as db:
        db.executescript(BEFORE_SCHEMA)
    empty = file_size(path)
    with sqlite3.connect(path) as db:
        db.executemany(
            "INSERT INTO cobalt_app_itemtrace (item_id, steps) VALUES (?, ?)",
            [(i + 1, text) for i, (text, _) in enumerate(payloads)],
        )
    traced = file_size(path)
    with sqlite3.connect(path) as db:
        db.executemany(
            "INSERT INTO cobalt_app_recording (experiment, item_key, run_index, exchanges, "
            "request_count, recorded_by, recorded_at) VALUES ('support', ?, 0, ?, 4, 'r1', "
            "'2026-11-26 10:00:00')",
            [(f"item-{i}", json.dumps(exchanges(i))) for i in range(n)],  # as JSONField does
        )
    return traced - empty, file_size(path) - traced


def _timed(work) -> tuple[float, float]:
    """Wall and CPU seconds (this process) of `work()`."""
    wall, cpu = time.perf_counter(), time.process_time()
    work()
    return time.perf_counter() - wall, time.process_time() - cpu


def after(path: Path, n: int, batch: int, payloads: list[tuple[str, list]]) -> dict[str, Any]:
    """Bytes of traces and recordings (file growth, and the rows' own bytes) and the time
    spent, stored through the real writes."""
    from django.db import transaction

    from cobalt_app import recording_store, trace_store
    from cobalt_app.models import Blob, ItemResult, ItemTrace, Recording, Run

    run = Run.objects.create(name="support", file="support.cobalt.py")
    ItemResult.objects.bulk_create(
        [ItemResult(run=run, item_index=i, item_key=f"item-{i}", input={}) for i in range(n)],
        batch_size=2000,
    )
    ids = list(
        ItemResult.objects.filter(run=run).order_by("item_index").values_list("id", flat=True)
    )
    empty = file_size(path)

    def write_traces() -> None:
        for start in range(0, n, batch):
            with transaction.atomic():
                trace_store.write(
                    [(ids[i], *payloads[i], "") for i in range(start, min(start + batch, n))]
                )

    trace_write = _timed(write_traces)
    traced = file_size(path)
    recorded = [exchanges(i) for i in range(n)]

    def write_recordings() -> None:
        for i in range(n):
            recording_store.save(
                experiment="support",
                item_key=f"item-{i}",
                run_index=0,
                exchanges=recorded[i],
                run_id="r1",
            )

    recording_write = _timed(write_recordings)
    read: dict[int, list] = {}
    trace_read = _timed(
        lambda: [
            read.update(trace_store.read(ids[start : start + 1000])) for start in range(0, n, 1000)
        ]
    )
    assert [read[ids[i]] for i in range(n)] == [steps for _, steps in payloads]
    assert recording_store.load_experiment("support") == {
        (f"item-{i}", 0): recorded[i] for i in range(n)
    }
    return {
        "traces": traced - empty,
        "recordings": file_size(path) - traced,
        "trace rows": sum(
            len(d) + len(b) for d, b in ItemTrace.objects.values_list("data", "blobs")
        ),
        "recording rows": sum(
            len(d) + len(b) for d, b in Recording.objects.values_list("data", "blobs")
        ),
        "blobs": sum(len(d) for d in Blob.objects.values_list("data", flat=True)),
        "blob count": Blob.objects.count(),
        "trace write": trace_write,
        "trace read": trace_read,
        "recording write": recording_write,
    }


def measure(n: int, batch: int, keep: bool) -> dict[str, Any]:
    """Bytes per item before and after, and the time spent, for `n` items (Django set up in
    this process, on a database of its own)."""
    folder = Path(tempfile.mkdtemp(prefix="cobalt-bench-storage-"))
    os.environ["COBALT_SQLITE_PATH"] = str(folder / "after.db")
    os.environ["COBALT_PROJECT_DIR"] = str(folder)
    sys.path.insert(0, str(REPO))
    from cobalt_project import bootstrap

    bootstrap.setup()
    from cobalt_app import storable

    payloads = []
    for i in range(n):
        steps = trace_steps(i)
        payloads.append((json.dumps(storable.salvage(steps), ensure_ascii=False), steps))
    recording_json = sum(len(json.dumps(exchanges(i)).encode()) for i in range(min(n, 1000)))
    try:
        old_traces, old_recordings = before(folder / "before.db", n, payloads)
        new = after(folder / "after.db", n, batch, payloads)
    finally:
        if not keep:
            shutil.rmtree(folder)
    return {
        **new,
        "items": n,
        "folder": str(folder),
        "trace json": sum(len(text.encode()) for text, _ in payloads) / n,
        "recording json": recording_json / min(n, 1000),
        "before traces": old_traces,
        "before recordings": old_recordings,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=1000, help="Traces per write (recorder).")
    parser.add_argument("--keep", action="store_true", help="Keep the two database files.")
    parser.add_argument("--json", type=Path, help="Also write the figures to this file.")
    args = parser.parse_args()
    n = args.items
    new = measure(n, args.batch, args.keep)
    if args.json:
        args.json.write_text(json.dumps(new))
    print(
        f"{n:,} items; per item: trace {new['trace json']:,.0f} B of JSON (10 steps), recording "
        f"{new['recording json']:,.0f} B of JSON (4 exchanges); SQLite {sqlite3.sqlite_version}"
    )
    old_traces, old_recordings = new["before traces"], new["before recordings"]
    rows = [
        ("traces", old_traces, new["traces"], new["trace rows"]),
        ("recordings", old_recordings, new["recordings"], new["recording rows"]),
        ("both", old_traces + old_recordings, new["traces"] + new["recordings"], None),
    ]
    print(f"{'bytes per item':<16}{'before':>10}{'after':>10}{'after/before':>14}{'row data':>10}")
    for name, old, now, row in rows:
        data = f"{row / n:>10,.0f}" if row is not None else ""
        print(f"{name:<16}{old / n:>10,.0f}{now / n:>10,.0f}{now / old:>13.1%}{data}")
    print(
        f"blobs: {new['blob count']}, {new['blobs']:,} B in all (stored once, whatever --items); "
        "'after' is the file's growth: SQLite keeps a row whole on a 4 KB page, so rows of "
        "1.4-2 KB take 2 KB and rows of 2-4 KB a page"
    )
    for label, key, unit in (
        ("trace write", "trace write", f"batches of {args.batch}"),
        ("trace read", "trace read", "1,000 a query"),
        ("recording write", "recording write", "one transaction each"),
    ):
        wall, cpu = new[key]
        print(
            f"{label}: {wall / n * 1e6:,.0f} µs per item, {cpu / n * 1e6:,.0f} µs of CPU ({unit})"
        )
    if args.keep:
        print(f"files in {new['folder']}")


if __name__ == "__main__":
    main()
