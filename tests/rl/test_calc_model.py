"""The calculator devnet's model (node/rl/assets/calc-model, scripts/make_devnet_model.py --env calculator)
and the multi-turn warm start that made it: demonstrated episodes are played through the environment's own
rules, so what the model learns is exactly what a validator's replay accepts."""

from __future__ import annotations

import json

import pytest

from swarmnode.node.devnet.rl import DEVNET_CALC_TURN_TOKENS, write_products
from swarmnode.node.rl.engine import TransformersEngine
from swarmnode.node.rl.environments import calculator
from swarmnode.node.rl.environments.episodes import EpisodeRules, replay_tokens, rules_from_terms
from swarmnode.node.rl.environments.replay import FabricatedTurn
from swarmnode.node.rl.rollouts import task_prompt_ids
from swarmnode.node.rl.run import DEVNET_CALC_MODEL, devnet_dataset, devnet_eval_tasks, environment_for
from swarmnode.node.rl.tasks import read_tasks
from swarmnode.node.rl.tasks.arithmetic import DEVNET_PRODUCTS
from swarmnode.node.rl.warmstart import IGNORE, BadDemonstration, episode_example, pass_rate
from swarmnode.protocol.messages import EnvSpan

META = json.loads(DEVNET_CALC_MODEL.with_name(DEVNET_CALC_MODEL.name + ".json").read_text())


@pytest.fixture(scope="module")
def engine() -> TransformersEngine:
    return TransformersEngine.from_folder(DEVNET_CALC_MODEL)


@pytest.fixture(scope="module")
def rules(engine: TransformersEngine) -> EpisodeRules:
    """The rules the devnet's trainer states for this model and the devnet's products."""
    terms = environment_for("calculator", devnet_dataset(DEVNET_PRODUCTS), engine.tokenizer, engine.info,
                            DEVNET_CALC_TURN_TOKENS)
    return rules_from_terms(terms, DEVNET_CALC_TURN_TOKENS)


def spans_of(labels: list[int]) -> list[EnvSpan]:
    """The environment spans of an example: its runs of unsupervised labels."""
    spans: list[EnvSpan] = []
    for i, label in enumerate(labels):
        if label != IGNORE:
            continue
        if spans and spans[-1].start + spans[-1].length == i:
            spans[-1] = EnvSpan(spans[-1].start, spans[-1].length + 1)
        else:
            spans.append(EnvSpan(i, 1))
    return spans


def test_a_demonstrated_episode_is_what_a_validator_replays_with_full_reward(engine, rules) -> None:
    eos = engine.info.eos_token_ids
    for task in devnet_dataset(DEVNET_PRODUCTS)[:64]:
        turns = calculator.demonstration(task)
        prompt, tokens, labels = episode_example(engine.tokenizer, rules, task, turns)
        assert prompt == list(task_prompt_ids(task, engine.tokenizer, rules))
        spans = spans_of(list(labels))
        assert len(spans) == 1  # the tool's reply, unsupervised; the call and the answer supervised
        replayed = replay_tokens(rules, task, 0, engine.tokenizer, tokens, spans, eos)
        assert replayed.reward == 1.0
        reply = engine.tokenizer.completion_text(tokens[spans[0].start : spans[0].start + spans[0].length])
        assert reply == f"<result>{task.target}</result>"
        assert len(prompt) + len(tokens) <= engine.info.max_positions


def test_a_demonstration_that_is_not_one_whole_episode_is_refused(engine, rules) -> None:
    task = devnet_dataset(DEVNET_PRODUCTS)[0]
    call, answer = calculator.demonstration(task)
    with pytest.raises(BadDemonstration, match="not over after 1 turns"):
        episode_example(engine.tokenizer, rules, task, [call])
    with pytest.raises(BadDemonstration, match="ended after turn 0"):
        episode_example(engine.tokenizer, rules, task, [answer, answer])
    with pytest.raises(BadDemonstration, match="more than its budget"):
        episode_example(engine.tokenizer, rules, task, [call.replace("*", " * " * 8), answer])


def test_the_tool_result_in_a_demonstration_is_the_environments(engine, rules) -> None:
    """A transcript with another result is a fabrication: the labels' env span is what replay checks."""
    task = devnet_dataset(DEVNET_PRODUCTS)[1]
    _, tokens, labels = episode_example(engine.tokenizer, rules, task, calculator.demonstration(task))
    (span,) = spans_of(list(labels))
    forged = engine.tokenizer.encode(f"<result>{int(task.target) + 1}</result>")
    changed = [*tokens[: span.start], *forged, *tokens[span.start + span.length :]]
    with pytest.raises(FabricatedTurn):
        replay_tokens(rules, task, 0, engine.tokenizer, changed, [EnvSpan(span.start, len(forged))],
                      engine.info.eos_token_ids)


def test_the_committed_model_is_warm_on_held_out_products_and_calls_the_tool(engine, rules) -> None:
    """A quick draw: the recipe records the devnet's measure (128 products x 8 samples)."""
    assert 0.3 <= META["devnet_eval"]["pass_rate"] <= 0.6
    assert META["recipe"]["environment"] == "calculator"
    assert META["devnet_eval"]["max_new_tokens"] == DEVNET_CALC_TURN_TOKENS
    tasks = devnet_eval_tasks(16, params=DEVNET_PRODUCTS)
    rate = pass_rate(engine, tasks, samples=2, max_new_tokens=DEVNET_CALC_TURN_TOKENS, temperature=1.0,
                     rules=rules)
    assert 0.1 < rate < 0.9, rate
    # greedy-ish: its first turn is a calculator call on the task's numbers
    prompt = list(task_prompt_ids(tasks[0], engine.tokenizer, rules))
    (first,) = engine.generate_group(prompt, 1, [7], DEVNET_CALC_TURN_TOKENS, 0.05)
    assert engine.tokenizer.completion_text(first.tokens).startswith(calculator.CALL_OPEN)


def test_the_devnet_writes_the_products_the_model_was_warmed_for(tmp_path) -> None:
    train, held_out = write_products(tmp_path)
    assert read_tasks(train) == devnet_dataset(DEVNET_PRODUCTS)
    assert read_tasks(held_out) == devnet_eval_tasks(params=DEVNET_PRODUCTS)
    assert not {t.task_id for t in read_tasks(train)} & {t.task_id for t in read_tasks(held_out)}
    assert META["task"]["params"] == {"min_value": 10, "max_value": 99, "operators": "*", "num_operands": 2}
