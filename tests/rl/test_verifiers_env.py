"""Bring your own environment (spec/environments.md, Verifiers environments): a deterministic verifiers
environment is exported, played by a real tiny model and replayed by a real validator in the sandbox; a
fabricated environment turn is rejected 611; an environment a swarm cannot verify is refused, saying why.

Needs verifiers' own venv (scripts/install_verifiers.sh, which scripts/test.sh runs): without it these
skip, unless SWARMNODE_REQUIRE_VERIFIERS=1 (CI) makes that a failure.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from pathlib import Path

import pytest

from swarmnode.crypto.hashing import sha256
from swarmnode.crypto.identity import NodeIdentity
from swarmnode.node.rl.environments import Done, EnvTurn
from swarmnode.node.rl.environments import verifiers_adapter as adapter
from swarmnode.node.rl.environments.episodes import UnknownEnvironment, default_terms, rules_from_terms
from swarmnode.node.rl.environments.replay import FabricatedTurn
from swarmnode.node.rl.environments.verifiers_adapter import VerifiersRefused, export_rows, load
from swarmnode.node.rl.model import model_commitment
from swarmnode.node.rl.rollouts import build_submission, task_prompt_ids
from swarmnode.node.rl.run import describe_run, devnet_grpo, devnet_policy
from swarmnode.node.rl.tasks import Task
from swarmnode.node.rl.tasks.verifiers_rows import VerifiersTaskError, parse_task
from swarmnode.node.rl.validation import ValidationContext, validate_submission
from swarmnode.protocol.errors import Reason, Reject
from swarmnode.testing.cheats import FABRICATED_ENV_TURN, build_dishonest_submission
from tests.tinymodel import eos_prone, tiny_engine, tiny_folder

HERE = Path(__file__).resolve().parent
MISBEHAVING = HERE / "verifiers_envs"
WORKER = NodeIdentity(sha256(b"verifiers-test-worker")).address
ROOT = sha256(b"checkpoint-1")
MAX_TURN_TOKENS = 6

if not (adapter.DEFAULT_VENV / "bin" / "python").exists() and not os.environ.get("SWARMNODE_VERIFIERS_VENV"):
    if os.environ.get("SWARMNODE_REQUIRE_VERIFIERS") == "1":
        raise RuntimeError("SWARMNODE_REQUIRE_VERIFIERS=1 but there is no verifiers venv: "
                           "run scripts/install_verifiers.sh")
    pytest.skip("no verifiers venv (scripts/install_verifiers.sh)", allow_module_level=True)


@pytest.fixture(scope="module")
def higher_lower() -> list[Task]:
    return export_rows("vf_higher_lower", {"count": 8}, 8)


def test_a_deterministic_game_is_exported_and_answers_by_its_rules(higher_lower):
    env = load("vf_higher_lower")
    assert env.name == "verifiers.vf_higher_lower" and env.version.startswith(adapter.LIBRARY_VERSION + "+")
    task = higher_lower[0]
    row = parse_task(task)
    assert row.module == "vf_higher_lower" and task.prompt.startswith("Guess my number from 1 to 16")
    secret = int(row.row["answer"])
    env.respond_many([(task, 0, (str(guess),)) for guess in (secret - 1, secret + 1, secret)])  # one run
    assert env.respond(task, 0, [str(secret - 1)]) == EnvTurn("Higher.")
    assert env.respond(task, 0, [str(secret + 1)]) == EnvTurn("Lower.")
    assert env.respond(task, 0, [str(secret)]) == Done(1.0)
    assert env.respond(task, 0, [str(secret + 1), f"then {secret}"]) == Done(1.0)  # one more sandbox run


def test_a_batch_larger_than_the_cache_is_read_without_another_sandbox_run(higher_lower, monkeypatch):
    """A submission of long episodes asks more answers at once than the cache keeps: all of them stay until
    the next batch, or each `respond` would cost a sandbox run of its own."""
    runs = []
    real = adapter._sandboxed
    monkeypatch.setattr(adapter, "_sandboxed", lambda *args: runs.append(1) or real(*args))
    monkeypatch.setattr(adapter, "CACHE_ENTRIES", 2)
    env = load("vf_higher_lower")
    calls = [(task, 0, ("1",)) for task in higher_lower[:5]]
    env.respond_many(calls)
    assert [env.respond(task, 0, turns) for task, _, turns in calls] and len(runs) == 1


def test_a_run_names_the_code_byte_for_byte(higher_lower, tmp_path, monkeypatch):
    """A node whose module differs by one byte has another version: it refuses the run, naming both."""
    terms = default_terms("verifiers.vf_higher_lower", 512)
    copy = tmp_path / "vf_higher_lower.py"
    shutil.copy(adapter.DEFAULT_ENVS / "vf_higher_lower.py", copy)
    copy.write_text(copy.read_text() + "\n")
    monkeypatch.setenv("SWARMNODE_VERIFIERS_ENVS", str(tmp_path))
    named = re.escape(f"version {terms.version}; this node has version")
    with pytest.raises(UnknownEnvironment, match=named):
        rules_from_terms(terms, 8)
    monkeypatch.setenv("SWARMNODE_VERIFIERS_ENVS", str(tmp_path / "nowhere"))
    with pytest.raises(UnknownEnvironment, match="no verifiers environment module 'vf_higher_lower'"):
        rules_from_terms(terms, 8)


@pytest.mark.parametrize(("kind", "why"), [
    ("judge", "JudgeRubric: its reward asks a judge model"),
    ("timeout", "timeout_seconds: a wall-clock limit"),
    # found by the vetting's three sandbox runs (about 8 s each): slow
    pytest.param("random", "differently", marks=pytest.mark.slow),
    pytest.param("counter", "differently within one process", marks=pytest.mark.slow),
    pytest.param("process", "differently in two processes", marks=pytest.mark.slow),
])
def test_an_environment_a_swarm_cannot_verify_is_refused_saying_why(kind, why):
    with pytest.raises(VerifiersRefused, match=why):
        export_rows("vf_misbehaving", {"kind": kind}, 8, folder=MISBEHAVING)


@pytest.mark.slow
def test_an_environment_that_raises_on_a_turn_ends_the_episode_with_reward_0():
    """Its code decides that on every node alike, as a scorer's exception does: not a fault of the machine."""
    tasks = export_rows("vf_misbehaving", {"kind": "raises"}, 8, folder=MISBEHAVING)
    env = load("vf_misbehaving", folder=MISBEHAVING)
    assert env.respond(tasks[0], 0, ["1"]) == EnvTurn("Try again.")
    assert env.respond(tasks[0], 0, ["1", "boom"]) == Done(0.0)


def test_a_task_whose_prompt_is_not_its_row_is_refused(higher_lower):
    task = higher_lower[0]
    with pytest.raises(VerifiersTaskError, match="not its row's prompt"):
        parse_task(dataclasses.replace(task, prompt=task.prompt + " Hint: 4."))
    with pytest.raises(VerifiersTaskError, match="canonical"):
        parse_task(dataclasses.replace(task, target=task.target.replace('"args":', '"args" :')))


# --- a tiny model plays it; a validator replays it (slow: a sandbox run per round of turns) ---------------


@pytest.fixture(scope="module")
def engine():
    return eos_prone(tiny_engine())


@pytest.fixture(scope="module")
def run(engine):
    """A run of the misbehaving module's honest kind (prompts short enough for the tiny model)."""
    os.environ["SWARMNODE_VERIFIERS_ENVS"] = str(MISBEHAVING)
    try:
        tasks = export_rows("vf_misbehaving", {"kind": "honest"}, 8)
        grpo = dataclasses.replace(devnet_grpo(engine.info, MAX_TURN_TOKENS), prompts_per_step=2,
                                   group_size=3)
        longest = max(len(task_prompt_ids(t, engine.tokenizer)) for t in tasks)
        terms = default_terms("verifiers.vf_misbehaving", engine.info.max_positions - longest)
        descriptor = describe_run(run="verifiers", trainer=b"\x01" * 20,
                                  model=model_commitment(tiny_folder()), tasks=tasks, grpo=grpo,
                                  policy=devnet_policy(), created_ms=0, environment=terms)
        yield descriptor, tasks
    finally:
        del os.environ["SWARMNODE_VERIFIERS_ENVS"]


def _context(run, engine) -> ValidationContext:
    descriptor, tasks = run
    return ValidationContext(descriptor, {t.task_id: t for t in tasks}, [t.task_id for t in tasks], 1,
                             {1: ROOT}, lambda _: True, engine.info, engine.tokenizer)


def _submit(engine, run, cheat: str = ""):
    descriptor, tasks = run
    by_id = {t.task_id: t for t in tasks}
    args = (engine, descriptor, by_id, list(by_id), WORKER, 1, ROOT, 0)
    return build_dishonest_submission(cheat, *args) if cheat else build_submission(*args)


@pytest.mark.slow
def test_a_tiny_model_plays_it_and_a_validator_accepts_the_replay(engine, run):
    honest = _submit(engine, run)
    spans = [c.env_spans for g in honest.groups for c in g.completions]
    assert any(spans), "no environment turn to check"
    accepted = validate_submission(honest, WORKER, _context(run, engine), lambda _: engine)
    env_tokens = sum(s.length for c_spans in spans for s in c_spans)
    assert accepted.tokens == sum(len(c.token_ids) for g in honest.groups for c in g.completions) - env_tokens


@pytest.mark.slow
def test_a_fabricated_environment_turn_is_rejected_611(engine, run):
    forged = _submit(engine, run, FABRICATED_ENV_TURN)
    assert any(c.env_spans for g in forged.groups for c in g.completions)
    with pytest.raises(Reject) as caught:
        validate_submission(forged, WORKER, _context(run, engine), lambda _: engine)
    assert caught.value.reason == Reason.FABRICATED_ENV_TURN


@pytest.mark.slow
def test_replay_names_the_first_changed_environment_byte(engine, run):
    """Any environment turn that is not the environment's, byte for byte, is a fabricated turn."""
    from swarmnode.node.rl.environments import prefetch
    from swarmnode.node.rl.environments.episodes import episode_rules, replay_calls, replay_tokens

    descriptor, tasks = run
    honest = _submit(engine, run)
    rules = episode_rules(descriptor)
    assert rules is not None
    by_id = {t.task_id: t for t in tasks}
    prefetch(rules.env, [call for g in honest.groups for c in g.completions
                         for call in replay_calls(by_id[g.task_id], c.seed, engine.tokenizer, c.token_ids,
                                                  c.env_spans)])  # one sandbox run answers every replay
    checked = 0
    for group in honest.groups:
        for c in group.completions:
            for span in c.env_spans:
                for at in (span.start, span.start + span.length - 1):
                    ids = list(c.token_ids)
                    ids[at] = (ids[at] + 1) % engine.info.vocab_size
                    with pytest.raises(FabricatedTurn):
                        replay_tokens(rules, by_id[group.task_id], c.seed, engine.tokenizer, ids, c.env_spans,
                                      engine.info.eos_token_ids)
                    checked += 1
    assert checked
