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
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import msgpack
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from swarmnode.node.dataplane.checkpoint import (
    ShardPlan,
    WeightsFile,
    model_extra_files,
    pack_weights,
)
from swarmnode.node.dataplane.store import ShardStore, write_hashed
from swarmnode.node.rl.model import ModelInfo, load_model
from swarmnode.node.rl.sampling import token_logprobs
from swarmnode.node.rl.tokenizer import load_tokenizer
from swarmnode.node.rl.trainer import (
    OptimizerParams,
    StepStats,
    TrainerStateMismatch,
    batch_loss,
    completion_batch,
    mean_reward,
    signal_groups,
)
from swarmnode.protocol.codec import decode, encode
from swarmnode.protocol.messages import GrpoParams, RolloutGroup, ShardInfo

if TYPE_CHECKING:
    from swarmnode.node.diloco.sharded import RankOuter

RANK_ENV = "RANK"
WORLD_ENV = "WORLD_SIZE"
LOCAL_RANK_ENV = "LOCAL_RANK"
RESTART_ENV = "TORCHELASTIC_RESTART_COUNT"
LEAVE_TIMEOUT_S = 30.0
DCP_SUFFIX = ".dcp"
GROUP_TIMEOUT_ENV = "SWARMNODE_GROUP_TIMEOUT_S"
GROUP_TIMEOUT_S = 600.0  # a collective that waits this long for a peer fails, and the group restarts
PINGS_PER_TIMEOUT = 10  # an idle rank 0 pings this often per timeout, so waiting for work never times out

log = logging.getLogger(__name__)


# --- the group -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupInfo:
    rank: int
    world_size: int
    device: torch.device

    @property
    def is_lead(self) -> bool:
        return self.rank == 0


def launched_rank() -> int | None:
    """This process's rank when a launcher started it as one of several, else None."""
    if int(os.environ.get(WORLD_ENV, "1")) <= 1:
        return None
    return int(os.environ.get(RANK_ENV, "0"))


def launch_group(argv: Sequence[str], nproc: int, max_restarts: int) -> None:
    """Run `python -m swarmnode.node.cli.run <argv>` as `nproc` ranks under torchrun's elastic agent here.

    The agent ends every rank when one dies and starts the group again, up to `max_restarts` times;
    raises `ChildFailedError` (naming the rank and its exit) once they are spent.
    """
    from torch.distributed.run import get_args_parser, run

    args = get_args_parser().parse_args(
        [
            "--standalone",
            f"--nproc-per-node={nproc}",
            f"--max-restarts={max_restarts}",
            "--monitor-interval=1",
            "-m",
            "swarmnode.node.cli.run",
            *argv,
        ]
    )
    run(args)


def group_timeout_s() -> float:
    """How long one collective may wait for a peer: GROUP_TIMEOUT_S, or $SWARMNODE_GROUP_TIMEOUT_S."""
    return float(os.environ.get(GROUP_TIMEOUT_ENV, GROUP_TIMEOUT_S))


def join_group() -> GroupInfo:
    """Join the process group the launcher described in the environment; NCCL on GPUs, gloo on CPUs.

    A collective that waits longer than `group_timeout_s()` raises, so a group with a dead or hung rank
    fails and the launcher restarts it rather than waiting forever.

    Each attempt meets under its own key prefix in the launcher's store. torchrun's agent keeps one store
    for all of its restarts, so without the prefix a restarted rank can read the address its dead
    predecessor published and connect to it: refused (the group fails again) or, once the port is
    reused, a connection to the wrong process that hangs.
    """
    if not dist.is_initialized():
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(int(os.environ.get(LOCAL_RANK_ENV, "0")))
        attempt = os.environ.get(RESTART_ENV, "0")
        rank, world = int(os.environ.get(RANK_ENV, "0")), int(os.environ.get(WORLD_ENV, "1"))
        timeout = timedelta(seconds=group_timeout_s())
        log.info("joining the trainer group", extra={"rank": rank, "attempt": attempt})
        store, _, _ = next(dist.rendezvous("env://", rank, world, timeout=timeout))
        dist.init_process_group(
            "nccl" if cuda else "gloo",
            store=dist.PrefixStore(f"swarmnode/attempt-{attempt}/", store),
            rank=rank,
            world_size=world,
            timeout=timeout,
        )
        log.info("joined the trainer group", extra={"rank": rank, "attempt": attempt})
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    return GroupInfo(dist.get_rank(), dist.get_world_size(), device)


def exit_rank(code: int = 0) -> NoReturn:
    """End a rank's process once its work is done and the group left, skipping C++ static destructors.

    At interpreter exit torch's distributed runtime can still own a joinable thread, and its destructor
    then aborts the process ("terminate called without an active exception", SIGABRT) about one exit in
    eight on this machine, which the launcher reads as a failed rank and restarts the group for. Nothing
    is left to flush but output and logs, so the rank flushes them and exits at once.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def leave_group(*, together: bool = False) -> None:
    """Leave the process group; with `together`, no rank goes on to exit before every rank has left.

    On a clean stop every rank counts itself out in the launcher's store and waits (at most
    LEAVE_TIMEOUT_S) for the others, so none closes its sockets while a peer is still tearing down; the
    abort some exits still hit after that is `exit_rank`'s to avoid.
    """
    if not dist.is_initialized():
        return
    store = dist.distributed_c10d._get_default_store() if together else None
    world = dist.get_world_size()
    if together:
        dist.barrier()  # every rank has had the last command
    dist.destroy_process_group()
    if store is None:
        return
    key = f"swarmnode/left/{os.environ.get(RESTART_ENV, '0')}"
    store.add(key, 1)
    deadline = time.monotonic() + LEAVE_TIMEOUT_S
    while store.add(key, 0) < world and time.monotonic() < deadline:
        time.sleep(0.01)


# --- bytes between ranks (no pickle) ---------------------------------------------------------------


def broadcast_bytes(data: bytes | None, device: torch.device, src: int = 0) -> bytes:
    """`data` from rank `src` on every rank (the others pass None)."""
    size = torch.tensor([len(data) if data is not None else 0], dtype=torch.int64, device=device)
    dist.broadcast(size, src)
    if dist.get_rank() == src:
        assert data is not None
        buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device) if data else None
    else:
        buffer = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    if buffer is None or buffer.numel() == 0:
        return data or b""
    dist.broadcast(buffer, src)
    return bytes(buffer.cpu().numpy()) if dist.get_rank() != src else data or b""


def all_gather_bytes(data: bytes, device: torch.device) -> list[bytes]:
    """Every rank's `data`, in rank order, on every rank."""
    world = dist.get_world_size()
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size)
    longest = max(int(s.item()) for s in sizes)
    if longest == 0:
        return [b""] * world
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    if data:
        padded[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    return [bytes(p[: int(s.item())].cpu().numpy()) for p, s in zip(parts, sizes, strict=True)]


# --- pure rules ------------------------------------------------------------------------------------


def rank_share(count: int, rank: int, world: int) -> list[int]:
    """The indices of a step's `count` completions that `rank` computes: dealt round-robin."""
    return list(range(rank, count, world))


def assign_files(files: Sequence[WeightsFile], world: int) -> list[int]:
    """The rank that writes each weights file: largest first to the least-loaded rank (ties: lower rank),
    so every rank writes about 1/N of the bytes and every rank computes the same assignment."""
    load = [0] * world
    owner = [0] * len(files)
    for index in sorted(range(len(files)), key=lambda i: (-files[i].nbytes, i)):
        rank = min(range(world), key=lambda r: (load[r], r))
        owner[index] = rank
        load[rank] += files[index].nbytes
    return owner


def dcp_dir(directory: Path, step: int) -> Path:
    return directory / f"step-{step:06d}{DCP_SUFFIX}"


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


# --- the model on one rank -------------------------------------------------------------------------


def shard_model(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """FSDP2 over `model` in place: each decoder layer its own unit, the rest (embeddings, norm, head)
    the root's. bf16 compute with fp32 reduction on GPUs; fp32 throughout on the CPU."""
    policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if device.type == "cuda"
        else MixedPrecisionPolicy()
    )
    model.to(device)
    for layer in model.model.layers:  # type: ignore[union-attr]  # every supported architecture has them
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


def completion_logprobs(
    model: torch.nn.Module,
    pad_id: int,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    temperature: float,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token logprobs (B, T) of `completions` with grad, and their mask.

    Through the model's own forward (so FSDP's hooks gather each unit), then the rows at the generated
    positions; `TransformersEngine.logprobs` computes the same numbers from the hidden rows.
    """
    seqs = [list(p) + list(c) for p, c in zip(prompts, completions, strict=True)]
    longest = max(len(s) for s in seqs)
    t_max = max(1, max(len(c) for c in completions))
    ids = torch.full((len(seqs), longest), pad_id, dtype=torch.int64)
    index = torch.zeros((len(seqs), t_max), dtype=torch.int64)
    targets = torch.full((len(seqs), t_max), pad_id, dtype=torch.int64)
    mask = torch.zeros((len(seqs), t_max), dtype=torch.bool)
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        ids[i, : len(seqs[i])] = torch.tensor(seqs[i])
        index[i, : len(c)] = torch.arange(len(p) - 1, len(p) - 1 + len(c))
        targets[i, : len(c)] = torch.tensor(list(c), dtype=torch.int64)
        mask[i, : len(c)] = True
    logits = model(input_ids=ids.to(device), use_cache=False).logits.float()
    index = index.to(device)
    rows = logits.gather(1, index[..., None].expand(-1, -1, logits.shape[-1]))
    mask = mask.to(device)
    values = token_logprobs(rows, targets.to(device), temperature)
    return values * mask, mask


class ShardedPolicy:
    """One rank's part of the trainer: its shard of the weights and of the AdamW state."""

    def __init__(
        self,
        group: GroupInfo,
        model: torch.nn.Module,
        info: ModelInfo,
        grpo: GrpoParams,
        optim: OptimizerParams,
        step: int = 0,
    ) -> None:
        self.group = group
        self.model = shard_model(model, group.device)
        self.info = info
        self.grpo = grpo
        self.optim = optim
        self.step_count = step
        self.diloco: RankOuter | None = None  # this rank's DiLoCo share, once the group is a participant
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=grpo.learning_rate,
            betas=optim.betas,
            eps=optim.eps,
            weight_decay=optim.weight_decay,
        )

    @classmethod
    def open(
        cls, group: GroupInfo, model_dir: Path, grpo: GrpoParams, optim: OptimizerParams
    ) -> ShardedPolicy:
        _, info = load_tokenizer(model_dir)
        return cls(group, load_model(model_dir), info, grpo, optim)

    def local_bytes(self) -> int:
        """Bytes of this rank's parameter and optimizer-state shards (what FSDP divides by N)."""
        total = 0
        for p in self.model.parameters():
            local = p.to_local() if isinstance(p, DTensor) else p
            total += local.numel() * local.element_size()
        for slots in self.optimizer.state.values():
            for value in slots.values():
                if isinstance(value, torch.Tensor):
                    local = value.to_local() if isinstance(value, DTensor) else value
                    total += local.numel() * local.element_size()
        return total

    # --- the step ----------------------------------------------------------------------------------

    def step(self, groups: Sequence[RolloutGroup]) -> StepStats:
        """The GRPO step on this rank's share of the batch; collective (every rank calls it together)."""
        used = signal_groups(groups)
        reward = mean_reward(groups)
        self.step_count += 1
        if not used:
            return StepStats(self.step_count, 0, len(groups), 0, 0.0, 0.0, 0.0, reward)
        batch = completion_batch(used)
        share = rank_share(len(batch), self.group.rank, self.group.world_size)
        # A rank without a completion still runs the forward and backward (FSDP's collectives need every
        # rank): on the first completion, weighted zero.
        mine = batch.select(share or [0])
        weight = float(self.group.world_size) if share else 0.0
        self.model.train()
        values, mask = completion_logprobs(
            self.model, self.info.pad_token_id, mine.prompts, mine.completions, self.grpo.temperature,
            self.group.device,
        )
        out = batch_loss(values, mask, mine, self.grpo)
        self.optimizer.zero_grad(set_to_none=True)
        (out.loss * weight).backward()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grpo.max_grad_norm)
        grad_norm = float(norm.full_tensor() if isinstance(norm, DTensor) else norm)
        for group in self.optimizer.param_groups:
            group["lr"] = self.optim.lr_at(self.grpo.learning_rate, self.step_count)
        self.optimizer.step()
        self.model.eval()
        return self._gathered_stats(out_stats(out, bool(share)), len(used), len(groups), grad_norm, reward)

    def _gathered_stats(
        self, local: list[float], used: int, groups: int, grad_norm: float, reward: float
    ) -> StepStats:
        """The whole step's loss, tokens and clipped fraction from every rank's share."""
        totals = torch.tensor(local, dtype=torch.float64, device=self.group.device)
        dist.all_reduce(totals)
        loss, tokens, clipped = (float(v) for v in totals.tolist())
        return StepStats(
            self.step_count, used, groups - used, int(tokens), loss, grad_norm, clipped / max(tokens, 1.0),
            reward,
        )

    # --- resume state (DCP) ------------------------------------------------------------------------

    def save_state(self, directory: Path) -> Path:
        """Write this step's sharded model and optimizer state; every rank calls it together."""
        target = dcp_dir(directory, self.step_count)
        staging = target.with_name(target.name + ".tmp")
        if self.group.is_lead:
            directory.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(staging, ignore_errors=True)
        dist.barrier()
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(staging))
        dist.barrier()
        if self.group.is_lead:
            shutil.rmtree(target, ignore_errors=True)
            os.replace(staging, target)
        dist.barrier()
        return target

    def load_state(self, directory: Path, step: int) -> None:
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        state = {"model": model_state, "optim": optim_state}
        dcp.load(state, checkpoint_id=str(dcp_dir(directory, step)))
        set_state_dict(
            self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
        self.step_count = step

    # --- a published checkpoint, written by every rank ---------------------------------------------

    def write_model(self, partial_dir: Path, shard_size: int, files: Mapping[str, bytes]) -> list[ShardInfo]:
        """Write this rank's weights files of a model folder into `partial_dir`; every rank calls it.

        Returns the `ShardInfo`s this rank wrote (rank 0 also writes `files` and the weights index).
        """
        state = self.model.state_dict()
        sizes = [(name, t.numel() * t.element_size()) for name, t in state.items()]
        layout = pack_weights(sizes, shard_size)
        owners = assign_files(layout, self.group.world_size)
        partial_dir.mkdir(parents=True, exist_ok=True)
        infos = []
        for weights, owner in zip(layout, owners, strict=True):
            tensors = {}
            for name in weights.tensors:
                tensor = state[name]
                full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
                if owner == self.group.rank:
                    tensors[name] = full.detach().to("cpu").contiguous().clone()
                del full
            if owner == self.group.rank:
                data = ShardPlan(weights.name, tensors, nbytes=weights.nbytes).serialize()
                infos.append(write_file(partial_dir, weights.name, data))
        if self.group.is_lead:
            for extra in model_extra_files(layout, files):
                infos.append(write_file(partial_dir, extra.name, extra.data))
        return infos


@dataclass(frozen=True)
class RankMemory:
    """What one rank holds: its parameter and optimizer shards, its peak RSS and peak device memory."""

    state_bytes: int
    peak_rss_bytes: int
    peak_device_bytes: int

    @classmethod
    def of(cls, policy: ShardedPolicy) -> RankMemory:
        import resource

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
        device = torch.cuda.max_memory_allocated() if policy.group.device.type == "cuda" else 0
        return cls(policy.local_bytes(), rss, device)


def out_stats(out: Any, counted: bool) -> list[float]:
    """(loss, tokens, clipped tokens) of a rank's share; zeros for a rank that had none."""
    if not counted:
        return [0.0, 0.0, 0.0]
    return [float(out.loss.item()), float(out.tokens), out.clipped_fraction * out.tokens]


def write_file(directory: Path, name: str, data: bytes) -> ShardInfo:
    return ShardInfo(name, len(data), write_hashed(directory, name, data))


# --- commands from rank 0 ---------------------------------------------------------------------------


def _grpo_from(fields: Mapping[str, Any]) -> GrpoParams:
    return GrpoParams(**fields)


def _optim_from(fields: Mapping[str, Any]) -> OptimizerParams:
    return OptimizerParams(
        betas=(float(fields["betas"][0]), float(fields["betas"][1])),
        eps=float(fields["eps"]),
        weight_decay=float(fields["weight_decay"]),
        warmup_steps=int(fields["warmup_steps"]),
    )


def execute(policy: ShardedPolicy | None, group: GroupInfo, command: Mapping[str, Any]) -> tuple[
    ShardedPolicy | None, Any
]:
    """Run one command on this rank (rank 0 and the others alike); returns the policy and a result."""
    op = command["op"]
    if op == "ping":  # rank 0 is idle; the wait for its next command starts again
        return policy, None
    if op == "init":
        grpo, optim = _grpo_from(command["grpo"]), _optim_from(command["optim"])
        policy = ShardedPolicy.open(group, Path(command["model_dir"]), grpo, optim)
        if command["resume_step"] is not None:
            policy.load_state(Path(command["trainer_dir"]), int(command["resume_step"]))
        return policy, None
    if policy is None:
        raise RuntimeError(f"command {op!r} before init")
    if op == "step":
        groups = [decode(RolloutGroup, g) for g in command["groups"]]
        return policy, policy.step(groups)
    if op == "save":
        return policy, policy.save_state(Path(command["trainer_dir"]))
    if op == "measure":
        mine = msgpack.packb(asdict(RankMemory.of(policy)))
        return policy, [RankMemory(**msgpack.unpackb(b)) for b in all_gather_bytes(mine, group.device)]
    if op.startswith("diloco_"):
        # imported here: node.diloco.sharded builds on this module
        from swarmnode.node.diloco.sharded import execute_diloco

        return policy, execute_diloco(policy, group, command)
    if op == "write":
        infos = policy.write_model(Path(command["partial_dir"]), int(command["shard_size"]), command["files"])
        packed = msgpack.packb([[i.name, i.size, i.sha256] for i in infos])
        gathered = all_gather_bytes(packed, group.device)
        every = [ShardInfo(n, s, h) for part in gathered for n, s, h in msgpack.unpackb(part)]
        return policy, every
    raise RuntimeError(f"unknown command {op!r}")


def serve_rank() -> NoReturn:
    """Ranks 1..N-1: join the group and run rank 0's commands until it says stop or the group breaks."""
    group = join_group()
    policy: ShardedPolicy | None = None
    try:
        while True:
            command = msgpack.unpackb(broadcast_bytes(None, group.device), raw=False)
            if command["op"] == "stop":
                leave_group(together=True)
                exit_rank(0)
            policy, _ = execute(policy, group, command)
    finally:
        leave_group()


class Commands:
    """Rank 0's line to the other ranks: one command at a time, and a ping whenever it has sent nothing
    for a while, so that a rank waiting for work (rank 0 waiting for rollouts, or a finished trainer
    still serving) never reaches the group's collective timeout."""

    def __init__(self, group: GroupInfo, idle_s: float) -> None:
        self.group = group
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._last = time.monotonic()
        self._stopping = threading.Event()
        self._pinger = threading.Thread(target=self._ping_while_idle, name="group-ping", daemon=True)
        self._pinger.start()

    def run(self, policy: ShardedPolicy | None, command: dict[str, Any]) -> tuple[ShardedPolicy | None, Any]:
        """Send `command` to the other ranks, then run it here."""
        with self._lock:
            try:
                self._send(command)
                return execute(policy, self.group, command)
            finally:
                self._last = time.monotonic()

    def stop(self) -> None:
        """No more pings; tell the other ranks to stop."""
        self._stopping.set()
        self._pinger.join()
        with self._lock:
            self._send({"op": "stop"})

    def _send(self, command: dict[str, Any]) -> None:
        broadcast_bytes(msgpack.packb(command, use_bin_type=True), self.group.device)

    def _ping_while_idle(self) -> None:
        while not self._stopping.wait(self.idle_s / 2):
            if time.monotonic() - self._last < self.idle_s or not self._lock.acquire(blocking=False):
                continue
            try:
                self._send({"op": "ping"})
                self._last = time.monotonic()
            except Exception:  # the group is broken: the next command fails and the launcher restarts us
                log.exception("cannot ping the trainer group")
                return
            finally:
                self._lock.release()


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
            optim = _optim_from(record["optimizer"])
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

