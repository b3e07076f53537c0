"""Replays spec/vectors/rollouts/*.json (spec/rollouts.md, spec/validation.md) through the real RL code.

Task ids, assignment, seeds, the seeded sampler, rewards and validators' verdicts are node code (torch, the
devnet's committed model), so this replay sits here; node/conformance.py lists it as the `rollouts` suite.
Torch and the model load inside the handlers that need them, on first use.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from swarmnode.protocol.codec import decode
from swarmnode.protocol.envelope import ReplayWindow, open_envelope
from swarmnode.protocol.errors import ProtocolError, Reason
from swarmnode.protocol.messages import RolloutSubmission, RunDescriptor

if TYPE_CHECKING:
    from swarmnode.node.rl.engine import TransformersEngine
    from swarmnode.node.rl.tasks import Task

OUT_OF_RANGE = "out-of-range"  # `expect.error` of an input outside a function's domain: it MUST be refused


def _hex(text: str) -> bytes:
    return bytes.fromhex(text[2:] if text.startswith("0x") else text)


def _task(obj: dict[str, Any]) -> Task:
    from swarmnode.node.rl.tasks import Task

    return Task(obj["kind"], obj["prompt"], obj["target"], obj.get("target_length", 0))


def check_task_id(inp: dict[str, Any]) -> dict[str, Any]:
    from swarmnode.node.rl.tasks import canonical_json, task_id

    task = _task(inp)
    return {"canonical_json": canonical_json(task), "task_id": "0x" + task_id(task).hex()}


def check_dataset_hash(inp: dict[str, Any]) -> dict[str, Any]:
    from swarmnode.node.rl.tasks import dataset_hash

    tasks = [_task(t) for t in inp["tasks"]]
    return {
        "task_ids": ["0x" + t.task_id.hex() for t in tasks],
        "dataset_hash": "0x" + dataset_hash(tasks).hex(),
    }


def check_assignment(inp: dict[str, Any]) -> dict[str, Any]:
    from swarmnode.node.rl.tasks import assign_tasks
    from swarmnode.protocol.runs import assignment_step

    ids = [_hex(x) for x in inp["dataset_ids"]]
    try:
        step = assignment_step(inp["checkpoint_version"], inp["counter"])
        assigned = assign_tasks(ids, _hex(inp["worker"]), step, inp["prompts_per_step"])
    except ValueError:
        return {"error": OUT_OF_RANGE}
    return {
        "step": step,
        "indices": [ids.index(t) for t in assigned],
        "task_ids": ["0x" + t.hex() for t in assigned],
    }


def check_seed(inp: dict[str, Any]) -> dict[str, Any]:
    from swarmnode.node.rl.sampling import derive_seed

    try:
        seed = derive_seed(inp["run"], _hex(inp["worker"]), inp["step"], _hex(inp["task_id"]), inp["index"])
    except ValueError:
        return {"error": OUT_OF_RANGE}
    return {"seed": seed}


def check_sampling(inp: dict[str, Any]) -> dict[str, Any]:
    """Tokens of the seeded Gumbel-max sampler, row p of `logits` being generated position p; with the
    position keys and the 32-bit noise hashes (exact integers) when the temperature is positive."""
    import torch

    from swarmnode.node.rl.sampling import noise_bits, position_key, sample_tokens

    logits = torch.tensor(inp["logits"], dtype=torch.float32)
    seed, temperature = inp["seed"], inp["temperature"]
    tokens = [int(sample_tokens(row[None], [seed], p, temperature)[0]) for p, row in enumerate(logits)]
    if temperature == 0:
        return {"tokens": tokens}
    keys = [position_key(seed, p) for p in range(len(logits))]
    bits = noise_bits(torch.tensor(keys, dtype=torch.int64), logits.shape[1])
    return {"keys": [list(k) for k in keys], "bits": bits.tolist(), "tokens": tokens}


def check_sampling_rule(inp: dict[str, Any]) -> dict[str, Any]:
    """The validator's sampling check (6d): positions whose claimed token is not within the tolerance."""
    import torch

    from swarmnode.node.rl.sampling import check_sampling as sampling_check

    logits = torch.tensor(inp["logits"], dtype=torch.float32).reshape(len(inp["tokens"]), -1)
    result = sampling_check(logits, inp["tokens"], inp["seed"], inp["temperature"], inp["tolerance"])
    return {"mismatches": list(result.mismatches)}


def _rewards_descriptor(task_kind: str, length_target: int, length_penalty: float) -> RunDescriptor:
    """A descriptor that only fixes what scoring reads (the length-target term); the rest is placeholder."""
    import dataclasses

    from swarmnode.node.rl.run import devnet_grpo, devnet_policy

    grpo = dataclasses.replace(
        devnet_grpo(_model_engine(_devnet_root()).info), length_target=length_target,
        length_penalty=length_penalty
    )
    zero = bytes(32)
    return RunDescriptor("rewards", bytes(20), zero, (), zero, zero, task_kind, grpo, 0, devnet_policy(), 0)


def check_rewards(inp: dict[str, Any]) -> dict[str, Any]:
    import torch

    from swarmnode.node.rl.grpo import group_advantages
    from swarmnode.node.rl.rollouts import completion_rewards

    task = _task(inp["task"])
    completions = [list(c) for c in inp["completions"]]
    tokenizer = _model_engine(_hex(inp["model"]).hex()).tokenizer
    descriptor = _rewards_descriptor(task.kind, inp["length_target"], inp["length_penalty"])
    rewards = completion_rewards(task, completions, descriptor, tokenizer)
    return {
        "texts": [tokenizer.completion_text(c) for c in completions],
        "rewards": rewards,
        "advantages": group_advantages(torch.tensor(rewards)).tolist(),
    }


@functools.lru_cache(maxsize=1)
def _devnet_root() -> str:
    """The base weights root (hex) of the devnet's committed model folder."""
    from swarmnode.node.rl.model import model_commitment
    from swarmnode.node.rl.run import DEVNET_MODEL

    return model_commitment(DEVNET_MODEL).weights_root.hex()


@functools.lru_cache(maxsize=2)
def _model_engine(weights_root_hex: str) -> TransformersEngine:
    """The engine of a model folder named by its base weights root; vectors may only name the devnet's."""
    from swarmnode.node.rl.engine import TransformersEngine
    from swarmnode.node.rl.run import DEVNET_MODEL

    if _devnet_root() != weights_root_hex:
        raise ValueError(f"model {weights_root_hex} is not held here (only the devnet's committed model is)")
    return TransformersEngine.from_folder(DEVNET_MODEL)


def check_validation(inp: dict[str, Any]) -> dict[str, Any]:
    """A validator's verdict on one signed RolloutSubmission, checks 1-6 of spec/validation.md, through the
    total judge (`judge_total`): the model config is the held checkpoint's, which the descriptor names."""
    from swarmnode.node.rl.engine import InferenceEngine
    from swarmnode.node.rl.tasks import dataset_hash
    from swarmnode.node.rl.validation import Accepted, BadProof, ValidationContext, judge_total

    descriptor = decode(RunDescriptor, _hex(inp["descriptor"]))
    tasks = [_task(t) for t in inp["dataset"]]
    if dataset_hash(tasks) != descriptor.dataset_hash:
        raise ValueError("the dataset is not the one the descriptor's dataset_hash names")
    held = {c["version"]: c for c in inp["checkpoints"]}
    eligible = {_hex(a) for a in inp["eligible"]}

    def engine_for(version: int) -> InferenceEngine:
        return _model_engine(_hex(held[version]["weights_root"]).hex())

    engine = engine_for(min(held))
    if engine.info.config_hash != descriptor.model_config_hash:
        raise ValueError("the held checkpoint's model config is not the one the descriptor names")
    ctx = ValidationContext(
        descriptor,
        {t.task_id: t for t in tasks},
        [t.task_id for t in tasks],
        inp["newest_version"],
        {version: _hex(c["root"]) for version, c in held.items()},
        lambda worker: worker in eligible,
        engine.info,
        engine.tokenizer,
    )
    try:
        opened = open_envelope(
            _hex(inp["envelope"]),
            run=descriptor.run,
            now_ms=inp["now_ms"],
            replay=ReplayWindow(),
            expect=RolloutSubmission,
        )
    except ProtocolError as exc:
        return {"verdict": exc.verdict, "reason": int(exc.reason)}
    outcome = judge_total(opened.message, opened.sender, ctx, engine_for)
    if isinstance(outcome, Accepted):
        return {"verdict": "accept", "tokens": outcome.tokens}
    if isinstance(outcome, BadProof):
        chunks = list(outcome.failure.failing_chunks)
        return {"verdict": "reject", "reason": int(Reason.BAD_PROOF), "failing_chunks": chunks}
    return {"verdict": outcome.verdict, "reason": int(outcome.reason)}


ROLLOUT_HANDLERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "task_id": check_task_id,
    "dataset_hash": check_dataset_hash,
    "assignment": check_assignment,
    "seed": check_seed,
    "sampling": check_sampling,
    "sampling_rule": check_sampling_rule,
    "rewards": check_rewards,
    "validation": check_validation,
}
