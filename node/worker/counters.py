"""The next submission counter of each checkpoint version, persisted in `data_dir/worker_state.json`.

The counter is persisted (atomic replace) *before* the submission is built: a crash then skips an
assignment rather than redoing it, and a redone assignment is exactly what validators treat as a duplicate.
The file belongs to one run and one worker; another's is ignored, an unreadable one stops the worker with
`WorkerStateError` naming it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from swarmnode.node.errors import OperatorError

STATE_FILE = "worker_state.json"


class WorkerStateError(OperatorError, RuntimeError):
    """The worker's state file cannot be read; the message names it."""


@dataclass
class Counters:
    """The next submission counter of each checkpoint version, persisted so a restart never redoes one."""

    path: Path
    run: str
    worker: bytes
    next_counter: dict[int, int] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path, run: str, worker: bytes) -> Counters:
        """The counters in `path` for this run and worker; empty when the file is absent or someone else's."""
        try:
            document = json.loads(path.read_text())
        except FileNotFoundError:
            return cls(path, run, worker)
        except (OSError, ValueError) as exc:
            raise WorkerStateError(
                f"cannot read worker state {path}: {exc}; remove it to start over"
            ) from None
        if not isinstance(document, dict):
            raise WorkerStateError(f"worker state {path} is not a JSON object; remove it to start over")
        if document.get("run") != run or document.get("worker") != "0x" + worker.hex():
            return cls(path, run, worker)
        try:
            counters = {int(v): int(n) for v, n in document["next_counter"].items()}
        except (KeyError, TypeError, ValueError, AttributeError):
            raise WorkerStateError(f"worker state {path} has no valid next_counter table") from None
        return cls(path, run, worker, counters)

    def used(self, version: int) -> int:
        return self.next_counter.get(version, 0)

    def reserve(self, version: int) -> int:
        """Take the next counter of `version` and persist the one after it before anything is generated."""
        counter = self.used(version)
        self.next_counter[version] = counter + 1
        self.save()
        return counter

    def forget_below(self, version: int) -> None:
        """Drop versions older than `version`: nobody generates on them again."""
        self.next_counter = {v: n for v, n in self.next_counter.items() if v >= version}

    def save(self) -> None:
        document = {
            "run": self.run,
            "worker": "0x" + self.worker.hex(),
            "next_counter": {str(v): n for v, n in sorted(self.next_counter.items())},
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(document))
        os.replace(tmp, self.path)
