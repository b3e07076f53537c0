"""A group that loses a rank and is restarted by torchrun's agent: run with --max-restarts=1.

Attempt 0: both ranks join, rank 1 dies by SIGKILL. Attempt 1: rank `--late` joins `--delay` seconds
after the other, which then reads the store first; both must meet and finish an all-reduce. Each rank
writes `<out>/rank-N.done` when it has.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist

from swarmnode.node.trainer.group import RESTART_ENV, exit_rank, join_group, launched_rank, leave_group


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--late", type=int, required=True, help="the rank that joins late on the restart")
    parser.add_argument("--delay", type=float, default=3.0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rank, restarted = launched_rank(), os.environ.get(RESTART_ENV, "0") != "0"
    if restarted and rank == args.late:
        time.sleep(args.delay)
    join_group()
    total = torch.ones(1)
    dist.all_reduce(total)
    if not restarted:
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # rank 0 waits to be ended by the agent
    (args.out / f"rank-{rank}.done").write_text(str(int(total.item())))
    leave_group(together=True)
    exit_rank(0)


if __name__ == "__main__":
    main()
