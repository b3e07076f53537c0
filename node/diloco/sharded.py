"""DiLoCo between trainer groups: a group of FSDP2 ranks is one DiLoCo participant, shard-wise.

The algorithm is node/diloco/algorithm.py's, run by every rank on the tensors it owns, so neither the
outer copy of θ, nor a pseudo-gradient, nor an averaged one, ever exists whole on one rank. This module
holds the collectives (`RankOuter`, every rank's part; `execute_diloco`, its commands; `ShardedDiloco`,
rank 0's handle); the pure rules and the file reading they run on are `rank_files`.

- Ownership: the trainable tensors are dealt to ranks by their fp32 size, one tensor per unit
  (`deal_tensors`, the same greedy rule as `assign_files`), from global shapes: every rank computes the
  same dealing without a collective. A rank keeps θ (fp32, CPU), the outer momentum and the int8 residual
  of its own tensors only; it runs `OuterOptimizer` and `Compressor` over that subset, which is exact:
  SGD, compression and averaging are per tensor.
- Contributing: each tensor is all-gathered once (`full_tensor`, as `ShardedPolicy.write_model` does) and
  kept only by its owner, which computes Δ = θ − θ_inner for it, compresses and writes its payload files
  into the origin's partial directory as `rank-RRRRR-shard-…` (the pieces layout of `plan_shards` over
  its own tensors). Names are fixed by (rank, world, tensors), so no rank plans another's files. Loaded
  with `load_checkpoint`, a group's payload is the tensors one process would have written; only its
  split into files differs (and so the Merkle root: each contribution is its own).
- Applying a round: each rank reads its tensors from every decided contribution (`PayloadFiles`: any
  pieces-layout directory, one file's sha256 checked before its tensors are read), decompresses them,
  averages in the spec's order and steps. The order is that of each contribution's content digest over
  the whole decompressed payload; contribution k's digest is streamed by rank k mod N through
  `content_digest_items`, one tensor at a time. With two contributions or fewer the order is moot (float
  addition is commutative) and no digest is computed.
- New weights go back into the FSDP2 shards tensor by tensor: the owner broadcasts the full tensor and
  every rank copies its own slice (`distribute_tensor` without communication) into its local shard.
- The outer state (θ, momentum, step) is written the same way, each rank its tensors'
  (`write_outer`), and read back by each rank for its tensors (`load_outer`: resume, resync); its θ
  digest is streamed from those files (`stream_theta_digest`).
- A refused payload must not split the group: every rank checks its part first, the ranks exchange their
  verdicts (`_agree`), and then all raise `PayloadRefused` or none does; nothing has changed by then.
- The commands are a family the trainer's ranks run without knowing DiLoCo (`RANK_COMMANDS`, by op
  prefix): rank 0 adds it as the group becomes a participant (`ShardedDiloco.start`), the other ranks get
  it from whoever starts them (`node.assemble.trainer_rank_families`), and `RankOuter` lives in the
  policy's `family_state`. So the trainer never imports the DiLoCo built on it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgpack
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, distribute_tensor

from swarmnode.node.dataplane.checkpoint import plan_shards
from swarmnode.node.dataplane.errors import CheckpointInvalid
from swarmnode.node.diloco.algorithm import (
    STEP_KEY,
    THETA_PREFIX,
    DilocoParams,
    OuterOptimizer,
    average,
    pseudo_gradient,
)
from swarmnode.node.diloco.compression import Compressor, decompress
from swarmnode.node.diloco.rank_files import (
    PayloadFiles,
    check_payload_names,
    deal_tensors,
    outer_keys,
    payload_keys,
    rank_file_name,
    stream_digest,
)
from swarmnode.node.trainer.commands import RankCommand
from swarmnode.node.trainer.group import GroupInfo, all_gather_bytes
from swarmnode.node.trainer.rank import write_file
from swarmnode.protocol.diloco import max_delta_element
from swarmnode.protocol.messages import ShardInfo

if TYPE_CHECKING:
    from swarmnode.node.trainer.rank import ShardedPolicy
    from swarmnode.node.trainer.sharded import ShardedGrpoTrainer

OP_PREFIX = "diloco_"
ORDER_FREE = 2  # up to this many contributions, summation order cannot change the float result


class PayloadRefused(ValueError):
    """A contribution or outer state some rank of the group found malformed; the group is unchanged."""


# --- one rank's part -------------------------------------------------------------------------------


def _trainable(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    return [(name, p) for name, p in model.named_parameters() if p.requires_grad]


def _nbytes(tensors: Mapping[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


class RankOuter:
    """One rank's share of the DiLoCo participant: θ, outer momentum and int8 residual of its tensors."""

    def __init__(self, policy: ShardedPolicy, params: DilocoParams) -> None:
        self.policy = policy
        self.group = policy.group
        self.params = params
        self.kind = params.compression
        self.max_abs = max_delta_element(params.inner_steps, params.inner_lr)  # a peer's bound, per element
        self.shapes = {name: tuple(p.shape) for name, p in _trainable(policy.model)}
        names = list(self.shapes)
        sizes = [(name, math.prod(shape) * 4) for name, shape in self.shapes.items()]
        self.owners = deal_tensors(sizes, self.group.world_size)
        self.mine = [n for n in names if self.owners[n] == self.group.rank]
        theta = self._gather_mine()
        self.outer = OuterOptimizer(theta, params) if theta else None
        self.compressor = Compressor(self.kind)
        self.peak_bytes = self.held_bytes()

    # --- what this rank holds ----------------------------------------------------------------------

    def theta(self) -> dict[str, torch.Tensor]:
        return self.outer.theta() if self.outer is not None else {}

    def held_bytes(self) -> int:
        """θ, momentum and residual of this rank's tensors: its share of the participant's outer copy."""
        state = self.outer.state_dict() if self.outer is not None else {}
        return _nbytes({k: v for k, v in state.items() if k != STEP_KEY}) + _nbytes(self.compressor.residual)

    def _note_peak(self, *extra: Mapping[str, torch.Tensor]) -> None:
        self.peak_bytes = max(self.peak_bytes, self.held_bytes() + sum(_nbytes(e) for e in extra))

    # --- collectives -------------------------------------------------------------------------------

    def _gather_mine(self) -> dict[str, torch.Tensor]:
        """fp32 CPU copies of this rank's tensors from the model; collective (one tensor at a time)."""
        out = {}
        for name, p in _trainable(self.policy.model):
            full = p.full_tensor() if isinstance(p, DTensor) else p
            if self.owners[name] == self.group.rank:
                out[name] = full.detach().to("cpu", torch.float32).contiguous().clone()
            del full
        return out

    def _put_weights(self, theta: Mapping[str, torch.Tensor]) -> None:
        """Each owner's new θ into every rank's FSDP2 shards; collective, in parameter order."""
        device = self.group.device
        with torch.no_grad():
            for name, p in _trainable(self.policy.model):
                owner = self.owners[name]
                if owner == self.group.rank:
                    full = theta[name].to(device, torch.float32).contiguous()
                else:
                    full = torch.empty(self.shapes[name], dtype=torch.float32, device=device)
                dist.broadcast(full, owner)
                if isinstance(p, DTensor):
                    mine = distribute_tensor(
                        full.to(p.dtype), p.device_mesh, p.placements, src_data_rank=None
                    )
                    p.to_local().copy_(mine.to_local())
                else:
                    p.copy_(full)
                del full

    def put_theta(self) -> None:
        """θ back into the model, where inner steps of a round that was then left changed it; collective."""
        self._put_weights(self.theta())

    def _agree(self, error: str | None) -> None:
        """Raise `PayloadRefused` on every rank when any rank has an error, else on none."""
        errors = [b.decode() for b in all_gather_bytes((error or "").encode(), self.group.device)]
        found = [f"rank {r}: {e}" for r, e in enumerate(errors) if e]
        if found:
            raise PayloadRefused("; ".join(found))

    # --- a round -----------------------------------------------------------------------------------

    def contribute(self, partial_dir: Path, shard_size: int) -> list[ShardInfo]:
        """Write this rank's compressed pseudo-gradient files; collective. Returns the files it wrote."""
        inner = self._gather_mine()
        error, written = None, []
        residual = dict(self.compressor.residual)
        try:
            if self.outer is not None:
                payload = self.compressor.compress(pseudo_gradient(self.outer.theta(), inner))
                self._note_peak(inner, payload)
                del inner
                written = _write_rank_files(partial_dir, self.group.rank, payload, shard_size)
        except ValueError as exc:
            error = str(exc)
        try:
            self._agree(error)
        except PayloadRefused:
            self.compressor.residual = residual  # another rank's tensors failed: this round never was
            raise
        return written

    def check(self, directory: Path, shards: Sequence[ShardInfo]) -> None:
        """`PayloadRefused` on every rank unless a fetched contribution is a valid payload for the model
        (what `load_delta` checks for one process), each rank reading its tensors only; collective."""
        error = None
        try:
            files = PayloadFiles(directory, shards)
            files.check_names(payload_keys(list(self.shapes), self.kind), "payload")
            decompress(files.tensors(payload_keys(self.mine, self.kind)), self.kind, like=self.theta(),
                       max_abs=self.max_abs)
        except (ValueError, CheckpointInvalid) as exc:
            error = str(exc)
        self._agree(error)

    def apply(self, contributions: Sequence[tuple[Path, Sequence[ShardInfo]]]) -> None:
        """Average the decided contributions' pseudo-gradients, take the outer step and load the new θ
        into the model; collective. `PayloadRefused`, with nothing changed, when any part is malformed."""
        error, digests, deltas = None, [b""] * len(contributions), []
        theta = self.theta()
        try:
            if not contributions:
                raise ValueError("nothing to average")
            files = [PayloadFiles(d, infos) for d, infos in contributions]
            for k, f in enumerate(files):
                f.check_names(payload_keys(list(self.shapes), self.kind), f"contribution {k}")
            for f in files:
                payload = f.tensors(payload_keys(self.mine, self.kind))
                deltas.append(decompress(payload, self.kind, like=theta, max_abs=self.max_abs))
                self._note_peak(*deltas)
            if len(files) > ORDER_FREE:
                for k in range(self.group.rank, len(files), self.group.world_size):
                    digests[k] = stream_digest(files[k], list(self.shapes), self.kind)
        except (ValueError, CheckpointInvalid) as exc:
            error = str(exc)
        self._agree(error)
        order = list(range(len(contributions)))
        if len(contributions) > ORDER_FREE:
            order = self._digest_order(digests)
        if self.outer is not None:
            ranked = [k.to_bytes(4, "big") for k in range(len(order))]
            new = self.outer.step(average([deltas[k] for k in order], keys=ranked))
        else:
            new = {}
        del deltas
        self._put_weights(new)

    def _digest_order(self, digests: list[bytes]) -> list[int]:
        """Contributions in ascending content digest, from the ranks that computed each."""
        gathered = all_gather_bytes(msgpack.packb(digests), self.group.device)
        every = [msgpack.unpackb(part) for part in gathered]
        final = [every[k % self.group.world_size][k] for k in range(len(digests))]
        return sorted(range(len(final)), key=lambda k: final[k])

    # --- outer state (resume, resync) --------------------------------------------------------------

    def write_outer(self, partial_dir: Path, shard_size: int) -> list[ShardInfo]:
        """Write this rank's θ and momentum (rank 0 also the step count) as outer-state files; collective."""
        state = self.outer.state_dict() if self.outer is not None else {}
        if self.group.is_lead and STEP_KEY not in state:
            state[STEP_KEY] = torch.tensor(0, dtype=torch.int64)
        if not self.group.is_lead:
            state.pop(STEP_KEY, None)
        written = _write_rank_files(partial_dir, self.group.rank, state, shard_size) if state else []
        self._agree(None)
        return written

    def load_outer(self, directory: Path, shards: Sequence[ShardInfo]) -> None:
        """Continue from an outer state (ours on resume, a peer's on resync): θ and momentum of this
        rank's tensors, the int8 residual dropped, θ into the model; collective."""
        error, outer = None, None
        try:
            files = PayloadFiles(directory, shards)
            files.check_names(outer_keys(list(self.shapes)), "outer state")
            wanted = outer_keys(self.mine)
            state = files.tensors(wanted)
            if self.mine:
                outer = OuterOptimizer.from_state_dict(state, self.params)
                check = {n: t for n, t in state.items() if n.startswith(THETA_PREFIX)}
                for name, t in check.items():
                    if tuple(t.shape) != self.shapes[name[len(THETA_PREFIX) :]]:
                        raise ValueError(f"outer state: {name} has shape {list(t.shape)}")
        except (ValueError, CheckpointInvalid) as exc:
            error = str(exc)
        self._agree(error)
        self.outer = outer
        self.compressor.reset()
        self._put_weights(self.theta())


def _write_rank_files(
    partial_dir: Path, rank: int, tensors: Mapping[str, torch.Tensor], shard_size: int
) -> list[ShardInfo]:
    partial_dir.mkdir(parents=True, exist_ok=True)
    infos = []
    for plan in plan_shards(tensors, shard_size):
        infos.append(write_file(partial_dir, rank_file_name(rank, plan.name), plan.serialize()))
    return infos


# --- commands ---------------------------------------------------------------------------------------


def _params_from(fields: Mapping[str, Any]) -> DilocoParams:
    betas = fields["inner_betas"]
    return DilocoParams(**{**fields, "inner_betas": (float(betas[0]), float(betas[1]))})


def _infos_from(rows: Sequence[Sequence[Any]]) -> list[ShardInfo]:
    return [ShardInfo(str(n), int(s), bytes(h)) for n, s, h in rows]


def _infos_rows(infos: Sequence[ShardInfo]) -> list[list[Any]]:
    return [[i.name, i.size, i.sha256] for i in infos]


def _gathered_infos(infos: Sequence[ShardInfo], group: GroupInfo) -> list[ShardInfo]:
    parts = all_gather_bytes(msgpack.packb(_infos_rows(infos)), group.device)
    return [info for part in parts for info in _infos_from(msgpack.unpackb(part))]


def execute_diloco(policy: ShardedPolicy, group: GroupInfo, command: Mapping[str, Any]) -> Any:
    """Run one DiLoCo command on this rank; a `PayloadRefused` is returned (every rank alike), not raised,
    so that the serving ranks keep serving."""
    op = command["op"]
    if op == "diloco_init":
        policy.family_state[OP_PREFIX] = RankOuter(policy, _params_from(command["params"]))
        return None
    outer: RankOuter | None = policy.family_state.get(OP_PREFIX)
    if outer is None:
        raise RuntimeError(f"command {op!r} before diloco_init")
    try:
        if op == "diloco_contribute":
            mine = outer.contribute(Path(command["partial_dir"]), int(command["shard_size"]))
            return _gathered_infos(mine, group)
        if op == "diloco_check":
            outer.check(Path(command["directory"]), _infos_from(command["shards"]))
            return None
        if op == "diloco_apply":
            outer.apply([(Path(d), _infos_from(rows)) for d, rows in command["contributions"]])
            return None
        if op == "diloco_write_outer":
            mine = outer.write_outer(Path(command["partial_dir"]), int(command["shard_size"]))
            return _gathered_infos(mine, group)
        if op == "diloco_load_outer":
            outer.load_outer(Path(command["directory"]), _infos_from(command["shards"]))
            return None
    except PayloadRefused as refused:
        return refused
    if op == "diloco_put_theta":
        outer.put_theta()
        return None
    if op == "diloco_measure":
        mine = msgpack.packb([outer.held_bytes(), outer.peak_bytes, _nbytes(outer.theta())])
        return [RankOuterBytes(*msgpack.unpackb(b)) for b in all_gather_bytes(mine, group.device)]
    raise RuntimeError(f"unknown command {op!r}")


RANK_COMMANDS: Mapping[str, RankCommand] = {OP_PREFIX: execute_diloco}  # what a trainer rank adds for DiLoCo


@dataclass(frozen=True)
class RankOuterBytes:
    """What one rank holds of the participant's outer copy, now and at its peak."""

    held: int  # θ + momentum + int8 residual of its tensors
    peak: int  # the most it held during a round, payloads included
    theta: int  # θ alone


class ShardedDiloco:
    """Rank 0's handle on the group's DiLoCo part: every method is a command all ranks run together."""

    def __init__(self, trainer: ShardedGrpoTrainer) -> None:
        self.trainer = trainer

    @classmethod
    def start(cls, trainer: ShardedGrpoTrainer, params: DilocoParams) -> ShardedDiloco:
        """Take the model's current weights as θ, dealt to the ranks."""
        names = [n for n, p in trainer.policy.model.named_parameters() if p.requires_grad]
        check_payload_names(names, params.compression)
        for prefix, run in RANK_COMMANDS.items():
            trainer.commands.add_family(prefix, run)
        trainer.run_command({"op": "diloco_init", "params": asdict(params)})
        return cls(trainer)

    def _run(self, command: dict[str, Any]) -> Any:
        result = self.trainer.run_command(command)
        if isinstance(result, PayloadRefused):
            raise result
        return result

    def contribute(self, partial_dir: Path, shard_size: int) -> list[ShardInfo]:
        """This round's payload files, written by their owners into `partial_dir`; all their infos."""
        infos: list[ShardInfo] = self._run(
            {"op": "diloco_contribute", "partial_dir": str(partial_dir), "shard_size": shard_size}
        )
        return infos

    def check(self, directory: Path, shards: Sequence[ShardInfo]) -> None:
        """Refuse (`PayloadRefused`) a fetched contribution that is not a valid payload for the model."""
        self._run({"op": "diloco_check", "directory": str(directory), "shards": _infos_rows(shards)})

    def apply(self, contributions: Sequence[tuple[Path, Sequence[ShardInfo]]]) -> None:
        """The round's outer step from the decided contributions' verified directories (shared
        filesystem), in any order; `PayloadRefused` with nothing changed when one is malformed."""
        rows = [[str(d), _infos_rows(infos)] for d, infos in contributions]
        self._run({"op": "diloco_apply", "contributions": rows})

    def write_outer(self, partial_dir: Path, shard_size: int) -> list[ShardInfo]:
        infos: list[ShardInfo] = self._run(
            {"op": "diloco_write_outer", "partial_dir": str(partial_dir), "shard_size": shard_size}
        )
        return infos

    def load_outer(self, directory: Path, shards: Sequence[ShardInfo]) -> None:
        self._run({"op": "diloco_load_outer", "directory": str(directory), "shards": _infos_rows(shards)})

    def put_theta(self) -> None:
        """Reset the model to θ (after inner steps of a round the participant left)."""
        self._run({"op": "diloco_put_theta"})

    def measure(self) -> list[RankOuterBytes]:
        memory: list[RankOuterBytes] = self._run({"op": "diloco_measure"})
        return memory
