"""Which queued submission a validator judges next: round-robin across workers (spec/validation.md, Fair
judging).

First-in-first-out let a worker with many identities queue ahead of everyone: 4 identities x 10 submissions
put an honest submission 33rd in line. Among the items that can be judged now, the judge takes the oldest
item of the worker it served least recently (a worker never served first), so each worker with something
ready gets one judgement per round of the queue, however many it queued. Identities are free, so this
shares the judge per staked identity; the stake each identity needs and the per-worker queue bound
(MAX_PENDING_PER_WORKER) price the rest.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from swarmnode.node.validator.store_rows import PendingItem

MAX_SERVED_WORKERS = 4096  # workers whose last turn is remembered (oldest forgotten: they rank as new)


class RoundRobin:
    """The order in which workers were last served, bounded to MAX_SERVED_WORKERS entries."""

    def __init__(self, capacity: int = MAX_SERVED_WORKERS) -> None:
        self.capacity = capacity
        self._turn = 0
        self._last: OrderedDict[bytes, int] = OrderedDict()

    def pick(self, ready: Sequence[PendingItem]) -> PendingItem:
        """The oldest ready item of the least recently served worker (`ready` is in queue order)."""
        if not ready:
            raise ValueError("nothing ready to pick from")
        return min(ready, key=lambda item: (self._last.get(item.worker, -1), item.id))

    def served(self, worker: bytes) -> None:
        """Record that `worker` had its turn now."""
        self._turn += 1
        self._last[worker] = self._turn
        self._last.move_to_end(worker)
        while len(self._last) > self.capacity:
            self._last.popitem(last=False)
