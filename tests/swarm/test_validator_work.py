"""The validator's work on real parts: the durable store, and the judge with real submissions, a real
checkpoint published by an origin, real signatures and a real signed-log ledger."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import trio

from swarmnode.crypto.hashing import sha256
from swarmnode.ledger.errors import BackendError, DuplicateSlash
from swarmnode.ledger.signedlog import SignedLog, verify_log
from swarmnode.ledger.types import Params
from swarmnode.node.config import NodeConfig
from swarmnode.node.dataplane.follower import VerifiedCheckpoint
from swarmnode.node.dataplane.origin import Sealer
from swarmnode.node.dataplane.roles import OriginNode
from swarmnode.node.rl.model import state_dict_of
from swarmnode.node.rl.rollouts import build_submission
from swarmnode.node.rl.run import (
    RunMismatch,
    RunSetup,
    devnet_grpo,
    devnet_policy,
    devnet_run,
    load_run_setup,
)
from swarmnode.node.validator import (
    MAX_PENDING_PER_WORKER,
    UNSAMPLED,
    SwarmValidatorWork,
    drawn_for_full_check,
    gets_full_check,
)
from swarmnode.node.validator import judging_loop as validator_module
from swarmnode.node.validator.store import AcceptedStore
from swarmnode.node.validator.store_rows import Decided, PendingItem
from swarmnode.protocol.codec import decode
from swarmnode.protocol.envelope import Envelope, envelope_digest, open_envelope, seal
from swarmnode.protocol.errors import Ignore, Reason, Reject
from swarmnode.protocol.messages import AcceptedRequest, RolloutSubmission, Verdict, VerdictBatch
from swarmnode.protocol.verdicts import check_opened_verdicts
from swarmnode.testing import cheats
from swarmnode.testing import ledger as T
from tests.forged import CODE_TASKS, code_grpo, program_submission
from tests.tinymodel import copy_folder, tiny_engine, tiny_folder

RUN = "devnet"
VERSION = 3
TRAINER, VALIDATOR = T.identity("trainer"), T.identity("validator")
HONEST, PERTURBED, TAMPERED, FORGED = (T.identity(n) for n in ("honest", "perturbed", "tampered", "forged"))
WORKERS = (HONEST, PERTURBED, TAMPERED, FORGED)
STAKE = 2 * 10**9
PARAMS = Params(
    min_stake_per_unit_gwei=10**9,
    unbonding_delay_epochs=24,
    slash_gwei=5 * 10**8,
    ejection_threshold=3,
    epoch_seconds=3600,
)


WINDOW = 2  # the run's challenge window, in epochs


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# --- fixtures: a run, its checkpoint v3, submissions --------------------------------------------------


@pytest.fixture(scope="module")
def base():
    """The run's base model: a tiny random-init Qwen2 folder (tests.tinymodel)."""
    return tiny_engine()


@pytest.fixture(scope="module")
def setup(base) -> RunSetup:
    grpo = dataclasses.replace(devnet_grpo(base.info), prompts_per_step=2, group_size=4)
    return devnet_run(TRAINER.address, tiny_folder(), created_ms=0, grpo=grpo)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, base) -> VerifiedCheckpoint:
    """Version 3 of the run, published by a real origin: the base weights as safetensors shards."""
    origin = OriginNode(tmp_path_factory.mktemp("origin"), TRAINER, RUN, shard_size=64 * 1024)

    async def publish():
        return await origin.origin.publish(
            state_dict_of(base.model),
            version=VERSION,
            parent_version=VERSION - 1,
            model_config_hash=base.info.config_hash,
        )

    manifest, envelope = trio.run(publish)
    return VerifiedCheckpoint(manifest, envelope, origin.store.complete_dir(VERSION))


def honest_submission(base, setup, worker, counter=0, version=VERSION, root=None, checkpoint=None):
    root = root if root is not None else checkpoint.manifest.merkle_root
    return build_submission(
        base, setup.descriptor, setup.dataset, setup.dataset_ids, worker.address, version, root, counter
    )


@pytest.fixture(scope="module")
def submissions(base, setup, checkpoint) -> dict[str, tuple[object, RolloutSubmission]]:
    """One submission per worker: honest, and the devnet's three cheats."""
    root = checkpoint.manifest.merkle_root
    d = setup.descriptor
    cheat_engine = tiny_engine()
    cheat_engine.load_weights(
        cheats.tamper_weights(cheats.PERTURBED_MODEL, state_dict_of(base.model), VERSION)
    )
    return {
        "honest": (HONEST, honest_submission(base, setup, HONEST, root=root)),
        "perturbed": (PERTURBED, honest_submission(cheat_engine, setup, PERTURBED, root=root)),
        "tampered": (
            TAMPERED,
            cheats.build_dishonest_submission(
                cheats.TAMPERED_PROMPT,
                base,
                d,
                setup.dataset,
                setup.dataset_ids,
                TAMPERED.address,
                VERSION,
                root,
                0,
            ),
        ),
        "forged": (
            FORGED,
            cheats.build_dishonest_submission(
                cheats.FORGED_REWARD,
                base,
                d,
                setup.dataset,
                setup.dataset_ids,
                FORGED.address,
                VERSION,
                root,
                0,
            ),
        ),
    }


def signed(worker, sub: RolloutSubmission, seq: int = 1):
    """What the SUBMIT handler hands the work: the opened envelope and its digest."""
    data = seal(worker, sub, run=RUN, seq=seq, ts=now_ms())
    return open_envelope(data, run=RUN, now_ms=now_ms(), replay=None), envelope_digest(data), data


def make_ledger(path: Path, **kwargs) -> SignedLog:
    """The trainer owns the run with VALIDATOR in its set; every worker staked. `kwargs`: SignedLog.create's
    (an epoch clock)."""
    ledger = SignedLog.create(path, PARAMS, ledger_id="devnet", **kwargs)
    for who, role in ((TRAINER, "trainer"), (VALIDATOR, "validator"), *((w, "worker") for w in WORKERS)):
        ledger.register(who, role, T.compute())
        ledger.deposit(who, STAKE)
    run = T.register_run(RUN, (VALIDATOR,), window=WINDOW, max_tokens=10**6, max_flops_per_token=2**32 - 1)
    ledger.register_run(TRAINER, run)
    return ledger


def make_work(tmp_path: Path, ledger, **kwargs) -> SwarmValidatorWork:
    config = NodeConfig(
        identity=tmp_path / "key.json", run=RUN, role="validator", data_dir=tmp_path / "validator"
    )
    return SwarmValidatorWork(config, VALIDATOR, ledger, model_dir=tiny_folder(), **kwargs)


class GossipLog:
    """The verdict side of a RoleNet: real seals with the validator's key; gossip kept in a list."""

    def __init__(self) -> None:
        self.identity = VALIDATOR
        self.sealer = Sealer(VALIDATOR, RUN)
        self.batches: list[VerdictBatch] = []
        self.published: list[Verdict] = []  # the verdicts of every batch, in order

    def seal(self, message) -> bytes:
        return self.sealer(message)

    async def publish(self, kind: str, message) -> bytes:
        assert kind == "verdicts" and isinstance(message, VerdictBatch)
        data = self.sealer(message)
        now = int(time.time() * 1000)
        opened = open_envelope(data, run=RUN, now_ms=now, replay=None, expect=VerdictBatch)
        check_opened_verdicts(opened)  # what every receiver checks
        self.batches.append(message)
        self.published.extend(message.verdicts)
        return data


async def wait_judged(work: SwarmValidatorWork, count: int) -> None:
    with trio.fail_after(20):
        await work.judging.wait_judged(count)


# --- the store -------------------------------------------------------------------------------------


def _pending(store: AcceptedStore, n: int, *, worker=b"\x01" * 20, step=None, size=100) -> PendingItem:
    return store.enqueue(
        digest=sha256(b"sub%d" % n),
        worker=worker,
        step=n if step is None else step,
        checkpoint_version=1,
        received_ms=n,
        envelope=bytes([n % 256]) * size,
        max_items=100,
        max_bytes=10**6,
    )


def _accept(store: AcceptedStore, item: PendingItem, size: int = 1000) -> int | None:
    return store.finish(
        item, status=0, tokens=5, verdict=b"v" * 10, submission=b"s" * size, judged_ms=item.received_ms
    )


def test_accepted_log_cursor_limits_and_restart(tmp_path):
    path = tmp_path / "v.db"
    store = AcceptedStore(path)
    assert store.after(0, 10, 10**6) == ([], 0)
    indices = [_accept(store, _pending(store, n), size=1000 * n) for n in range(1, 6)]
    assert indices == [1, 2, 3, 4, 5] and store.newest == 5
    items, newest = store.after(0, 3, 10**6)
    assert [i.index for i in items] == [1, 2, 3] and newest == 5
    assert items[1].submission == b"s" * 2000 and items[1].verdict == b"v" * 10
    items, _ = store.after(2, 10, 3000 + 4000 + 20)  # the byte cap stops before item 5
    assert [i.index for i in items] == [3, 4]
    items, _ = store.after(3, 10, 1)  # over the cap, but one item always comes
    assert [i.index for i in items] == [4]
    assert store.after(5, 10, 10**6) == ([], 5)
    secret = store.secret()
    store.close()
    again = AcceptedStore(path)
    assert again.newest == 5 and again.secret() == secret
    assert [i.index for i in again.after(0, 10, 10**6)[0]] == [1, 2, 3, 4, 5]
    assert _accept(again, _pending(again, 6)) == 6


def test_pending_queue_survives_restart_and_refuses_duplicates(tmp_path):
    path = tmp_path / "v.db"
    store = AcceptedStore(path)
    first, second = _pending(store, 1), _pending(store, 2)
    with pytest.raises(Ignore) as err:  # the same submission again
        _pending(store, 1)
    assert err.value.reason == Reason.DUPLICATE
    with pytest.raises(Reject) as err:  # another submission for a queued assignment step
        _pending(store, 3, step=2)
    assert err.value.reason == Reason.ASSIGNMENT_REUSED
    store.close()

    store = AcceptedStore(path)  # "killed" before judging: both are still queued, in order
    assert store.pending() == [first, second]
    assert store.pending_envelope(second.id) == bytes([2]) * 100
    store.finish(first, status=int(Reason.BAD_REWARD), tokens=0, verdict=b"v", submission=None, judged_ms=9)
    store.finish(
        second, status=int(Reason.STALE), tokens=0, verdict=b"", submission=None, judged_ms=9, ignored=True
    )
    assert store.pending() == [] and store.newest == 0
    with pytest.raises(Reject) as err:  # judged (rejected): the step stays taken
        _pending(store, 4, step=1)
    assert err.value.reason == Reason.ASSIGNMENT_REUSED
    retry = _pending(store, 5, step=2)  # ignored (stale): nobody's fault, the step may be retried
    counts = store.judged_counts()
    assert counts.by_status == {int(Reason.BAD_REWARD): 1} and counts.ignored == {int(Reason.STALE): 1}
    with pytest.raises(Ignore) as err:
        store.enqueue(
            digest=sha256(b"big"),
            worker=b"\x02" * 20,
            step=1,
            checkpoint_version=1,
            received_ms=0,
            envelope=b"x" * 1000,
            max_items=100,
            max_bytes=1000,
        )
    assert err.value.reason == Reason.NOT_FOR_US  # queue full (by bytes)
    store.close()
    assert AcceptedStore(path).pending() == [retry]


def test_every_ignore_frees_the_step_and_counts_as_an_ignore(tmp_path):
    """607 is an ignore although it is not a 2xx code: a resend of the step is queued, a restart counts it
    as ignored; a store from before the `ignored` flag is migrated the same way."""
    work = make_work(tmp_path, None)
    store = work.store
    first = _pending(store, 1)
    store.finish(
        first,
        status=int(Reason.UNKNOWN_CHECKPOINT),
        tokens=0,
        verdict=b"",
        submission=None,
        judged_ms=1,
        ignored=True,
    )
    _pending(store, 2, step=1)  # the same assignment step again: not a duplicate
    store.close()
    status = make_work(tmp_path, None).status()
    assert (status["ignored"], status["rejected"], status["judged"]) == (1, 0, 1)
    assert status["by_reason"] == {"UNKNOWN_CHECKPOINT": 1} and status["per_worker"] == {}

    old = tmp_path / "old.db"  # the schema before the flag: ignores were told by a 2xx code
    db = sqlite3.connect(old)
    db.executescript(
        "CREATE TABLE judged (digest BLOB PRIMARY KEY, worker BLOB NOT NULL, step BLOB NOT NULL,"
        " status INTEGER NOT NULL, tokens INTEGER NOT NULL, verdict BLOB NOT NULL,"
        " judged_ms INTEGER NOT NULL);"
        "CREATE UNIQUE INDEX judged_assignment ON judged (worker, step) WHERE status NOT BETWEEN 200 AND 299;"
    )
    worker = b"\x01" * 20
    for n, code in ((1, Reason.UNKNOWN_CHECKPOINT), (2, Reason.STALE), (3, Reason.BAD_REWARD)):
        db.execute(
            "INSERT INTO judged VALUES (?, ?, ?, ?, 0, x'', 0)",
            (sha256(b"old%d" % n), worker, n.to_bytes(8, "big"), int(code)),
        )
    db.commit()
    db.close()
    migrated = AcceptedStore(old)
    counts = migrated.judged_counts()
    assert counts.ignored == {int(Reason.UNKNOWN_CHECKPOINT): 1, int(Reason.STALE): 1}
    assert counts.by_status == {int(Reason.BAD_REWARD): 1}
    _pending(migrated, 1)  # step 1 (607) and step 2 (203) are free, step 3 (603) is taken
    _pending(migrated, 2)
    with pytest.raises(Reject) as err:
        _pending(migrated, 3)
    assert err.value.reason == Reason.ASSIGNMENT_REUSED
    migrated.close()


def test_a_decision_survives_a_restart_and_finish_keeps_its_verdict(tmp_path):
    path = tmp_path / "v.db"
    store = AcceptedStore(path)
    item, other = _pending(store, 1), _pending(store, 2)
    decided = Decided("accepted", 0, 5, b"verdict body", b"sealed verdict", True, 0.25)
    store.decide(item, decided, decided_ms=7)
    with pytest.raises(KeyError):  # decided once
        store.decide(item, decided, decided_ms=8)
    with pytest.raises(ValueError):  # an acceptance has status 0, a rejection its code
        store.decide(other, dataclasses.replace(decided, status=int(Reason.BAD_PROOF)), decided_ms=8)
    store.close()

    store = AcceptedStore(path)  # killed after deciding: the decision and the queue are both still there
    assert store.decided() == {item.id: decided} and store.pending() == [item, other]
    with pytest.raises(ValueError):  # finished with another verdict than the one decided
        store.finish(item, status=0, tokens=5, verdict=b"resealed", submission=b"s", judged_ms=9)
    assert store.decided() == {item.id: decided} and store.newest == 0
    assert (
        store.finish(item, status=0, tokens=5, verdict=b"sealed verdict", submission=b"s", judged_ms=9) == 1
    )
    assert store.decided() == {} and store.pending() == [other]
    assert store.after(0, 16, 10**6)[0][0].verdict == b"sealed verdict"
    with pytest.raises(KeyError):  # not pending any more
        store.decide(item, decided, decided_ms=10)
    store.close()


def test_a_cursor_beyond_any_index_is_refused(tmp_path):
    store = AcceptedStore(tmp_path / "v.db")
    for cursor in (2**63, 2**64 - 1):
        with pytest.raises(Reject) as err:
            store.after(cursor, 16, 10**6)
        assert err.value.reason == Reason.OUT_OF_RANGE
    assert store.after(2**63 - 1, 16, 10**6) == ([], 0)


def test_long_poll_wakes_on_acceptance(tmp_path):
    store = AcceptedStore(tmp_path / "v.db")
    item = _pending(store, 1)

    async def main():
        start = trio.current_time()
        assert await store.wait_after(0, 0.05) == 0  # nothing: returns at the timeout
        assert trio.current_time() - start >= 0.05
        async with trio.open_nursery() as nursery:

            async def accept_soon():
                await trio.sleep(0.05)
                await store.finish_async(item, status=0, tokens=1, verdict=b"v", submission=b"s", judged_ms=0)

            nursery.start_soon(accept_soon)
            with trio.fail_after(5):
                assert await store.wait_after(0, 30.0) == 1

    trio.run(main)


def test_the_full_check_draw_is_a_secret_fraction():
    digests = [sha256(b"%d" % i) for i in range(4000)]
    a, b = b"a" * 32, b"b" * 32
    drawn = [drawn_for_full_check(a, d, 0.25) for d in digests]
    assert 0.22 < sum(drawn) / len(drawn) < 0.28
    assert drawn != [drawn_for_full_check(b, d, 0.25) for d in digests]  # another secret, another draw
    assert all(drawn_for_full_check(a, d, 1.0) for d in digests[:50])
    assert not any(drawn_for_full_check(a, d, 0.0) for d in digests[:50])


# --- the judge ---------------------------------------------------------------------------------------


def test_honest_work_is_credited_and_every_cheat_is_slashed(tmp_path, setup, checkpoint, submissions):
    ledger = make_ledger(tmp_path / "ledger.db")
    work = make_work(tmp_path, ledger)
    out = GossipLog()
    acks = {}

    async def main():
        await work.prepare(setup)
        assert await work.hold_verified(checkpoint)
        async with trio.open_nursery() as nursery:
            await nursery.start(work.judge_forever, out)
            sent = {}
            for name, (worker, sub) in submissions.items():
                opened, digest, _ = sent[name] = signed(worker, sub)
                acks[name] = await work.submit(None, opened, digest)
            await wait_judged(work, len(submissions))
            await work.settlement.commit_credits()  # the committer's round, without waiting for its interval
            duplicate = await work.submit(None, *sent["honest"][:2])  # the same envelope again
            assert duplicate.status == Reason.DUPLICATE
            resealed = await work.submit(None, *signed(HONEST, submissions["honest"][1], seq=2)[:2])
            assert resealed.status == Reason.ASSIGNMENT_REUSED  # the same assignment, sealed anew
            request = open_envelope(
                seal(TRAINER, AcceptedRequest(RUN, 0, 16, 0), run=RUN, seq=1, ts=now_ms()),
                run=RUN,
                now_ms=now_ms(),
                replay=None,
            )
            batch = await work.accepted_log.serve_accepted(None, request)
            counts = work.counts
            await poll_until(lambda: len(out.published) == counts.accepted + counts.rejected)  # a flush away
            nursery.cancel_scope.cancel()
        return batch

    batch = trio.run(main)
    assert {name: ack.status for name, ack in acks.items()} == dict.fromkeys(submissions, 100)

    verdicts = {v.worker: v for v in out.published}
    assert verdicts[HONEST.address].accepted
    assert verdicts[PERTURBED.address].reason_code == Reason.BAD_PROOF
    assert verdicts[PERTURBED.address].failing_chunks
    assert verdicts[TAMPERED.address].reason_code == Reason.BAD_ASSIGNMENT
    assert verdicts[FORGED.address].reason_code == Reason.BAD_REWARD

    # the trainer's pull: the honest submission, with the validator's sealed accepting verdict
    assert batch.newest == 1 and [i.index for i in batch.items] == [1]
    item = batch.items[0]
    verdict_envelope = decode(Envelope, item.verdict)
    assert verdict_envelope.sender == VALIDATOR.address
    assert decode(Verdict, verdict_envelope.body) == verdicts[HONEST.address]
    assert decode(RolloutSubmission, decode(Envelope, item.submission).body) == submissions["honest"][1]

    # the ledger accepted every write, so its own evidence checks passed; the log audits clean
    ledger.refresh()
    [credit] = ledger.contributions()
    assert credit.worker == HONEST.address and credit.tokens == verdicts[HONEST.address].tokens > 0
    assert credit.rollout_digest == verdicts[HONEST.address].submission_digest
    assert credit.flops == 2 * work.run_context.engines.parameters * credit.tokens
    [batch] = ledger.batches()
    assert (batch.validator, batch.count) == (VALIDATOR.address, 1)
    assert ledger.check_credit_proof(ledger.prove_credit(credit.index))
    slashed = {s.worker: s for s in ledger.slashes()}
    assert set(slashed) == {PERTURBED.address, TAMPERED.address, FORGED.address}
    assert slashed[PERTURBED.address].failing_chunks == verdicts[PERTURBED.address].failing_chunks
    # filed, pending their challenge window: nothing taken yet
    assert all(
        (s.status, s.taken_gwei, s.requested_gwei) == ("pending", 0, PARAMS.slash_gwei)
        for s in slashed.values()
    )
    assert all(s.final_epoch == s.epoch + WINDOW for s in slashed.values())
    assert not ledger.slashes(HONEST.address)
    assert ledger.stake(HONEST.address).bonded_gwei == STAKE
    assert verify_log(tmp_path / "ledger.db").ok

    status = work.status()
    assert (status["judged"], status["accepted"], status["rejected"], status["ignored"]) == (4, 1, 3, 0)
    assert status["by_reason"] == {"BAD_ASSIGNMENT": 1, "BAD_PROOF": 1, "BAD_REWARD": 1}
    assert (status["slashes"], status["contributions"], status["ledger_errors"]) == (3, 1, 0)
    assert status["slashes_pending"] == 3 and status["slashes_finalized"] == 0
    assert status["credits"] == {"queued": 0, "committed": 1, "batches": 1, "dropped": {}, "blocked": ""}
    assert status["per_worker"]["0x" + HONEST.address.hex()] == {"accepted": 1, "rejected": 0, "slashed": 0}
    assert status["per_worker"]["0x" + PERTURBED.address.hex()]["slashed"] == 1
    assert status["versions_held"] == [VERSION] and status["queued"] == 0 and status["cpu_s"] > 0
    assert json.loads(json.dumps(status)) == status  # what the status file holds
    ledger.close()


def test_queued_submissions_are_judged_after_a_restart(tmp_path, setup, checkpoint, submissions):
    ledger = make_ledger(tmp_path / "ledger.db")
    opened, digest, _ = signed(HONEST, submissions["honest"][1])

    async def queue_only():  # a validator that acknowledges and is killed before judging
        work = make_work(tmp_path, ledger)
        await work.prepare(setup)
        ack = await work.submit(None, opened, digest)
        assert ack.status == 100 and work.status()["queued"] == 1
        work.store.close()

    trio.run(queue_only)
    work = make_work(tmp_path, ledger)
    assert work.status()["queued"] == 1

    async def restart():
        await work.prepare(setup)
        await work.hold_verified(checkpoint)
        async with trio.open_nursery() as nursery:
            await nursery.start(work.judge_forever, GossipLog())
            await wait_judged(work, 1)
            await work.settlement.commit_credits()
            nursery.cancel_scope.cancel()

    trio.run(restart)
    assert work.status()["accepted"] == 1 and work.store.newest == 1
    assert [c.rollout_digest for c in ledger.contributions()] == [digest]
    ledger.close()
    assert make_work(tmp_path, None).status()["accepted"] == 1  # outcome counts are read back too


def test_a_submission_waits_for_its_checkpoint(tmp_path, base, setup, checkpoint):
    """v4 is not held when its submission arrives: it waits (no verdict) and is judged once v4 loads."""
    state = state_dict_of(base.model)
    root4 = sha256(b"v4 root")
    sub = honest_submission(base, setup, HONEST, version=4, root=root4)
    work = make_work(tmp_path, None)

    async def main():
        await work.prepare(setup)
        await work.hold_verified(checkpoint)
        async with trio.open_nursery() as nursery:
            await nursery.start(work.judge_forever, GossipLog())
            assert (await work.submit(None, *signed(HONEST, sub)[:2])).status == 100
            await trio.sleep(0.3)
            assert work.counts.judged == 0 and work.status()["queued"] == 1
            await work.hold(4, root4, state)
            await wait_judged(work, 1)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert work.status()["accepted"] == 1 and work.status()["versions_held"] == [3, 4]


def test_a_checkpoint_that_never_comes_is_ignored_after_the_wait(tmp_path, base, setup, checkpoint):
    sub = honest_submission(base, setup, HONEST, version=5, root=sha256(b"v5"))
    work = make_work(tmp_path, None, wait_for_checkpoint_s=0.2)
    out = GossipLog()

    async def main():
        await work.prepare(setup)
        await work.hold_verified(checkpoint)
        async with trio.open_nursery() as nursery:
            await nursery.start(work.judge_forever, out)
            await work.submit(None, *signed(HONEST, sub)[:2])
            await wait_judged(work, 1)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert work.status()["ignored"] == 1 and work.status()["by_reason"] == {"UNKNOWN_CHECKPOINT": 1}
    assert out.published == []  # an ignore is nobody's fault: no verdict is gossiped


def test_unsampled_submissions_get_only_the_cheap_checks(tmp_path, setup, checkpoint, submissions):
    """sample_fraction 0: a perturbed model goes unseen, a forged reward is still caught (and slashed)."""
    policy = dataclasses.replace(setup.descriptor.policy, sample_fraction=0.0)
    unsampled = RunSetup(dataclasses.replace(setup.descriptor, policy=policy), setup.tasks)
    ledger = make_ledger(tmp_path / "ledger.db")
    work = make_work(tmp_path, ledger)

    async def main():
        await work.prepare(unsampled)
        await work.hold_verified(checkpoint)
        async with trio.open_nursery() as nursery:
            await nursery.start(work.judge_forever, GossipLog())
            for name in ("perturbed", "forged"):
                worker, sub = submissions[name]
                await work.submit(None, *signed(worker, sub)[:2])
            await wait_judged(work, 2)
            nursery.cancel_scope.cancel()

    trio.run(main)
    status = work.status()
    assert (status["full_checks"], status["cheap_checks"]) == (0, 2)
    assert (status["accepted"], status["rejected"], status["slashes"]) == (1, 1, 1)
    assert [s.worker for s in ledger.slashes()] == [FORGED.address]
    ledger.close()


def test_a_code_submission_is_always_checked_in_full(tmp_path, base, checkpoint, submissions):
    """sample_fraction 0 on a run of code tasks: grading a code completion executes it, so every such
    submission is drawn for the model checks, whatever the fraction. The worker's own program claimed as
    the model's (tests.forged) is refused by the sampling check and slashed; the status counts a full check
    and the verdict is a full one."""
    policy = dataclasses.replace(devnet_policy(), sample_fraction=0.0)
    grpo = code_grpo(devnet_grpo(base.info), base.tokenizer)
    code = devnet_run(TRAINER.address, tiny_folder(), 0, grpo=grpo, policy=policy, tasks=CODE_TASKS)
    root, worker = checkpoint.manifest.merkle_root, FORGED.address
    sub = program_submission(base, code.descriptor, code.dataset, code.dataset_ids, worker, VERSION, root)
    opened, digest, _ = signed(FORGED, sub)
    secret = b"s" * 32
    assert gets_full_check(sub, code.dataset, secret, digest, 0.0)
    arithmetic = submissions["honest"][1]  # parsing kinds keep the draw
    assert not gets_full_check(arithmetic, {t.task_id: t for t in CODE_TASKS}, secret, digest, 0.0)
    ledger = make_ledger(tmp_path / "ledger.db")
    work = make_work(tmp_path, ledger)
    out = GossipLog()

    async def main():
        await work.prepare(code)
        await work.hold_verified(checkpoint)
        async with trio.open_nursery() as nursery:
            await nursery.start(work.judge_forever, out)
            assert (await work.submit(None, opened, digest)).status == 100
            await wait_judged(work, 1)
            await poll_until(lambda: len(out.published) == 1)
            nursery.cancel_scope.cancel()

    trio.run(main)
    status = work.status()
    assert (status["full_checks"], status["cheap_checks"]) == (1, 0)
    assert status["by_reason"] == {"BAD_SAMPLING": 1} and status["slashes"] == 1
    [verdict] = out.published
    assert verdict.reason_code == Reason.BAD_SAMPLING and verdict.detail != UNSAMPLED
    assert [s.worker for s in ledger.slashes()] == [FORGED.address]
    ledger.close()


class FlakyLedger:
    """A real signed log behind per-method failures: `fail[name]` is raised instead of calling it."""

    def __init__(self, inner: SignedLog) -> None:
        self.inner = inner
        self.fail: dict[str, Exception] = {}
        self.calls: dict[str, int] = {}

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            self.calls[name] = self.calls.get(name, 0) + 1
            failure = self.fail.get(name)
            if failure is not None:
                raise failure
            return attr(*args, **kwargs)

        return call


async def poll_until(predicate, timeout: float = 20.0) -> None:  # noqa: ASYNC109
    with trio.fail_after(timeout):
        while not predicate():  # noqa: ASYNC110
            await trio.sleep(0.02)


def test_a_ledger_outage_defers_judgements_and_never_accepts_unread_stake(
    tmp_path, setup, checkpoint, submissions, monkeypatch
):
    """Eligibility unreadable (a web3-style error): nothing is judged. A slash failing (OSError): judged
    once, kept queued, retried with backoff until the ledger answers; an acceptance finishes at once, its
    credit queued, and a failing commit (BackendError) is retried by the committer. A typed refusal
    (DuplicateSlash) decides the write: the submission leaves the queue without a retry."""
    inner = make_ledger(tmp_path / "ledger.db")
    ledger = FlakyLedger(inner)
    work = make_work(tmp_path, ledger, ledger_retry_s=0.02, ledger_retry_max_s=0.1, credit_interval_s=0.05)
    out = GossipLog()
    judged_calls = []
    real_judge = validator_module.judge_submission

    def counting_judge(sub, worker, *args):
        judged_calls.append(worker)
        return real_judge(sub, worker, *args)

    monkeypatch.setattr(validator_module, "judge_submission", counting_judge)

    async def main():
        await work.prepare(setup)
        await work.hold_verified(checkpoint)
        for name in ("honest", "forged"):  # queued while the stake reads (SUBMIT's) still answer
            worker, sub = submissions[name]
            assert (await work.submit(None, *signed(worker, sub)[:2])).status == 100
        ledger.fail = {
            "is_eligible": RuntimeError("{'code': -32000, 'message': 'header not found'}"),
            "commit_credits": BackendError("rpc down"),
            "slash": OSError("connection reset"),
        }
        async with trio.open_nursery() as nursery:
            await nursery.start(work.judge_forever, out)
            await poll_until(lambda: work.judging.ledger_retries >= 6)  # several retries of both
            assert judged_calls == [] and work.counts.judged == 0 and work.status()["queued"] == 2

            del ledger.fail["is_eligible"]  # stake readable, writes still failing
            await poll_until(
                lambda: ledger.calls.get("slash", 0) >= 2 and ledger.calls.get("commit_credits", 0) >= 2
            )
            # the acceptance is done: its credit waits
            assert work.counts.judged == 1 and work.counts.accepted == 1
            assert (
                work.status()["credits"]["queued"] == 1 and "rpc down" in work.status()["credits"]["blocked"]
            )
            [decided] = work.store.decided().values()  # the slash's retries use the decision stored first
            assert decided.outcome == "rejected"

            ledger.fail = {"slash": DuplicateSlash("already slashed")}  # commits work; the slash is decided
            await wait_judged(work, 2)
            await poll_until(lambda: work.settlement.contributions == 1 and len(out.published) == 2)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert sorted(judged_calls) == sorted([HONEST.address, FORGED.address])  # judged once each
    status = work.status()
    assert (status["accepted"], status["rejected"], status["queued"]) == (1, 1, 0)
    assert (status["contributions"], status["slashes"], status["ledger_refusals"]) == (1, 0, 1)
    assert status["ledger_deferred"] == 0 and status["ledger_retries"] >= 6
    assert status["credits"]["queued"] == 0 and status["credits"]["blocked"] == ""
    assert sorted(v.worker for v in out.published) == sorted([HONEST.address, FORGED.address])
    assert work.store.decided() == {}
    inner.refresh()
    assert [c.worker for c in inner.contributions()] == [HONEST.address] and inner.slashes() == []
    inner.close()


@pytest.mark.parametrize("crash", ["before_ledger_write", "before_finish"])
@pytest.mark.parametrize("name", ["honest", "forged"])
def test_a_decided_submission_is_not_judged_again_after_a_crash(
    tmp_path, setup, checkpoint, submissions, monkeypatch, name, crash
):
    """Killed after the decision was stored, before (or after) the ledger write, before `finish`. The
    restarted validator holds no checkpoint (judged again, the submission would be ignored 607 after its
    wait), yet it does not judge again: it replays the slash (a duplicate refusal when it was filed before
    the crash), finishes with the verdict sealed before the crash (an acceptance queues its credit then,
    committed once) and gossips it once."""
    ledger_path = tmp_path / "ledger.db"
    make_ledger(ledger_path).close()
    worker, sub = submissions[name]
    opened, digest, _ = signed(worker, sub)
    first_out = GossipLog()

    async def judge_then_die():
        ledger = SignedLog.open(ledger_path)
        work = make_work(tmp_path, ledger)
        await work.prepare(setup)
        await work.hold_verified(checkpoint)
        async with trio.open_nursery() as nursery:

            async def killed(*args, **kwargs):  # the process dies here: nothing after this point runs
                nursery.cancel_scope.cancel()
                await trio.sleep_forever()

            if crash == "before_finish":
                work.store.finish_async = killed
            else:
                work.judging._write_ledger = killed
            await nursery.start(work.judge_forever, first_out)
            assert (await work.submit(None, opened, digest)).status == 100
            await trio.sleep_forever()
        decided = work.store.decided()
        written = len(ledger.contributions()) + len(ledger.slashes())
        work.store.close()
        ledger.close()
        return decided, written

    stored, written = trio.run(judge_then_die)
    [decided] = stored.values()
    assert decided.outcome == ("accepted" if name == "honest" else "rejected") and decided.sealed
    assert (
        written == (1 if crash == "before_finish" and name == "forged" else 0) and first_out.published == []
    )

    def judge_again(*args):
        raise AssertionError("a decided submission was judged again")

    monkeypatch.setattr(validator_module, "judge_submission", judge_again)
    ledger = SignedLog.open(ledger_path)
    work = make_work(tmp_path, ledger, wait_for_checkpoint_s=0.1)
    out = GossipLog()
    assert work.status()["queued"] == 1

    async def restart():
        await work.prepare(setup)  # no checkpoint held: no engine could judge it
        async with trio.open_nursery() as nursery:
            await nursery.start(work.judge_forever, out)
            await wait_judged(work, 1)
            await poll_until(lambda: out.published)
            await work.settlement.commit_credits()
            nursery.cancel_scope.cancel()

    trio.run(restart)
    status = work.status()
    assert status["queued"] == 0 and status["versions_held"] == [] and status["ignored"] == 0
    assert status["ledger_refusals"] == (1 if crash == "before_finish" and name == "forged" else 0)
    assert work.store.decided() == {}
    [gossiped] = out.published
    assert gossiped == decode(Verdict, decode(Envelope, decided.sealed).body)
    ledger.refresh()
    if name == "honest":
        assert status["accepted"] == 1 and work.store.newest == 1
        [item], _ = work.store.after(0, 16, 10**6)
        assert item.verdict == decided.sealed  # byte for byte: sealed once, before the crash
        assert decode(RolloutSubmission, decode(Envelope, item.submission).body) == sub
        [credit] = ledger.contributions()
        assert credit.rollout_digest == digest and status["contributions"] == 1
        assert ledger.slashes() == []
    else:
        assert status["rejected"] == 1 and status["by_reason"] == {"BAD_REWARD": 1}
        assert work.store.newest == 0 and ledger.contributions() == []
        [slash] = ledger.slashes()
        assert slash.worker == FORGED.address
    assert trio.run(work.submit, None, opened, digest).status == Reason.DUPLICATE  # judged: decided for good
    work.store.close()
    ledger.close()
    assert verify_log(ledger_path).ok


def accepted_request(sender, after: int, wait_ms: int):
    data = seal(sender, AcceptedRequest(RUN, after, 16, wait_ms), run=RUN, seq=1, ts=now_ms())
    return open_envelope(data, run=RUN, now_ms=now_ms(), replay=None)


def test_accepted_is_served_to_the_trainer_only(tmp_path):
    work = make_work(tmp_path, None)

    async def main():
        with pytest.raises(Ignore) as err:  # the run (so its trainer) is not known yet
            await work.accepted_log.serve_accepted(None, accepted_request(TRAINER, 0, 0))
        assert err.value.reason == Reason.NOT_FOR_US
        work.run_context.trainers = frozenset({TRAINER.address})  # what the run record (or prepare) sets
        start = trio.current_time()
        with pytest.raises(Ignore) as err:  # anyone else: refused at once, no 30 s long poll held
            await work.accepted_log.serve_accepted(None, accepted_request(HONEST, 0, 30_000))
        assert err.value.reason == Reason.NOT_FOR_US and trio.current_time() - start < 1.0
        with pytest.raises(Reject) as err:  # a cursor SQLite cannot hold
            await work.accepted_log.serve_accepted(None, accepted_request(TRAINER, 2**63, 0))
        assert err.value.reason == Reason.OUT_OF_RANGE
        batch = await work.accepted_log.serve_accepted(None, accepted_request(TRAINER, 0, 0))
        assert batch.items == () and batch.newest == 0

    trio.run(main)
    assert work.status()["accepted_refused"] == 3


def test_accepted_is_served_to_the_co_trainers_the_descriptor_names(tmp_path, setup):
    """A multi-trainer (DiLoCo) run: every trainer it names pulls the same log; anyone else is refused."""
    co_trainer, stranger = T.identity("co-trainer"), T.identity("stranger")
    descriptor = dataclasses.replace(setup.descriptor, co_trainers=(co_trainer.address,))
    work = make_work(tmp_path, None)
    index = _accept(work.store, _pending(work.store, 1))

    async def main():
        await work.prepare(RunSetup(descriptor, setup.tasks))
        for trainer in (TRAINER, co_trainer):  # the lead and its co-trainer, each with its own cursor
            batch = await work.accepted_log.serve_accepted(None, accepted_request(trainer, 0, 0))
            assert [i.index for i in batch.items] == [index] and batch.newest == index
        for other in (stranger, HONEST):  # a stranger, a worker of the run: refused as before
            with pytest.raises(Ignore) as err:
                await work.accepted_log.serve_accepted(None, accepted_request(other, 0, 0))
            assert err.value.reason == Reason.NOT_FOR_US

    trio.run(main)
    assert work.run_context.trainers == {TRAINER.address, co_trainer.address}
    assert work.status()["accepted_refused"] == 2


def test_submit_refuses_unknown_versions_and_caps_each_worker(tmp_path, setup, submissions):
    """A version above the newest trainer-signed manifest seen is ignored 607 at SUBMIT; a worker holds at
    most MAX_PENDING_PER_WORKER places in the queue."""
    work = make_work(tmp_path, None)
    work.run_context.follower = SimpleNamespace(
        node=SimpleNamespace(catalog=SimpleNamespace(latest_version=VERSION)), statistics=dict
    )
    _, sub = submissions["honest"]

    async def main():
        await work.prepare(setup)
        ahead = dataclasses.replace(sub, checkpoint_version=VERSION + 1, step=(VERSION + 1) << 32)
        ack = await work.submit(None, *signed(HONEST, ahead)[:2])
        assert ack.status == Reason.UNKNOWN_CHECKPOINT
        acks = []
        for i in range(MAX_PENDING_PER_WORKER + 1):
            mine = dataclasses.replace(sub, step=sub.step + i)
            acks.append((await work.submit(None, *signed(HONEST, mine)[:2])).status)
        assert acks == [100] * MAX_PENDING_PER_WORKER + [Reason.NOT_FOR_US]
        other = await work.submit(None, *signed(FORGED, sub)[:2])
        assert other.status == 100  # another worker still has room

    trio.run(main)
    assert work.status()["queued"] == MAX_PENDING_PER_WORKER + 1 and work.intake.refused == 2


def test_checkpoint_engines_keep_the_newest_versions(tmp_path, base, setup):
    work = make_work(tmp_path, None)
    state = state_dict_of(base.model)
    shifted = {k: v + 0.01 if v.is_floating_point() else v for k, v in state.items()}

    async def main():
        await work.prepare(setup)  # async_level 2: three versions
        for version in (1, 2, 3, 4):
            assert await work.hold(version, sha256(b"%d" % version), shifted if version == 4 else state)
        assert not await work.hold(1, sha256(b"1"), state)  # older than everything kept
        assert not await work.hold(4, sha256(b"4"), state)  # held already

    trio.run(main)
    engines = work.run_context.engines
    assert engines.versions() == [2, 3, 4] and engines.roots()[4] == sha256(b"4")
    weight = next(iter(state))
    assert torch.equal(engines.engine(4).model.state_dict()[weight], shifted[weight])
    assert torch.equal(engines.engine(3).model.state_dict()[weight], state[weight])


# --- over the network ----------------------------------------------------------------------------------


def test_submit_verdict_gossip_and_accepted_pull_over_the_network(tmp_path, base, setup, checkpoint):
    """The work inside a real validator node: SUBMIT from a worker node, the verdict on gossip, ACCEPTED."""
    from libp2p.peer.id import ID

    from swarmnode.node.p2p.endpoints import ACCEPTED, SUBMIT
    from swarmnode.node.p2p.ports import free_port
    from swarmnode.node.p2p.records import RunRecord
    from swarmnode.node.validator.service import Validator
    from tests.p2p.helpers import RUN as P2P_RUN
    from tests.p2p.helpers import node_config, swarm, wait_until

    config = node_config(tmp_path, "work", "validator", port=free_port())
    work = SwarmValidatorWork(config, VALIDATOR, None, model_dir=tiny_folder())

    async def main():
        async with swarm(
            tmp_path, ["bootstrap", "validator", "worker"], services={1: Validator(work)}
        ) as nodes:
            validator, worker = nodes[1].net, nodes[2].net
            # the run names the worker node as its trainer: ACCEPTED serves the trainer only
            trainer = worker.identity.address
            descriptor = dataclasses.replace(setup.descriptor, run=P2P_RUN, trainer=trainer)
            p2p_setup = RunSetup(descriptor, setup.tasks)
            await wait_until(lambda: worker.finder.found("validator"), timeout=20)
            validator.set_run_record(RunRecord(trainer, 1, descriptor))
            await wait_until(lambda: work.run_context.engines is not None, timeout=20)
            assert await work.hold_verified(checkpoint)
            await wait_until(lambda: validator.gossip.topic_peers("verdicts") >= 1, timeout=20)
            peer = ID.from_base58(validator.identity.peer_id)
            sub = honest_submission(base, p2p_setup, worker.identity, checkpoint=checkpoint)
            ack = (await worker.request(peer, SUBMIT, sub)).message
            assert ack.status == 100
            received = nodes[2].role.work.received
            await wait_until(lambda: received.get("verdicts/verdict_batch") == 1, timeout=20)
            batch = (await worker.request(peer, ACCEPTED, AcceptedRequest(P2P_RUN, 0, 16, 5000))).message
            assert [i.index for i in batch.items] == [1] and batch.newest == 1
            assert decode(RolloutSubmission, decode(Envelope, batch.items[0].submission).body) == sub
            start = trio.current_time()
            empty = (await worker.request(peer, ACCEPTED, AcceptedRequest(P2P_RUN, 1, 16, 300))).message
            assert empty.items == () and empty.newest == 1 and trio.current_time() - start >= 0.3
            assert work.status()["verdicts_gossiped"] == 1

    trio.run(main)


# --- the run's model must be this node's folder -----------------------------------------------------------


class RunOnly:
    """The part of RoleNet a validator reads before it loads anything: ACCEPTED's registration and the run."""

    def __init__(self, descriptor) -> None:
        from swarmnode.node.p2p.records import RunRecord

        self.record = RunRecord(descriptor.trainer, 1, descriptor)
        self.served: list[str] = []

    def serve(self, spec, handler, *, admit=None) -> None:
        self.served.append(spec.protocol)

    async def wait_run_record(self):
        return self.record


def _other_weights(tmp_path: Path) -> Path:
    return tiny_folder("qwen2", seed=8)  # the same config and tokenizer, other weights


def _edited_template(tmp_path: Path) -> Path:
    folder = copy_folder("qwen2", tmp_path / "template")
    template = folder / "chat_template.jinja"
    template.write_text(template.read_text() + "\n")
    return folder


def _edited_config(tmp_path: Path) -> Path:
    folder = copy_folder("qwen2", tmp_path / "config")
    config = folder / "config.json"
    config.write_text(json.dumps(json.loads(config.read_text()), indent=1))  # same values, other bytes
    return folder


@pytest.mark.parametrize(
    ("make_folder", "named"),
    [
        (_other_weights, "model.safetensors"),
        (_edited_template, "chat_template.jinja"),
        (_edited_config, "config.json"),
    ],
)
def test_a_validator_refuses_a_run_whose_model_is_not_its_folder(tmp_path, setup, make_folder, named):
    folder = make_folder(tmp_path)
    config = NodeConfig(identity=tmp_path / "key.json", run=RUN, role="validator", data_dir=tmp_path / "v")
    work = SwarmValidatorWork(config, VALIDATOR, None, model_dir=folder)
    net = RunOnly(setup.descriptor)
    with pytest.raises(RunMismatch, match=named):
        trio.run(work.run, net)
    context = work.run_context
    assert net.served and context.setup is None and context.engines is None  # nothing of the run was loaded
    same = SwarmValidatorWork(config, VALIDATOR, None, model_dir=copy_folder("qwen2", tmp_path / "same"))
    trio.run(same.prepare, load_run_setup(setup.descriptor, same.model_dir, same.tasks))
    assert same.run_context.engines is not None and same.run_context.engines.model_info == tiny_engine().info


# --- verdict gossip: batches -------------------------------------------------------------------------


def _verdict(n: int, *, chunks: int = 0) -> Verdict:
    return Verdict(RUN, sha256(b"%d" % n), HONEST.address, n, VERSION, chunks == 0, 0 if chunks == 0 else 605,
                   "", tuple(range(2**31, 2**31 + chunks)), 10, 0.0, 0.0)


def test_verdicts_are_gossiped_in_batches_at_the_interval_or_when_full(tmp_path):
    """A pending batch goes `verdict_flush_s` after its first verdict, or at once when full (by bytes:
    tests/test_verdict_batch.py); what is pending when the judge stops goes too. Every verdict is gossiped
    once, in order, in batches every receiver accepts."""
    from trio.testing import MockClock, wait_all_tasks_blocked

    work = make_work(tmp_path, None, verdict_flush_s=1.0, verdict_batch_items=4)
    out = GossipLog()
    sent: list[Verdict] = []

    def sizes() -> list[int]:
        return [len(b.verdicts) for b in out.batches]

    async def main() -> None:
        clock = trio.lowlevel.current_clock()
        send, receive = trio.open_memory_channel[Verdict](256)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(work.judging.gossip_verdicts, out, receive)

            async def judged(*verdicts: Verdict) -> None:
                for v in verdicts:
                    sent.append(v)
                    await send.send(v)
                await wait_all_tasks_blocked()

            await judged(*(_verdict(n) for n in range(3)))
            clock.jump(0.99)
            await wait_all_tasks_blocked()
            assert sizes() == []  # the interval has not run out: the batch waits for more
            clock.jump(0.02)
            await wait_all_tasks_blocked()
            assert sizes() == [3]
            await judged(*(_verdict(n) for n in range(3, 9)))  # full at 4: one goes at once, 2 wait
            assert sizes() == [3, 4]
            clock.jump(1.01)
            await wait_all_tasks_blocked()
            assert sizes() == [3, 4, 2]
            await judged(_verdict(9, chunks=8))  # a rejection, waiting in a batch of its own
            send.close()  # the judge stopped: what is pending goes now
            await wait_all_tasks_blocked()
        assert out.published == sent and sizes() == [3, 4, 2, 1]
        judging = work.judging
        assert judging.verdicts_gossiped == len(sent) and judging.verdict_batches == len(out.batches)

    trio.run(main, clock=MockClock())
