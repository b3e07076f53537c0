"""The trainer as a process group: FSDP2 over torch.distributed, rank 0 the node's only face.

A run whose model and AdamW state outgrow one device trains on N ranks (`swarmnode run --role trainer
--nproc N`, or under `torchrun` across hosts). Rank 0 is the node: its libp2p host, HTTP origin and ledger
access, its inbox of accepted rollouts. It hands each command to every rank (`broadcast_bytes`: msgpack,
never pickle) and runs the command itself; the other ranks only run `serve_rank`'s loop.

- The model is sharded with FSDP2 (`fully_shard` per decoder layer, then the root) and so is its AdamW
  state: each rank holds 1/N of both. On GPUs parameters compute in bf16 and gradients reduce in fp32
  (`MixedPrecisionPolicy`); on the CPU (gloo) everything stays fp32, so N ranks and one process agree
  within fp32 rounding.
- A step's completions are dealt round-robin to the ranks. Each rank's loss is its tokens' share of the
  sum over the token budget, times N, because FSDP averages gradients over ranks: the averaged gradient is
  then the one-process gradient.
- Resume state is torch.distributed.checkpoint (DCP), sharded: `step-NNNNNN.dcp/` beside the same JSON
  record one process writes (written last, so a record names only complete state).
- A published checkpoint is written without a full gather on any rank: every rank plans the same weights
  files from the parameters' global shapes (`pack_weights`), the files are dealt to ranks by size
  (`assign_files`), each tensor is all-gathered once and kept only by its file's owner, which writes and
  hashes its files; rank 0 writes the config and tokenizer files and collects the `ShardInfo`s. The ranks
  must share the filesystem of the store (one host, or a shared mount).
- A rank that dies breaks the group's next collective; the launcher (torchrun's elastic agent) then ends
  every rank and restarts the group, which resumes from the last saved step.

Parts, one concern each (this module is rank 0's handle, `ShardedGrpoTrainer`, and its resume record):

- `node.trainer.group`: the process group (join per restart attempt, timeouts, leave, exit, bytes between
  ranks, `launched_rank`).
- `node.trainer.rank`: one rank's part (`ShardedPolicy`: FSDP2 model and AdamW shard, the step, DCP state,
  its weights files; the pure dealing rules `rank_share` and `assign_files`).
- `node.trainer.commands`: rank 0's commands to every rank (`Commands`, `execute`, `serve_rank`, pings).
- `node.trainer.launch`: starting the ranks here under torchrun (`launch_group`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from swarmnode.node.dataplane.store import ShardStore
from swarmnode.node.rl.learner import OptimizerParams, StepStats, TrainerStateMismatch
from swarmnode.node.rl.model import ModelInfo
from swarmnode.node.trainer.commands import Commands, optim_from
from swarmnode.node.trainer.group import group_timeout_s, join_group, leave_group
from swarmnode.node.trainer.rank import RankMemory, ShardedPolicy
from swarmnode.protocol.codec import encode
from swarmnode.protocol.messages import GrpoParams, RolloutGroup, ShardInfo

PINGS_PER_TIMEOUT = 10  # an idle rank 0 pings this often per timeout, so waiting for work never times out

log = logging.getLogger(__name__)


def newest_sharded_step(directory: Path) -> dict[str, Any] | None:
    """The newest JSON record of a complete sharded save in `directory`, or None.

    A one-process save there is refused rather than skipped: starting over would drop its steps.
    """
    for record_path in sorted(directory.glob("step-*.json"), reverse=True):
        try:
            record = json.loads(record_path.read_text())
        except (OSError, ValueError):
            continue
        if record.get("format") != "dcp":
            raise TrainerStateMismatch(
                f"{record_path} was saved by a one-process trainer: run it with [work] nproc = 1"
            )
        if (directory / record["state"]).is_dir():
            return dict(record)
    return None


_COMMANDS: Commands | None = None


def lead_group() -> Commands:
    """Rank 0: join the group (once per process) and start keeping the other ranks' wait alive.

    A trainer's rank 0 calls this first thing, before its node starts, so that every rank of a
    (re)started group joins at once: a rank that joins alone gives up after gloo's few connection tries.
    """
    global _COMMANDS
    if _COMMANDS is None:
        _COMMANDS = Commands(join_group(), group_timeout_s() / PINGS_PER_TIMEOUT)
    return _COMMANDS


class ShardedGrpoTrainer:
    """Rank 0's handle on the group: the same surface as `GrpoTrainer` for the trainer's work.

    Every method sends its command to the other ranks first, then runs it here; they run in lockstep.
    """

    def __init__(self, commands: Commands, policy: ShardedPolicy, trainer_dir: Path) -> None:
        self.commands = commands
        self.group = commands.group
        self.policy = policy
        self.trainer_dir = trainer_dir

    @classmethod
    def start(
        cls, trainer_dir: Path, model_dir: Path, grpo: GrpoParams, optim: OptimizerParams | None = None
    ) -> ShardedGrpoTrainer:
        """Join the group and load the model on every rank: from the newest sharded save in
        `trainer_dir` with its recorded optimizer settings when there is one, else fresh with `optim`."""
        commands = lead_group()
        record = newest_sharded_step(trainer_dir)
        if record is not None:
            optim = optim_from(record["optimizer"])
        optim = optim or OptimizerParams()
        command = {
            "op": "init",
            "model_dir": str(model_dir),
            "trainer_dir": str(trainer_dir),
            "grpo": asdict(grpo),
            "optim": asdict(optim),
            "resume_step": record["step"] if record else None,
        }
        log.info("loading the model on every rank", extra={"resume_step": command["resume_step"]})
        policy, _ = commands.run(None, command)
        assert policy is not None
        log.info("the group's model is loaded", extra={"step": policy.step_count})
        return cls(commands, policy, trainer_dir)

    def run_command(self, command: dict[str, Any]) -> Any:
        """Send `command` to the other ranks and run it here; its result on this rank."""
        _, result = self.commands.run(self.policy, command)
        return result

    @property
    def info(self) -> ModelInfo:
        return self.policy.info

    @property
    def step_count(self) -> int:
        return self.policy.step_count

    @property
    def grpo(self) -> GrpoParams:
        return self.policy.grpo

    def parameter_count(self) -> int:
        return sum(p.numel() for p in self.policy.model.parameters())

    def step(self, groups: Sequence[RolloutGroup]) -> StepStats:
        stats: StepStats = self.run_command({"op": "step", "groups": [encode(g) for g in groups]})
        return stats

    def save(self, directory: Path) -> Path:
        """Sharded state of the current step, then its JSON record (last: it names only what is complete)."""
        target: Path = self.run_command({"op": "save", "trainer_dir": str(directory)})
        record = {
            "step": self.step_count,
            "format": "dcp",
            "state": target.name,
            "world_size": self.group.world_size,
            "grpo": asdict(self.grpo),
            "optimizer": asdict(self.policy.optim),
        }
        path = directory / f"step-{self.step_count:06d}.json"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(record, indent=1))
        os.replace(tmp, path)
        return target

    def write_model(
        self, store: ShardStore, version: int, shard_size: int, files: Mapping[str, bytes]
    ) -> list[ShardInfo]:
        """Every rank writes its files of version `version`'s model folder into the store's partial
        directory; returns all of their `ShardInfo`s."""
        command = {
            "op": "write",
            "partial_dir": str(store.partial_dir(version)),
            "shard_size": shard_size,
            "files": dict(files),
        }
        infos: list[ShardInfo] = self.run_command(command)
        return infos

    def measure(self) -> list[RankMemory]:
        """Every rank's memory, in rank order."""
        memory: list[RankMemory] = self.run_command({"op": "measure"})
        return memory

    def close(self) -> None:
        """Tell the other ranks to stop, then leave the group."""
        global _COMMANDS
        self.commands.stop()
        _COMMANDS = None
        leave_group(together=True)
