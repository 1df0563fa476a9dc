"""Conversations: scripted and simulated users (the fake provider plays the simulator through
the SDK), per-turn scoring, `turns` / `goal-reached`, errors on a turn, team mode."""

from __future__ import annotations

import json

import pytest

from cobalt import Dataset, Evaluator, experiment
from cobalt_app.models import ItemResult, Run
from cobalt_app.selectors import item_trace
from tests.helpers import define, execute_one
from tests.team_harness import Team

pytestmark = pytest.mark.django_db(transaction=True)


def items(run: Run) -> dict[str, ItemResult]:
    return {row.item_key: row for row in ItemResult.objects.filter(run=run)}


def support_bot(ctx):
    """Answers each user message; its reply names the turn and what it was asked."""
    last = ctx.messages[-1]["content"]
    assert ctx.messages[-1]["role"] == "user" and len(ctx.messages) == 2 * ctx.turn - 1
    return {"output": f"turn {ctx.turn}: about {last!r}", "metadata": {"tokens": 10}}


def test_scripted_conversations_of_1_3_and_10_turns_keep_their_transcripts(project):
    turns = {"one": 1, "three": 3, "ten": 10}
    dataset = Dataset(
        items=[
            {"id": key, "turns": [f"{key} message {n}" for n in range(1, count + 1)]}
            for key, count in turns.items()
        ]
    )
    definition = define(
        "scripted",
        dataset,
        support_bot,
        evaluators=[Evaluator(name="turns", type="turns", min_turns=1, max_turns=5)],
        conversation=True,
        max_turns=10,
        concurrency=3,
    )
    run = execute_one(project, definition)
    rows = items(run)
    for key, count in turns.items():
        row = rows[key]
        assert row.status == "ok"
        assert len(row.output) == 2 * count
        assert row.output[-2:] == [
            {"role": "user", "content": f"{key} message {count}"},
            {"role": "assistant", "content": f"turn {count}: about '{key} message {count}'"},
        ]
        assert row.metadata["conversation"] == {"turns": count, "ended": "script"}
        assert row.tokens == 10 * count  # the agent's tokens over every turn
    scores = {key: rows[key].evaluations.get().score for key in turns}
    assert scores == {"one": 1.0, "three": 1.0, "ten": 0.0}
    assert rows["ten"].evaluations.get().reason == "10 turns (expected 1..5)"


def test_per_turn_scoring_records_the_mean_and_names_the_worst_turn(project):
    def polite(ctx):
        return {"score": 0.0 if "turn 2" in ctx.output else 1.0, "reason": ctx.output[:6]}

    definition = define(
        "per-turn",
        Dataset(items=[{"id": "a", "turns": ["hi", "where is my order?", "thanks"]}]),
        support_bot,
        evaluators=[
            Evaluator(name="polite", type="function", fn=polite, per_turn=True),
            Evaluator(  # a bare score: no reason to quote after the worst turn
                name="bare", type="function", fn=lambda ctx: 0.5, per_turn=True
            ),
            Evaluator(name="whole", type="contains", value="turn 3"),
        ],
        conversation=True,
    )
    run = execute_one(project, definition)
    evaluations = {e.evaluator: e for e in items(run)["a"].evaluations.all()}
    assert evaluations["polite"].score == pytest.approx(2 / 3)
    assert evaluations["polite"].reason == (
        "mean of 3 turns [1.00, 0.00, 1.00]; worst: turn 2 (0.00): turn 2"
    )
    assert evaluations["bare"].reason == "mean of 3 turns [0.50, 0.50, 0.50]; worst: turn 1 (0.50)"
    assert evaluations["whole"].score == 1.0  # the transcript as a whole contains it


def test_a_judge_reads_the_transcript_and_the_last_reply(project, fake_provider):
    definition = define(
        "judged",
        Dataset(items=[{"id": "a", "turns": ["hello", "bye"]}]),
        support_bot,
        evaluators=[
            Evaluator(
                name="judge",
                prompt="Conversation:\n{{transcript}}\nLast: {{last_reply}} [[score:0.7]]",
            )
        ],
        conversation=True,
    )
    run = execute_one(project, definition)
    assert items(run)["a"].evaluations.get().score == 0.7
    (request,) = [r for r in fake_provider.requests if "Conversation:" in json.dumps(r)]
    prompt = json.dumps(request["json"])
    assert "user: hello\\nassistant: turn 1: about 'hello'\\nuser: bye" in prompt
    assert "Last: turn 2: about 'bye'" in prompt


def simulated(key: str, script: list, **user) -> dict:
    return {
        "id": key,
        "user": {
            "goal": f"{key}: get a refund",
            "persona": f"[[turns:{json.dumps(script)}]]",
            **user,
        },
    }


def test_simulated_users_reach_their_goal_give_up_or_run_out_of_turns(project, fake_provider):
    reached = [
        {"message": "I want a refund", "done": False},
        {"message": "order 42", "done": False},
        {"done": True, "goal_reached": True, "reason": "refund granted"},
    ]
    gives_up = [{"message": "refund?", "done": False}, {"done": True, "goal_reached": False}]
    endless = [{"message": "and again", "done": False}]
    dataset = Dataset(
        items=[
            simulated("reached", reached),
            simulated("gives-up", gives_up),
            simulated("endless", endless, max_turns=4),
        ]
    )
    definition = define(
        "simulated",
        dataset,
        support_bot,
        evaluators=[Evaluator(name="goal", type="goal-reached")],
        conversation=True,
        concurrency=3,
    )
    run = execute_one(project, definition)
    rows = items(run)
    assert [m["content"] for m in rows["reached"].output if m["role"] == "user"] == [
        "I want a refund",
        "order 42",
    ]
    info = rows["reached"].metadata["conversation"]
    assert info["turns"] == 2 and info["ended"] == "goal" and info["goalReached"] is True
    assert info["simulatorTokens"] > 0
    assert rows["gives-up"].metadata["conversation"]["ended"] == "gave-up"
    assert rows["endless"].metadata["conversation"]["turns"] == 4
    assert rows["endless"].metadata["conversation"]["ended"] == "max_turns"
    goal = {key: row.evaluations.get() for key, row in rows.items()}
    assert (goal["reached"].score, goal["reached"].reason) == (1.0, "refund granted")
    assert goal["gives-up"].score == 0.0
    assert goal["endless"].reason == "no verdict: stopped at 4 turns"
    # The simulator's tokens are judge tokens; the agent's 10 per turn are the agent's.
    assert run.summary["agentTokens"] == 10 * (2 + 1 + 4)
    assert run.summary["judgeTokens"] >= sum(
        row.metadata["conversation"]["simulatorTokens"] for row in rows.values()
    )


def test_a_simulator_reply_that_is_not_json_is_retried_then_an_error(project, fake_provider):
    definition = define(
        "bad-simulator",
        Dataset(items=[simulated("bad", [{"message": "hi", "done": False}, "I refuse to JSON"])]),
        support_bot,
        conversation=True,
    )
    run = execute_one(project, definition)
    row = items(run)["bad"]
    assert row.status == "error"
    assert row.error.startswith("turn 2: the simulated user did not answer JSON")
    assert "'I refuse to JSON'" in row.error
    assert len(row.output) == 2  # the first turn is kept
    simulator_calls = [r for r in fake_provider.requests if "bad: get a refund" in json.dumps(r)]
    assert len(simulator_calls) == 3  # the opening, then turn 2 and its one retry


def test_a_runner_that_raises_on_turn_3_is_an_error_naming_the_turn_with_the_transcript(project):
    def breaks(ctx):
        if ctx.turn == 3:
            raise RuntimeError("the bot crashed")
        return f"reply {ctx.turn}"

    definition = define(
        "breaks",
        Dataset(items=[{"id": "a", "turns": ["1", "2", "3", "4"]}]),
        breaks,
        conversation=True,
    )
    run = execute_one(project, definition)
    row = items(run)["a"]
    assert row.status == "error"
    assert row.error == "turn 3: RuntimeError: the bot crashed"
    assert "Traceback" in row.traceback
    assert [m["content"] for m in row.output] == ["1", "reply 1", "2", "reply 2", "3"]
    assert row.metadata["conversation"]["ended"] == "error"


def test_conversation_items_need_turns_or_a_user():
    with pytest.raises(ValueError, match=r"item #2: a conversation item needs `turns`"):
        experiment(
            "x",
            Dataset(items=[{"turns": ["hi"]}, {"input": "no conversation"}]),
            support_bot,
            conversation=True,
        )


def test_team_mode_plays_conversations_on_a_worker(team: Team):
    (team.folder / "experiments" / "chat.cobalt.py").write_text(
        "from cobalt import Dataset, Evaluator, experiment\n\n"
        "@experiment('chat', Dataset(items=[{'id': f'c{i}', 'turns': ['hi', 'more']} "
        "for i in range(4)]), conversation=True, "
        "evaluators=[Evaluator(name='turns', type='turns', max_turns=2)])\n"
        "async def run(ctx):\n"
        "    return f'answer {ctx.turn} to {ctx.messages[-1][\"content\"]}'\n"
    )
    team.start_worker()
    result = team.cli("run")
    assert result.returncode == 0, result.stdout + result.stderr
    run_id = team.latest_run()
    rows = team.services.query(
        "SELECT output::text, metadata->'conversation'->>'turns' FROM cobalt_app_itemresult "
        "WHERE run_id = %s",
        [run_id],
    )
    assert len(rows) == 4
    for output, count in rows:
        assert json.loads(output)[-1] == {"role": "assistant", "content": "answer 2 to more"}
        assert count == "2"


def test_a_turn_past_its_timeout_is_a_timeout_naming_the_turn_and_keeps_the_transcript(project):
    import asyncio

    async def slow_third(ctx):
        if ctx.turn == 3:
            await asyncio.sleep(30)
        return f"reply {ctx.turn}"

    definition = define(
        "slow-turn",
        Dataset(items=[{"id": "a", "turns": ["1", "2", "3"]}]),
        slow_third,
        conversation=True,
        turn_timeout=0.2,
        timeout=20,
    )
    run = execute_one(project, definition)
    row = items(run)["a"]
    assert row.status == "timeout"
    assert row.error == "turn 3 timed out after 0.2s (the runner was cancelled)"
    assert [m["content"] for m in row.output] == ["1", "reply 1", "2", "reply 2", "3"]
    assert row.metadata["conversation"]["ended"] == "timeout"


def test_each_turn_is_a_step_of_the_trace_holding_the_agents_model_calls(project, fake_provider):
    import openai

    client = openai.OpenAI(base_url=fake_provider.openai_base_url, api_key="agent-key")

    def bot(ctx):
        reply = client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": f"ECHO: bot turn {ctx.turn}"}],
        )
        return reply.choices[0].message.content

    script = [
        {"message": "hello", "done": False},
        {"message": "more", "done": False},
        {"done": True, "goal_reached": True},
    ]
    definition = define(
        "traced-chat",
        Dataset(items=[simulated("traced", script)]),
        bot,
        conversation=True,
    )
    run = execute_one(project, definition)
    row = items(run)["traced"]
    assert row.status == "ok", row.error
    trace = item_trace(row.id)
    turns = [(i, s) for i, s in enumerate(trace) if s["kind"] == "agent"]
    assert [s["name"] for _, s in turns] == ["turn 1", "turn 2"]
    assert [s["input"] for _, s in turns] == ["hello", "more"]
    llm = [s for s in trace if s["kind"] == "llm"]
    assert len(llm) == 2  # the bot's two calls; the simulated user's three are not its steps
    assert [s["parent"] for s in llm] == [i for i, _ in turns]
    assert row.tokens > 0  # counted from the trace: the bot reports no usage
