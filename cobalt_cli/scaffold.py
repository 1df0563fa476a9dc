"""Files written by `cobalt init`: a config, an offline example experiment and its dataset."""

from __future__ import annotations

from pathlib import Path

CONFIG = """\
# Cobalt configuration — every key is optional. What each does: docs/concepts/configuration.md
# in Cobalt's checkout (or its docs site).
test_dir = "experiments"
concurrency = 5
timeout = 30            # seconds per item

[judge]                 # the LLM that scores outputs for llm-judge evaluators
provider = "openai"     # or "anthropic"
model = "gpt-4o-mini"
# base_url = "http://localhost:11434/v1"   # any OpenAI-compatible server (Ollama, vLLM, …)
# The key comes from OPENAI_API_KEY / ANTHROPIC_API_KEY; never write it here.

[cache]
enabled = true
ttl = "7d"

# [ci.thresholds.exact]
# avg = 0.8
"""

DATASET = """\
{"id": "capital-france", "input": "What is the capital of France?", "expected_output": "Paris"}
{"id": "capital-japan", "input": "What is the capital of Japan?", "expected_output": "Tokyo"}
{"id": "capital-italy", "input": "What is the capital of Italy?", "expected_output": "Rome"}
{"id": "capital-canada", "input": "What is the capital of Canada?", "expected_output": "Ottawa"}
{"id": "capital-australia", "input": "Capital of Australia?", "expected_output": "Canberra"}
{"id": "capital-brazil", "input": "What is the capital of Brazil?", "expected_output": "Brasília"}
{"id": "math-add", "input": "What is 12 + 30?", "expected_output": "42"}
{"id": "greeting", "input": "Say hello in Spanish.", "expected_output": "Hola"}
"""

EXPERIMENT = '''\
"""Example Cobalt experiment. It runs offline: no API key needed.

Run it with `cobalt run`, or `python experiments/example.cobalt.py`.
Replace `answer()` with a call to your own agent.
"""

import re

from cobalt import Dataset, Evaluator, experiment

dataset = Dataset.from_file("datasets/example.jsonl")

KNOWN_CAPITALS = {
    "france": "Paris",
    "japan": "Tokyo",
    "italy": "Rome",
    "canada": "Toronto",  # a deliberate mistake, so you can see a low score
    "australia": "Sydney",  # another one
}


def answer(question: str) -> str:
    """A tiny rule-based 'agent'. Swap in your LLM agent here."""
    match = re.search(r"capital of (\\w+)", question, re.IGNORECASE)
    if match:
        return KNOWN_CAPITALS.get(match.group(1).lower(), "I don't know")
    numbers = [int(n) for n in re.findall(r"\\d+", question)]
    if "+" in question and numbers:
        return str(sum(numbers))
    return "I don't know"


def mentions_expected(ctx):
    expected = ctx.item["expected_output"].lower()
    found = expected in str(ctx.output).lower()
    return {"score": float(found), "reason": "mentions the answer" if found else "answer missing"}


evaluators = [
    Evaluator(name="exact", type="exact-match", field="expected_output"),
    Evaluator(name="mentions-answer", type="function", fn=mentions_expected),
    # An LLM judge (needs OPENAI_API_KEY):
    # Evaluator(
    #     name="relevance",
    #     prompt="Question: {{input}}\\nAnswer: {{output}}\\n"
    #     "Rate from 0 to 1 how well the answer addresses the question.",
    # ),
]


@experiment("example-qa", dataset, evaluators=evaluators, tags=["example"])
async def run(ctx):
    output = answer(ctx.item["input"])
    return {"output": output, "metadata": {"model": "rule-based"}}
'''


def write_if_absent(path: Path, content: str) -> bool:
    if path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content, encoding="utf-8")
    return True


def ensure_gitignored(project_dir: Path, entry: str = ".cobalt/") -> bool:
    gitignore = project_dir / ".gitignore"
    text = gitignore.read_text(encoding="utf-8") if gitignore.exists() else ""
    lines = [line.strip() for line in text.splitlines()]
    if entry in lines or entry.rstrip("/") in lines or "/" + entry in lines:
        return False
    prefix = "" if not text or text.endswith("\n") else "\n"
    with gitignore.open("a", encoding="utf-8") as fh:
        fh.write(f"{prefix}{entry}\n")
    return True


def scaffold(project_dir: Path) -> list[tuple[str, bool]]:
    """Write the starter files; existing files are left alone. Returns (path, written)."""
    project_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for relative, content in (
        ("cobalt.toml", CONFIG),
        ("datasets/example.jsonl", DATASET),
        ("experiments/example.cobalt.py", EXPERIMENT),
    ):
        written.append((relative, write_if_absent(project_dir / relative, content)))
    (project_dir / ".cobalt").mkdir(exist_ok=True)
    written.append((".gitignore (.cobalt/)", ensure_gitignored(project_dir)))
    return written
