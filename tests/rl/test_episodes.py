"""Multi-turn rollouts on the wire (spec/environments.md): a real tiny model plays the guessing game, a real
validator replays it, a worker that fabricates an environment turn is rejected 611, the trainer's loss
leaves the environment's tokens out, and replay is exact on any transcript."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarmnode.crypto.hashing import sha256
from swarmnode.crypto.identity import NodeIdentity
from swarmnode.node.rl.environments.episodes import (
    ModelTurn,
    UnknownEnvironment,
    default_terms,
    model_mask,
    play,
    play_all,
    replay_tokens,
    rules_from_terms,
)
from swarmnode.node.rl.environments.game import KIND, generate_tasks
from swarmnode.node.rl.environments.replay import FabricatedTurn
from swarmnode.node.rl.learner import batch_loss, completion_batch
from swarmnode.node.rl.model import model_commitment
from swarmnode.node.rl.rollouts import build_submission, task_prompt_ids
from swarmnode.node.rl.run import describe_run, devnet_grpo, devnet_policy
from swarmnode.node.rl.tasks import Task
from swarmnode.node.rl.validation import ValidationContext, validate_submission
from swarmnode.protocol.codec import decode, encode
from swarmnode.protocol.errors import Reason, Reject
from swarmnode.protocol.messages import EnvironmentTerms, RolloutSubmission, RunDescriptor
from swarmnode.testing.cheats import FABRICATED_ENV_TURN, build_dishonest_submission
from tests.tinymodel import eos_prone, tiny_engine, tiny_folder

WORKER = NodeIdentity(sha256(b"episodes-test-worker")).address
ROOT = sha256(b"checkpoint-1")
MAX_TURN_TOKENS = 6


@pytest.fixture(scope="module")
def engine():
    return eos_prone(tiny_engine())


def short_games(count: int, seed: int) -> list[Task]:
    """Games with prompts short enough for the tiny model's 128 positions (the rules live in the target)."""
    games = {t.target: Task(KIND, f"{t.target}?", t.target) for t in generate_tasks(count, seed, 9, 4)}
    return list(games.values())


@pytest.fixture(scope="module")
def setup(engine):
    tasks = short_games(16, seed=5)
    grpo = dataclasses.replace(devnet_grpo(engine.info, MAX_TURN_TOKENS), prompts_per_step=2, group_size=3)
    longest = max(len(task_prompt_ids(t, engine.tokenizer)) for t in tasks)
    terms = default_terms("guess", max_completion_tokens=engine.info.max_positions - longest)
    descriptor = describe_run(run="episodes", trainer=b"\x01" * 20, model=model_commitment(tiny_folder()),
                              tasks=tasks, grpo=grpo, policy=devnet_policy(), created_ms=0, environment=terms)
    return descriptor, tasks


def context(setup, engine) -> ValidationContext:
    descriptor, tasks = setup
    return ValidationContext(descriptor, {t.task_id: t for t in tasks}, [t.task_id for t in tasks], 1,
                             {1: ROOT}, lambda _: True, engine.info, engine.tokenizer)


def submit(engine, setup, cheat: str = "") -> RolloutSubmission:
    """A worker's submission on checkpoint 1, honest or with a cheat of `swarmnode.testing.cheats`."""
    descriptor, tasks = setup
    by_id = {t.task_id: t for t in tasks}
    args = (engine, descriptor, by_id, list(by_id), WORKER, 1, ROOT, 0)
    return build_dishonest_submission(cheat, *args) if cheat else build_submission(*args)


@pytest.fixture(scope="module")
def honest(engine, setup):
    return submit(engine, setup)


def test_an_honest_multi_turn_submission_is_accepted(honest, setup, engine):
    spans = [c.env_spans for g in honest.groups for c in g.completions]
    assert any(spans), "the tiny model never guessed wrong: no environment turn to check"
    accepted = validate_submission(honest, WORKER, context(setup, engine), lambda _: engine)
    env_tokens = sum(s.length for c_spans in spans for s in c_spans)
    all_tokens = sum(len(c.token_ids) for g in honest.groups for c in g.completions)
    assert accepted.tokens == all_tokens - env_tokens  # credit for the sampled tokens only
    assert decode(RolloutSubmission, encode(honest)) == honest


def test_a_fabricated_environment_turn_is_rejected_611(setup, engine):
    """The cheat plays a game that hands the model the target where the real one says higher or lower, and
    samples its next turns on that: the model checks pass, only the replay sees the lie."""
    forged = submit(engine, setup, FABRICATED_ENV_TURN)
    assert any(c.env_spans for g in forged.groups for c in g.completions)
    with pytest.raises(Reject) as caught:
        validate_submission(forged, WORKER, context(setup, engine), lambda _: engine)
    assert caught.value.reason == Reason.FABRICATED_ENV_TURN
    assert "is not what the environment says" in caught.value.detail


def test_an_environment_span_in_a_single_turn_run_is_malformed(honest, setup, engine):
    descriptor, tasks = setup
    single = dataclasses.replace(descriptor, environment=())
    ctx = dataclasses.replace(context(setup, engine), descriptor=single)
    with pytest.raises(Reject) as caught:
        validate_submission(honest, WORKER, ctx, lambda _: engine)
    assert caught.value.reason in (Reason.MALFORMED_ROLLOUT, Reason.BAD_ASSIGNMENT)


def test_an_environment_token_with_a_logprob_is_malformed(honest, setup, engine):
    gi, ci, c = next((gi, ci, c) for gi, g in enumerate(honest.groups)
                     for ci, c in enumerate(g.completions) if c.env_spans)
    at = c.env_spans[0].start
    logprobs = c.logprobs[: 4 * at] + b"\x00\x00\x80\xbf" + c.logprobs[4 * at + 4 :]  # -1.0
    forged = _with_completion(honest, gi, ci, dataclasses.replace(c, logprobs=logprobs))
    with pytest.raises(Reject) as caught:
        validate_submission(forged, WORKER, context(setup, engine), lambda _: engine)
    assert caught.value.reason == Reason.MALFORMED_ROLLOUT
    assert "logprob is not 0.0" in caught.value.detail


def _with_completion(sub, gi, ci, completion):
    group = sub.groups[gi]
    completions = (*group.completions[:ci], completion, *group.completions[ci + 1 :])
    groups = (*sub.groups[:gi], dataclasses.replace(group, completions=completions), *sub.groups[gi + 1 :])
    return dataclasses.replace(sub, groups=groups)


def test_the_loss_ignores_environment_tokens(honest, engine):
    """Whatever logprobs the environment's positions hold, the GRPO loss is the same."""
    batch = completion_batch(honest.groups)
    assert any(not bool(m.all()) for m in batch.sampled)
    longest = max(len(c) for c in batch.completions)
    current = torch.randn(len(batch), longest)
    mask = torch.zeros(len(batch), longest, dtype=torch.bool)
    for i, c in enumerate(batch.completions):
        mask[i, : len(c)] = True
    grpo = devnet_grpo(engine.info)
    noisy = current.clone()
    for i, sampled in enumerate(batch.sampled):
        noisy[i, : sampled.numel()][~sampled] += 100.0
    assert torch.equal(batch_loss(current, mask, batch, grpo).loss, batch_loss(noisy, mask, batch, grpo).loss)


def test_a_node_without_the_environment_refuses_the_run(setup):
    descriptor: RunDescriptor = setup[0]
    terms = descriptor.environment[0]
    with pytest.raises(UnknownEnvironment, match="version 9"):
        rules_from_terms(dataclasses.replace(terms, version="9"), 8)
    with pytest.raises(UnknownEnvironment, match="does not have"):
        rules_from_terms(dataclasses.replace(terms, name="chess"), 8)


# ------------------------------------------------------------------------------------------ replay property


@st.composite
def scripted_turns(draw, vocab: int, eos: int):
    """A model that writes what hypothesis draws: each turn some ids, ending in EOS or at its budget."""
    return draw(st.lists(st.tuples(st.lists(st.integers(0, vocab - 1).filter(lambda t: t != eos), max_size=8),
                                   st.booleans()), min_size=1, max_size=12))


def scripted_sampler(script, eos: int):
    turns = iter(script)

    def sample_turn(so_far, budget):
        ids, stops = next(turns, ([], True))
        ids = ids[: budget - 1] + [eos] if stops or len(ids) < budget else ids[:budget]
        return ModelTurn(tuple(ids), torch.zeros(len(ids)), torch.zeros(len(ids), 1), ids[-1] == eos)
    return sample_turn


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_replay_reproduces_every_played_episode_and_rejects_any_changed_environment_token(data, engine):
    tokenizer = engine.tokenizer
    eos = engine.info.eos_token_ids[0]
    vocab = engine.info.vocab_size
    task = data.draw(st.sampled_from(short_games(8, seed=1)))
    seed = data.draw(st.integers(0, 2**63 - 1))
    turns, total_bytes = data.draw(st.integers(1, 6)), data.draw(st.integers(16, 4096))
    terms = EnvironmentTerms("guess", "1", turns, 128, total_bytes, data.draw(st.integers(2, 64)))
    rules = rules_from_terms(terms, data.draw(st.integers(1, 8)))
    script = data.draw(scripted_turns(vocab, eos))
    played = play(rules, task, seed, tokenizer, scripted_sampler(script, eos))
    replayed = replay_tokens(rules, task, seed, tokenizer, played.tokens, played.env_spans, (eos,))
    assert (replayed.reward, replayed.ended_by) == (played.reward, played.ended_by)
    assert model_mask(len(played.tokens), played.env_spans).sum() == sum(len(t.tokens) for t in played.turns)
    if played.env_spans:
        span = data.draw(st.sampled_from(played.env_spans))
        at = span.start + data.draw(st.integers(0, span.length - 1))
        other = data.draw(st.integers(0, vocab - 1).filter(lambda t: t != played.tokens[at]))
        changed = (*played.tokens[:at], other, *played.tokens[at + 1 :])
        with pytest.raises(FabricatedTurn):
            replay_tokens(rules, task, seed, tokenizer, changed, played.env_spans, (eos,))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_episodes_played_together_are_each_the_episode_played_alone(data, engine):
    """Rounds of turns (what an engine batches) change no episode: the same tokens, spans and rewards as
    each played on its own, with episodes ending in different rounds; the sampler is asked for exactly
    the episodes still going, each with its own tokens so far."""
    tokenizer, eos, vocab = engine.tokenizer, engine.info.eos_token_ids[0], engine.info.vocab_size
    turns, max_tokens = data.draw(st.integers(1, 5)), data.draw(st.integers(8, 64))
    terms = EnvironmentTerms("guess", "1", turns, 128, 4096, max_tokens)
    rules = rules_from_terms(terms, data.draw(st.integers(1, 8)))
    games = short_games(8, seed=2)
    count = data.draw(st.integers(1, 5))
    episodes = [(data.draw(st.sampled_from(games)), data.draw(st.integers(0, 2**63 - 1)))
                for _ in range(count)]
    scripts = [data.draw(scripted_turns(vocab, eos)) for _ in range(count)]
    alone = [play(rules, task, seed, tokenizer, scripted_sampler(script, eos))
             for (task, seed), script in zip(episodes, scripts, strict=True)]
    samplers = [scripted_sampler(script, eos) for script in scripts]
    rounds = []

    def sample_turns(asks):
        rounds.append([i for i, _, _ in asks])
        return [samplers[i](so_far, budget) for i, so_far, budget in asks]

    together = play_all(rules, episodes, tokenizer, sample_turns)
    assert [(p.tokens, p.env_spans, p.reward, p.ended_by) for p in together] == [
        (p.tokens, p.env_spans, p.reward, p.ended_by) for p in alone]
    for r, asked in enumerate(rounds):  # episode i is asked in the rounds of its turns, and no other
        assert asked == [i for i, p in enumerate(alone) if len(p.turns) > r]


def test_the_cli_offers_every_built_in_multi_turn_environment():
    from swarmnode.node.config import ENVIRONMENT_CHOICES
    from swarmnode.node.rl.environments.registry import ENVIRONMENTS
    from swarmnode.node.rl.environments.single_turn import SINGLE_TURN

    assert set(ENVIRONMENT_CHOICES) == set(ENVIRONMENTS) - set(SINGLE_TURN)


def test_a_run_whose_prompts_leave_no_room_for_a_turn_is_refused(engine):
    from swarmnode.node.errors import RunMismatch
    from swarmnode.node.rl.run import environment_for
    from swarmnode.node.rl.tasks.arithmetic import DEVNET_PARAMS
    from swarmnode.node.rl.tasks.arithmetic import generate_tasks as additions

    with pytest.raises(RunMismatch, match="no room for a turn"):  # the calculator's instructions are long
        environment_for("calculator", additions(DEVNET_PARAMS, 1, 4), engine.tokenizer, engine.info, 6)
    with pytest.raises(RunMismatch, match="plays tasks of kind guess, not arithmetic"):
        environment_for("guess", additions(DEVNET_PARAMS, 1, 4), engine.tokenizer, engine.info, 6)


def test_tasks_show_reads_games_and_the_filter_refuses_them(tmp_path):
    from click.testing import CliRunner

    from swarmnode.node.cli.tasks import tasks_group
    from swarmnode.node.rl.tasks import write_tasks

    games = write_tasks(short_games(8, seed=4), tmp_path / "games.jsonl")
    shown = CliRunner().invoke(tasks_group, ["show", str(games)])
    assert shown.exit_code == 0 and "guess" in shown.output
    refused = CliRunner().invoke(tasks_group, ["filter", "--model", str(tiny_folder()), "--tasks", str(games),
                                               "--out", str(tmp_path / "kept.jsonl")])
    assert refused.exit_code == 1 and "played in an environment" in refused.output


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_signed_span_layout_gets_a_verdict_never_a_fault(data, honest, setup, engine):
    """Hostile: a worker may sign any spans the codec admits (up to 63, any starts and lengths) over its
    completion. Whatever it claims, judging ends in a verdict naming the worker's fault, never a judge fault,
    and only the honest layout is accepted."""
    from swarmnode.node.rl.validation import judge_total
    from swarmnode.protocol.errors import ProtocolError
    from swarmnode.protocol.messages import EnvSpan

    gi = data.draw(st.integers(0, len(honest.groups) - 1))
    ci = data.draw(st.integers(0, len(honest.groups[gi].completions) - 1))
    c = honest.groups[gi].completions[ci]
    n = len(c.token_ids)
    spans = tuple(data.draw(st.lists(st.builds(EnvSpan, st.integers(1, n + 2), st.integers(1, n + 2)),
                                     max_size=8)))
    forged = _with_completion(honest, gi, ci, dataclasses.replace(c, env_spans=spans))
    assert decode(RolloutSubmission, encode(forged)) == forged  # well-formed on the wire
    outcome = judge_total(forged, WORKER, context(setup, engine), lambda _: engine)
    if spans == c.env_spans:
        assert not isinstance(outcome, ProtocolError)
    else:
        assert isinstance(outcome, Reject), outcome
        assert outcome.reason in (Reason.MALFORMED_ROLLOUT, Reason.FABRICATED_ENV_TURN, Reason.BAD_PROOF,
                                  Reason.BAD_SAMPLING, Reason.BAD_TERMINATION, Reason.RULE_VIOLATION), outcome
