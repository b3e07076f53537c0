"""The worker's counts for its status display: what it built, delivered, and how it was judged.

Verdicts naming this worker are counted once per submission digest, whoever gossips them; they never make
a verdict of this node's own.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from swarmnode.ledger.evidence import SLASHABLE_REASONS
from swarmnode.node.worker.build import Built
from swarmnode.protocol.errors import Reason
from swarmnode.protocol.messages import Verdict


@dataclass
class WorkerStats:
    submitted: int = 0  # built and handed to delivery
    delivered: int = 0  # queued by a validator (ack 100)
    undelivered: int = 0  # no validator took it before it went stale or the rounds ran out
    acks: Counter[int] = field(default_factory=Counter)
    submit_failures: int = 0  # requests that got no valid answer
    accepted: int = 0
    rejected: int = 0
    slashable: int = 0
    by_reason: Counter[str] = field(default_factory=Counter)
    generate_s: float = 0.0
    cpu_s: float = 0.0
    tokens: int = 0
    grader_faults: int = 0  # counters skipped: the grader hit a safety net, so no reward could be claimed
    swap_failures: int = 0  # checkpoints the engine failed to load (nothing generated until the next one)
    _judged: set[bytes] = field(default_factory=set, repr=False)

    def record_build(self, built: Built) -> None:
        self.submitted += 1
        self.generate_s += built.wall_s
        self.cpu_s += built.cpu_s
        self.tokens += built.tokens

    def observe_verdict(self, verdict: Verdict, worker: bytes, run: str) -> bool:
        """Count a verdict on one of this worker's submissions, once per submission; False if not ours."""
        if verdict.worker != worker or verdict.run != run or verdict.submission_digest in self._judged:
            return False
        self._judged.add(verdict.submission_digest)
        if verdict.accepted:
            self.accepted += 1
            return True
        self.rejected += 1
        try:
            reason = Reason(verdict.reason_code)
        except ValueError:
            self.by_reason[str(verdict.reason_code)] += 1
            return True
        self.by_reason[reason.name] += 1
        self.slashable += reason in SLASHABLE_REASONS
        return True

    def as_dict(self) -> dict[str, Any]:
        return {
            "submitted": self.submitted,
            "delivered": self.delivered,
            "undelivered": self.undelivered,
            "acks": {str(status): n for status, n in sorted(self.acks.items())},
            "submit_failures": self.submit_failures,
            "accepted": self.accepted,
            "rejected": self.rejected,
            "slashable": self.slashable,
            "by_reason": dict(sorted(self.by_reason.items())),
            "generate_s": round(self.generate_s, 3),
            "cpu_s": round(self.cpu_s, 3),
            "tokens": self.tokens,
            "grader_faults": self.grader_faults,
            "swap_failures": self.swap_failures,
        }
