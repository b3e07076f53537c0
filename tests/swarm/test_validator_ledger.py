"""The validator on the ledger, on real parts (store, engine, signed log): credits are queued with the
acceptance and committed in batches, once, whatever crashes; a refused batch still credits what it can; a
filed slash waits out the run's challenge window and is then finalized; the run must be its trainer's."""

from __future__ import annotations

from dataclasses import replace

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarmnode.crypto.hashing import sha256
from swarmnode.ledger.errors import MalformedOperation
from swarmnode.ledger.signedlog import SignedLog
from swarmnode.node.devnet.rl import (
    DEVNET_CHALLENGE_WINDOW_EPOCHS,
    DevnetLedger,
    ledger_facts,
    model_parameters,
)
from swarmnode.node.errors import RunMismatch
from swarmnode.node.rl.run import DEVNET_MAX_NEW_TOKENS, DEVNET_MODEL, devnet_grpo
from swarmnode.node.rl.tokenizer import load_tokenizer
from swarmnode.node.roles.common import check_run_owner, ensure_run, run_registration, wait_run_owner
from swarmnode.node.validator.store import AcceptedStore
from swarmnode.node.validator.store_rows import CreditCounts, RunCredit
from swarmnode.protocol.errors import Reason
from swarmnode.protocol.ledger_messages import FLOPS_PER_TOKEN_MAX, MAX_RUN_VALIDATORS, RUN_LIMIT_MAX, Credit
from swarmnode.testing import ledger as T
from tests.swarm import test_validator_work as vw
from tests.swarm.test_validator_work import (
    FORGED,
    HONEST,
    PARAMS,
    PERTURBED,
    RUN,
    STAKE,
    TAMPERED,
    TRAINER,
    VALIDATOR,
    WINDOW,
    GossipLog,
    honest_submission,
    make_ledger,
    make_work,
    signed,
    wait_judged,
)

# the judge's fixtures: a tiny model's run, its checkpoint v3, and a submission per cheat
base, setup, checkpoint, submissions = vw.base, vw.setup, vw.checkpoint, vw.submissions

OTHER_TRAINER = T.identity("other trainer")


def queue_credit(store: AcceptedStore, n: int, worker: bytes, *, tokens: int = 10, step: int | None = None):
    """An acceptance finished with its credit, as the judge finishes one (the store's real transaction)."""
    step = (1 << 32) | n if step is None else step
    item = store.enqueue(
        digest=sha256(b"sub%d" % n),
        worker=worker,
        step=step,
        checkpoint_version=1,
        received_ms=n,
        envelope=b"e" * 10,
        max_items=10_000,
        max_bytes=10**8,
    )
    credit = Credit(worker, step, tokens, 100 * tokens, sha256(b"sub%d" % n))
    store.finish(
        item,
        status=0,
        tokens=tokens,
        verdict=b"v",
        submission=b"s",
        judged_ms=n,
        credit=RunCredit(RUN, credit),
    )
    return credit


async def judge(work, setup, checkpoint, items) -> None:
    """Judge `items` (worker, submission) on a prepared work; the committer waits (a long interval)."""
    await work.prepare(setup)
    await work.hold_verified(checkpoint)
    async with trio.open_nursery() as nursery:
        await nursery.start(work.judge_forever, GossipLog())
        for worker, sub in items:
            assert (await work.submit(None, *signed(worker, sub)[:2])).status == 100
        await wait_judged(work, len(items))
        nursery.cancel_scope.cancel()


# --- credits ----------------------------------------------------------------------------------------


def test_accepted_credits_survive_a_restart_and_are_credited_once(tmp_path, base, setup, checkpoint):
    """Accepted, then killed before any commit: the credits are in the store, not the ledger. The restart
    commits them as one batch. A crash between the commit and its mark sends them again: the ledger
    refuses the duplicate, the validator finds them credited and drops them; each is credited once."""
    ledger = make_ledger(tmp_path / "ledger.db")
    subs = [honest_submission(base, setup, HONEST, counter=n, checkpoint=checkpoint) for n in (0, 1)]
    work = make_work(tmp_path, ledger, credit_interval_s=3600)
    trio.run(judge, work, setup, checkpoint, [(HONEST, s) for s in subs])
    assert work.status()["credits"]["queued"] == 2 and ledger.contributions() == []
    work.store.close()  # killed: nothing committed

    work = make_work(tmp_path, ledger)
    assert work.status()["credits"]["queued"] == 2  # read back from the store

    async def commit_then_die():
        await work.prepare(setup)

        def killed(*args, **kwargs):
            raise SystemExit("killed between the commit and its mark")

        work.store.settle_credits = killed
        with pytest.raises(SystemExit):
            await work.settlement.commit_credits()

    trio.run(commit_then_die)
    [batch] = ledger.batches()
    assert batch.count == 2 and [c.step for c in ledger.contributions()] == sorted(s.step for s in subs)
    work.store.close()

    work = make_work(tmp_path, ledger)
    assert work.status()["credits"]["queued"] == 2  # the mark never happened

    async def restart():
        await work.prepare(setup)
        await work.settlement.commit_credits()

    trio.run(restart)
    status = work.status()["credits"]
    assert status["queued"] == 0 and status["dropped"] == {"already_credited": 2} and status["committed"] == 0
    assert len(ledger.batches()) == 1 and len(ledger.contributions()) == 2  # credited once
    assert work.store.credit_counts().dropped == 2
    trio.run(work.settlement.commit_credits)  # nothing left: no new batch
    assert len(ledger.batches()) == 1
    ledger.close()


def test_a_refused_batch_drops_what_the_ledger_refuses_and_credits_the_others(tmp_path, setup):
    """One batch of five: a worker that unbonded (ineligible), an assignment already credited, a credit
    above the run's token bound, and two good ones. The ledger refuses the batch; the validator drops the
    three, each for its reason, and commits the two."""
    ledger = make_ledger(tmp_path / "ledger.db")
    work = make_work(tmp_path, ledger)
    store = work.store
    good = [queue_credit(store, 1, HONEST.address), queue_credit(store, 2, PERTURBED.address)]
    ineligible = queue_credit(store, 3, FORGED.address)
    credited = queue_credit(store, 4, TAMPERED.address)
    too_long = queue_credit(store, 5, HONEST.address, tokens=10**6 + 1)
    ledger.unbond(FORGED, STAKE)
    ledger.commit_credits(VALIDATOR, T.batch(RUN, credited))  # committed before (another life of ours)
    store.close()
    work = make_work(tmp_path, ledger)
    work.run_context.setup = setup

    trio.run(work.settlement.commit_credits)
    status = work.status()["credits"]
    assert status["dropped"] == {"already_credited": 1, "ineligible": 1, "out_of_bounds": 1}
    assert status["queued"] == 0 and status["committed"] == 2 and status["batches"] == 1
    last = ledger.batches()[-1]
    members = ledger.contributions()[last.first_contribution :]
    assert sorted((c.worker, c.step) for c in members) == sorted((c.worker, c.step) for c in good)
    assert not ledger.is_credited(RUN, ineligible.worker, ineligible.step)
    assert not ledger.is_credited(RUN, too_long.worker, too_long.step)
    assert work.store.credit_counts() == CreditCounts(queued=0, committed=2, dropped=3)
    ledger.close()


class RefusesSome:
    """A real signed log whose CommitCredits is refused (MalformedOperation) while a batch holds a credit
    of a `poison` step: a refusal that no query explains, which only splitting the batch can locate."""

    def __init__(self, inner: SignedLog, poison: set[int]) -> None:
        self.inner = inner
        self.poison = poison
        self.commits = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def commit_credits(self, identity, op):
        self.commits += 1
        if any(c.step in self.poison for c in op.credits):
            raise MalformedOperation("a credit this ledger will not take")
        return self.inner.commit_credits(identity, op)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(count=st.integers(1, 12), poison=st.sets(st.integers(0, 11), max_size=4), batch=st.integers(1, 5))
def test_an_unexplained_refusal_is_split_down_to_the_credits_it_names(
    tmp_path_factory, setup, count, poison, batch
):
    """Whatever credits the ledger refuses for no reason a query shows, the committer terminates, drops
    exactly those (as "refused") and credits every other one, once."""
    folder = tmp_path_factory.mktemp("split")
    inner = make_ledger(folder / "ledger.db")
    steps = [(1 << 32) | n for n in range(count)]
    ledger = RefusesSome(inner, {steps[p] for p in poison if p < count})
    work = make_work(folder, ledger, max_credits_per_batch=batch)
    for n, step in enumerate(steps):
        queue_credit(work.store, n, HONEST.address, step=step)
    work.run_context.setup = setup

    trio.run(work.settlement.commit_credits)
    refused = ledger.poison
    assert sorted(c.step for c in inner.contributions()) == [s for s in steps if s not in refused]
    assert work.status()["credits"]["dropped"] == ({"refused": len(refused)} if refused else {})
    assert work.status()["credits"]["queued"] == 0
    assert ledger.commits <= 2 * count  # a batch of b is split into at most 2b - 1 parts
    inner.close()


def test_a_validator_outside_the_run_set_keeps_its_credits_until_it_is_added(tmp_path, setup):
    """A refusal of the whole batch (this validator is not in the run's set) drops nothing: the credits
    wait, the status says why, and they are committed once the owner adds the validator."""
    ledger = SignedLog.create(tmp_path / "ledger.db", PARAMS, ledger_id="devnet")
    for who, role in (
        (TRAINER, "trainer"),
        (VALIDATOR, "validator"),
        (PERTURBED, "validator"),
        (HONEST, "worker"),
    ):
        ledger.register(who, role, T.compute())
        ledger.deposit(who, STAKE)
    work = make_work(tmp_path, ledger)
    work.run_context.setup = setup
    credit = queue_credit(work.store, 1, HONEST.address)

    trio.run(work.settlement.commit_credits)  # the run is not registered yet
    assert "not registered" in work.status()["credits"]["blocked"]
    ledger.register_run(TRAINER, T.register_run(RUN, (PERTURBED,), max_flops_per_token=2**32 - 1))
    trio.run(work.settlement.commit_credits)
    credits = work.status()["credits"]
    assert "not one of run" in credits["blocked"] and credits["queued"] == 1 and credits["dropped"] == {}
    assert ledger.contributions() == []

    ensure_run(ledger, TRAINER, T.register_run(RUN, (PERTURBED, VALIDATOR)))  # the owner adds us
    trio.run(work.settlement.commit_credits)
    assert [(c.worker, c.step) for c in ledger.contributions()] == [(credit.worker, credit.step)]
    assert work.status()["credits"]["blocked"] == "" and work.status()["credits"]["queued"] == 0
    ledger.close()


def test_a_run_owned_by_another_key_is_refused(tmp_path, setup):
    """The ledger's run owner is not the descriptor's trainer: the validator refuses the run (RunMismatch)
    before judging, and its committer would refuse it too."""
    ledger = SignedLog.create(tmp_path / "ledger.db", PARAMS, ledger_id="devnet")
    for who, role in ((OTHER_TRAINER, "trainer"), (VALIDATOR, "validator")):
        ledger.register(who, role, T.compute())
        ledger.deposit(who, STAKE)
    ledger.register_run(OTHER_TRAINER, T.register_run(RUN, (VALIDATOR,)))
    work = make_work(tmp_path, ledger)
    work.run_context.setup = setup
    with pytest.raises(RunMismatch, match="not by its descriptor's trainer"):
        trio.run(work.settlement.wait_run_on_ledger, setup.descriptor)
    queue_credit(work.store, 1, HONEST.address)
    with pytest.raises(RunMismatch):
        trio.run(work.settlement.commit_credits)
    with pytest.raises(RunMismatch, match="choose another run id"):
        ensure_run(ledger, TRAINER, T.register_run(RUN, (VALIDATOR,)))
    ledger.close()


def test_a_worker_waits_for_the_run_and_refuses_one_another_key_owns(tmp_path, setup):
    """The worker's gate (node.worker.work): it waits while the run is not on the ledger, goes on once the
    descriptor's trainer registered it, and refuses (RunMismatch) a run another key registered."""
    ledger = SignedLog.create(tmp_path / "ledger.db", PARAMS, ledger_id="devnet")
    for who, role in ((TRAINER, "trainer"), (OTHER_TRAINER, "trainer"), (VALIDATOR, "validator")):
        ledger.register(who, role, T.compute())
        ledger.deposit(who, STAKE)

    async def register_later_and_wait() -> object:
        async with trio.open_nursery() as nursery:
            found: list[object] = []

            async def wait() -> None:
                found.append(await wait_run_owner(ledger, setup.descriptor, WINDOW_ACCEPTED, poll_s=0.01))

            nursery.start_soon(wait)
            await trio.sleep(0.1)
            assert not found  # still waiting: nobody registered the run
            ledger.register_run(TRAINER, T.register_run(RUN, (VALIDATOR,)))
        return found[0]

    info = trio.run(register_later_and_wait)
    assert info.owner == TRAINER.address  # type: ignore[attr-defined]
    other = replace(setup.descriptor, run="another-run")
    ledger.register_run(OTHER_TRAINER, T.register_run("another-run", (VALIDATOR,)))
    with pytest.raises(RunMismatch, match="not by its descriptor's trainer"):
        trio.run(lambda: wait_run_owner(ledger, other, WINDOW_ACCEPTED, poll_s=0.01))
    ledger.close()


WINDOW_ACCEPTED = 168  # WorkSettings.max_challenge_window_epochs' default


@pytest.mark.parametrize("window", [WINDOW_ACCEPTED, WINDOW_ACCEPTED + 1])
def test_a_worker_refuses_a_run_whose_challenge_window_is_longer_than_it_accepts(tmp_path, setup, window):
    """A slash pending in the run would freeze the worker's stake for the whole window: the worker reads the
    window before it works and refuses one above its `[work] max_challenge_window_epochs`, naming both."""
    ledger = SignedLog.create(tmp_path / "ledger.db", PARAMS, ledger_id="devnet")
    for who, role in ((TRAINER, "trainer"), (VALIDATOR, "validator")):
        ledger.register(who, role, T.compute())
        ledger.deposit(who, STAKE)
    ledger.register_run(TRAINER, T.register_run(RUN, (VALIDATOR,), window=window))
    if window <= WINDOW_ACCEPTED:
        info = trio.run(lambda: wait_run_owner(ledger, setup.descriptor, WINDOW_ACCEPTED, poll_s=0.01))
        assert info.challenge_window_epochs == window
    else:
        with pytest.raises(RunMismatch, match=f"{window} epochs .* accepts \\({WINDOW_ACCEPTED}, "):
            trio.run(lambda: wait_run_owner(ledger, setup.descriptor, WINDOW_ACCEPTED, poll_s=0.01))
    ledger.close()


def test_submit_is_busy_while_too_many_credits_wait(tmp_path, base, setup, checkpoint):
    ledger = make_ledger(tmp_path / "ledger.db")
    work = make_work(tmp_path, ledger, max_queued_credits=1)
    sub = honest_submission(base, setup, HONEST, checkpoint=checkpoint)

    async def main():
        await work.prepare(setup)
        work.credits.queued = 1
        return await work.submit(None, *signed(HONEST, sub)[:2])

    ack = trio.run(main)
    assert ack.status == Reason.BUSY and "credits wait" in ack.detail
    assert work.store.pending() == []
    ledger.close()


# --- slashes ----------------------------------------------------------------------------------------


def test_a_filed_slash_is_finalized_after_the_challenge_window(
    tmp_path, base, setup, checkpoint, submissions
):
    """Two cheats slashed: both pending, nothing taken. A restarted validator reads its pending slashes
    back from the ledger; the run's owner voids one within the window; once the window has passed, the
    validator finalizes the other (stake taken) and forgets the voided one (counted)."""
    clock = T.ManualEpochs()
    ledger = make_ledger(tmp_path / "ledger.db", epochs=clock)
    work = make_work(tmp_path, ledger)
    trio.run(judge, work, setup, checkpoint, [submissions["forged"], submissions["tampered"]])
    filed = {s.worker: s for s in ledger.slashes()}
    assert set(filed) == {FORGED.address, TAMPERED.address}
    assert all((s.status, s.taken_gwei, s.final_epoch) == ("pending", 0, WINDOW) for s in filed.values())
    assert work.status()["slashes_pending"] == 2

    trio.run(work.settlement.finalize_slashes)  # epoch 0: the window is open, nothing is tried
    assert all(s.status == "pending" for s in ledger.slashes())
    work.store.close()

    work = make_work(tmp_path, ledger, slash_check_s=0.01)
    assert work.status()["slashes_pending"] == 0  # a restart knows them from the ledger only

    async def restart():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(work.settlement.finalize_forever)
            with trio.fail_after(10):
                while work.status()["slashes_pending"] < 2:  # noqa: ASYNC110
                    await trio.sleep(0.01)
                await trio.sleep(0.05)  # several rounds at epoch 0: nothing finalized
                assert work.settlement.slashes_finalized == 0
                ledger.void_slash(TRAINER, filed[TAMPERED.address].index)  # the owner voids one in time
                clock.epoch = WINDOW
                while work.settlement.slashes_finalized + work.settlement.slashes_voided < 2:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()

    trio.run(restart)
    final = {s.worker: s for s in ledger.slashes()}
    assert (final[FORGED.address].status, final[FORGED.address].taken_gwei) == ("final", PARAMS.slash_gwei)
    assert final[TAMPERED.address].status == "voided"
    assert ledger.stake(FORGED.address).bonded_gwei == STAKE - PARAMS.slash_gwei
    assert ledger.stake(TAMPERED.address).bonded_gwei == STAKE
    status = work.status()
    assert (status["slashes_finalized"], status["slashes_voided"], status["slashes_pending"]) == (1, 1, 0)
    ledger.close()


# --- the run's registration --------------------------------------------------------------------------


@given(
    group=st.integers(2, 1024),
    prompts=st.integers(1, 65536),
    tokens=st.integers(1, 1 << 20),
    parameters=st.integers(0, 10**13),
    validators=st.lists(st.binary(min_size=20, max_size=20), min_size=1, max_size=40),
)
def test_run_registration_bounds_a_credit_as_a_submission_is_bounded(
    setup, group, prompts, tokens, parameters, validators
):
    grpo = replace(setup.descriptor.grpo, group_size=group, prompts_per_step=prompts, max_new_tokens=tokens)
    distinct = sorted(set(validators))
    if len(distinct) > MAX_RUN_VALIDATORS:
        with pytest.raises(ValueError, match="validators"):
            run_registration(RUN, grpo, validators, parameters, WINDOW)
        return
    op = run_registration(RUN, grpo, validators, parameters, WINDOW)
    assert op.validators == tuple(distinct)
    assert op.max_tokens_per_credit == min(group * prompts * tokens, RUN_LIMIT_MAX)
    assert op.max_flops_per_token == min(2 * parameters, FLOPS_PER_TOKEN_MAX)
    assert 1 <= op.max_tokens_per_credit <= RUN_LIMIT_MAX  # what RegisterRun's codec admits


def test_ensure_run_registers_once_and_follows_the_operators_validators(tmp_path, setup):
    ledger = SignedLog.create(tmp_path / "ledger.db", PARAMS, ledger_id="devnet")
    for who, role in ((TRAINER, "trainer"), (OTHER_TRAINER, "trainer")):
        ledger.register(who, role, T.compute())
        ledger.deposit(who, STAKE)
    op = T.register_run(RUN, (VALIDATOR,))
    info = ensure_run(ledger, TRAINER, op)
    assert (info.owner, info.validators) == (TRAINER.address, (VALIDATOR.address,))
    check_run_owner(info, setup.descriptor)  # the descriptor's trainer owns it
    size = ledger.size()
    assert ensure_run(ledger, TRAINER, op) == info and ledger.size() == size  # a restart writes nothing
    moved = ensure_run(ledger, TRAINER, T.register_run(RUN, (VALIDATOR, PERTURBED)))
    assert moved.validators == tuple(sorted((VALIDATOR.address, PERTURBED.address)))
    with pytest.raises(RunMismatch):
        ensure_run(ledger, OTHER_TRAINER, op)
    with pytest.raises(RunMismatch):
        check_run_owner(info, replace(setup.descriptor, trainer=OTHER_TRAINER.address))
    ledger.close()


def test_the_devnet_registers_its_run_with_every_validator_and_reports_it(tmp_path):
    devnet = DevnetLedger("signed", tmp_path)
    devnet.create()
    lead, worker = T.identity("devnet trainer"), T.identity("devnet worker")
    validators = [T.identity(f"devnet validator {n}") for n in range(3)]
    nodes = [("trainer", lead), ("worker", worker), *(("validator", v) for v in validators)]
    devnet.enroll(nodes, {})
    info = devnet.register_run(lead, "devnet", validators)
    assert info.owner == lead.address and info.validators == tuple(sorted(v.address for v in validators))
    assert info.challenge_window_epochs == DEVNET_CHALLENGE_WINDOW_EPOCHS
    assert info.max_flops_per_token == 2 * model_parameters(DEVNET_MODEL)
    grpo = devnet_grpo(load_tokenizer(DEVNET_MODEL)[1], DEVNET_MAX_NEW_TOKENS)
    assert info.max_tokens_per_credit == grpo.max_new_tokens * grpo.group_size * grpo.prompts_per_step
    assert devnet.register_run(lead, "devnet", validators) == info  # idempotent
    ledger = devnet.open()
    ledger.commit_credits(
        validators[0], T.batch("devnet", T.credit(worker, nonce=0), T.credit(worker, nonce=1))
    )
    ledger.slash(validators[1], T.slash(worker, 10**8, run="devnet"))
    ledger.close()
    facts = ledger_facts(devnet)
    assert (facts.batches, facts.credits, facts.verified) == (1, 2, True)
    assert facts.slashes_by_status == {"pending": 1, "final": 0, "voided": 0}
    assert facts.slashes[0]["status"] == "pending" and facts.slashes[0]["requested_gwei"] == 10**8


def test_the_committer_respects_the_batch_cap(tmp_path, setup):
    ledger = make_ledger(tmp_path / "ledger.db")
    work = make_work(tmp_path, ledger, max_credits_per_batch=3)
    for n in range(7):
        queue_credit(work.store, n, HONEST.address)
    work.run_context.setup = setup
    trio.run(work.settlement.commit_credits)
    assert [b.count for b in ledger.batches()] == [3, 3, 1]
    assert work.status()["credits"]["batches"] == 3
    ledger.close()
