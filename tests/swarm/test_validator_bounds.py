"""The validator against hostile input, on real parts (store, engine, signed-log ledger): the judge is total,
an assignment is credited once, only staked senders take queue room, and the store and tallies are bounded."""

from __future__ import annotations

import dataclasses
import sqlite3
from collections import OrderedDict
from types import SimpleNamespace

import pytest
import trio
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from libp2p.peer.id import ID

from swarmnode.crypto.hashing import sha256
from swarmnode.ledger.errors import BackendError
from swarmnode.ledger.signedlog import SignedLog
from swarmnode.node.rl import validation as validation_module
from swarmnode.node.rl.model import state_dict_of
from swarmnode.node.roles.common import TtlCache, bounded_get
from swarmnode.node.validator import judging_loop as validator_module
from swarmnode.node.validator.store import MAX_JUDGED_PER_ASSIGNMENT, AcceptedStore
from swarmnode.protocol.errors import Ignore, Reason, Reject
from swarmnode.testing import ledger as T
from tests.swarm.test_validator_work import (  # noqa: F401  (fixtures)
    FORGED,
    HONEST,
    RUN,
    STAKE,
    TRAINER,
    VERSION,
    FlakyLedger,
    GossipLog,
    accepted_request,
    base,
    checkpoint,
    honest_submission,
    make_ledger,
    make_work,
    poll_until,
    setup,
    signed,
    submissions,
    wait_judged,
)

# pytest finds fixtures by name in this module's globals, so the shared ones are imported; a test that takes
# one as a parameter shadows the import, which F811 flags (hence its `noqa: F811`).

POISON = T.identity("poison")
UNSTAKED = T.identity("unstaked")


def staked_ledger(path) -> SignedLog:
    ledger = make_ledger(path)
    ledger.register(POISON, "worker", T.compute())
    ledger.deposit(POISON, STAKE)
    return ledger


def _enqueue(store: AcceptedStore, n: int, *, version: int, counter: int = 0, worker=b"\x01" * 20):
    return store.enqueue(
        digest=sha256(b"sub%d" % n),
        worker=worker,
        step=version << 32 | counter,
        checkpoint_version=version,
        received_ms=n,
        envelope=b"e" * 100,
        max_items=100,
        max_bytes=10**6,
    )


# --- the judge is total ------------------------------------------------------------------------------


def test_poison_items_are_quarantined_and_a_restart_judges_the_honest_ones_behind_them(
    tmp_path, base, setup, checkpoint, submissions, monkeypatch  # noqa: F811
):
    """Queued before a restart, in this order: a submission on which the engine raises IndexError, one whose
    stored envelope is corrupt, one whose `finish` fails once (a decision stored, then a store error), and
    an honest one. The restarted validator ends each poison item with a JUDGE_FAULT ignore and credits the
    honest one; a second restart finds an empty queue and the same counts."""
    ledger_path = tmp_path / "ledger.db"
    staked_ledger(ledger_path).close()
    poison_sub = honest_submission(base, setup, POISON, checkpoint=checkpoint)
    forged_worker, forged_sub = submissions["forged"]
    honest_worker, honest_sub = submissions["honest"]
    queued = {}

    async def queue_then_die():
        ledger = SignedLog.open(ledger_path)
        work = make_work(tmp_path, ledger)
        await work.prepare(setup)
        for name, worker, sub in (
            ("engine", POISON, poison_sub),
            ("corrupt", POISON, dataclasses.replace(poison_sub, step=poison_sub.step + 1)),
            ("finish", forged_worker, forged_sub),
            ("honest", honest_worker, honest_sub),
        ):
            opened, digest, _ = signed(worker, sub)
            assert (await work.submit(None, opened, digest)).status == 100
            queued[name] = work.queue.items[-1]
        work.store.close()
        ledger.close()

    trio.run(queue_then_die)
    db = sqlite3.connect(tmp_path / "validator" / "validator" / "validator.db")
    db.execute("UPDATE pending SET envelope = x'c1c1' WHERE id = ?", (queued["corrupt"].id,))
    db.commit()
    db.close()

    ledger = SignedLog.open(ledger_path)
    work = make_work(tmp_path, ledger)
    prefills = []

    def engine_raises_once(real):
        def prefill_batch(batch):
            prefills.append(len(batch))
            if len(prefills) == 1:
                raise IndexError("index out of range in self")
            return real(batch)

        return prefill_batch

    real_finish = work.store.finish

    def finish_fails_for_forged(item, **kwargs):
        if item.worker == forged_worker.address:
            raise sqlite3.OperationalError("disk I/O error")
        return real_finish(item, **kwargs)

    monkeypatch.setattr(work.store, "finish", finish_fails_for_forged)

    async def restart():
        await work.prepare(setup)
        await work.hold_verified(checkpoint)
        engine = work.run_context.engines.engine(VERSION)
        monkeypatch.setattr(engine, "prefill_batch", engine_raises_once(engine.prefill_batch))
        async with trio.open_nursery() as nursery:
            await nursery.start(work.judge_forever, GossipLog())
            await wait_judged(work, 4)
            await work.settlement.commit_credits()
            nursery.cancel_scope.cancel()

    trio.run(restart)
    status = work.status()
    assert status["queued"] == 0 and status["accepted"] == 1 and status["ignored"] == 3
    assert status["by_reason"] == {"JUDGE_FAULT": 3} and status["quarantined"] == 1
    assert work.store.decided() == {} and work.store.pending() == []
    ledger.refresh()
    assert [c.worker for c in ledger.contributions()] == [honest_worker.address]
    # the forged one was decided and slashed before its `finish` failed: the slash stands, the item is out
    assert [s.worker for s in ledger.slashes()] == [forged_worker.address]
    work.store.close()
    ledger.close()

    again = make_work(tmp_path, None)
    assert again.status()["queued"] == 0 and again.status()["by_reason"] == {"JUDGE_FAULT": 3}


def test_judge_submission_turns_any_exception_into_a_judge_fault(setup, checkpoint, base, monkeypatch):  # noqa: F811
    def explode(*args, **kwargs):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(validation_module, "validate_submission", explode)
    sub = honest_submission(base, setup, HONEST, checkpoint=checkpoint)
    engines = SimpleNamespace(engine=None)
    judgement = validator_module.judge_submission(sub, HONEST.address, None, engines, True)
    assert isinstance(judgement.outcome, Ignore) and judgement.outcome.reason == Reason.JUDGE_FAULT
    assert judgement.outcome.detail == "ZeroDivisionError: boom"


# --- one credit per assignment -------------------------------------------------------------------------


def test_a_second_submission_for_an_assignment_is_refused_then_and_at_judgement(
    tmp_path, setup, checkpoint, submissions  # noqa: F811
):
    """SUBMIT refuses a resealed assignment (610) and a resend (201). A reuse that slipped past SUBMIT (a
    second writer of the store) is rejected 610 when judged: no credit, no slash, no accepted item."""
    ledger = make_ledger(tmp_path / "ledger.db")
    work = make_work(tmp_path, ledger)
    worker, sub = submissions["honest"]
    opened, digest, _ = signed(worker, sub, seq=1)

    async def main():
        await work.prepare(setup)
        await work.hold_verified(checkpoint)
        assert (await work.submit(None, opened, digest)).status == 100
        assert (await work.submit(None, opened, digest)).status == Reason.DUPLICATE
        assert (await work.submit(None, *signed(worker, sub, seq=2)[:2])).status == Reason.ASSIGNMENT_REUSED
        raced = sqlite3.connect(work.store.path)  # the other SUBMIT's judgement, written meanwhile
        raced.execute(
            "INSERT INTO judged (digest, worker, step, status, tokens, verdict, judged_ms, ignored, version)"
            " VALUES (?, ?, ?, 0, 1, x'', 0, 0, ?)",
            (sha256(b"other"), worker.address, sub.step.to_bytes(8, "big"), VERSION),
        )
        raced.commit()
        raced.close()
        async with trio.open_nursery() as nursery:
            await nursery.start(work.judge_forever, GossipLog())
            await wait_judged(work, 1)
            nursery.cancel_scope.cancel()

    trio.run(main)
    status = work.status()
    assert status["by_reason"] == {"ASSIGNMENT_REUSED": 1} and status["accepted"] == 0
    assert status["refused"] == 2 and work.store.newest == 0
    ledger.refresh()
    assert ledger.contributions() == [] and ledger.slashes() == []
    ledger.close()


def test_an_assignment_is_judged_a_bounded_number_of_times(tmp_path):
    """Ignores free the step, but not forever: the (MAX+1)th submission for it is refused 610."""
    store = AcceptedStore(tmp_path / "v.db")
    for n in range(MAX_JUDGED_PER_ASSIGNMENT):
        item = _enqueue(store, n, version=3)
        store.quarantine(item, status=int(Reason.JUDGE_FAULT), judged_ms=n)
    with pytest.raises(Reject) as err:
        _enqueue(store, 99, version=3)
    assert err.value.reason == Reason.ASSIGNMENT_REUSED
    assert store.statistics().judged == MAX_JUDGED_PER_ASSIGNMENT


# --- staked before queued --------------------------------------------------------------------------------


def test_only_staked_senders_are_queued_and_stake_reads_are_cached(tmp_path, setup, base, checkpoint):  # noqa: F811
    inner = make_ledger(tmp_path / "ledger.db")
    ledger = FlakyLedger(inner)
    work = make_work(tmp_path, ledger, eligibility_ttl_s=0.2)
    stranger_sub = honest_submission(base, setup, UNSTAKED, checkpoint=checkpoint)
    honest_sub = honest_submission(base, setup, HONEST, checkpoint=checkpoint)

    async def main():
        await work.prepare(setup)
        await work.hold_verified(checkpoint)
        unstaked_peer = ID.from_base58(UNSTAKED.peer_id)
        assert work.admits_submitter(unstaked_peer)  # unknown: one frame is read, its stake looked up
        for seq in (1, 2):  # an unstaked sender: refused, nothing stored; its stake read once
            ack = await work.submit(None, *signed(UNSTAKED, stranger_sub, seq=seq)[:2])
            assert ack.status == Reason.NOT_STAKED
        assert ledger.calls["is_eligible"] == 1
        # now known unstaked: its streams are refused before they take a slot, until the TTL passes
        assert not work.admits_submitter(unstaked_peer)
        assert work.admits_submitter(ID.from_base58(HONEST.peer_id))
        assert work.store.statistics().pending == 0 and work.store.statistics().judged == 0

        ledger.fail = {"is_eligible": BackendError("rpc down")}  # a staked sender while the ledger is down
        ack = await work.submit(None, *signed(HONEST, honest_sub)[:2])
        assert ack.status == Reason.BUSY and work.store.statistics().pending == 0
        ledger.fail = {}
        assert (await work.submit(None, *signed(HONEST, honest_sub)[:2])).status == 100
        await trio.sleep(0.25)  # the TTL passes: the next SUBMIT reads the stake again
        calls = ledger.calls["is_eligible"]
        await work.submit(None, *signed(UNSTAKED, stranger_sub, seq=3)[:2])
        assert ledger.calls["is_eligible"] == calls + 1

    trio.run(main)
    assert work.status()["queued"] == 1 and work.intake.refused == 4
    inner.close()


def test_submit_refuses_before_the_run_is_loaded_and_unbound_steps(tmp_path, setup, submissions):  # noqa: F811
    work = make_work(tmp_path, None)
    worker, sub = submissions["honest"]

    async def main():
        assert (await work.submit(None, *signed(worker, sub)[:2])).status == Reason.BUSY
        await work.prepare(setup)
        unbound = dataclasses.replace(sub, step=(VERSION + 7) << 32)
        assert (await work.submit(None, *signed(worker, unbound)[:2])).status == Reason.BAD_ASSIGNMENT
        allowed = setup.descriptor.max_submissions_per_version
        beyond = dataclasses.replace(sub, step=VERSION << 32 | allowed)  # a counter the run does not allow
        assert (await work.submit(None, *signed(worker, beyond)[:2])).status == Reason.BAD_ASSIGNMENT
        assert work.store.statistics().pending == 0

    trio.run(main)


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.integers(0, 30), st.booleans(), st.floats(0, 3, allow_nan=False)), max_size=60
    ),
    cap=st.integers(1, 8),
)
def test_ttl_cache_is_bounded_and_forgets_after_its_ttl(ops, cap):
    cache: TtlCache[int, bool] = TtlCache(1.0, cap)
    now = 0.0
    written: dict[int, tuple[float, bool]] = {}
    for key, value, dt in ops:
        now += dt
        got = cache.get(key, now)
        if got is not None:  # only what was put, and not after its TTL
            assert written[key][1] == got and now < written[key][0] + 1.0
        cache.put(key, value, now)
        written[key] = (now, value)
        assert cache.get(key, now) == value and len(cache) <= cap


@given(keys=st.lists(st.integers(0, 50), max_size=200), cap=st.integers(1, 10))
def test_bounded_tallies_keep_the_most_recent_workers(keys, cap):
    table: OrderedDict[int, list[int]] = OrderedDict()
    for key in keys:
        bounded_get(table, key, list, cap).append(key)
        assert len(table) <= cap and next(reversed(table)) == key
    recent = list(dict.fromkeys(reversed(keys)))[:cap]
    assert set(table) == set(recent)


# --- the store is bounded ------------------------------------------------------------------------------


def test_prune_keeps_the_window_refuses_below_the_floor_and_cuts_only_pulled_bytes(tmp_path):
    path = tmp_path / "v.db"
    store = AcceptedStore(path)
    for version in range(1, 6):
        for counter in range(2):
            item = _enqueue(store, version * 10 + counter, version=version, counter=counter)
            store.finish(item, status=0, tokens=3, verdict=b"v" * 10, submission=b"s" * 90, judged_ms=0)
    ignored = _enqueue(store, 99, version=5, counter=9)
    store.finish(ignored, status=int(Reason.STALE), tokens=0, verdict=b"", submission=None, judged_ms=0)
    before = store.judged_counts()

    pruned = store.prune(floor=3, max_accepted_bytes=10**6, pulled=0)
    assert (pruned.floor, pruned.judged, pruned.accepted) == (3, 4, 4)
    items, newest = store.after(0, 100, 10**6)
    assert [i.index for i in items] == [5, 6, 7, 8, 9, 10] and newest == 10  # indices never move
    counts = store.judged_counts()  # the status counts survive pruning
    assert (counts.by_status, counts.ignored, counts.tokens) == (before.by_status, before.ignored, 30)
    with pytest.raises(Ignore) as err:  # a pruned assignment cannot come back
        _enqueue(store, 11, version=2, counter=1)
    assert err.value.reason == Reason.STALE
    with pytest.raises(Reject):  # a retained one is still held
        _enqueue(store, 12, version=3, counter=0)

    assert store.prune(floor=1, max_accepted_bytes=0, pulled=6).floor == 3  # the floor never goes down
    assert [i.index for i in store.after(0, 100, 10**6)[0]] == [7, 8, 9, 10]  # only what was pulled went
    stats = store.statistics()
    assert (stats.accepted, stats.accepted_bytes, stats.judged, stats.floor) == (4, 400, 7, 3)
    store.prune(floor=9, max_accepted_bytes=0, pulled=10)  # everything goes, the indices stay
    assert store.after(0, 100, 10**6) == ([], 10) and store.newest == 10
    store.close()
    again = AcceptedStore(path)  # durable: the floor, and the newest index a trainer's cursor may hold
    assert (again.floor, again.newest, again.after(0, 100, 10**6)) == (9, 10, ([], 10))


def test_an_older_store_gets_versions_from_its_steps(tmp_path):
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE judged (digest BLOB PRIMARY KEY, worker BLOB NOT NULL, step BLOB NOT NULL,"
        " status INTEGER NOT NULL, tokens INTEGER NOT NULL, verdict BLOB NOT NULL,"
        " judged_ms INTEGER NOT NULL, ignored INTEGER NOT NULL DEFAULT 0);"
        "CREATE TABLE accepted (idx INTEGER PRIMARY KEY AUTOINCREMENT, digest BLOB NOT NULL UNIQUE,"
        " verdict BLOB NOT NULL, submission BLOB NOT NULL);"
    )
    for version in (1, 4):
        digest = sha256(b"old%d" % version)
        step = (version << 32 | 5).to_bytes(8, "big")
        db.execute("INSERT INTO judged VALUES (?, ?, ?, 0, 1, x'', 0, 0)", (digest, b"\x01" * 20, step))
        db.execute("INSERT INTO accepted (digest, verdict, submission) VALUES (?, x'00', x'00')", (digest,))
    db.commit()
    db.close()
    store = AcceptedStore(path)
    assert store.prune(floor=2, max_accepted_bytes=10**6, pulled=0).judged == 1
    assert [i.index for i in store.after(0, 10, 10**6)[0]] == [2]
    with pytest.raises(Reject):  # v4's assignment, kept, is still held
        _enqueue(store, 1, version=4, counter=5)


def test_the_work_prunes_past_the_window_and_keeps_what_trainers_have_not_pulled(
    tmp_path, base, setup, checkpoint  # noqa: F811
):
    """async_level 2 + a horizon of 1: holding v6, versions from 3 are kept. Over the byte cap, only what the
    trainer pulled goes; the status shows the store."""
    work = make_work(tmp_path, None, retention_versions=1, max_accepted_bytes=250)
    state = state_dict_of(base.model)
    for version in range(1, 7):
        item = _enqueue(work.store, version, version=version)
        work.store.finish(item, status=0, tokens=1, verdict=b"v" * 10, submission=b"s" * 90, judged_ms=0)

    async def main():
        await work.prepare(setup)
        await work.hold(6, sha256(b"6"), state)
        assert work.accepted_log.retention_floor() == 3
        await work.accepted_log.prune()
        batch = await work.accepted_log.serve_accepted(None, accepted_request(TRAINER, 0, 0))
        assert [i.index for i in batch.items] == [3, 4, 5, 6]
        # 400 bytes > 250, but the trainer's cursor is 0: nothing it lacks goes
        await work.accepted_log.prune()
        assert work.store.statistics().accepted == 4
        await work.accepted_log.serve_accepted(None, accepted_request(TRAINER, 4, 0))
        await work.accepted_log.prune()

    trio.run(main)
    assert [i.index for i in work.store.after(0, 10, 10**6)[0]] == [5, 6]
    store = work.status()["store"]
    assert store["floor_version"] == 3 and store["accepted_rows"] == 2 and store["accepted_bytes"] == 200
    assert store["pruned_judged"] == 2 and store["pruned_accepted"] == 4


# --- mutated signed submissions through SUBMIT and the judge --------------------------------------------

MUTATIONS = st.one_of(
    st.tuples(st.just("none")),
    st.tuples(st.just("token"), st.integers(0, 99), st.integers(0, 99), st.integers(0, 2**64 - 1)),
    st.tuples(st.just("prompt"), st.integers(0, 99), st.integers(0, 2**64 - 1)),
    st.tuples(st.just("logprobs"), st.integers(0, 99), st.integers(-9, 9)),
    st.tuples(st.just("proof"), st.integers(0, 99), st.binary(max_size=40)),
    st.tuples(st.just("reward"), st.integers(0, 99), st.floats(allow_nan=False, allow_infinity=False)),
    st.tuples(st.just("seed"), st.integers(0, 99), st.integers(0, 2**64 - 1)),
    st.tuples(st.just("eos"), st.integers(0, 99)),
    st.tuples(st.just("drop"), st.integers(0, 99)),
)


def mutate(sub, mutation):
    """`sub` with one field changed as `mutation` says (indices wrap around what exists)."""
    kind, *args = mutation
    if kind == "none":
        return sub
    groups = list(sub.groups)
    flat = [(gi, ci) for gi, g in enumerate(groups) for ci in range(len(g.completions))]
    gi, ci = flat[args[0] % len(flat)]
    group = groups[gi]
    completions = list(group.completions)
    c = completions[ci]
    if kind == "prompt":
        prompt = list(group.prompt_ids)
        prompt[args[0] % len(prompt)] = args[1]
        group = dataclasses.replace(group, prompt_ids=tuple(prompt))
    elif kind == "drop":
        group = dataclasses.replace(group, completions=tuple(completions[:ci]))
    else:
        if kind == "token":
            tokens = list(c.token_ids)
            tokens[args[1] % len(tokens)] = args[2]
            c = dataclasses.replace(c, token_ids=tuple(tokens))
        elif kind == "logprobs":
            delta = args[1]
            logprobs = c.logprobs[:delta] if delta < 0 else c.logprobs + b"\x00" * delta
            c = dataclasses.replace(c, logprobs=logprobs)
        elif kind == "proof":
            proofs = list(c.proofs)
            proofs[args[0] % len(proofs)] = args[1]
            c = dataclasses.replace(c, proofs=tuple(proofs))
        elif kind == "reward":
            c = dataclasses.replace(c, reward=args[1])
        elif kind == "seed":
            c = dataclasses.replace(c, seed=args[1])
        elif kind == "eos":
            c = dataclasses.replace(c, ended_with_eos=not c.ended_with_eos)
        completions[ci] = c
        group = dataclasses.replace(group, completions=tuple(completions))
    groups[gi] = group
    return dataclasses.replace(sub, groups=tuple(groups))


def test_mutated_signed_submissions_all_end_judged_and_a_restart_finds_nothing_left(
    tmp_path, base, setup, checkpoint  # noqa: F811
):
    """Batches of signed submissions, each with one field mutated (tokens and prompt ids up to 2^64,
    logprob bytes, proofs, rewards, seeds, EOS flags, completion counts): every one is either refused at
    SUBMIT or queued and judged, no exception leaves the judge, the unchanged ones are accepted."""
    work = make_work(tmp_path, None)
    trio.run(work.prepare, setup)
    trio.run(work.hold_verified, checkpoint)
    honest: dict[int, object] = {}
    counters = iter(range(setup.descriptor.max_submissions_per_version))

    # each example spends 6 of the run's counters on one validator: generated once, never replayed
    @settings(max_examples=5, deadline=None, database=None, phases=(Phase.generate,))
    @given(batch=st.lists(MUTATIONS, min_size=6, max_size=6))
    def judge_batch(batch):
        sent = []
        for mutation in batch:
            counter = next(counters)
            if counter not in honest:
                honest[counter] = honest_submission(
                    base, setup, HONEST, counter=counter, checkpoint=checkpoint
                )
            sent.append((honest[counter], mutate(honest[counter], mutation)))

        async def main():
            judged = work.counts.judged
            async with trio.open_nursery() as nursery:
                await nursery.start(work.judge_forever, GossipLog())
                acks = [(await work.submit(None, *signed(HONEST, sub)[:2])).status for _, sub in sent]
                queued = acks.count(100)
                await wait_judged(work, judged + queued)
                nursery.cancel_scope.cancel()
            return acks

        accepted = work.counts.accepted
        acks = trio.run(main)
        assert all(a == 100 or 200 <= a < 700 for a in acks)
        assert work.status()["queued"] == 0 and work.store.decided() == {}
        assert work.counts.accepted - accepted >= sum(1 for original, sub in sent if sub == original)

    judge_batch()
    work.store.close()
    again = make_work(tmp_path, None)
    assert again.status()["queued"] == 0 and again.status()["judged"] == work.counts.judged


def test_accepted_admits_only_the_runs_trainers_before_any_read(tmp_path):
    """ACCEPTED long polls hold slots for 30 s: a peer that is not one of the run's trainers is refused
    by the admit predicate, before its stream takes a slot or its frame is read."""
    work = make_work(tmp_path, None)
    trainer, stranger = ID.from_base58(TRAINER.peer_id), ID.from_base58(UNSTAKED.peer_id)
    assert not work.accepted_log.admits_puller(trainer)  # the run is not known yet: nobody
    work.run_context.trainers = frozenset({TRAINER.address})
    assert work.accepted_log.admits_puller(trainer) and not work.accepted_log.admits_puller(stranger)
    work.store.close()
