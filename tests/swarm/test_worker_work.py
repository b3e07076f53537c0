"""The worker's work without a network: every cheat is caught by the check meant for it, honest work passes,
the refusal names the fix, counters survive a restart, stale versions are never generated on, and
submissions move on to the next validator when one cannot take them."""

from __future__ import annotations

import dataclasses
import json
from functools import partial
from pathlib import Path

import pytest
import torch
import trio
import trio.lowlevel
import trio.testing
from libp2p.peer.id import ID

from swarmnode.crypto.hashing import sha256
from swarmnode.crypto.identity import NodeIdentity
from swarmnode.crypto.toploc import CalibratedPolicy, aggregate, judge, verify_proofs
from swarmnode.ledger.signedlog import SignedLog
from swarmnode.ledger.types import Params
from swarmnode.node.assemble import worker_conduct
from swarmnode.node.config import NodeConfig, WorkSettings
from swarmnode.node.dataplane.checkpoint import build_manifest, plan_shards, shard_info
from swarmnode.node.dataplane.follower import VerifiedCheckpoint
from swarmnode.node.p2p.gossip import Delivery
from swarmnode.node.p2p.peers import PeerRecord
from swarmnode.node.p2p.reqresp import PeerUnreachable
from swarmnode.node.rl.engine import TransformersEngine
from swarmnode.node.rl.grpo import group_advantages
from swarmnode.node.rl.rollouts import assigned_tasks, completion_rewards
from swarmnode.node.rl.run import RunSetup, devnet_grpo, devnet_run
from swarmnode.node.rl.validation import BadProof, ValidationContext, validate_submission
from swarmnode.node.validator.service import IdleValidatorWork, Validator
from swarmnode.node.worker.build import CheckpointRef, make_submission, prepare_weights
from swarmnode.node.worker.conduct import HONEST
from swarmnode.node.worker.counters import STATE_FILE, Counters, WorkerStateError
from swarmnode.node.worker.delivery import NetTransport, Rotation, deliver, try_another
from swarmnode.node.worker.eligibility import NotEligible, ledger_cli_args, require_eligible
from swarmnode.node.worker.pacing import Pacer, plan_counter, submission_budget
from swarmnode.node.worker.service import Worker
from swarmnode.node.worker.stats import WorkerStats
from swarmnode.node.worker.work import SwarmWorkerWork
from swarmnode.protocol.envelope import Opened, open_envelope, seal
from swarmnode.protocol.errors import Reason, Reject
from swarmnode.protocol.messages import RolloutSubmission, SubmitAck, Verdict, VerdictBatch
from swarmnode.protocol.pacing import WORKER_WINDOW_VERSIONS, share_budget, share_draw
from swarmnode.protocol.runs import assignment_step
from swarmnode.protocol.verdicts import VerdictBatcher, check_opened_verdicts
from swarmnode.testing import ledger as T
from swarmnode.testing.cheats import (
    FORGED_REWARD,
    GREEDY,
    PERTURBED_MODEL,
    TAMPERED_PROMPT,
    easier_task,
    forge_rewards,
    perturb_weights,
    tamper_weights,
)
from tests.p2p.helpers import swarm, wait_until
from tests.swarm.models import eos_folder

pytestmark = pytest.mark.timeout(60)

RUN = "testrun"
WORKER = NodeIdentity(sha256(b"worker-work-test"))
ROOT = sha256(b"checkpoint-3")
REF = CheckpointRef(3, ROOT)


def run_engine() -> TransformersEngine:
    """A fresh engine on the run's model: a tiny folder that answers in digits (tests.swarm.models)."""
    return TransformersEngine.from_folder(eos_folder())


@pytest.fixture(scope="module")
def base_engine() -> TransformersEngine:
    return run_engine()


@pytest.fixture(scope="module")
def setup(base_engine) -> RunSetup:
    grpo = dataclasses.replace(devnet_grpo(base_engine.info), prompts_per_step=2, group_size=4)
    run = devnet_run(b"\x01" * 20, eos_folder(), grpo=grpo)
    return RunSetup(dataclasses.replace(run.descriptor, run=RUN), run.tasks)


def submission(
    engine: TransformersEngine, setup: RunSetup, cheat: str, counter: int = 0
) -> RolloutSubmission:
    return make_submission(
        engine, setup.descriptor, setup.dataset, setup.dataset_ids, WORKER.address, REF, counter,
        worker_conduct(cheat),
    )


def judge_submission(sub: RolloutSubmission, setup: RunSetup, engine: TransformersEngine) -> None:
    ctx = ValidationContext(
        setup.descriptor, setup.dataset, setup.dataset_ids, 3, {3: ROOT}, lambda _: True,
        model=engine.info, tokenizer=engine.tokenizer,
    )  # fmt: skip
    validate_submission(sub, WORKER.address, ctx, lambda version: engine)


def reject_reason(sub: RolloutSubmission, setup: RunSetup, engine: TransformersEngine) -> Reject:
    with pytest.raises(Reject) as err:
        judge_submission(sub, setup, engine)
    return err.value


# --- each cheat trips its check; honest work passes ----------------------------------------------------


def test_honest_submission_is_accepted(base_engine, setup):
    """The run's honest bounds (devnet_policy) let an honest worker through."""
    judge_submission(submission(base_engine, setup, ""), setup, base_engine)


def test_tampered_prompt_is_a_bad_assignment(base_engine, setup):
    honest = submission(base_engine, setup, "")
    sub = submission(base_engine, setup, TAMPERED_PROMPT)
    first = sub.groups[0]
    assigned = setup.dataset[first.task_id]
    assert [g.task_id for g in sub.groups] == [
        g.task_id for g in honest.groups
    ]  # still claims the assignment
    tokenizer = base_engine.tokenizer
    assert list(first.prompt_ids) == tokenizer.encode_prompt(easier_task(assigned, setup.dataset).prompt)
    assert list(first.prompt_ids) != tokenizer.encode_prompt(assigned.prompt)
    assert sub.groups[1:] == honest.groups[1:]
    err = reject_reason(sub, setup, base_engine)
    assert err.reason == Reason.BAD_ASSIGNMENT and "prompt" in err.detail


def test_forged_reward_is_a_bad_reward(base_engine, setup):
    sub = submission(base_engine, setup, FORGED_REWARD)
    for group in sub.groups:  # internally consistent: only the reward recomputation can object
        claimed = torch.tensor([c.reward for c in group.completions])
        assert torch.allclose(
            torch.tensor([c.advantage for c in group.completions]), group_advantages(claimed)
        )
    tokenizer = base_engine.tokenizer
    earned = [
        completion_rewards(setup.dataset[g.task_id], [c.token_ids for c in g.completions], setup.descriptor,
                           tokenizer)
        for g in sub.groups
    ]
    claimed = [[c.reward for c in g.completions] for g in sub.groups]
    assert claimed != earned and all(sum(c) >= sum(e) for c, e in zip(claimed, earned, strict=True))
    err = reject_reason(sub, setup, base_engine)
    assert err.reason == Reason.BAD_REWARD and "claimed reward differs" in err.detail


def test_perturbed_model_trips_toploc(base_engine, setup):
    """5% noise still answers in digits, but its hidden rows fall far outside the run's TOPLOC bounds.

    `validate_submission` must name BAD_PROOF: TOPLOC runs before the logprobs comparison (which would only
    say RULE_VIOLATION, not slashable), so the cheat is slashed with the failing chunks as evidence.
    """
    state = dict(base_engine.model.state_dict())
    cheat = run_engine()
    cheat.load_weights(tamper_weights(PERTURBED_MODEL, state, REF.version))
    sub = submission(cheat, setup, "")
    texts = [cheat.tokenizer.completion_text(c.token_ids).strip() for g in sub.groups for c in g.completions]
    assert sum(t.isdigit() for t in texts) >= len(texts) // 2, texts  # plausible output, not noise

    policy = setup.descriptor.policy
    flat = [(g.prompt_ids, c) for g in sub.groups for c in g.completions]
    prefills = base_engine.prefill_batch([(list(p), list(c.token_ids)) for p, c in flat])
    checks = [
        check
        for (_, c), pre in zip(flat, prefills, strict=True)
        for check in verify_proofs(
            pre.hidden_rows, list(c.proofs), k=policy.toploc_k, chunk=policy.toploc_chunk
        )
    ]
    summary = aggregate(checks)
    bounds = CalibratedPolicy(policy.max_mean_exp_mismatches, policy.max_mean_mant_err)
    assert not judge(summary, bounds).passed
    assert summary.mean_mant_err > 2 * policy.max_mean_mant_err  # far outside, not at the edge

    err = reject_reason(sub, setup, base_engine)
    assert err.reason == Reason.BAD_PROOF, err
    assert isinstance(err, BadProof) and err.failure.failing_chunks


def test_perturbation_is_seeded_and_scaled():
    gen = torch.Generator().manual_seed(0)
    state = {"w": torch.randn(256, 256, generator=gen) * 3.0, "steps": torch.tensor([7])}
    first, again = perturb_weights(state, seed=5), perturb_weights(state, seed=5)
    assert torch.equal(first["w"], again["w"]) and not torch.equal(
        first["w"], perturb_weights(state, seed=6)["w"]
    )
    noise_std = float((first["w"] - state["w"]).std())
    assert 0.04 * 3.0 < noise_std < 0.06 * 3.0
    assert torch.equal(first["steps"], state["steps"])  # integer tensors untouched
    assert tamper_weights(FORGED_REWARD, state, 5) is state and tamper_weights("", state, 5) is state


@pytest.mark.parametrize(
    ("rewards", "forged"),
    [
        ([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0]], [[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]]),
        ([[0.0, 0.0]], [[1.0, 1.0]]),
        ([[1.0, 1.0], [1.0, 1.0]], [[2.0, 1.0], [1.0, 1.0]]),  # nothing wrong: it still over-claims
    ],
)
def test_forge_rewards_claims_more_than_earned(rewards, forged):
    assert forge_rewards(rewards) == forged


# --- eligibility ------------------------------------------------------------------------------------


def node_config(tmp_path: Path, **work: object) -> NodeConfig:
    ledger_url = f"signed:{tmp_path / 'ledger.db'}"
    return NodeConfig(
        identity=tmp_path / "worker.key",
        run=RUN,
        role="worker",
        data_dir=tmp_path / "worker",
        ledger_url=ledger_url,
        work=WorkSettings(**work),  # type: ignore[arg-type]
    )


def worker_work(config: NodeConfig, identity: NodeIdentity, ledger: SignedLog | None) -> SwarmWorkerWork:
    conduct = worker_conduct(config.work.cheat)  # as the composition root chooses it
    return SwarmWorkerWork(config, identity, ledger, model_dir=eos_folder(), conduct=conduct)


def set_up(work: SwarmWorkerWork, config: NodeConfig, setup: RunSetup) -> SwarmWorkerWork:
    """What `run` does before its loops: the run's setup and the persisted counters."""
    work.setup = setup
    work.counters = Counters.load(config.data_dir / STATE_FILE, RUN, WORKER.address)
    return work


def test_an_ineligible_worker_refuses_to_start_and_says_how_to_fix_it(tmp_path):
    config = node_config(tmp_path)
    ledger = SignedLog.create(tmp_path / "ledger.db", Params(min_stake_per_unit_gwei=1000))
    options = f"--ledger {config.ledger_url} --key {config.identity}"
    work = worker_work(config, WORKER, ledger)
    with pytest.raises(NotEligible) as err:
        trio.run(work.run, None)  # refused before it touches the network
    message = str(err.value)
    assert "not registered" in message and WORKER.checksum_address in message
    assert f"swarmnode register --role worker --accelerator cpu --count 1 --memory-gb 1 {options}" in message
    assert f"swarmnode stake deposit 1000gwei {options}" in message

    ledger.register(WORKER, "worker", T.compute(count=2))
    ledger.deposit(WORKER, 500)
    with pytest.raises(NotEligible) as err:
        require_eligible(ledger, WORKER.address, config)
    message = str(err.value)
    assert "500 gwei bonded" in message and "2000 gwei required" in message
    assert f"swarmnode stake deposit 1500gwei {options}" in message and "register" not in message

    ledger.deposit(WORKER, 1500)
    require_eligible(ledger, WORKER.address, config)

    validator = T.identity("worker-test-validator")
    ledger.register(validator, "validator", T.compute())
    with pytest.raises(NotEligible, match="registered as a validator"):
        require_eligible(ledger, validator.address, config)
    ledger.close()


def test_ledger_options_for_the_cli():
    assert ledger_cli_args("signed:/data/ledger.db") == "--ledger signed:/data/ledger.db"
    assert (
        ledger_cli_args("evm:http://127.0.0.1:8545#0xabc")
        == "--ledger evm:http://127.0.0.1:8545 --contract 0xabc"
    )
    assert ledger_cli_args("evm:http://127.0.0.1:8545") == "--ledger evm:http://127.0.0.1:8545"


# --- counters and version gating -------------------------------------------------------------------


def test_counters_survive_a_restart(tmp_path):
    path = tmp_path / STATE_FILE
    counters = Counters.load(path, RUN, WORKER.address)
    assert [counters.reserve(3), counters.reserve(3), counters.reserve(4)] == [0, 1, 0]
    restarted = Counters.load(path, RUN, WORKER.address)
    assert restarted.used(3) == 2 and restarted.reserve(3) == 2 and restarted.used(4) == 1
    restarted.forget_below(4)
    restarted.save()
    assert Counters.load(path, RUN, WORKER.address).next_counter == {4: 1}
    assert Counters.load(path, "other-run", WORKER.address).next_counter == {}
    assert Counters.load(path, RUN, b"\x05" * 20).next_counter == {}
    path.write_text("{not json")
    with pytest.raises(WorkerStateError, match=str(path)):
        Counters.load(path, RUN, WORKER.address)


@pytest.mark.parametrize(
    ("loaded", "newest", "used", "expected"),
    [
        (None, None, 0, None),  # nothing loaded yet
        (None, 5, 0, None),
        (5, 5, 0, 0),
        (5, 5, 3, 3),
        (5, 5, 4, None),  # budget of 4 spent: wait for a newer checkpoint
        (5, 7, 1, 1),  # two behind: still within async_level 2
        (5, 8, 1, None),  # three behind: a validator would drop it as stale
    ],
)
def test_plan_counter(loaded, newest, used, expected):
    assert plan_counter(loaded, newest, 2, used, budget=4) == expected


# --- the loop, end to end without a network -----------------------------------------------------------


STEP_MS = 600_000  # the trainer's pace in these checkpoints' stamps: slow enough that time cuts nothing


def write_checkpoint(
    root: Path, version: int, state: dict[str, torch.Tensor], cfg_hash: bytes, *, step_ms: int = STEP_MS
) -> VerifiedCheckpoint:
    directory = root / f"v{version}"
    directory.mkdir(parents=True)
    infos = []
    for plan in plan_shards(state, shard_size=256 * 1024):
        data = plan.serialize()
        (directory / plan.name).write_bytes(data)
        infos.append(shard_info(plan.name, data))
    parent = max(version - 1, 0)
    manifest = build_manifest(
        run=RUN,
        version=version,
        parent_version=parent,
        model_config_hash=cfg_hash,
        shards=infos,
        created_ms=10**12 + version * step_ms,
    )
    return VerifiedCheckpoint(manifest, b"", directory)


def peer(n: int) -> PeerRecord:
    identity = NodeIdentity(sha256(b"validator-%d" % n))
    return PeerRecord(identity.peer_id, identity.address, "validator", "", "test", 0.0)


class Validators:
    """Validators as the worker sees them: a list of peers and one scripted answer each (an ack status, or
    None for a peer that cannot be reached); what each one was sent is kept."""

    def __init__(self, answers: list[int | None]) -> None:
        self.peers = [peer(i) for i in range(len(answers))]
        self.answers = {p.peer_id: a for p, a in zip(self.peers, answers, strict=True)}
        self.sent: list[tuple[str, RolloutSubmission]] = []

    def validators(self) -> list[PeerRecord]:
        return list(self.peers)

    async def wait_for_validators(self) -> list[PeerRecord]:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    async def send(self, peer_id: str, submission: RolloutSubmission) -> SubmitAck:
        await trio.lowlevel.checkpoint()
        self.sent.append((peer_id, submission))
        status = self.answers[peer_id]
        if status is None:
            raise PeerUnreachable(ID.from_base58(peer_id), "/swarmnode/submit/1.0.0", "down")
        return SubmitAck(sha256(repr((peer_id, len(self.sent))).encode()), status, "")


def test_worker_loop_spends_its_budget_per_version_and_skips_stale_ones(tmp_path, base_engine, setup):
    """Checkpoints arrive, are swapped in between submissions, each gets `submissions_per_version`
    assignments; a restart resumes the counters; a version too far behind the newest is left alone."""
    state = {k: v.clone() for k, v in base_engine.model.state_dict().items()}
    cfg_hash = setup.descriptor.model_config_hash
    v1, v2 = (write_checkpoint(tmp_path / "ckpt", v, state, cfg_hash) for v in (1, 2))
    config = node_config(tmp_path, submissions_per_version=2)
    validators = Validators([100])

    def start(work: SwarmWorkerWork) -> None:
        set_up(work, config, setup).engine = run_engine()

    async def wait_sent(n: int) -> None:
        with trio.fail_after(20):
            while len(validators.sent) < n:  # noqa: ASYNC110  # the loop under test offers no event
                await trio.sleep(0.01)

    def sent_steps() -> list[tuple[int, int]]:
        return [(s.checkpoint_version, s.step & 0xFFFFFFFF) for _, s in validators.sent]

    async def main() -> None:
        work = worker_work(config, WORKER, None)
        start(work)
        send, receive = trio.open_memory_channel[VerifiedCheckpoint](8)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(work._load_checkpoints, receive)
            nursery.start_soon(work._work, validators)
            await send.send(v1)
            await wait_sent(2)
            await trio.sleep(0.2)
            assert sent_steps() == [(1, 0), (1, 1)] and work.status()["version"] == 1
            await send.send(v2)
            await wait_sent(4)
            await trio.sleep(0.2)
            assert sent_steps()[2:] == [(2, 0), (2, 1)]
            nursery.cancel_scope.cancel()
        status = work.status()
        assert status["submitted"] == 4 and status["acks"] == {"100": 4} and status["version"] == 2
        assert status["tokens"] == sum(
            len(c.token_ids) for _, s in validators.sent for g in s.groups for c in g.completions
        )
        assert status["generate_s"] > 0 and status["cpu_s"] > 0
        json.dumps(status)
        # each submission is the assignment its (version, counter) names
        for _, sub in validators.sent:
            expected = assigned_tasks(setup.descriptor, setup.dataset_ids, WORKER.address, sub.step)
            assert [g.task_id for g in sub.groups] == expected
            assert sub.checkpoint_root == (v1 if sub.checkpoint_version == 1 else v2).manifest.merkle_root

        # restarted: v2's budget is already spent, and v1 is never generated on again
        again = worker_work(config, WORKER, None)
        start(again)
        send, receive = trio.open_memory_channel[VerifiedCheckpoint](8)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(again._load_checkpoints, receive)
            nursery.start_soon(again._work, validators)
            await send.send(v2)
            await trio.sleep(0.5)
            assert again.loaded == CheckpointRef(2, v2.manifest.merkle_root) and len(validators.sent) == 4
            nursery.cancel_scope.cancel()

        # restarted with a larger budget while the trainer is already three versions ahead: v2 is stale
        bigger = worker_work(
            dataclasses.replace(config, work=WorkSettings(submissions_per_version=3)), WORKER, None
        )
        start(bigger)
        bigger._note_version(5)
        send, receive = trio.open_memory_channel[VerifiedCheckpoint](8)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(bigger._load_checkpoints, receive)
            nursery.start_soon(bigger._work, validators)
            await send.send(v2)
            await trio.sleep(0.5)
            assert bigger.loaded is not None and bigger.newest_known() == 5 and len(validators.sent) == 4
            bigger._newest = 4  # (as if the trainer had only reached v4: two behind is fresh again)
            bigger._wake()
            await wait_sent(5)
            assert sent_steps()[4] == (2, 2)
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_fast_trainer_cuts_each_version_to_one_submission(tmp_path, base_engine, setup):
    """The trainer steps every 20 ms (its stamps say so), far less than one build takes (10 s measured):
    with a budget of 4 the worker still makes one submission per version it holds (the floor), then waits
    for the next."""
    state = {k: v.clone() for k, v in base_engine.model.state_dict().items()}
    cfg_hash = setup.descriptor.model_config_hash
    v0, v1, v2 = (write_checkpoint(tmp_path / "ckpt", v, state, cfg_hash, step_ms=20) for v in (0, 1, 2))
    config = node_config(tmp_path, submissions_per_version=4)
    validators = Validators([100])

    async def main() -> None:
        work = set_up(worker_work(config, WORKER, None), config, setup)
        work.engine = run_engine()
        work._note_version(0, v0.manifest.created_ms)  # the head of v0 was heard: one stamp, no pace yet
        for _ in range(16):  # builds measured at 10 s (a warm tiny model builds in ms, faster than 20 ms)
            work.pacer.built(10.0)
        send, receive = trio.open_memory_channel[VerifiedCheckpoint](8)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(work._load_checkpoints, receive)
            nursery.start_soon(work._work, validators)
            await send.send(v1)
            with trio.fail_after(20):
                while not validators.sent:  # noqa: ASYNC110  # the loop under test offers no event
                    await trio.sleep(0.01)
            await trio.sleep(0.5)
            await send.send(v2)
            with trio.fail_after(20):
                while len(validators.sent) < 2:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            await trio.sleep(0.5)
            nursery.cancel_scope.cancel()
        assert [(s.checkpoint_version, s.step & 0xFFFFFFFF) for _, s in validators.sent] == [(1, 0), (2, 0)]
        pace = work.status()["pace"]
        assert pace["step_interval_ms"] == 20 and pace["generate_ms"] > 0 and pace["versions_cut"] == 2
        assert work.next_counter() is None

    trio.run(main)


def test_the_pacer_measures_the_trainer_and_itself():
    pacer = Pacer(me=WORKER.address, wanted=1000)  # a share far above the cap: time alone limits here
    assert pacer.budget(3, 2, used=0, cap=4, at_ms=0) == 4  # nothing heard: the cap
    pacer.heard(3, 1_000_000, at_ms=50_000)
    pacer.heard(4, 1_002_000, at_ms=51_900)  # 2 s per version; v4 heard at 51.9 s of our clock
    pacer.heard(4, 5, at_ms=52_000)  # a second stamp of v4 changes nothing
    assert (pacer.newest, pacer.newest_heard_ms) == (4, 51_900)
    assert pacer.budget(4, 2, used=0, cap=64, at_ms=52_000) == 64  # no build timed yet
    pacer.built(0.5)
    pacer.handed(assignment_step(4, 0), at_ms=52_500)
    pacer.judged(assignment_step(4, 0), at_ms=52_900)  # 400 ms to the verdict
    pacer.judged(assignment_step(4, 1), at_ms=53_000)  # never handed over: no sample
    assert pacer.statistics() == {
        "step_interval_ms": 2_000, "generate_ms": 500, "latency_ms": 400, "versions_cut": 0, "workers": 1,
    }  # fmt: skip
    # v4's deadline: 51.9 + 2 x 2 - 0.4 = 55.5 s; from 53 s, five builds of 0.5 s fit
    assert pacer.budget(4, 2, used=1, cap=64, at_ms=53_000) == 6
    assert pacer.budget(4, 2, used=6, cap=64, at_ms=55_400) == 6 and pacer.cut == 1
    assert pacer.budget(4, 2, used=6, cap=64, at_ms=55_450) == 6 and pacer.cut == 1  # counted once
    for n in range(200):  # hand-overs whose verdicts never come are forgotten, oldest first
        pacer.handed(assignment_step(5, n), at_ms=60_000)
    assert len(pacer._handed) <= 64 and assignment_step(5, 199) in pacer._handed


def test_the_pacer_cuts_a_version_to_its_share_of_the_swarm_and_grows_it_while_the_version_stands():
    """Six workers accepted, three submissions wanted per version: half a submission each, drawn per
    version; a version that stands beyond an interval grows its share; the wake-up says when."""
    pacer = Pacer(me=WORKER.address, wanted=3)
    pacer.heard(3, 1_000_000, at_ms=50_000)
    pacer.heard(4, 1_002_000, at_ms=52_000)  # 2 s per version
    for n in range(5):
        pacer.accepted(bytes([n + 1]) * 20, 4)
    pacer.accepted(bytes([9]) * 20, 4 - WORKER_WINDOW_VERSIONS)  # long gone: not counted
    pacer.built(0.1)
    assert pacer.statistics()["workers"] == 6
    takes = {v: pacer.budget(v, 2, used=0, cap=4, at_ms=52_000 - (4 - v) * 2_000) for v in range(5)}
    assert set(takes.values()) <= {0, 1}
    share = {"wanted": 3, "workers": 6, "waited_ms": 0, "interval_ms": 2_000}
    drawn = [share_budget(draw=share_draw(WORKER.address, v), **share) for v in range(5)]
    assert list(takes.values()) == drawn
    version = next((v for v, n in takes.items() if n == 0), None)
    if version is not None:  # a version not drawn: the worker waits until its share has grown to one
        heard = 52_000 - (4 - version) * 2_000
        wait = pacer.recheck_in_ms(version, 0, heard)
        assert wait is not None and 2_000 <= wait <= 4_000  # half a share: one after at most 2 intervals
        assert pacer.budget(version, 2, used=0, cap=4, at_ms=heard + wait) == 1
        assert pacer.budget(version, 2, used=0, cap=4, at_ms=heard + wait - 1) == 0
    assert pacer.recheck_in_ms(4, 5, 52_000) is not None  # the share, not the cap, holds it back
    assert Pacer(me=WORKER.address).recheck_in_ms(4, 0, 0) is None  # no pace measured: no share


def test_a_stalled_trainer_gets_more_of_its_newest_version_up_to_the_runs_bound():
    """No newer version for longer than the trainer is overdue (a run without signal): the worker's cap
    grows by itself per overdue period, to the run's max_submissions_per_version, and the wake-up says
    when; a version that is not the newest, or a healthy trainer, keeps the configured cap."""
    pacer = Pacer(me=WORKER.address, wanted=1000)  # the share does not bind here
    pacer.heard(0, 1_000_000, at_ms=10_000)  # one version only: no interval measured, overdue after 30 s
    pacer.built(0.1)
    run = {"cap": 4, "run_max": 10}
    assert pacer.budget(0, 2, used=4, at_ms=10_000 + 29_999, **run) == 4
    assert pacer.recheck_in_ms(0, 4, 10_000 + 29_999, async_level=2, **run) == 1
    assert pacer.budget(0, 2, used=4, at_ms=10_000 + 30_000, **run) == 8
    assert pacer.budget(0, 2, used=8, at_ms=10_000 + 60_000, **run) == 10  # the run's bound
    assert pacer.recheck_in_ms(0, 10, 10_000 + 90_000, async_level=2, **run) is None  # a new version only
    assert pacer.budget(0, 2, used=0, at_ms=10_000 + 90_000, cap=4) == 4  # run_max not given: no growth
    pacer.heard(1, 1_002_000, at_ms=12_000)  # v0 is no longer the newest: its cap stays
    assert pacer.budget(0, 2, used=4, at_ms=100_000, **run) <= 4


def test_prepare_weights_reads_the_verified_checkpoint_and_applies_the_cheat(tmp_path, base_engine, setup):
    state = {k: v.clone() for k, v in base_engine.model.state_dict().items()}
    checkpoint = write_checkpoint(tmp_path, 4, state, setup.descriptor.model_config_hash)
    honest = prepare_weights(checkpoint, HONEST)
    assert honest.ref == CheckpointRef(4, checkpoint.manifest.merkle_root)
    assert all(torch.equal(honest.state[k], state[k]) for k in state)
    cheat = prepare_weights(checkpoint, worker_conduct(PERTURBED_MODEL))
    assert any(not torch.equal(cheat.state[k], state[k]) for k in state)


# --- submitting ----------------------------------------------------------------------------------------


def small_submission() -> RolloutSubmission:
    return RolloutSubmission(RUN, assignment_step(3, 0), 3, ROOT, ())


def test_ack_classes():
    assert not try_another(100)
    assert not try_another(int(Reason.BAD_PROOF)) and not try_another(int(Reason.DUPLICATE))
    assert not try_another(int(Reason.STALE)) and not try_another(int(Reason.NOT_STAKED))
    assert try_another(int(Reason.NOT_FOR_US)) and try_another(int(Reason.UNKNOWN_CHECKPOINT))
    assert try_another(int(Reason.BUSY))  # the validator cannot read stake now, or has not loaded the run
    assert try_another(int(Reason.BAD_SIGNATURE)) and try_another(int(Reason.WRONG_SENDER))


def test_submission_moves_on_past_unreachable_and_busy_validators():
    validators = Validators([None, int(Reason.NOT_FOR_US), 100, 100])
    stats, rotation = WorkerStats(), Rotation()

    async def main() -> None:
        ack = await deliver(validators, rotation, small_submission(), stats)
        assert ack is not None and ack.status == 100
        assert [p for p, _ in validators.sent] == [p.peer_id for p in validators.peers[:3]]
        # the next submission starts one validator further on
        await deliver(validators, rotation, small_submission(), stats)
        assert validators.sent[3][0] == validators.peers[1].peer_id

    trio.run(main)
    assert stats.submit_failures == 1 and stats.delivered == 2
    assert stats.acks == {int(Reason.NOT_FOR_US): 2, 100: 2}


def test_a_rejection_is_final():
    validators = Validators([int(Reason.BAD_REWARD), 100])
    stats = WorkerStats()
    ack = trio.run(deliver, validators, Rotation(), small_submission(), stats)
    assert ack is not None and ack.status == Reason.BAD_REWARD and len(validators.sent) == 1
    assert stats.delivered == 0 and stats.undelivered == 0


def test_a_submission_nobody_takes_is_given_up_after_backing_off():
    validators = Validators([None, int(Reason.NOT_FOR_US)])
    stats = WorkerStats()
    clock = trio.testing.MockClock(autojump_threshold=0)

    async def main() -> float:
        start = trio.current_time()
        assert await deliver(validators, Rotation(), small_submission(), stats, rounds=4) is None
        return trio.current_time() - start

    waited = trio.run(main, clock=clock)
    assert waited == 1 + 2 + 4 + 8 and len(validators.sent) == 8 and stats.undelivered == 1

    stale = Validators([None])
    assert (
        trio.run(partial(deliver, stale, Rotation(), small_submission(), stats, fresh=lambda: False)) is None
    )
    assert stale.sent == []  # a stale submission is not even offered


def test_no_validator_known_yet_waits_then_gives_up():
    validators = Validators([])
    stats = WorkerStats()

    async def main() -> None:
        assert await deliver(validators, Rotation(), small_submission(), stats, rounds=2) is None

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert stats.undelivered == 1


# --- verdicts ------------------------------------------------------------------------------------------


VERDICT_VALIDATOR = T.identity("worker-test-validator")


def a_verdict(worker: bytes, digest: bytes, accepted: bool, reason: int = 0) -> Verdict:
    return Verdict(RUN, digest, worker, assignment_step(3, 0), 3, accepted, reason, "", (), 10, 0.0, 0.0)


def batch_delivery(verdicts: list[Verdict], seq: int) -> Delivery:
    """A validator's VerdictBatch as the topic delivers it: sealed, opened and checked whole."""
    batch = VerdictBatch(RUN, VERDICT_VALIDATOR.address, tuple(verdicts))
    data = seal(VERDICT_VALIDATOR, batch, run=RUN, seq=seq, ts=1_000)
    opened = open_envelope(data, run=RUN, now_ms=1_000, replay=None, expect=VerdictBatch)
    check_opened_verdicts(opened)
    return Delivery("verdicts", opened, "forwarder", 0.0, 0, len(data))


VERDICTS = [
    a_verdict(WORKER.address, sha256(b"a"), True),
    a_verdict(WORKER.address, sha256(b"a"), True),  # the same submission again
    a_verdict(WORKER.address, sha256(b"b"), False, int(Reason.BAD_REWARD)),
    a_verdict(WORKER.address, sha256(b"c"), False, int(Reason.BAD_PROOF)),
    a_verdict(WORKER.address, sha256(b"d"), False, int(Reason.STALE)),
    a_verdict(b"\x09" * 20, sha256(b"e"), False, int(Reason.BAD_PROOF)),  # someone else's
    a_verdict(b"\x0a" * 20, sha256(b"f"), True),  # another worker accepted: the pacer's N
]


def batched(verdicts: list[Verdict], max_items: int) -> list[Delivery]:
    """The deliveries a validator's batcher makes of `verdicts`, `max_items` at most per batch."""
    batcher = VerdictBatcher(RUN, VERDICT_VALIDATOR.address, max_items=max_items)
    batches = [b for v in verdicts for b in batcher.add(v)]
    last = batcher.take()
    batches += [last] if last is not None else []
    return [batch_delivery(list(b.verdicts), seq) for seq, b in enumerate(batches, 1)]


@pytest.mark.parametrize("max_items", [1, 3, 256])
def test_verdicts_naming_this_worker_are_counted_once(tmp_path, max_items):
    """One verdict per batch (as single verdicts were) or many: the worker counts the same."""
    work = worker_work(node_config(tmp_path, cheat=FORGED_REWARD), WORKER, None)
    deliveries = batched(VERDICTS, max_items)

    async def main() -> None:
        for delivery in deliveries:
            await work.on_gossip(None, delivery)  # type: ignore[arg-type]  # verdicts need no network

    trio.run(main)
    status = work.status()
    assert (status["accepted"], status["rejected"], status["slashable"]) == (1, 3, 2)
    assert status["by_reason"] == {"BAD_PROOF": 1, "BAD_REWARD": 1, "STALE": 1}
    assert status["cheat"] == FORGED_REWARD and status["version"] is None
    assert dict(work.pacer.seen) == {WORKER.address: 3, b"\x0a" * 20: 3}  # accepted workers: the pacer's N
    json.dumps(status)


# --- over a real swarm -----------------------------------------------------------------------------


class QueueingValidator(IdleValidatorWork):
    """A validator that queues whatever it is sent (the judging is tested above)."""

    def __init__(self) -> None:
        super().__init__()
        self.queued: list[RolloutSubmission] = []

    async def submit(self, peer: ID, submission: Opened, digest: bytes) -> SubmitAck:
        self.queued.append(submission.message)
        return SubmitAck(submission_digest=digest, status=100, detail="queued")


def test_submissions_reach_a_validator_found_through_the_dht(tmp_path):
    """Two validators in the DHT, one not validating yet (205): every submission ends up queued. The
    worker node runs the real work, which waits for a run descriptor (none here) and reports its status."""
    queueing = QueueingValidator()
    work = worker_work(node_config(tmp_path / "work"), WORKER, None)
    services = {1: Worker(work), 2: Validator(), 3: Validator(queueing)}

    async def main() -> None:
        async with swarm(
            tmp_path, ["bootstrap", "worker", "validator", "validator"], services=services
        ) as nodes:
            net = nodes[1].net
            assert net is not None
            await wait_until(lambda: len(net.peers("validator")) == 2, timeout=30)
            stats, rotation, transport = WorkerStats(), Rotation(), NetTransport(net)
            for _ in range(2):
                ack = await deliver(transport, rotation, small_submission(), stats)
                assert ack is not None and ack.status == 100
            assert stats.acks == {int(Reason.NOT_FOR_US): 1, 100: 2} and stats.submit_failures == 0
            assert queueing.queued == [small_submission()] * 2
            status = json.loads(json.dumps(nodes[1].status()))["work"]
            assert (
                status["version"] is None
                and status["submitted"] == 0
                and status["follower"]["gossip_heads"] == 0
            )

    trio.run(main)


def test_a_retried_submission_is_the_same_envelope_for_every_validator() -> None:
    """Sealed once: a validator that queued it before our timeout and the next one name it by one digest."""
    from types import SimpleNamespace

    from swarmnode.crypto.identity import NodeIdentity
    from swarmnode.node.worker.delivery import NetTransport
    from swarmnode.protocol.envelope import seal

    identity = NodeIdentity(b"\x07" * 32)
    sent: list[bytes] = []
    counter = iter(range(1, 100))

    async def request(peer, spec, message, *, sealed=None):  # type: ignore[no-untyped-def]
        sent.append(sealed)
        return SimpleNamespace(message=SubmitAck(bytes(32), 100, "queued"))

    net = SimpleNamespace(
        seal=lambda m: seal(identity, m, run=m.run, seq=next(counter), ts=1), request=request
    )
    transport = NetTransport(net)  # type: ignore[arg-type]
    first = RolloutSubmission("devnet", 0, 0, bytes(32), ())
    second = RolloutSubmission("devnet", 1, 0, bytes(32), ())
    validator = NodeIdentity(b"\x08" * 32).peer_id

    async def main() -> None:
        await transport.send(validator, first)
        await transport.send(validator, first)
        await transport.send(validator, second)

    trio.run(main)
    assert sent[0] == sent[1] != sent[2]


def test_the_budget_never_exceeds_the_runs_bound(setup):
    descriptor = dataclasses.replace(setup.descriptor, max_submissions_per_version=3)
    assert submission_budget(2, descriptor) == 2
    assert submission_budget(3, descriptor) == 3
    assert submission_budget(50, descriptor) == 3


def test_a_worker_configured_beyond_the_runs_bound_stops_at_it(tmp_path, base_engine, setup):
    """`submissions_per_version` 5 on a run allowing 2 per version: counters 0 and 1 only (a third would be
    rejected 602 and slashed)."""
    bounded = RunSetup(dataclasses.replace(setup.descriptor, max_submissions_per_version=2), setup.tasks)
    state = {k: v.clone() for k, v in base_engine.model.state_dict().items()}
    v1 = write_checkpoint(tmp_path / "ckpt", 1, state, bounded.descriptor.model_config_hash)
    config = node_config(tmp_path, submissions_per_version=5)
    validators = Validators([100])

    async def main() -> None:
        work = set_up(worker_work(config, WORKER, None), config, bounded)
        work.engine = run_engine()
        send, receive = trio.open_memory_channel[VerifiedCheckpoint](8)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(work._load_checkpoints, receive)
            nursery.start_soon(work._work, validators)
            await send.send(v1)
            with trio.fail_after(20):
                while len(validators.sent) < 2:  # noqa: ASYNC110  # the loop under test offers no event
                    await trio.sleep(0.01)
            await trio.sleep(0.5)
            nursery.cancel_scope.cancel()
        assert [s.step for _, s in validators.sent] == [assignment_step(1, 0), assignment_step(1, 1)]
        assert work.next_counter() is None

    trio.run(main)


def test_a_greedy_worker_ignores_pacing_up_to_the_runs_bound(tmp_path, setup):
    """The devnet's greedy worker (tests/swarm/test_role_abuse_devnet.py): on a version where the pacer
    cuts an honest worker to one counter (a trainer stepping every 20 ms, builds of 10 s), it takes every
    counter the run allows, and never one past it (that one would be rejected 602 and slashed)."""
    bounded = RunSetup(dataclasses.replace(setup.descriptor, max_submissions_per_version=5), setup.tasks)
    counters: dict[str, list[int]] = {}
    for cheat in ("", GREEDY):
        config = node_config(tmp_path / (cheat or "honest"), submissions_per_version=4, cheat=cheat)
        work = set_up(worker_work(config, WORKER, None), config, bounded)
        work.loaded = CheckpointRef(1, b"\x01" * 32)

        async def plan(work: SwarmWorkerWork = work) -> list[int]:
            for version, created_ms in ((0, 1_000), (1, 1_020)):
                work._note_version(version, created_ms)
            for _ in range(16):
                work.pacer.built(10.0)
            taken = []
            while (counter := work.next_counter()) is not None:
                taken.append(counter)
            return taken

        counters[cheat or "honest"] = trio.run(plan)
    assert counters == {"honest": [0], GREEDY: [0, 1, 2, 3, 4]}


class SwapFailsOnce:
    """An engine whose first weight swap fails halfway (as a vLLM reload can): the rest is the real one."""

    def __init__(self, engine) -> None:
        self.engine, self.failed = engine, False

    def load_weights(self, state) -> None:
        if not self.failed:
            self.failed = True
            raise RuntimeError("reload_weights failed on a prepacked parameter")
        self.engine.load_weights(state)

    def __getattr__(self, name):
        return getattr(self.engine, name)


def test_a_failed_weight_swap_stops_generation_not_the_worker(tmp_path, base_engine, setup):
    """Nothing is generated on weights that may be half swapped; the next checkpoint swaps in whole and
    the worker goes on."""
    state = {k: v.clone() for k, v in base_engine.model.state_dict().items()}
    v1 = write_checkpoint(tmp_path / "ckpt1", 1, state, setup.descriptor.model_config_hash)
    v2 = write_checkpoint(tmp_path / "ckpt2", 2, state, setup.descriptor.model_config_hash)
    config = node_config(tmp_path, submissions_per_version=1)
    validators = Validators([100])

    async def main() -> None:
        work = set_up(worker_work(config, WORKER, None), config, setup)
        work.engine = SwapFailsOnce(run_engine())
        send, receive = trio.open_memory_channel[VerifiedCheckpoint](8)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(work._load_checkpoints, receive)
            nursery.start_soon(work._work, validators)
            await send.send(v1)
            with trio.fail_after(20):
                while not work.stats.swap_failures:  # noqa: ASYNC110  # the loop under test offers no event
                    await trio.sleep(0.01)
            assert work.loaded is None and work.next_counter() is None and not validators.sent
            await send.send(v2)
            with trio.fail_after(20):
                while not validators.sent:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
        assert [s.checkpoint_version for _, s in validators.sent] == [2]
        assert work.status()["swap_failures"] == 1

    trio.run(main)
