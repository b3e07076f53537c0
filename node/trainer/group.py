"""The trainer group's processes: joining, leaving and exiting, and bytes between ranks (no pickle).

A sharded trainer (`node.trainer.sharded`) is N processes a launcher started (`node.trainer.launch`, or
`torchrun` across hosts), described by the environment (RANK, WORLD_SIZE, ...). This module is only their
process group: how a rank joins it (a fresh rendezvous per restart attempt), how long a collective may wait
for a peer before the group fails and restarts, how the ranks leave together, and the two collectives
that move msgpack bytes between ranks. What the ranks compute is `node.trainer.rank`'s.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import NoReturn

import torch
import torch.distributed as dist

RANK_ENV = "RANK"
WORLD_ENV = "WORLD_SIZE"
LOCAL_RANK_ENV = "LOCAL_RANK"
RESTART_ENV = "TORCHELASTIC_RESTART_COUNT"
LEAVE_TIMEOUT_S = 30.0
GROUP_TIMEOUT_ENV = "SWARMNODE_GROUP_TIMEOUT_S"
GROUP_TIMEOUT_S = 600.0  # a collective that waits this long for a peer fails, and the group restarts

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
