"""The `code-injection` cheat against the real validator: a completion whose tokens are a program that
kills the grader's parent, with the model's own hidden rows and logprobs (teacher-forced), claimed at full
marks. The model checks reject it, slashable, and nothing is executed: no sandbox run starts while it is
judged (spec/validation.md, the order of the checks).
"""

from __future__ import annotations

import dataclasses

import pytest

from swarmnode.node.rl.model import model_commitment
from swarmnode.node.rl.run import describe_run, devnet_dataset, devnet_grpo, devnet_policy
from swarmnode.node.rl.validation import ValidationContext, validate_submission
from swarmnode.node.sandbox import run as sandbox_run
from swarmnode.protocol.errors import Reason, Reject
from swarmnode.testing.cheats import CODE_INJECTION, KILL_PAYLOAD, build_dishonest_submission
from tests.code_tasks import as_code
from tests.tinymodel import eos_prone, tiny_engine, tiny_folder

WORKER = b"\x22" * 20
ROOT = b"\x33" * 32


@pytest.fixture(scope="module")
def run():
    engine = eos_prone(tiny_engine())
    tasks = [as_code(t) for t in devnet_dataset()[:16]]
    grpo = dataclasses.replace(devnet_grpo(engine.info), prompts_per_step=2, group_size=2, max_new_tokens=40)
    descriptor = describe_run(run="injection", trainer=b"\x01" * 20, model=model_commitment(tiny_folder()),
                              tasks=tasks, grpo=grpo, policy=devnet_policy(), created_ms=0)
    dataset = {t.task_id: t for t in tasks}
    ids = [t.task_id for t in tasks]
    ctx = ValidationContext(descriptor, dataset, ids, 3, {3: ROOT}, lambda _: True, engine.info,
                            engine.tokenizer)
    return engine, descriptor, dataset, ids, ctx


def test_an_injected_program_is_rejected_before_anything_runs(run, monkeypatch):
    engine, descriptor, dataset, ids, ctx = run
    sub = build_dishonest_submission(CODE_INJECTION, engine, descriptor, dataset, ids, WORKER, 3, ROOT, 0)
    injected = sub.groups[0].completions[0]
    assert engine.tokenizer.completion_text(injected.token_ids) == KILL_PAYLOAD
    assert injected.reward == 1.0
    runs: list[str] = []
    real_run = sandbox_run._run

    def counted(host, source, *rest):  # a spy: the real sandbox still runs whatever reaches it
        runs.append(source)
        return real_run(host, source, *rest)

    monkeypatch.setattr(sandbox_run, "_run", counted)
    with pytest.raises(Reject) as caught:
        validate_submission(sub, WORKER, ctx, lambda version: engine)
    assert caught.value.reason in (Reason.BAD_SAMPLING, Reason.BAD_TERMINATION), caught.value
    assert runs == []  # the payload never reached a grader


def test_the_payload_is_harmless_even_when_run():
    """Were it executed, the sandbox holds it: `os.getppid()` there is the sandbox's own first process."""
    from swarmnode.node.rl.tasks.code import grade

    task = as_code(devnet_dataset()[0])
    assert grade(task, KILL_PAYLOAD).reward == 0.0  # the tests fail on its source; nothing outside is touched
