"""Starting a trainer group on this host: `nproc` ranks under torchrun's elastic agent.

The parent process only launches; each rank it starts runs `python -m swarmnode.node.cli.run` again and
finds itself a rank (`node.trainer.group.launched_rank`).
"""

from __future__ import annotations

from collections.abc import Sequence


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
