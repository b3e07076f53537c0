"""DiLoCo rounds between in-process trainers over real HTTP on loopback (fixed peer maps, no libp2p).

The networked trainers must compute what `reference_diloco` computes in one process on the same data
(bit-exactly here: same process, same torch threads), leave out a trainer that never comes or is too slow
for a round while all of them still agree, let a late trainer join from the outer state, and refuse a
contribution whose payload is not one the run's compression produces.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import trio

from swarmnode.node.diloco.algorithm import content_digest, reference_diloco
from swarmnode.node.diloco.holdings import Holdings
from swarmnode.node.diloco.participant import params_of
from swarmnode.node.diloco.pretraining import LmBatch, lm_loss
from swarmnode.node.diloco.weights import trainable_state
from swarmnode.protocol import diloco as rules
from swarmnode.testing.straggler import straggling
from tests.diloco.helpers import (
    LocalTrainer,
    identities,
    make_trainer,
    model,
    serve,
    tiny_plan,
    train,
    trainer_data,
)


@pytest.fixture(autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)  # as the trainer processes run; the reference must use the same kernels


def reference(
    data: list[list[LmBatch]], plan_kwargs: dict[str, object], rounds: int
) -> dict[str, torch.Tensor]:
    plan, _ = tiny_plan(identities(len(data)), **plan_kwargs)
    return reference_diloco(model, data, params_of(plan), rounds, lm_loss)


def assert_same(theta: dict[str, torch.Tensor] | None, ref: dict[str, torch.Tensor]) -> None:
    assert theta is not None and set(theta) == set(ref)
    for name in ref:
        torch.testing.assert_close(theta[name], ref[name], rtol=0, atol=1e-6)


def rounds_of(trainer: LocalTrainer) -> dict[int, tuple[list[str], str]]:
    return {e["round"]: (e["contributors"], e["theta"]) for e in trainer.events if e["event"] == "round_done"}


async def run_all(
    tmp: Path,
    trainers: list[LocalTrainer],
    *,
    serving: int | None = None,
    delays: dict[int, float] | None = None,
) -> None:
    """Serve the first `serving` trainers (all by default), train those not delayed forever."""
    peers: dict[bytes, str] = {}
    async with trio.open_nursery() as nursery:
        for t in trainers[:serving]:
            peers[t.identity.address] = await serve(t, nursery)

        async def start(t: LocalTrainer, delay: float) -> None:
            await trio.sleep(delay)
            await train(t, peers)

        async with trio.open_nursery() as training:
            for i, t in enumerate(trainers[:serving]):
                training.start_soon(start, t, (delays or {}).get(i, 0.0))
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("compression", ["fp16", "int8", "none"])
def test_two_trainers_compute_what_one_process_computes(tmp_path: Path, compression: str) -> None:
    keys = identities(2)
    plan, envelope = tiny_plan(keys, compression=compression, rounds=3)
    data = [trainer_data(i, batches=6) for i in range(2)]
    trainers = [make_trainer(tmp_path, k, plan, envelope, data[i]) for i, k in enumerate(keys)]
    trio.run(run_all, tmp_path, trainers)
    ref = reference(data, {"compression": compression}, 3)
    for t in trainers:
        assert t.kinds()[-1] == "done"
        assert [len(c) for c, _ in rounds_of(t).values()] == [2, 2, 2]
        assert_same(t.theta, ref)
    assert rounds_of(trainers[0]) == rounds_of(trainers[1])


def test_a_trainer_that_never_comes_is_left_out_after_the_timeout(tmp_path: Path) -> None:
    keys = identities(3)
    plan, envelope = tiny_plan(keys, collect_timeout_ms=600, vote_timeout_ms=600)
    data = [trainer_data(i) for i in range(3)]
    trainers = [make_trainer(tmp_path, k, plan, envelope, data[i]) for i, k in enumerate(keys)]
    trio.run(lambda: run_all(tmp_path, trainers, serving=2))
    ref = reference(data[:2], {}, plan.rounds)  # the absent trainer's data never counts
    for t in trainers[:2]:
        assert [len(c) for c, _ in rounds_of(t).values()] == [2, 2]
        assert_same(t.theta, ref)


def test_a_straggler_is_left_out_of_its_slow_round_and_everyone_agrees(tmp_path: Path) -> None:
    keys = identities(3)
    plan, envelope = tiny_plan(keys, rounds=4, collect_timeout_ms=500, vote_timeout_ms=5000)
    trainers = []
    for i, key in enumerate(keys):
        data = trainer_data(i, batches=8)
        trainer = make_trainer(tmp_path, key, plan, envelope, data)
        if i == 2:  # one trainer is 2 s late in round 1: far past the others' collect timeout
            trainer.work.inner.loss_fn = straggling(lm_loss, data, 1, plan.inner_steps, 2.0)  # type: ignore[attr-defined]
        trainers.append(trainer)
    trio.run(run_all, tmp_path, trainers)
    rounds = [rounds_of(t) for t in trainers]
    assert rounds[0] == rounds[1] == rounds[2], "every trainer must average the same set every round"
    straggler = "0x" + keys[2].address.hex()
    assert straggler not in rounds[0][1][0] and len(rounds[0][1][0]) == 2
    assert straggler in rounds[0][0][0]
    finals = {content_digest(t.theta) for t in trainers if t.theta is not None}
    assert len(finals) == 1


def test_a_late_trainer_joins_from_the_outer_state_and_then_contributes(tmp_path: Path) -> None:
    keys = identities(3)
    plan, envelope = tiny_plan(keys, rounds=5, collect_timeout_ms=800, vote_timeout_ms=800)
    trainers = [make_trainer(tmp_path, k, plan, envelope, trainer_data(i)) for i, k in enumerate(keys)]
    trio.run(lambda: run_all(tmp_path, trainers, delays={2: 2.0}))
    late = trainers[2]
    resync = [e for e in late.events if e["event"] == "resync"]
    assert resync and resync[0]["previous"] == 0 and resync[0]["round"] >= 1
    joined_at = resync[0]["round"]
    mine = rounds_of(late)
    assert min(mine) == joined_at and mine == {
        r: v for r, v in rounds_of(trainers[0]).items() if r >= joined_at
    }
    assert any(len(contributors) == 3 for contributors, _ in mine.values())
    assert len({content_digest(t.theta) for t in trainers if t.theta is not None}) == 1


def test_a_malformed_payload_is_refused_and_left_out(tmp_path: Path) -> None:
    keys = identities(3)
    plan, envelope = tiny_plan(keys, rounds=1, collect_timeout_ms=1500, vote_timeout_ms=500)
    data = [trainer_data(i) for i in range(3)]
    honest = [make_trainer(tmp_path, k, plan, envelope, data[i]) for i, k in enumerate(keys[:2])]
    liar = Holdings(tmp_path / "liar", keys[2], plan, envelope, shard_size=64 * 1024)
    theta = trainable_state(model())
    bad = {name: torch.zeros(3, dtype=torch.float16) for name in theta}  # right names, wrong shapes

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            peers = {t.identity.address: await serve(t, nursery) for t in honest}
            from swarmnode.node.dataplane.http_server import HttpServer, ServerConfig
            from swarmnode.node.diloco.contribution_endpoints import DilocoService

            server = HttpServer(DilocoService(liar), ServerConfig(port=0))
            port = await nursery.start(server.serve)
            liar.set_endpoint(f"http://127.0.0.1:{port}")
            peers[keys[2].address] = liar.endpoint
            await liar.publish_contribution(0, plan.initial_digest, bad, {})
            async with trio.open_nursery() as training:
                for t in honest:
                    training.start_soon(train, t, peers)
            nursery.cancel_scope.cancel()

    trio.run(main)
    ref = reference(data[:2], {}, 1)
    for t in honest:
        refused = [e for e in t.events if e["event"] == "refused"]
        assert refused and refused[0]["peer"] == "0x" + keys[2].address.hex()
        assert (refused[0]["verdict"], refused[0]["reason"]) == ("reject", "RULE_VIOLATION")
        assert_same(t.theta, ref)


def test_a_restarted_trainer_reuses_its_signed_messages(tmp_path: Path) -> None:
    keys = identities(2)
    plan, envelope = tiny_plan(keys, rounds=1)
    trainers = [make_trainer(tmp_path, k, plan, envelope, trainer_data(i)) for i, k in enumerate(keys)]
    trio.run(run_all, tmp_path, trainers)
    first = trainers[0].holdings

    async def reopen() -> None:
        again = Holdings(first.root, first.identity, plan, envelope, shard_size=64 * 1024)
        held, tensors = again.restore()
        assert held is not None and tensors is not None and held.state.message.round == 1
        assert held.envelope == first.outer.envelope  # type: ignore[union-attr]
        own = again.contribution(0, first.me)
        assert own is not None and own.envelope == first.contribution(0, first.me).envelope  # type: ignore[union-attr]
        state = rules.verify_outer_state(
            held.envelope, plan=plan, digest=again.plan_digest, now_ms=first.clock_ms()
        )
        assert state.message.contributors == first.entries(0)  # both contributions, ascending by author

    trio.run(reopen)


class StuckInRound:
    """An inner round that never ends in round `stuck`: a trainer waiting for data that no longer comes
    (in an RL run, rollouts of versions the run has left behind)."""

    def __init__(self, inner: Any, stuck: int) -> None:
        self.inner, self.stuck = inner, stuck

    async def __call__(self, round_index: int, theta: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if round_index == self.stuck:
            await trio.sleep_forever()
        return await self.inner(round_index, theta)

    def statistics(self) -> dict[str, Any]:
        return dict(self.inner.statistics())


def test_a_trainer_stuck_in_a_round_the_others_closed_resyncs_instead_of_waiting(tmp_path: Path) -> None:
    keys = identities(3)
    plan, envelope = tiny_plan(keys, rounds=4, collect_timeout_ms=600, vote_timeout_ms=600)
    trainers = [
        make_trainer(tmp_path, k, plan, envelope, trainer_data(i, batches=8)) for i, k in enumerate(keys)
    ]
    stuck = trainers[2]
    stuck.work.inner = StuckInRound(stuck.work.inner, 1)  # type: ignore[assignment]

    async def bounded() -> None:
        with trio.fail_after(120):  # without leaving the round, the stuck trainer would wait forever
            await run_all(tmp_path, trainers)

    trio.run(bounded)
    assert [e["round"] for e in stuck.events if e["event"] == "overtaken"] == [1]
    resync = [e for e in stuck.events if e["event"] == "resync"]
    assert resync and resync[0]["previous"] == 1 and resync[0]["round"] >= 2
    straggler = "0x" + keys[2].address.hex()
    assert straggler not in rounds_of(trainers[0])[1][0]
    assert len({content_digest(t.theta) for t in trainers if t.theta is not None}) == 1
