"""A trainer process group for the tests: run under `torch.distributed.run` with N ranks.

Rank 0 takes `--steps` GRPO steps on the groups in `--groups` (msgpack list of encoded RolloutGroups),
saves its sharded state in `--trainer-dir` after each, and writes the final model folder as version
`step` into a ShardStore under `--out`, listing the ShardInfos it got in `<out>/infos.json`. The other
ranks serve rank 0's commands.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import msgpack

from node.dataplane.origin import model_folder_files
from node.dataplane.store import ShardStore
from node.rl.sharded import ShardedGrpoTrainer, launched_rank, serve_rank
from protocol.codec import decode
from protocol.messages import GrpoParams, RolloutGroup


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--groups", type=Path, required=True)
    parser.add_argument("--grpo", required=True, help="GrpoParams as JSON")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--trainer-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shard-size", type=int, default=50 * 1024 * 1024)
    args = parser.parse_args()
    if launched_rank() not in (None, 0):
        serve_rank()
        return
    groups = [decode(RolloutGroup, g) for g in msgpack.unpackb(args.groups.read_bytes())]
    trainer = ShardedGrpoTrainer.start(args.trainer_dir, args.model, GrpoParams(**json.loads(args.grpo)))
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


if __name__ == "__main__":
    main()
