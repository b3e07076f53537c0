"""What to generate next: the counter plan, the version's budget, and the pace that cuts it (`Pacer`).

A version more than `async_level` behind the newest known one is never generated on: a validator would
drop it as stale. The budget per version is `submissions_per_version` capped by the run's
`max_submissions_per_version`, then cut by the pace (`protocol.pacing`):
- the worker learns the trainer's step interval from the created_ms of the trainer-signed heads and
  manifests it sees, times its own builds, and times each hand-over until the verdict on it is gossiped. A
  version's budget ends when one more build would be handed over after the trainer's step
  v + async_level has taken its batch (it would only be dropped as stale); the worker then waits for the
  newest version.
- The budget is also cut to this worker's share of the version: the swarm aims at
  `SWARM_SUBMISSIONS_PER_VERSION` per version between its N workers (counted from accepted verdicts),
  a share below one drawn per (worker, version); the share grows while a version stands (the loop
  wakes when it next allows a counter), so a bad estimate of N or of the pace never stalls the run.
  Verdicts naming workers that do not exist only lower this worker's share for a while.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import trio

from swarmnode.protocol.messages import RunDescriptor
from swarmnode.protocol.pacing import (
    SAMPLE_HISTORY,
    SWARM_SUBMISSIONS_PER_VERSION,
    Stamps,
    active_workers,
    note_checkpoint,
    note_sample,
    note_worker,
    overdue_after_ms,
    plan_budget,
    share_budget,
    share_draw,
    share_wait_ms,
    stalled_cap,
    stalled_cap_grows_in_ms,
    step_interval_ms,
    typical_ms,
)


def within_async_level(version: int, newest: int, async_level: int) -> bool:
    """Whether a submission on `version` is still fresh when the newest known checkpoint is `newest`."""
    return newest - version <= async_level


def plan_counter(
    loaded: int | None, newest: int | None, async_level: int, used: int, budget: int
) -> int | None:
    """The counter to generate next on the loaded version, or None: nothing loaded, stale, or budget spent."""
    if loaded is None:
        return None
    if newest is not None and not within_async_level(loaded, newest, async_level):
        return None
    return used if used < budget else None


def submission_budget(configured: int, descriptor: RunDescriptor) -> int:
    """Counters to use per version: the configured number, never more than the run allows (a counter
    at or past `max_submissions_per_version` is rejected 602 and slashed)."""
    return min(configured, descriptor.max_submissions_per_version)


def now_ms() -> int:
    """This worker's clock in milliseconds (trio's: monotonic, and a MockClock in tests)."""
    return int(trio.current_time() * 1000)


@dataclass
class Pacer:
    """What the worker has measured of the trainer's pace and of its own, in milliseconds of its clock.

    `stamps` are the trainer's created_ms per version (only their differences are used); `newest_heard_ms`
    is when this worker first heard of the newest version; `generate` and `latency` are the last build
    times and hand-over-to-verdict times; `seen` the newest version each worker was accepted on, whose
    count sets this worker's (`me`) share of each version's `wanted` submissions. All bounded
    (`protocol.pacing`).
    """

    me: bytes = b""
    wanted: int = SWARM_SUBMISSIONS_PER_VERSION
    seen: dict[bytes, int] = field(default_factory=dict)
    stamps: Stamps = ()
    newest: int | None = None
    newest_heard_ms: int = 0
    generate: tuple[int, ...] = ()
    latency: tuple[int, ...] = ()
    cut: int = 0  # versions whose budget time cut below the configured cap
    _handed: dict[int, int] = field(default_factory=dict, repr=False)  # step -> when handed over
    _last_cut: int | None = field(default=None, repr=False)

    def heard(self, version: int, created_ms: int, at_ms: int) -> None:
        """A trainer-signed head or manifest of `version`, stamped `created_ms` by the trainer."""
        self.stamps = note_checkpoint(self.stamps, version, created_ms)
        if self.newest is None or version > self.newest:
            self.newest, self.newest_heard_ms = version, at_ms

    def built(self, wall_s: float) -> None:
        self.generate = note_sample(self.generate, round(wall_s * 1000))

    def handed(self, step: int, at_ms: int) -> None:
        """A submission of assignment `step` goes to the validators now."""
        self._handed[step] = at_ms
        while len(self._handed) > 4 * SAMPLE_HISTORY:  # verdicts that never came: forget the oldest
            del self._handed[next(iter(self._handed))]

    def judged(self, step: int, at_ms: int) -> None:
        """The verdict on our submission of `step` was gossiped: one latency sample."""
        handed = self._handed.pop(step, None)
        if handed is not None:
            self.latency = note_sample(self.latency, at_ms - handed)

    def accepted(self, worker: bytes, version: int) -> None:
        """A validator-signed verdict accepted `worker`'s submission on `version`: it supplies the run."""
        self.seen = note_worker(self.seen, worker, version)

    def _share(self, version: int, used: int, at_ms: int) -> tuple[int, int] | None:
        """(counters this worker's share of `version` allows now, ms until it allows one more), or None
        until the trainer's interval is measured. The version has stood since the newest was heard, plus
        an interval per version it is behind the newest."""
        interval = step_interval_ms(self.stamps)
        if interval is None or self.newest is None or version > self.newest:
            return None
        workers = active_workers(self.seen, self.me, self.newest)
        draw = share_draw(self.me, version)
        stood = at_ms - self.newest_heard_ms + (self.newest - version) * interval
        share = dict(wanted=self.wanted, workers=workers, draw=draw, interval_ms=interval)
        allowed = share_budget(waited_ms=stood, **share)
        return allowed, max(0, share_wait_ms(used=used, **share) - stood)

    def _overdue_ms(self, async_level: int) -> int:
        return overdue_after_ms(step_interval_ms(self.stamps), async_level)

    def _stood_ms(self, version: int, at_ms: int) -> int | None:
        """How long `version` has stood as the newest; None if it is not the newest."""
        return at_ms - self.newest_heard_ms if version == self.newest else None

    def cap(self, version: int, async_level: int, cap: int, run_max: int, at_ms: int) -> int:
        """The per-version cap now: `cap`, grown on a newest version whose trainer is overdue
        (`stalled_cap`)."""
        stood = self._stood_ms(version, at_ms)
        if stood is None:
            return cap
        return stalled_cap(cap=cap, run_max=run_max, stood_ms=stood, overdue_ms=self._overdue_ms(async_level))

    def recheck_in_ms(
        self, version: int, used: int, at_ms: int, *, async_level: int = 0, cap: int | None = None,
        run_max: int = 0,
    ) -> int | None:
        """When `version` next allows a counter, if what holds the worker back is its share or a cap that
        grows while the trainer is overdue (`cap` given); None if only a new version can (time past the
        deadline, or the run's bound reached)."""
        waits = []
        share = self._share(version, used, at_ms)
        if share is not None and share[0] <= used:
            waits.append(share[1])
        run_max = max(run_max, cap or 0)
        if cap is not None and used >= self.cap(version, async_level, cap, run_max, at_ms):
            stood = self._stood_ms(version, at_ms)
            grows = None if stood is None else stalled_cap_grows_in_ms(
                cap=cap, run_max=run_max, stood_ms=stood, overdue_ms=self._overdue_ms(async_level)
            )
            if grows is None:
                return None
            waits.append(grows)
        return max(waits) if waits else None

    def budget(
        self, version: int, async_level: int, used: int, cap: int, at_ms: int, run_max: int = 0
    ) -> int:
        """Counters to use on `version` now: `protocol.pacing.plan_budget` (time left, at most the cap,
        grown up to `run_max` while the trainer is overdue), cut to this worker's share of the version
        (`share_budget`, which may be none yet)."""
        if self.newest is None:
            return cap
        cap = self.cap(version, async_level, cap, max(run_max, cap), at_ms)
        budget = plan_budget(
            version=version,
            newest=self.newest,
            newest_heard_ms=self.newest_heard_ms,
            now_ms=at_ms,
            stamps=self.stamps,
            async_level=async_level,
            generate_ms=typical_ms(self.generate),
            latency_ms=typical_ms(self.latency),
            used=used,
            cap=cap,
        )
        share = self._share(version, used, at_ms)
        if share is not None:
            budget = min(budget, share[0])
        if budget <= used < cap and version != self._last_cut:
            self._last_cut = version
            self.cut += 1
        return budget

    def statistics(self) -> dict[str, Any]:
        return {
            "step_interval_ms": step_interval_ms(self.stamps),
            "generate_ms": typical_ms(self.generate),
            "latency_ms": typical_ms(self.latency),
            "versions_cut": self.cut,
            "workers": active_workers(self.seen, self.me, self.newest) if self.newest is not None else None,
        }
