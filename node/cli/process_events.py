"""What the test-and-demo process commands (`swarmnode dataplane`, `swarmnode diloco`) share: JSON-line
events on stdout that their harnesses (swarmnode.testing) read, a raw hex key argument, and a clean stop
on SIGTERM or SIGINT that prints the final statistics first."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from typing import Any

import trio

from swarmnode.crypto.identity import NodeIdentity


def emit(event: str, **fields: Any) -> None:
    """One JSON line on stdout, flushed: the harness reads it as it comes."""
    print(json.dumps({"event": event, "t": time.time(), **fields}, default=str), flush=True)


def hex_key(text: str) -> NodeIdentity:
    """A key given as hex on the command line (these processes are for tests and demos, not operators)."""
    return NodeIdentity(bytes.fromhex(text.removeprefix("0x")))


async def until_signalled(
    nursery: trio.Nursery,
    final: Callable[[], dict[str, Any]],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """On SIGTERM or SIGINT print the final statistics (`stats`) and stop the process's nursery."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()
        async for _ in signals:
            emit("stats", cpu_s=time.process_time(), **final())
            nursery.cancel_scope.cancel()
            return
