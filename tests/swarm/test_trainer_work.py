"""The trainer's work: its inbox, the checks on pulled accepted rollouts, the batch of a step, resuming.

Real parts throughout: secp256k1 identities and sealed envelopes, SQLite on disk, groups generated with
TOPLOC proofs by a tiny model folder (tests.swarm.models: its completions end at random lengths), GRPO
steps on it, the origin serving over loopback HTTP, and one test with two libp2p runtimes (the
validator's side of ACCEPTED is a small stand-in here: the real one is `node.validator`'s).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import sqlite3
from collections import Counter, OrderedDict
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from libp2p.peer.id import ID

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.crypto.merkle import merkle_root
from swarmnode.ledger.signedlog import SignedLog
from swarmnode.ledger.types import Params
from swarmnode.node import trainer as trainer_module
from swarmnode.node.config import LivenessSettings, NodeConfig, WorkSettings
from swarmnode.node.dataplane.checkpoint import MODEL_LAYOUT, plan_files, shard_info
from swarmnode.node.dataplane.origin import model_folder_files
from swarmnode.node.errors import RunMismatch
from swarmnode.node.p2p.clock import wall_ms
from swarmnode.node.p2p.dht import DiscoverySettings
from swarmnode.node.p2p.endpoints import ACCEPTED
from swarmnode.node.p2p.peers import PeerRecord
from swarmnode.node.p2p.ports import free_port
from swarmnode.node.rl.engine import TransformersEngine
from swarmnode.node.rl.learner import signal_groups
from swarmnode.node.rl.model import model_commitment, state_dict_of
from swarmnode.node.rl.rollouts import build_submission
from swarmnode.node.rl.run import devnet_dataset, devnet_grpo, devnet_run, run_commitment
from swarmnode.node.roles.base import RoleNet
from swarmnode.node.runtime import NodeRuntime
from swarmnode.node.trainer import (
    MANIFEST_OK,
    SwarmTrainerWork,
    check_batch,
    check_trainable,
    ingest_batch,
    load_or_create_descriptor,
    plan_batch,
    verify_accepted,
)
from swarmnode.node.trainer import pull as pull_module
from swarmnode.node.trainer import registration as registration_module
from swarmnode.node.trainer.inbox import InboxEntry, InboxRow, RolloutInbox, StepRecord, Stored
from swarmnode.node.trainer.service import Trainer
from swarmnode.node.validator.service import Validator
from swarmnode.protocol.codec import decode, encode
from swarmnode.protocol.envelope import Envelope, Opened, envelope_digest, seal
from swarmnode.protocol.errors import Ignore, ProtocolError, Reason
from swarmnode.protocol.messages import (
    LATEST_VERSION,
    AcceptedBatch,
    AcceptedRequest,
    AcceptedRollout,
    Completion,
    ManifestRequest,
    RolloutGroup,
    RolloutSubmission,
    RunDescriptor,
    Verdict,
)
from swarmnode.protocol.pacing import HOLD_MARGIN, LAG_HISTORY
from swarmnode.protocol.types import MIB
from swarmnode.testing import ledger as T
from tests.p2p.helpers import wait_until
from tests.swarm.models import eos_folder

RUN = "testrun"
TRAINER = NodeIdentity(b"\x01" * 32)
VALIDATOR = NodeIdentity(b"\x02" * 32)
OTHER_VALIDATOR = NodeIdentity(b"\x03" * 32)
WORKER = NodeIdentity(b"\x04" * 32)
OTHER_WORKER = NodeIdentity(b"\x05" * 32)
CFG = TransformersEngine.from_folder(eos_folder()).info  # the run's model
# Small groups so that a step takes a fraction of a second: 4 prompts x 4 completions per submission. The
# length target gives completions of different lengths different rewards (the tiny model answers nothing).
GRPO = replace(devnet_grpo(CFG), group_size=4, prompts_per_step=4, token_budget=4 * 4 * 6, length_target=3)


@functools.cache
def v0_root() -> bytes:
    """The Merkle root of version 0 as the trainer's origin publishes it: the run's model folder, its
    weights in the default 1 MiB shards."""
    engine = TransformersEngine.from_folder(eos_folder())
    files = model_folder_files(eos_folder())
    plans = plan_files(MODEL_LAYOUT, state_dict_of(engine.model), MIB, files)
    return merkle_root([shard_info(plan.name, plan.serialize()).sha256 for plan in plans])


def small_descriptor(trainer: bytes = TRAINER.address) -> RunDescriptor:
    return replace(
        devnet_run(trainer, eos_folder(), 1_700_000_000_000, info=CFG).descriptor, run=RUN, grpo=GRPO
    )


_seq = iter(range(1, 1 << 30))


def sealed(identity: NodeIdentity, message: object, run: str = RUN) -> bytes:
    return seal(identity, message, run=run, seq=next(_seq), ts=wall_ms())


def verdict_for(submission: bytes, worker: bytes, *, accepted: bool = True, version: int = 0) -> Verdict:
    sub = decode(RolloutSubmission, decode(Envelope, submission).body)
    return Verdict(
        run=RUN,
        submission_digest=envelope_digest(submission),
        worker=worker,
        step=sub.step,
        checkpoint_version=version,
        accepted=accepted,
        reason_code=100 if accepted else int(Reason.BAD_PROOF),
        detail="",
        failing_chunks=(),
        tokens=sum(len(c.token_ids) for g in sub.groups for c in g.completions),
        mean_exp_mismatches=0.0,
        mean_mant_err=0.0,
    )


def accepted_item(index: int, submission: RolloutSubmission, **verdict_changes: Any) -> AcceptedRollout:
    """An honest validator's item: WORKER signed the submission, VALIDATOR accepted it."""
    envelope = sealed(WORKER, submission)
    verdict = replace(
        verdict_for(envelope, WORKER.address, version=submission.checkpoint_version), **verdict_changes
    )
    return AcceptedRollout(index, sealed(VALIDATOR, verdict), envelope)


@pytest.fixture(scope="module")
def submissions() -> list[RolloutSubmission]:
    """Honest submissions on version 0 from the run's base model, each with at least one group with signal."""
    engine = TransformersEngine.from_folder(eos_folder())
    descriptor = small_descriptor()
    tasks = devnet_dataset()
    dataset, ids = {t.task_id: t for t in tasks}, [t.task_id for t in tasks]
    out = []
    for counter in range(12):
        sub = build_submission(engine, descriptor, dataset, ids, WORKER.address, 0, v0_root(), counter)
        if signal_groups(sub.groups):
            out.append(sub)
        if len(out) == 4:
            return out
    raise AssertionError("the base model should give groups with signal")


def hand_group(rewards: list[float], tokens: int = 3) -> RolloutGroup:
    completion = Completion(
        token_ids=(5,) * tokens,
        logprobs=b"\0\0\0\0" * tokens,
        reward=0.0,
        advantage=0.0,
        seed=1,
        ended_with_eos=False,
        proofs=(),
    )
    return RolloutGroup(b"\x07" * 32, (3, 4), tuple(replace(completion, reward=r) for r in rewards))


# --- the inbox ------------------------------------------------------------------------------------------


def entry(index: int, *, digest: bytes | None = None, version: int = 0, signal: int = 1) -> InboxEntry:
    return InboxEntry(
        index=index,
        digest=digest or bytes([index]) * 32,
        worker=WORKER.address,
        step=index,
        checkpoint_version=version,
        groups=4,
        signal_groups=signal,
        submission=b"sub%d" % index,
        verdict=b"verdict%d" % index,
        received_ms=1,
    )


@pytest.fixture
def inbox(tmp_path: Path) -> Iterator[RolloutInbox]:
    box = RolloutInbox(tmp_path / "inbox.sqlite")
    yield box
    box.close()


def test_inbox_stores_items_with_the_cursor_and_keeps_both_across_a_reopen(tmp_path: Path) -> None:
    box = RolloutInbox(tmp_path / "inbox.sqlite")
    assert box.cursor(VALIDATOR.address) == 0
    stored = box.store(VALIDATOR.address, [entry(1), entry(2)], cursor=2)
    assert (stored.inserted, stored.duplicates) == (2, 0)
    box.close()
    box = RolloutInbox(tmp_path / "inbox.sqlite")
    assert box.cursor(VALIDATOR.address) == 2
    assert box.cursor(OTHER_VALIDATOR.address) == 0
    assert [r.digest for r in box.pending()] == [bytes([1]) * 32, bytes([2]) * 32]
    assert box.submissions([r.id for r in box.pending()]) == [b"sub1", b"sub2"]
    assert box._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert box._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    box.close()


def test_inbox_keeps_a_submission_accepted_by_two_validators_once(inbox: RolloutInbox) -> None:
    inbox.store(VALIDATOR.address, [entry(1)], cursor=1)
    again = inbox.store(OTHER_VALIDATOR.address, [entry(7, digest=bytes([1]) * 32)], cursor=7)
    assert (again.inserted, again.duplicates) == (0, 1)
    assert len(inbox.pending()) == 1
    assert inbox.cursor(OTHER_VALIDATOR.address) == 7  # the cursor still moves past it


def test_inbox_stores_neither_items_nor_cursor_when_the_transaction_fails(inbox: RolloutInbox) -> None:
    inbox.store(VALIDATOR.address, [entry(1)], cursor=1)
    broken = replace(entry(3), submission=None)  # type: ignore[arg-type]  # NOT NULL violation
    with pytest.raises(sqlite3.IntegrityError):
        inbox.store(VALIDATOR.address, [entry(2), broken], cursor=3)
    assert inbox.cursor(VALIDATOR.address) == 1
    assert len(inbox.pending()) == 1


def test_inbox_release_from_makes_rows_of_unsaved_steps_pending_again(inbox: RolloutInbox) -> None:
    inbox.store(VALIDATOR.address, [entry(i) for i in range(1, 6)], cursor=5)
    ids = [r.id for r in inbox.pending()]
    inbox.consume(ids[:2], 0)
    inbox.drop(ids[2:3], 1)
    inbox.consume(ids[3:4], 1)
    for step in (0, 1):
        inbox.record_step(StepRecord(step, 1, 4, 2, 0.5, 0.1, 0.2, 0.3))
    assert inbox.counts() == {"received": 5, "used": 3, "dropped": 1, "pending": 1}
    assert inbox.release_from(1) == 2
    assert [r.id for r in inbox.pending()] == ids[2:]
    assert [r.step for r in inbox.steps()] == [0]
    assert inbox.used_per_worker() == {WORKER.address: 2}


def test_inbox_settle_gives_back_only_rows_of_rounds_no_average_counted(inbox: RolloutInbox) -> None:
    """A DiLoCo trainer with H = 2: round 0 counted, round 1 left out, round 2 counted."""
    inbox.store(VALIDATOR.address, [entry(i) for i in range(1, 8)], cursor=7)
    ids = [r.id for r in inbox.pending()]
    for step, row in enumerate(ids[:6]):
        inbox.consume([row], step)
        inbox.record_step(StepRecord(step, 1, 4, 2, 0.5, 0.1, 0.2, 0.3))
    assert inbox.settle(2, counted_from=0) == 0  # round 0's steps 0, 1 were averaged in
    assert inbox.settled_below() == 2
    assert inbox.settle(4, counted_from=4) == 2  # round 1 was left out: steps 2, 3 give theirs back
    assert [r.id for r in inbox.pending()] == [ids[2], ids[3], ids[6]]
    assert [r.step for r in inbox.steps()] == [0, 1, 4, 5]  # the left-out steps trained nothing in
    assert inbox.settle(6, counted_from=4) == 0  # round 2 counted
    assert inbox.settle(4, counted_from=0) == 0  # settling is never undone
    assert inbox.settled_below() == 6
    assert inbox.counts()["used"] == 4


# --- verifying pulled items -----------------------------------------------------------------------------


def verify(
    item: AcceptedRollout, validator: bytes = VALIDATOR.address, roots: dict[int, bytes] | None = None
) -> InboxEntry:
    roots = {0: v0_root()} if roots is None else roots
    return verify_accepted(item, run=RUN, validator=validator, grpo=GRPO, cfg=CFG, roots=roots, received_ms=5)


def refusal(item: AcceptedRollout, roots: dict[int, bytes] | None = None) -> Reason:
    with pytest.raises(ProtocolError) as info:
        verify(item, roots=roots)
    return info.value.reason


def test_an_honest_item_becomes_an_inbox_entry(submissions: list[RolloutSubmission]) -> None:
    item = accepted_item(3, submissions[0])
    got = verify(item)
    assert got.index == 3 and got.worker == WORKER.address and got.checkpoint_version == 0
    assert got.digest == envelope_digest(item.submission)
    assert got.groups == 4 and got.signal_groups == len(signal_groups(submissions[0].groups)) >= 1
    assert (got.submission, got.verdict, got.received_ms) == (item.submission, item.verdict, 5)


def test_a_forged_verdict_is_refused(submissions: list[RolloutSubmission]) -> None:
    item = accepted_item(1, submissions[0])
    envelope = decode(Envelope, item.verdict)
    forged = encode(replace(envelope, sig=bytes([envelope.sig[0] ^ 1]) + envelope.sig[1:]))
    assert refusal(replace(item, verdict=forged)) == Reason.BAD_SIGNATURE


def test_a_verdict_with_a_body_changed_after_signing_is_refused(submissions: list[RolloutSubmission]) -> None:
    item = accepted_item(1, submissions[0], accepted=False)
    envelope = decode(Envelope, item.verdict)
    flipped = replace(decode(Verdict, envelope.body), accepted=True)
    forged = encode(replace(envelope, body=encode(flipped)))
    assert refusal(replace(item, verdict=forged)) == Reason.BAD_SIGNATURE


def test_a_verdict_by_another_validator_is_refused(submissions: list[RolloutSubmission]) -> None:
    item = accepted_item(1, submissions[0])
    by_other = sealed(OTHER_VALIDATOR, decode(Verdict, decode(Envelope, item.verdict).body))
    assert refusal(replace(item, verdict=by_other)) == Reason.WRONG_SENDER


def test_a_rejecting_verdict_is_refused(submissions: list[RolloutSubmission]) -> None:
    assert refusal(accepted_item(1, submissions[0], accepted=False)) == Reason.RULE_VIOLATION


def test_a_verdict_for_another_submission_is_refused(submissions: list[RolloutSubmission]) -> None:
    item = accepted_item(1, submissions[0])
    other = accepted_item(2, submissions[1])
    assert refusal(replace(item, submission=other.submission)) == Reason.BAD_HASH


def test_a_submission_not_signed_by_the_verdicts_worker_is_refused(
    submissions: list[RolloutSubmission],
) -> None:
    envelope = sealed(OTHER_WORKER, submissions[0])
    verdict = verdict_for(envelope, WORKER.address)  # names WORKER, but OTHER_WORKER signed it
    assert refusal(AcceptedRollout(1, sealed(VALIDATOR, verdict), envelope)) == Reason.WRONG_SENDER


def test_a_verdict_of_another_run_is_refused(submissions: list[RolloutSubmission]) -> None:
    item = accepted_item(1, submissions[0])
    verdict = decode(Verdict, decode(Envelope, item.verdict).body)
    assert refusal(replace(item, verdict=sealed(VALIDATOR, verdict, run="otherrun"))) == Reason.WRONG_RUN


def test_a_submission_envelope_in_the_verdict_slot_is_refused(submissions: list[RolloutSubmission]) -> None:
    item = accepted_item(1, submissions[0])
    assert refusal(replace(item, verdict=item.submission)) == Reason.TYPE_MISMATCH


def test_a_verdict_naming_another_checkpoint_is_refused(submissions: list[RolloutSubmission]) -> None:
    assert refusal(accepted_item(1, submissions[0], checkpoint_version=1)) == Reason.RULE_VIOLATION


def test_submissions_the_step_cannot_take_are_refused(submissions: list[RolloutSubmission]) -> None:
    sub = submissions[0]
    group = sub.groups[0]
    first = group.completions[0]
    broken = [
        replace(sub, groups=()),
        replace(sub, groups=(replace(group, completions=group.completions[:2]),)),
        replace(sub, groups=(replace(group, completions=(replace(first, advantage=float("nan")),) * 4),)),
        replace(sub, groups=(replace(group, completions=(replace(first, logprobs=b"\0\0\0\0"),) * 4),)),
        replace(
            sub, groups=(replace(group, completions=(replace(first, token_ids=(CFG.vocab_size,)),) * 4),)
        ),
        replace(sub, groups=(replace(group, completions=(replace(first, token_ids=(1,) * 7),) * 4),)),
    ]
    for bad in broken:
        with pytest.raises(ProtocolError) as info:
            check_trainable(bad, GRPO, CFG)
        assert info.value.reason == Reason.RULE_VIOLATION
    check_trainable(sub, GRPO, CFG)


def test_a_batch_stores_good_items_skips_bad_ones_and_moves_the_cursor(
    inbox: RolloutInbox, submissions: list[RolloutSubmission]
) -> None:
    good1, good2 = accepted_item(4, submissions[0]), accepted_item(9, submissions[1])
    bad = accepted_item(6, submissions[2], accepted=False)
    result = ingest_batch(
        inbox,
        VALIDATOR.address,
        AcceptedBatch((good1, bad, good2), 9),
        run=RUN,
        grpo=GRPO,
        cfg=CFG,
        roots={0: v0_root()},
        now_ms=1,
    )
    assert result.stored.inserted == 2 and result.cursor == 9
    assert [(i, r) for i, r, _ in result.refused] == [(6, Reason.RULE_VIOLATION)]
    assert inbox.cursor(VALIDATOR.address) == 9
    assert [r.digest for r in inbox.pending()] == [
        envelope_digest(good1.submission),
        envelope_digest(good2.submission),
    ]
    # the same items again, or indices that do not rise, are refused and change nothing
    again = ingest_batch(
        inbox,
        VALIDATOR.address,
        AcceptedBatch((good2, good1), 9),
        run=RUN,
        grpo=GRPO,
        cfg=CFG,
        roots={0: v0_root()},
        now_ms=1,
    )
    assert again.stored.inserted == 0 and [i for i, _, _ in again.refused] == [9, 4]
    assert inbox.cursor(VALIDATOR.address) == 9


def test_a_validator_that_lost_its_log_is_pulled_from_the_start(inbox: RolloutInbox) -> None:
    inbox.store(VALIDATOR.address, [], cursor=40)
    result = ingest_batch(
        inbox,
        VALIDATOR.address,
        AcceptedBatch((), 3),
        run=RUN,
        grpo=GRPO,
        cfg=CFG,
        roots={0: v0_root()},
        now_ms=1,
    )
    assert result.cursor == 0 and inbox.cursor(VALIDATOR.address) == 0


# --- the batch of a step --------------------------------------------------------------------------------


def row(id: int, version: int, signal: int = 2) -> InboxRow:
    return InboxRow(id, bytes([id]) * 32, WORKER.address, version, 4, signal)


def test_a_step_takes_fresh_submissions_in_arrival_order_until_it_has_enough_signal() -> None:
    pending = [row(1, 3), row(2, 4, signal=0), row(3, 5), row(4, 2), row(5, 5, signal=3), row(6, 5)]
    plan = plan_batch(pending, step=5, async_level=2, need=4)
    assert [r.id for r in plan.take] == [1, 2, 3]  # whole submissions, zero-signal ones included
    assert plan.ready and plan.signal_groups == 4
    assert [r.id for r in plan.stale] == [4]  # version 2 < 5 - 2
    exceeding = plan_batch(pending, step=5, async_level=2, need=5)
    assert [r.id for r in exceeding.take] == [1, 2, 3, 5] and exceeding.signal_groups == 7


def test_a_step_waits_while_there_is_too_little_signal_and_leaves_newer_versions_alone() -> None:
    pending = [row(1, 0), row(2, 6), row(3, 1, signal=0)]
    plan = plan_batch(pending, step=1, async_level=2, need=3)
    assert not plan.ready and plan.take == () and plan.signal_groups == 2 and plan.stale == ()


def test_online_filtering_counts_only_groups_with_unequal_rewards() -> None:
    groups = [hand_group([1, 1, 1, 1]), hand_group([0, 1, 0, 0]), hand_group([0, 0, 0, 0])]
    assert signal_groups(groups) == [groups[1]]


# --- the work: descriptor, training, killing and resuming -----------------------------------------------


def work_config(data_dir: Path, **work: object) -> NodeConfig:
    return NodeConfig(
        identity=data_dir / "key",
        run=RUN,
        role="trainer",
        data_dir=data_dir,
        http_port=0,
        work=WorkSettings(**work),  # type: ignore[arg-type]
    )


def trainer_work(config: NodeConfig, **kwargs: Any) -> SwarmTrainerWork:
    """TRAINER's work on the run's model folder."""
    return SwarmTrainerWork(config, TRAINER, model_dir=eos_folder(), **kwargs)


def prepared_dir(data_dir: Path) -> Path:
    """A trainer data dir whose stored descriptor is the small one (as if published by an earlier life)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "run_descriptor.bin").write_bytes(encode(small_descriptor()))
    return data_dir


def test_the_descriptor_is_created_once_and_reused(tmp_path: Path) -> None:
    path, model, tasks = tmp_path / "run_descriptor.bin", eos_folder(), devnet_dataset()
    first = load_or_create_descriptor(path, RUN, TRAINER.address, model, tasks)
    configured = SwarmTrainerWork(work_config(tmp_path, model=str(model)), TRAINER)  # `[work] model`
    again = configured.run_descriptor(RUN, TRAINER.address)
    assert configured.model_dir == model and first == again and first.run == RUN
    assert first.task_kind == "arithmetic"
    assert run_commitment(first) == model_commitment(model)
    with pytest.raises(RunMismatch):
        load_or_create_descriptor(path, RUN, OTHER_WORKER.address, model, tasks)
    with pytest.raises(RunMismatch, match="co-trainers"):
        load_or_create_descriptor(path, RUN, TRAINER.address, model, tasks, (OTHER_WORKER.address,))


def test_a_run_is_not_created_on_fewer_tasks_than_its_prompts_per_step(tmp_path: Path) -> None:
    """Every worker's step draws prompts_per_step distinct tasks: a trainer refuses to publish a run its
    [work] tasks cannot feed, with the operator's one line (issue #32), and writes nothing."""
    from swarmnode.node.errors import OperatorError

    path = tmp_path / "run_descriptor.bin"
    expected = r"^\[work\] tasks has 25 tasks; the run takes 32 prompts per step"
    with pytest.raises(OperatorError, match=expected):
        load_or_create_descriptor(path, RUN, TRAINER.address, eos_folder(), devnet_dataset()[:25])
    assert not path.exists()


def test_an_unreadable_stored_descriptor_is_refused_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "run_descriptor.bin"
    path.write_bytes(encode(small_descriptor())[:-3])
    with pytest.raises(RunMismatch, match="older swarmnode, or damaged"):
        load_or_create_descriptor(path, RUN, TRAINER.address, eos_folder(), devnet_dataset())
    assert path.read_bytes() == encode(small_descriptor())[:-3]  # left for the operator to move


def test_a_killed_trainer_resumes_without_losing_or_reusing_an_accepted_rollout(
    tmp_path: Path, submissions: list[RolloutSubmission]
) -> None:
    data = prepared_dir(tmp_path / "trainer")
    items = [accepted_item(i + 1, sub) for i, sub in enumerate(submissions)]
    digests = [envelope_digest(i.submission) for i in items]

    async def life(steps: int, feed: list[AcceptedRollout]) -> dict[str, object]:
        work = trainer_work(work_config(data, steps=steps, min_batch_groups=1))
        async with trio.open_nursery() as nursery:
            endpoint = await nursery.start(work.serve)
            assert endpoint.startswith("http://127.0.0.1:")
            if feed:
                await work.ingest(VALIDATOR.address, AcceptedBatch(tuple(feed), feed[-1].index))
            await work.train()
            status = work.status() | {"catalog": work.origin_node.catalog.versions()}  # type: ignore[union-attr]
            latest = await work.manifest(ID(b"x"), ManifestRequest(RUN, LATEST_VERSION))
            assert latest.status == MANIFEST_OK
            assert latest.manifest == work.origin_node.catalog.latest.envelope  # type: ignore[union-attr]
            unknown = await work.manifest(ID(b"x"), ManifestRequest(RUN, 77))
            assert unknown.status == Reason.UNKNOWN_CHECKPOINT
            nursery.cancel_scope.cancel()  # the kill: nothing is flushed or closed politely before it
        return status

    first = trio.run(life, 1, items[:3])
    assert first["step"] == 1 and first["version"] == 1 and first["done"] is True
    assert first["submissions_received"] == 3 and first["submissions_used"] == 1
    assert first["per_worker"] == {"0x" + WORKER.address.hex(): 1}
    assert first["catalog"] == [0, 1]
    assert len(first["rewards"]) == 1 and len(first["step_s"]) == 1  # type: ignore[arg-type]
    assert first["groups_used"] + first["groups_filtered"] == 4  # type: ignore[operator]

    # second life: resumes at step 1 from its saved state, with its inbox and cursor; the last item arrives
    second = trio.run(life, 2, items[3:])
    assert second["step"] == 2 and second["catalog"] == [0, 1, 2]
    assert second["submissions_received"] == 4 and second["submissions_used"] == 2
    assert second["validators"] == {} and len(second["rewards"]) == 2  # type: ignore[arg-type]

    # a third life consumes a row for step 2 and is killed before saving step 2: the row comes back
    box = RolloutInbox(data / "inbox.sqlite")
    assert box.cursor(VALIDATOR.address) == 4
    used = {
        bytes(d) for (d,) in box._db.execute("SELECT digest FROM rollouts WHERE consumed_step IS NOT NULL")
    }
    assert used == set(digests[:2])
    box.consume([box.pending()[0].id], 2)
    box.close()
    third = trio.run(life, 2, [])  # already done: trains nothing, serves version 2 restored from disk
    assert third["submissions_used"] == 2 and third["catalog"] == [0, 1, 2]
    box = RolloutInbox(data / "inbox.sqlite")
    assert {r.digest for r in box.pending()} == set(digests[2:])
    box.close()


def test_a_ready_step_is_held_for_the_rows_of_its_oldest_version_by_the_measured_lag(tmp_path: Path) -> None:
    """The first row of each version gives one lag sample from the version's signed created_ms; a step
    whose oldest usable version is published waits HOLD_MARGIN median lags after it, one before is not
    held, and the set of versions seen stays bounded."""
    work = trainer_work(work_config(prepared_dir(tmp_path / "trainer"), steps=1))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(work.serve)
            assert work.origin_node is not None and work.origin_node.catalog.latest is not None
            published = work.origin_node.catalog.latest.manifest.created_ms  # version 0
            assert work._hold_until_ms(0) == 0  # nothing measured yet: at once
            work._note_arrivals({0}, published + 400)
            work._note_arrivals({0}, published + 9_000)  # not the first row of version 0: no sample
            work._note_arrivals({-2, 5}, published)  # versions never published: no sample
            assert work._lags == (400,)
            assert work._hold_until_ms(0) == published + round(HOLD_MARGIN * 400)
            assert work._hold_until_ms(-2) == 0  # no version older than the base: not held
            work._note_arrivals(set(range(100, 200)), published)
            assert len(work._lagged) <= 4 * LAG_HISTORY and 199 in work._lagged
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_step_without_learning_signal_is_reported_with_its_cause_and_cleared_by_a_step(
    tmp_path: Path, submissions: list[RolloutSubmission]
) -> None:
    """Rows whose groups all have zero advantage (the model never solves its tasks) fill a step's worth of
    groups: after `no_signal_after_s` the trainer says why in its status, though nothing more arrives; rows
    with signal then let the step start and the report goes."""
    work = trainer_work(
        work_config(prepared_dir(tmp_path / "trainer"), steps=1, min_batch_groups=2, no_signal_after_s=0.2)
    )
    unsolved = [
        RolloutSubmission(RUN, 1000 + i, 0, v0_root(), (hand_group([0.0] * 4), hand_group([0.0] * 4)))
        for i in range(2)
    ]
    rows = [
        replace(entry(i + 1, signal=0), groups=2, submission=sealed(WORKER, sub), step=sub.step)
        for i, sub in enumerate(unsolved)
    ]

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(work.serve)
            assert work.inbox is not None
            work.inbox.store(VALIDATOR.address, rows, 2)
            nursery.start_soon(work.train)
            await wait_until(lambda: bool(work.status()["signal"]), timeout=30)
            signal = work.status()["signal"]
            assert signal["starved"] and signal["groups"] == 4 and signal["signal_groups"] == 0
            assert signal["mean_reward"] == 0.0 and "never solves" in signal["message"]
            assert "swarmnode tasks filter" in signal["message"] and not work.done
            items = [accepted_item(i + 10, sub) for i, sub in enumerate(submissions[:2])]
            await work.ingest(VALIDATOR.address, AcceptedBatch(tuple(items), items[-1].index))
            await wait_until(lambda: work.done, timeout=120)
            assert work.status()["signal"] == {} and work.status()["step"] == 1
            nursery.cancel_scope.cancel()

    trio.run(main)


# --- over the network -----------------------------------------------------------------------------------


class ServingValidator(Validator):
    """A validator whose ACCEPTED side serves a fixed list (the real one lives in node.validator)."""

    def __init__(self, items: list[AcceptedRollout]) -> None:
        super().__init__()
        self.items = items
        self.requests: list[AcceptedRequest] = []

    def register(self, net: RoleNet) -> None:
        super().register(net)

        async def on_accepted(peer: ID, opened: Opened) -> AcceptedBatch:
            request: AcceptedRequest = opened.message
            self.requests.append(request)
            newer = [i for i in self.items if i.index > request.after][: request.limit]
            if not newer:
                await trio.sleep(min(request.wait_ms / 1000, 0.5))
            return AcceptedBatch(tuple(newer), self.items[-1].index)

        net.serve(ACCEPTED, on_accepted)


def test_the_trainer_pulls_from_a_validator_it_finds_trains_and_gossips_checkpoints(
    tmp_path: Path, submissions: list[RolloutSubmission]
) -> None:
    ports = [free_port(), free_port()]
    identities = [TRAINER, VALIDATOR]
    discovery = DiscoverySettings(early_refresh=(0.5, 1.0, 2.0), lookup_interval=2.0)

    def config(name: str, role: str, port: int, bootstrap: tuple[str, ...], **work: object) -> NodeConfig:
        return dataclasses.replace(
            work_config(tmp_path / name, **work),
            role=role,
            listen=f"/ip4/127.0.0.1/tcp/{port}",
            bootstrap=bootstrap,
            discovery=discovery,
            liveness=LivenessSettings(interval=1.0, idle_after=2.0, max_strikes=2),
        )

    bootstrap = (f"/ip4/127.0.0.1/tcp/{ports[0]}/p2p/{TRAINER.peer_id}",)
    trainer_config = config("trainer", "trainer", ports[0], (), steps=1, min_batch_groups=1)
    prepared_dir(trainer_config.data_dir)
    work = trainer_work(trainer_config)
    forged = replace(
        accepted_item(2, submissions[1]),
        verdict=sealed(
            OTHER_VALIDATOR, Verdict(RUN, bytes(32), WORKER.address, 0, 0, True, 100, "", (), 0, 0.0, 0.0)
        ),
    )
    validator = ServingValidator([accepted_item(1, submissions[0]), forged])

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            runtimes = [
                NodeRuntime(trainer_config, identities[0], Trainer(work)),
                NodeRuntime(config("validator", "validator", ports[1], bootstrap), identities[1], validator),
            ]
            for runtime in runtimes:
                await nursery.start(runtime.run)
            received = validator.work.received  # type: ignore[attr-defined]
            await wait_until(
                lambda: work.done and bool(received.get("checkpoints/checkpoint_head")), timeout=20
            )
            status = work.status()
            assert json.loads(json.dumps(status)) == status
            assert status["step"] == 1 and status["submissions_used"] == 1
            assert status["refused"] == {"WRONG_SENDER": 1}
            pulled = status["validators"]["0x" + VALIDATOR.address.hex()]  # type: ignore[index]
            assert pulled["cursor"] == 2 and pulled["refused"] == 1 and pulled["peer"] == VALIDATOR.peer_id
            assert validator.requests[0].after == 0 and validator.requests[-1].after == 2
            assert runtimes[0].guard is not None and runtimes[0].guard.reports >= 1
            nursery.cancel_scope.cancel()

    trio.run(main)


# --- review fixes: the ledger, the checkpoint, the advantage bound, overflow, one row per assignment --------


LEDGER_STAKE = 2 * 10**9
LEDGER_PARAMS = Params(
    min_stake_per_unit_gwei=10**9,
    unbonding_delay_epochs=24,
    slash_gwei=5 * 10**8,
    ejection_threshold=3,
    epoch_seconds=3600,
)


class PeersOnly:
    """The part of RoleNet `_pull_validators` reads: everyone here answered Hello with role=validator."""

    def __init__(self, identities: list[NodeIdentity]) -> None:
        self.records = [PeerRecord(i.peer_id, i.address, "validator", "", "test", 0.0) for i in identities]

    def peers(self, role: str) -> list[PeerRecord]:
        return list(self.records) if role == "validator" else []


def test_with_a_ledger_only_validators_in_good_standing_are_pulled_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good, worker, unstaked, unknown = (T.identity(n) for n in ("good", "worker", "unstaked", "unknown"))
    path = tmp_path / "ledger.db"
    writer = SignedLog.create(path, LEDGER_PARAMS, ledger_id="devnet")
    writer.register(good, "validator", T.compute())
    writer.deposit(good, LEDGER_STAKE)
    writer.register(worker, "worker", T.compute())  # staked, but not a validator
    writer.deposit(worker, LEDGER_STAKE)
    writer.register(unstaked, "validator", T.compute())  # a validator without its stake yet
    reader = SignedLog.open(path)  # the trainer's own handle: it must read what the writer appends later
    monkeypatch.setattr(pull_module, "PEER_SCAN_S", 0.02)
    monkeypatch.setattr(pull_module, "TRUST_CHECK_S", 0.1)
    work = trainer_work(work_config(tmp_path / "trainer"), ledger=reader)
    pulling: set[bytes] = set()
    stopped: list[bytes] = []

    async def fake_pull(net: object, validator: bytes) -> None:
        pulling.add(validator)
        try:
            await trio.sleep_forever()
        finally:
            pulling.discard(validator)
            stopped.append(validator)

    monkeypatch.setattr(work, "_pull", fake_pull)
    net = PeersOnly([good, worker, unstaked, unknown])

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(work._pull_validators, net)
            await wait_until(lambda: len(work.validators) == 4 and good.address in pulling, timeout=5)
            await trio.sleep(0.3)  # several re-checks: still only the good one
            assert pulling == {good.address}
            status = work.status()["validators"]
            assert status["0x" + good.address.hex()]["trusted"] is True
            assert status["0x" + worker.address.hex()]["pulling"] is False
            # the good one unbonds (loses its standing), the unstaked one deposits (gains it)
            writer.unbond(good, LEDGER_STAKE)
            writer.deposit(unstaked, LEDGER_STAKE)
            await wait_until(lambda: pulling == {unstaked.address}, timeout=5)
            assert stopped == [good.address]
            assert work.tallies.ledger_errors == 0
            nursery.cancel_scope.cancel()

    trio.run(main)
    writer.close()
    reader.close()


def test_a_failing_ledger_means_not_trusted_yet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ledger.db"
    ledger = SignedLog.create(path, LEDGER_PARAMS, ledger_id="devnet")
    ledger.register(VALIDATOR, "validator", T.compute())
    ledger.deposit(VALIDATOR, LEDGER_STAKE)
    ledger.close()  # every later call fails (sqlite3.ProgrammingError: closed database)
    work = trainer_work(work_config(tmp_path / "trainer"), ledger=ledger)
    state = trainer_module.ValidatorPull(PeersOnly([VALIDATOR]).records[0])
    assert trio.run(work._trusted, VALIDATOR.address, state) is False
    assert work.tallies.ledger_errors == 1 and state.trusted is False


def test_a_submission_must_name_a_published_version_with_its_root(
    submissions: list[RolloutSubmission],
) -> None:
    sub = submissions[0]
    assert verify(accepted_item(1, sub)).checkpoint_version == 0
    assert refusal(accepted_item(1, sub), roots={0: b"\x09" * 32}) == Reason.BAD_HASH
    assert refusal(accepted_item(1, sub), roots={}) == Reason.UNKNOWN_CHECKPOINT  # nothing published
    # version 1 (its step bound to it) when only version 0 was published: never published by us
    v1 = replace(sub, checkpoint_version=1, step=(1 << 32) | (sub.step & 0xFFFFFFFF))
    assert refusal(accepted_item(1, v1)) == Reason.UNKNOWN_CHECKPOINT
    assert verify(accepted_item(1, v1), roots={0: v0_root(), 1: v0_root()}).checkpoint_version == 1
    # older than every version kept: stale, nobody's fault
    with pytest.raises(Ignore) as info:
        verify(accepted_item(1, sub), roots={3: v0_root(), 4: v0_root()})
    assert info.value.reason == Reason.STALE


def test_advantages_beyond_the_group_normalised_bound_are_refused(
    submissions: list[RolloutSubmission],
) -> None:
    sub = submissions[0]
    group = sub.groups[0]
    bound = math.sqrt(GRPO.group_size - 1)

    def with_advantage(a: float) -> RolloutSubmission:
        completions = (replace(group.completions[0], advantage=a),) + group.completions[1:]
        return replace(sub, groups=(replace(group, completions=completions),))

    check_trainable(with_advantage(-bound), GRPO, CFG)  # all others equal: exactly sqrt(n - 1)
    for a in (bound * 1.01, -1e6):
        with pytest.raises(ProtocolError) as info:
            check_trainable(with_advantage(a), GRPO, CFG)
        assert info.value.reason == Reason.RULE_VIOLATION
    # the honest groups are within it
    assert all(abs(c.advantage) <= bound + 1e-4 for s in submissions for g in s.groups for c in g.completions)


def test_huge_versions_and_indices_are_refused_not_stored(
    inbox: RolloutInbox, submissions: list[RolloutSubmission]
) -> None:
    sub = submissions[0]
    huge = replace(sub, checkpoint_version=2**63, step=2**64 - 1)
    assert refusal(accepted_item(1, huge)) == Reason.BAD_ASSIGNMENT
    top = replace(sub, checkpoint_version=2**32, step=2**64 - 1)  # the step cannot carry it
    assert refusal(accepted_item(1, top)) == Reason.BAD_ASSIGNMENT
    far = accepted_item(2**63, submissions[1])  # allowed by the wire format, not storable
    good = accepted_item(5, submissions[2])
    batch = AcceptedBatch((accepted_item(3, huge), good, far), 2**63)
    result = ingest_batch(
        inbox, VALIDATOR.address, batch, run=RUN, grpo=GRPO, cfg=CFG, roots={0: v0_root()}, now_ms=1
    )
    assert result.stored.inserted == 1 and result.cursor == 5 and inbox.cursor(VALIDATOR.address) == 5
    assert [(i, r) for i, r, _ in result.refused] == [
        (3, Reason.BAD_ASSIGNMENT),
        (2**63, Reason.OUT_OF_RANGE),
    ]
    checked = check_batch(
        AcceptedBatch((far,), 2**63),
        0,
        run=RUN,
        validator=VALIDATOR.address,
        grpo=GRPO,
        cfg=CFG,
        roots={0: v0_root()},
        now_ms=1,
    )
    assert checked.cursor == 0 and checked.entries == ()


class OneValidatorNet:
    """The part of RoleNet `_pull` uses: ACCEPTED answers from a list, reports recorded."""

    run = RUN

    def __init__(self, batches: list[AcceptedBatch]) -> None:
        self.batches = batches
        self.reports: list[tuple[ID, Reason, str]] = []

    async def request(self, peer: ID, spec: object, request: AcceptedRequest) -> Any:
        if not self.batches:
            await trio.sleep_forever()
        return dataclasses.make_dataclass("Answer", ["message"])(self.batches.pop(0))

    def report(self, peer: ID, reason: Reason, detail: str = "") -> None:
        self.reports.append((peer, reason, detail))


def test_a_batch_that_fails_unexpectedly_is_counted_and_reported_and_the_pull_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inbox: RolloutInbox
) -> None:
    monkeypatch.setattr(pull_module, "PULL_BACKOFF_S", (0.01, 0.05))
    work = trainer_work(work_config(tmp_path / "trainer"))
    work.trainer, work.inbox, work.descriptor = object(), inbox, small_descriptor()  # type: ignore[assignment]
    work.validators[VALIDATOR.address] = trainer_module.ValidatorPull(PeersOnly([VALIDATOR]).records[0])
    net = OneValidatorNet([AcceptedBatch((), 1), AcceptedBatch((), 1)])
    seen: list[AcceptedBatch] = []

    async def ingest(validator: bytes, batch: AcceptedBatch) -> trainer_module.Ingested:
        seen.append(batch)
        if len(seen) == 1:
            raise OverflowError("Python int too large to convert to SQLite INTEGER")
        return trainer_module.Ingested(Stored(0, 0), 1, ())

    monkeypatch.setattr(work, "ingest", ingest)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(work._pull, net, VALIDATOR.address)
            await wait_until(lambda: len(seen) == 2, timeout=5)
            nursery.cancel_scope.cancel()

    trio.run(main)
    state = work.validators[VALIDATOR.address]
    assert state.errors == 1 and work.tallies.pull_errors == 1 and state.pulls >= 2
    [(peer, reason, detail)] = net.reports
    assert peer == ID.from_base58(VALIDATOR.peer_id) and reason == Reason.RULE_VIOLATION
    assert "OverflowError" in detail or "too large" in detail


def test_one_assignment_delivered_by_two_validators_is_stored_once(
    inbox: RolloutInbox, submissions: list[RolloutSubmission]
) -> None:
    sub = submissions[0]
    first = accepted_item(1, sub)
    # the worker sends the same assignment, sealed anew, to another validator, which accepts it too
    again = sealed(WORKER, sub)
    assert envelope_digest(again) != envelope_digest(first.submission)
    second = AcceptedRollout(1, sealed(OTHER_VALIDATOR, verdict_for(again, WORKER.address)), again)
    roots = {0: v0_root()}
    one = ingest_batch(
        inbox,
        VALIDATOR.address,
        AcceptedBatch((first,), 1),
        run=RUN,
        grpo=GRPO,
        cfg=CFG,
        roots=roots,
        now_ms=1,
    )
    other = ingest_batch(
        inbox,
        OTHER_VALIDATOR.address,
        AcceptedBatch((second,), 1),
        run=RUN,
        grpo=GRPO,
        cfg=CFG,
        roots=roots,
        now_ms=1,
    )
    assert (one.stored.inserted, other.stored.inserted, other.stored.duplicates) == (1, 0, 1)
    assert [r.digest for r in inbox.pending()] == [envelope_digest(first.submission)]
    assert inbox.cursor(OTHER_VALIDATOR.address) == 1  # the cursor still passes it
    # another assignment step of the same worker is a new row
    nxt = ingest_batch(
        inbox,
        VALIDATOR.address,
        AcceptedBatch((accepted_item(2, submissions[1]),), 2),
        run=RUN,
        grpo=GRPO,
        cfg=CFG,
        roots=roots,
        now_ms=1,
    )
    assert nxt.stored.inserted == 1 and len(inbox.pending()) == 2


def test_an_inbox_made_before_the_step_column_gets_it(tmp_path: Path) -> None:
    path = tmp_path / "inbox.sqlite"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE rollouts (id INTEGER PRIMARY KEY AUTOINCREMENT, validator BLOB NOT NULL,"
        " idx INTEGER NOT NULL, digest BLOB NOT NULL UNIQUE, worker BLOB NOT NULL,"
        " checkpoint_version INTEGER NOT NULL, groups INTEGER NOT NULL, signal_groups INTEGER NOT NULL,"
        " submission BLOB NOT NULL, verdict BLOB NOT NULL, received_ms INTEGER NOT NULL,"
        " consumed_step INTEGER, dropped_step INTEGER);"
        "INSERT INTO rollouts (validator, idx, digest, worker, checkpoint_version, groups, signal_groups,"
        " submission, verdict, received_ms) VALUES (x'02', 1, x'aa', x'04', 0, 4, 1, x'', x'', 1);"
    )
    db.close()
    box = RolloutInbox(path)
    stored = box.store(VALIDATOR.address, [entry(2), entry(3, digest=b"\x09" * 32)], cursor=3)
    assert (stored.inserted, stored.duplicates) == (2, 0) and len(box.pending()) == 3
    again = box.store(VALIDATOR.address, [replace(entry(2), digest=b"\x0a" * 32)], cursor=4)
    assert (again.inserted, again.duplicates) == (0, 1)  # same worker and step
    box.close()


# --- bounded tables ---------------------------------------------------------------------------------------


def most_recent(workers: list[int], cap: int) -> list[int]:
    """The `cap` distinct workers counted last, newest first."""
    return list(dict.fromkeys(reversed(workers)))[:cap]


@settings(max_examples=200, deadline=None)
@given(workers=st.lists(st.integers(0, 40), max_size=200), cap=st.integers(1, 8))
def test_the_verdict_tally_keeps_the_most_recently_counted_workers(workers: list[int], cap: int) -> None:
    """Its keys are the `cap` workers counted last; each one's count runs from when it last came in."""
    verdicts: OrderedDict[str, Counter[str]] = OrderedDict()
    came_in: dict[int, int] = {}
    for t, w in enumerate(workers):
        if w not in most_recent(workers[:t], cap):
            came_in[w] = t
        trainer_module.count_verdict(verdicts, f"w{w}", "accepted", cap=cap)
        assert len(verdicts) <= cap
    kept = most_recent(workers, cap)
    assert list(verdicts) == [f"w{w}" for w in reversed(kept)]
    for w in kept:
        assert verdicts[f"w{w}"]["accepted"] == workers[came_in[w] :].count(w)


def record(n: int) -> PeerRecord:
    return PeerRecord(f"peer{n}", n.to_bytes(20, "big"), "validator", "", "test", 0.0)


@settings(max_examples=200, deadline=None)
@given(
    scans=st.lists(st.lists(st.integers(0, 60), max_size=30), min_size=1, max_size=8),
    pulling=st.sets(st.integers(0, 60)),
    cap=st.integers(1, 10),
)
def test_tracked_validators_stay_under_the_cap_and_never_drop_one_being_pulled_from(
    scans: list[list[int]], pulling: set[int], cap: int
) -> None:
    tracked: dict[bytes, trainer_module.ValidatorPull] = {}
    now = 0.0
    for scan in scans:
        pulled_from = {a for a, p in tracked.items() if p.scope is not None}
        trainer_module.track_validators(tracked, [record(n) for n in scan], now, cap=cap)
        assert len(tracked) <= cap and pulled_from <= set(tracked)
        for address, pull in tracked.items():  # what the scan loop does: read each one's standing
            n = int.from_bytes(address, "big")
            if pull.checked_at is None or now - pull.checked_at >= trainer_module.TRUST_CHECK_S:
                pull.checked_at, pull.trusted = now, n in pulling
                pull.scope = trio.CancelScope() if n in pulling else None
        now += trainer_module.TRUST_CHECK_S / 2


def test_a_full_table_of_untrusted_validators_gives_way_to_a_newcomer_only_after_a_trust_check() -> None:
    tracked: dict[bytes, trainer_module.ValidatorPull] = {}
    trainer_module.track_validators(tracked, [record(1), record(2)], 0.0, cap=2)
    for pull in tracked.values():
        pull.checked_at, pull.trusted = 0.0, False  # read once: not a validator in good standing
    trainer_module.track_validators(tracked, [record(3)], 1.0, cap=2)
    assert set(tracked) == {record(1).address, record(2).address}  # too soon: no ledger read churn
    tracked[record(2).address].checked_at = 0.5
    trainer_module.track_validators(tracked, [record(3)], trainer_module.TRUST_CHECK_S, cap=2)
    assert set(tracked) == {record(2).address, record(3).address}  # the stalest one gave way


def test_a_validator_with_its_share_of_the_inbox_is_not_pulled_from_until_a_prune(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inbox: RolloutInbox
) -> None:
    monkeypatch.setattr(pull_module, "PULL_EMPTY_PAUSE_S", 0.01)
    assert [trainer_module.pull_limit(n, cap=20) for n in (0, 4, 19, 20, 99)] == [16, 16, 1, 0, 0]
    inbox.store(VALIDATOR.address, [entry(1), entry(2, version=5)], cursor=2)
    inbox.store(OTHER_VALIDATOR.address, [entry(3)], cursor=3)
    inbox.drop([inbox.pending()[0].id], 0)  # dropped rows are still held (on disk) until pruned
    assert inbox.held_from(VALIDATOR.address) == 2 and inbox.held_from(OTHER_VALIDATOR.address) == 1
    bounds = trainer_module.TrainerBounds(rows_per_validator=3)
    work = trainer_work(work_config(tmp_path / "trainer"), bounds=bounds)
    work.trainer, work.inbox, work.descriptor = object(), inbox, small_descriptor()  # type: ignore[assignment]
    work.validators[VALIDATOR.address] = trainer_module.ValidatorPull(PeersOnly([VALIDATOR]).records[0])
    asked: list[int] = []

    class Recording(OneValidatorNet):
        async def request(self, peer: ID, spec: object, request: AcceptedRequest) -> Any:
            asked.append(request.limit)
            return await super().request(peer, spec, request)

    async def ingest(validator: bytes, batch: AcceptedBatch) -> trainer_module.Ingested:
        inbox.store(validator, [entry(4, version=5)], cursor=4)  # its third row: its share is full
        return trainer_module.Ingested(Stored(1, 0), 4, ())

    monkeypatch.setattr(work, "ingest", ingest)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(work._pull, Recording([AcceptedBatch((), 4)]), VALIDATOR.address)
            await wait_until(lambda: len(asked) == 1, timeout=5)
            await trio.sleep(0.1)
            assert asked == [1]  # room for one; then full: no request while its rows are held
            inbox.prune(newest=2 + inbox.retention_versions + 1, async_level=2)  # version 0 goes
            await wait_until(lambda: len(asked) == 2, timeout=5)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert asked == [1, 1]


# --- the run on the ledger -------------------------------------------------------------------------------


class FailsFirst:
    """A real signed log whose first `failures` calls of `run` fail as an RPC outage would."""

    def __init__(self, inner: SignedLog, failures: int) -> None:
        self.inner = inner
        self.failures = failures

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def run(self, run: str) -> Any:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("rpc down")
        return self.inner.run(run)


def test_the_lead_registers_its_run_and_followers_refuse_another_owner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lead registers the run with the validators it names (bounds from the descriptor, a ledger outage
    waited out) and finds it its own after a restart; a lead naming none refuses an unregistered run; a
    trainer refuses a run another key owns (RunMismatch), whatever it names."""
    monkeypatch.setattr(registration_module, "RUN_WAIT_S", 0.01)
    other, validator = T.identity("another trainer"), T.identity("a validator")
    ledger = SignedLog.create(tmp_path / "ledger.db", LEDGER_PARAMS, ledger_id="devnet")
    for who in (TRAINER, other):
        ledger.register(who, "trainer", T.compute())
        ledger.deposit(who, LEDGER_STAKE)
    descriptor = small_descriptor()
    flaky = FailsFirst(ledger, failures=2)
    lead = trainer_work(work_config(tmp_path / "t"), ledger=flaky, run_validators=[validator.address])
    info = trio.run(lead.register_run, flaky, descriptor, 1000)
    grpo = descriptor.grpo
    assert (info.owner, info.validators) == (TRAINER.address, (validator.address,))
    assert info.max_tokens_per_credit == grpo.max_new_tokens * grpo.group_size * grpo.prompts_per_step
    assert info.max_flops_per_token == 2000 and lead.tallies.ledger_errors == 2
    assert trio.run(lead.register_run, ledger, descriptor, 1000) == info  # a restart

    unnamed = trainer_work(work_config(tmp_path / "u"), ledger=ledger)
    assert trio.run(unnamed.register_run, ledger, descriptor, 1000) == info  # registered: it checks the owner
    with pytest.raises(RunMismatch, match="names no validators"):
        trio.run(unnamed.register_run, ledger, replace(descriptor, run="unregistered"), 1000)
    with pytest.raises(RunMismatch, match="not by its descriptor.s trainer"):  # a follower of another trainer
        trio.run(unnamed.register_run, ledger, replace(descriptor, trainer=other.address), 1000)
    stranger = SwarmTrainerWork(work_config(tmp_path / "o"), other, model_dir=eos_folder(), ledger=ledger,
                                run_validators=[validator.address])  # fmt: skip
    with pytest.raises(RunMismatch, match="choose another run id"):
        trio.run(stranger.register_run, ledger, replace(descriptor, trainer=other.address), 1000)
    ledger.close()
