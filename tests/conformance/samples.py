"""One realistic instance of every wire message, shared by vectors, property tests and benchmarks."""

from __future__ import annotations

import struct
from typing import Any

from swarmnode.crypto.hashing import sha256
from swarmnode.protocol import ledger_messages as lm
from swarmnode.protocol import messages as m
from tests.conformance.keys import NOW_MS, RUN, vector_identity


def _digest(label: str) -> bytes:
    return sha256(label.encode())


def grpo_params() -> m.GrpoParams:
    return m.GrpoParams(
        group_size=8, prompts_per_step=16, max_new_tokens=24, temperature=1.0, learning_rate=3e-4,
        clip_epsilon=0.2, clip_delta=4.0, max_grad_norm=1.0, token_budget=4096, length_target=0,
        length_penalty=0.0003,
    )


def validator_policy() -> m.ValidatorPolicy:
    return m.ValidatorPolicy(
        toploc_k=128, toploc_chunk=32, max_mean_exp_mismatches=1.0, max_mean_mant_err=0.5,
        sampling_tolerance=1e-3, eos_min_prob=0.01, sample_fraction=1.0, min_stake_gwei=10**9,
        slash_gwei=5 * 10**8,
    )


def completion(seed: int, tokens: int = 40) -> m.Completion:
    token_ids = tuple((seed * 7 + i) % 50 for i in range(tokens))
    logprobs = struct.pack(f"<{tokens}f", *[-0.5 - 0.01 * i for i in range(tokens)])
    chunks = (tokens + 31) // 32
    proofs = tuple(bytes([0xFF, 0xD9]) + bytes(range(256)) for _ in range(chunks))
    return m.Completion(token_ids, logprobs, 1.0 if seed % 2 else 0.0, 0.5 if seed % 2 else -0.5, seed, True,
                        proofs)


def rollout_submission(groups: int = 2, group_size: int = 4) -> m.RolloutSubmission:
    return m.RolloutSubmission(
        run=RUN, step=7, checkpoint_version=6, checkpoint_root=_digest("ckpt-6"),
        groups=tuple(
            m.RolloutGroup(_digest(f"task-{g}"), tuple(range(1, 12)),
                           tuple(completion(g * group_size + i) for i in range(group_size)))
            for g in range(groups)
        ),
    )


def manifest() -> m.CheckpointManifest:
    shards = tuple(
        m.ShardInfo(f"shard-{i:05d}.safetensors", 50_000_000, _digest(f"shard-{i}")) for i in range(3)
    )
    from swarmnode.crypto.merkle import merkle_root

    return m.CheckpointManifest(RUN, 6, 5, _digest("config"), 150_000_000, shards,
                                merkle_root([s.sha256 for s in shards]), NOW_MS - 1000)


def checkpoint_head() -> m.CheckpointHead:
    """The head the trainer gossips for `manifest()` (spec/shards.md, CheckpointHead)."""
    from swarmnode.protocol.shards import manifest_head

    return manifest_head(manifest())


def every_message() -> list[Any]:
    """One instance of each type in MESSAGE_TYPES, in registry order."""
    trainer = vector_identity(1)
    worker = vector_identity(2)
    verdict = m.Verdict(RUN, _digest("submission"), worker.address, 7, 6, False, 605,
                        "TOPLOC: 3 chunks failed", (1, 4, 9), 320, 12.5, 3.25)
    samples: list[Any] = [
        m.RunDescriptor(RUN, trainer.address, _digest("config"),
                        (m.FileDigest("tokenizer.json", _digest("tokenizer")),), _digest("base"),
                        _digest("dataset"), "arithmetic",
                        grpo_params(), 2, validator_policy(), NOW_MS - 10_000,
                        co_trainers=(vector_identity(3).address, vector_identity(4).address)),
        manifest(),
        m.ShardHave(RUN, 6, _digest("root-6"), bytes([0b10110000]), "http://127.0.0.1:8401"),
        rollout_submission(),
        verdict,
        lm.RegisterNode("worker", lm.ComputeSpec("cpu", 2, 24, 100), worker.peer_id),
        lm.StakeDeposit(2 * 10**9),
        lm.StakeUnbond(10**9),
        lm.StakeWithdraw(),
        lm.RegisterRun(RUN, tuple(sorted((vector_identity(5).address, vector_identity(6).address))), 2, 8192,
                       1_000_000),
        lm.SetRunValidators(RUN, (vector_identity(5).address,)),
        lm.CommitCredits(RUN, (
            lm.Credit(worker.address, (6 << 32) | 7, 320, 320_000_000, _digest("rollout")),
            lm.Credit(worker.address, (6 << 32) | 8, 256, 256_000_000, _digest("rollout-2")),
        )),
        lm.Slash(RUN, worker.address, 5 * 10**8, (1, 4, 9), 605, b"\x02" * 300),
        lm.VoidSlash(3),
        lm.FinalizeSlash(4),
        lm.LedgerEntry(3, _digest("entry-2"), 1, b"\x03" * 120),
        lm.LedgerGenesis("devnet-ledger", 1_767_225_600, 60, 10**9, 3, 5 * 10**8, 3),
        m.Hello(RUN, "relay", "http://127.0.0.1:8402", "swarmnode/0.1.0"),
        m.Ping(b"\x00\x01\x02\x03\x04\x05\x06\x07"),
        m.Pong(b"\x00\x01\x02\x03\x04\x05\x06\x07"),
        m.ManifestRequest(RUN, m.LATEST_VERSION),
        m.ManifestResponse(200, b"\x04" * 64),
        m.SubmitAck(_digest("submission"), 100, "queued"),
        m.AcceptedRequest(RUN, 41, 16, 20_000),
        m.AcceptedRollout(42, b"\x05" * 48, b"\x06" * 96),
        m.AcceptedBatch((m.AcceptedRollout(42, b"\x05" * 48, b"\x06" * 96),), 42),
        *diloco_messages(),
        checkpoint_head(),
        m.VerdictBatch(RUN, trainer.address, (  # signed by vector key 1, as the envelope vectors are
            verdict,
            m.Verdict(RUN, _digest("submission-2"), worker.address, 8, 6, True, 0, "", (), 256, 0.5, 1.25),
        )),
    ]
    assert [type(s).TYPE for s in samples] == list(m.MESSAGE_TYPES), "samples must cover every message type"
    return samples


def diloco_messages() -> list[Any]:
    """DilocoRun, DilocoContribution, DilocoVote, DilocoOuterState (spec/diloco.md), in registry order."""
    a, b = sorted((vector_identity(1).address, vector_identity(2).address))
    entries = (m.DilocoEntry(a, _digest("contribution-a-3")), m.DilocoEntry(b, _digest("contribution-b-3")))
    return [
        m.DilocoRun(RUN, (a, b), _digest("config"), _digest("theta-0"), 100, 50, 1e-3, 0.7, 0.9, True, "fp16",
                    30_000, 30_000, NOW_MS - 10_000),
        m.DilocoContribution(RUN, 3, a, _digest("plan"), _digest("theta-3"), "fp16", _digest("root-a-3"),
                             b"\x07" * 200),
        m.DilocoVote(RUN, 3, _digest("plan"), _digest("theta-3"), entries),
        m.DilocoOuterState(RUN, 4, _digest("plan"), _digest("theta-4"), _digest("theta-3"), entries,
                           _digest("root-outer-4"), b"\x08" * 200),
    ]
