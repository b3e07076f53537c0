"""A trainer process group for the tests: run under `torch.distributed.run` with N ranks.

Rank 0 takes `--steps` GRPO steps on the groups in `--groups` (msgpack list of encoded RolloutGroups),
saves its sharded state in `--trainer-dir` after each, and writes the final model folder as version
`step` into a ShardStore under `--out`, listing the ShardInfos it got in `<out>/infos.json`. The other
ranks serve rank 0's commands.

With `--diloco PARAMS` the group is one DiLoCo participant instead: `--rounds` rounds of H GRPO steps,
each round's inner weights written as model version 2r+1, its payload as version r of namespace
`payload`, averaged with the contributions under `<--extra>/round-<r>/<k>/` (files + infos.json), and
the new outer weights written as model version 2r+2. A contribution under `<--extra>/bad/` is offered
first in round 0 and must be refused with nothing changed.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import msgpack

from swarmnode.node.dataplane.origin import model_folder_files
from swarmnode.node.dataplane.store import ShardStore
from swarmnode.node.diloco.algorithm import DilocoParams
from swarmnode.node.diloco.sharded import RANK_COMMANDS, PayloadRefused, ShardedDiloco
from swarmnode.node.trainer.commands import serve_rank
from swarmnode.node.trainer.group import exit_rank, launched_rank
from swarmnode.node.trainer.sharded import ShardedGrpoTrainer
from swarmnode.protocol.codec import decode
from swarmnode.protocol.messages import GrpoParams, RolloutGroup, ShardInfo


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--groups", type=Path, required=True)
    parser.add_argument("--grpo", required=True, help="GrpoParams as JSON")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--trainer-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shard-size", type=int, default=50 * 1024 * 1024)
    parser.add_argument("--diloco", help="DilocoParams as JSON: run DiLoCo rounds")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--extra", type=Path, help="other trainers' contributions, per round")
    parser.add_argument("--idle", type=float, default=0.0, help="seconds to sit idle after loading")
    args = parser.parse_args()
    if launched_rank() not in (None, 0):
        serve_rank(RANK_COMMANDS)
        return
    groups = [decode(RolloutGroup, g) for g in msgpack.unpackb(args.groups.read_bytes())]
    trainer = ShardedGrpoTrainer.start(args.trainer_dir, args.model, GrpoParams(**json.loads(args.grpo)))
    time.sleep(args.idle)  # as rank 0 does while it waits for rollouts
    if args.diloco:
        diloco_rounds(trainer, groups, args)
        trainer.close()
        return
    started = trainer.step_count
    stats = []
    for _ in range(args.steps):
        stats.append(trainer.step(groups).__dict__)
        trainer.save(args.trainer_dir)
    store = ShardStore(args.out, "job")
    infos = trainer.write_model(store, trainer.step_count, args.shard_size, model_folder_files(args.model))
    report = {
        "started": started,
        "step": trainer.step_count,
        "stats": stats,
        "local_bytes": trainer.policy.local_bytes(),
        "partial_dir": str(store.partial_dir(trainer.step_count)),
        "infos": [[i.name, i.size, i.sha256.hex()] for i in infos],
    }
    (args.out / "report.json").write_text(json.dumps(report))
    trainer.close()



def read_contribution(directory: Path) -> tuple[Path, list[ShardInfo]]:
    rows = json.loads((directory / "infos.json").read_text())
    return directory, [ShardInfo(n, s, bytes.fromhex(h)) for n, s, h in rows]


def diloco_rounds(trainer: ShardedGrpoTrainer, groups: list[RolloutGroup], args: argparse.Namespace) -> None:
    fields = json.loads(args.diloco)
    params = DilocoParams(**{**fields, "inner_betas": tuple(fields["inner_betas"])})
    diloco = ShardedDiloco.start(trainer, params)
    models, payloads = ShardStore(args.out, "job"), ShardStore(args.out, "payload")
    files = model_folder_files(args.model)
    report: dict = {"rounds": [], "checked": None, "refused": None}
    for r in range(args.rounds):
        for _ in range(params.inner_steps):
            trainer.step(groups)
        trainer.write_model(models, 2 * r + 1, args.shard_size, files)
        infos = diloco.contribute(payloads.partial_dir(r), args.shard_size)
        own = (payloads.partial_dir(r), infos)
        if r == 0 and (args.extra / "bad").is_dir():
            bad = read_contribution(args.extra / "bad")
            try:
                diloco.check(*bad)
            except PayloadRefused as exc:
                report["checked"] = str(exc)
            try:
                diloco.apply([own, bad])
            except PayloadRefused as exc:
                report["refused"] = str(exc)
        others = sorted((args.extra / f"round-{r}").iterdir())
        for other in others:
            diloco.check(*read_contribution(other))
        diloco.apply([own, *(read_contribution(d) for d in others)])
        trainer.write_model(models, 2 * r + 2, args.shard_size, files)
        report["rounds"].append(
            {
                "inner": str(models.partial_dir(2 * r + 1)),
                "payload": str(payloads.partial_dir(r)),
                "payload_infos": [[i.name, i.size, i.sha256.hex()] for i in infos],
                "outer": str(models.partial_dir(2 * r + 2)),
            }
        )
    outer_dir = args.out / "outer-state"
    outer_infos = diloco.write_outer(outer_dir, args.shard_size)
    diloco.load_outer(outer_dir, outer_infos)  # resuming from what we wrote changes nothing
    trainer.write_model(models, 2 * args.rounds + 1, args.shard_size, files)
    report["outer_state"] = [str(outer_dir), [[i.name, i.size, i.sha256.hex()] for i in outer_infos]]
    report["reloaded"] = str(models.partial_dir(2 * args.rounds + 1))
    report["memory"] = [m.__dict__ for m in diloco.measure()]
    (args.out / "report.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
    exit_rank(0)  # skip torch's racy C++ teardown at exit (node.trainer.group.exit_rank)
