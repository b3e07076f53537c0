"""A DiLoCo run of two participants over HTTP, for the tests: run under `torch.distributed.run` with N ranks.

Participant A is the process group (FSDP2, `GroupParticipant` on rank 0, the other ranks serving its
commands); participant B is a one-process trainer (`WholeParticipant`) in rank 0's process. Both start
from the tiny folder's weights and take `inner_steps` GRPO steps per round on the groups in `--groups`
(msgpack list of encoded RolloutGroups), through the real round protocol (`DilocoTrainerWork`, loopback
HTTP servers). `<out>/report.json` gets each participant's round history, the θ digest of its last outer
state, and whether the group's signed outer state holds exactly the one-process trainer's θ.

Then the group participant is made again over the same directory, as after a restart: it must resume
from its signed outer state on disk (`Holdings.restore(load=False)`, each rank loading its tensors) at
the last round, with that θ, and play no round again. Last, the group starts over from θ_0 with empty
holdings, as a trainer that joins late: it must adopt the one-process trainer's newest outer state
(fetched over HTTP, θ digest streamed from the files, each rank loading its tensors).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import msgpack
import torch
import trio

from swarmnode.node.dataplane.checkpoint import load_checkpoint
from swarmnode.node.dataplane.http_server import HttpServer, ServerConfig
from swarmnode.node.diloco.algorithm import THETA_PREFIX
from swarmnode.node.diloco.contribution_endpoints import DilocoService
from swarmnode.node.diloco.holdings import Holdings
from swarmnode.node.diloco.participant import GroupParticipant
from swarmnode.node.diloco.plan import checkpoint_digest
from swarmnode.node.diloco.rounds import DilocoTrainerWork
from swarmnode.node.diloco.sharded import RANK_COMMANDS
from swarmnode.node.diloco.weights import load_trainable, trainable_state
from swarmnode.node.rl.engine import TransformersEngine
from swarmnode.node.rl.learner import GrpoTrainer
from swarmnode.node.trainer.commands import serve_rank
from swarmnode.node.trainer.group import exit_rank, launched_rank
from swarmnode.node.trainer.sharded import ShardedGrpoTrainer
from swarmnode.protocol.codec import decode
from swarmnode.protocol.messages import GrpoParams, RolloutGroup
from tests.diloco.helpers import FAST, identities, tiny_plan

SHARD_SIZE = 20_000  # several files per rank


async def steps(trainer: ShardedGrpoTrainer | GrpoTrainer, groups: list[RolloutGroup]) -> float:
    return (await trio.to_thread.run_sync(trainer.step, groups)).loss


class GroupSteps:
    """The group's inner round: its ranks' model holds θ and keeps the trained weights."""

    def __init__(self, trainer: ShardedGrpoTrainer, groups: list[RolloutGroup], steps: int) -> None:
        self.trainer, self.groups, self.steps = trainer, groups, steps
        self.losses: list[float] = []

    async def __call__(self, round_index: int, theta: dict[str, torch.Tensor] | None) -> None:
        if theta is not None:
            raise AssertionError("a group participant was handed θ")
        self.losses = [await steps(self.trainer, self.groups) for _ in range(self.steps)]

    def statistics(self) -> dict[str, Any]:
        return {"last_round_mean_loss": sum(self.losses) / max(len(self.losses), 1)}


class WholeSteps:
    """The one-process trainer's inner round: load θ, take the steps, return the trained weights."""

    def __init__(self, trainer: GrpoTrainer, groups: list[RolloutGroup], steps: int) -> None:
        self.trainer, self.groups, self.steps = trainer, groups, steps
        self.losses: list[float] = []

    async def __call__(
        self, round_index: int, theta: dict[str, torch.Tensor] | None
    ) -> dict[str, torch.Tensor]:
        assert theta is not None
        model = self.trainer.engine.model
        await trio.to_thread.run_sync(load_trainable, model, theta)
        self.losses = [await steps(self.trainer, self.groups) for _ in range(self.steps)]
        return await trio.to_thread.run_sync(trainable_state, model)

    def statistics(self) -> dict[str, Any]:
        return {"last_round_mean_loss": sum(self.losses) / max(len(self.losses), 1)}


async def serve(holdings: Holdings, nursery: trio.Nursery) -> str:
    port = await nursery.start(HttpServer(DilocoService(holdings), ServerConfig(port=0)).serve)
    endpoint = f"http://127.0.0.1:{port}"
    holdings.set_endpoint(endpoint)
    return endpoint


async def play(args: argparse.Namespace, group: ShardedGrpoTrainer, whole: GrpoTrainer, groups) -> dict:
    keys = identities(2)
    plan, envelope = tiny_plan(
        keys, rounds=args.rounds, inner_steps=2, compression="int8", initial=checkpoint_digest(args.model),
        collect_timeout_ms=120_000, vote_timeout_ms=120_000,
    )
    a = Holdings(args.out / "a", keys[0], plan, envelope, shard_size=SHARD_SIZE)
    b = Holdings(args.out / "b", keys[1], plan, envelope, shard_size=SHARD_SIZE)
    events: dict[str, list[str]] = {"a": [], "b": []}
    participant = await trio.to_thread.run_sync(GroupParticipant.start_group, a, group)
    zero = args.out / "theta0"
    theta0 = (zero, await trio.to_thread.run_sync(participant.group.write_outer, zero, SHARD_SIZE))
    work_a = DilocoTrainerWork(
        a, participant, GroupSteps(group, groups, plan.inner_steps), settings=FAST,
        emit=lambda event, **_: events["a"].append(event),
    )
    work_b = DilocoTrainerWork(
        b, whole.engine.model, WholeSteps(whole, groups, plan.inner_steps), settings=FAST,
        emit=lambda event, **_: events["b"].append(event),
    )
    results: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        peers = {keys[0].address: await serve(a, nursery), keys[1].address: await serve(b, nursery)}

        async def run(name: str, work: DilocoTrainerWork) -> None:
            results[name] = await work.train(lambda: peers)

        async with trio.open_nursery() as both:
            both.start_soon(run, "a", work_a)
            both.start_soon(run, "b", work_b)
        report: dict[str, Any] = {"events": events, "a_returned": results["a"] is None}
        for name, work, holdings in (("a", work_a, a), ("b", work_b, b)):
            report[name] = {"history": work.history, "theta": holdings.outer.state.message.theta.hex()}
        outer = a.outer
        stored = load_checkpoint(outer.directory, outer.state.manifest)
        theta = {k[len(THETA_PREFIX):]: v for k, v in stored.items() if k.startswith(THETA_PREFIX)}
        final = results["b"]
        report["group_theta_equals_whole"] = set(theta) == set(final) and all(
            torch.equal(theta[n], final[n]) for n in final
        )
        report["initial_moved"] = b.outer.state.message.theta != plan.initial_digest
        again = Holdings(args.out / "a", keys[0], plan, envelope, shard_size=SHARD_SIZE)
        resumed = await trio.to_thread.run_sync(GroupParticipant.start_group, again, group)
        events["again"] = []
        work_again = DilocoTrainerWork(
            again, resumed, GroupSteps(group, groups, plan.inner_steps), settings=FAST,
            emit=lambda event, **_: events["again"].append(event),
        )
        await work_again.train(lambda: peers)
        report["again"] = {
            "round": work_again.round, "theta": resumed.base().hex(), "history": work_again.history
        }
        late = Holdings(args.out / "late", keys[0], plan, envelope, shard_size=SHARD_SIZE)
        joining = await trio.to_thread.run_sync(GroupParticipant.start_group, late, group)
        await trio.to_thread.run_sync(joining.group.load_outer, *theta0)  # the model back at θ_0
        events["late"] = []
        work_late = DilocoTrainerWork(
            late, joining, GroupSteps(group, groups, plan.inner_steps), settings=FAST,
            emit=lambda event, **_: events["late"].append(event),
        )
        await work_late.train(lambda: peers)
        report["late"] = {
            "round": work_late.round, "theta": joining.base().hex(), "history": work_late.history
        }
        nursery.cancel_scope.cancel()
    return report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--groups", type=Path, required=True)
    parser.add_argument("--grpo", required=True, help="GrpoParams as JSON")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if launched_rank() not in (None, 0):
        serve_rank(RANK_COMMANDS)
        return
    groups = [decode(RolloutGroup, g) for g in msgpack.unpackb(args.groups.read_bytes())]
    grpo = GrpoParams(**json.loads(args.grpo))
    group = ShardedGrpoTrainer.start(args.out / "group-trainer", args.model, grpo)
    whole = GrpoTrainer(TransformersEngine.from_folder(args.model), grpo)
    try:
        report = trio.run(play, args, group, whole, groups)
    finally:
        group.close()
    (args.out / "report.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
    exit_rank(0)  # skip torch's racy C++ teardown at exit (node.trainer.group.exit_rank)
