"""Pacing a worker to the trainer's step rate: when a version's submissions stop being usable.

A submission on checkpoint version v is trainable until the trainer's step v + async_level takes its batch
(spec/rollouts.md, Accepted rollouts); that step begins about async_level step intervals after v was
published. A worker that keeps generating on v past that point only feeds the stale drops.

Decisions:
- The step interval comes from the trainer's own `created_ms` stamps (CheckpointHead, CheckpointManifest),
  used only as differences between versions: a trainer clock that is off from the worker's by any constant
  cancels out. Deadlines are then placed on the worker's own clock, from the moment it heard of the newest
  version, so no two clocks are ever compared.
- Robust to a hostile or broken clock: the median of the per-version intervals over the last
  `PACE_HISTORY` versions; a pair whose stamps do not increase (a clock that went back, equal stamps) is
  skipped; the result is clamped to [`MIN_STEP_INTERVAL_MS`, `MAX_STEP_INTERVAL_MS`].
- Never a stall: a worker always gets at least one submission on each version it holds (`version_budget`),
  and with nothing measured yet (fewer than two versions seen, no generation timed) time sets no limit.
- Supply, not only freshness: every worker keeping busy until the deadline gives the swarm N workers'
  output per version while a trainer step uses about one submission, and the rest aged out (41-48% of
  honest submissions stale in the 12-step devnet). So each worker takes a share of a version,
  `SWARM_SUBMISSIONS_PER_VERSION / N` submissions (`share_budget`), N being the workers it saw accepted on
  the last `WORKER_WINDOW_VERSIONS` versions (validator-signed verdicts, itself included). A share below
  one is a deterministic draw hashed from (worker, version), so that different workers take different
  versions and the expected total is the target whatever N is; the draw lets a worker with a large N go
  without a version, which replaces the floor of one.
- The share grows once the newest version has stood longer than a step interval, in proportion to the
  time, so that a swarm that over-counted N (or whose trainer lacks rows) supplies more the longer it
  waits: no input stalls the trainer. (Growing from the start doubled the supply at a typical
  interval: 18% of honest submissions stale in one devnet run.) A worker that lies to itself about N
  only changes its own output, and over-counting by fake verdicts slows supply by at most the growth's
  delay. Counting over a window errs towards a small N (a worker with a small share may not appear in
  it): towards oversupply, never a stall.
- A stalled trainer gets more, up to what the run allows. Past `overdue_after_ms` without a newer
  version (the trainer lacks rows, or every group it gets is without signal: spec/rollouts.md, Learning
  signal) the worker's own per-version cap grows by itself per further overdue period, up to the run's
  `max_submissions_per_version` (`stalled_cap`), so a swarm keeps producing for the current version
  instead of waiting forever at its configured supply. A healthy trainer is never overdue, so this costs
  a healthy run nothing.
- Pure: the clock, the measurements and the history arrive as arguments (milliseconds, integers).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence

PACE_HISTORY = 16  # versions whose created_ms are kept: enough for a median, short enough to follow drift
SAMPLE_HISTORY = 16  # durations kept per measure (generation, submit latency)
MIN_STEP_INTERVAL_MS = 10
OVERDUE_MIN_MS = 30_000  # a trainer is overdue after async_level + 1 intervals, and never sooner than this
MAX_STEP_INTERVAL_MS = 86_400_000  # one day: beyond it, time stops limiting anything a worker does
SWARM_SUBMISSIONS_PER_VERSION = 3  # the swarm's target per version: ~1 feeds a step, the trainer takes <= ~4
WORKER_WINDOW_VERSIONS = 32  # versions over which accepted workers are counted (a 3/N share shows in 32)
MAX_COUNTED_WORKERS = 4096  # workers remembered for the count; beyond it the least recent go
SHARE_DOMAIN = b"swarmnode/pacing/share/v1"
DRAW_SPACE = 1 << 32

Stamps = tuple[tuple[int, int], ...]  # (version, created_ms), versions ascending and distinct


def note_checkpoint(stamps: Stamps, version: int, created_ms: int, *, limit: int = PACE_HISTORY) -> Stamps:
    """`stamps` with (version, created_ms) added, the newest `limit` versions kept.

    The first stamp heard for a version stands: a second, different one for the same version changes
    nothing (only the trainer signs them, but a replayed or re-signed head must not move the estimate).
    """
    if limit < 2:
        raise ValueError(f"a pace history of {limit} versions has no interval")
    if any(v == version for v, _ in stamps):
        return stamps
    return tuple(sorted((*stamps, (version, created_ms))))[-limit:]


def step_interval_ms(stamps: Stamps) -> int | None:
    """The trainer's milliseconds per version: the median over consecutive known versions, clamped.

    None with no usable pair (fewer than two versions, or stamps that never increase).
    """
    per_version = [
        (c2 - c1) / (v2 - v1)
        for (v1, c1), (v2, c2) in zip(stamps, stamps[1:], strict=False)
        if v2 > v1 and c2 > c1
    ]
    median = median_of(per_version)
    if median is None:
        return None
    return min(max(round(median), MIN_STEP_INTERVAL_MS), MAX_STEP_INTERVAL_MS)


def median_of(values: Sequence[float]) -> float | None:
    """The median (the mean of the middle two for an even count); None when there are no values."""
    if not values:
        return None
    ordered = sorted(values)
    middle = len(ordered) // 2
    return float(ordered[middle]) if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def note_sample(samples: tuple[int, ...], value_ms: int, *, limit: int = SAMPLE_HISTORY) -> tuple[int, ...]:
    """`samples` with a measured duration appended (negative ones clamped to 0), the last `limit` kept."""
    return (*samples, max(value_ms, 0))[-limit:]


def typical_ms(samples: Iterable[int]) -> int | None:
    """A measured duration to plan with: the median of the samples, or None before the first one."""
    median = median_of(list(samples))
    return None if median is None else round(median)


def version_deadline_ms(
    version: int, newest: int, newest_heard_ms: int, interval_ms: int, async_level: int, latency_ms: int
) -> int:
    """The worker-clock time by which a submission on `version` must be handed to a validator.

    The trainer's step `version + async_level` takes the last batch `version` may feed; it begins
    `version + async_level - newest` intervals after the newest version was heard of, and the submission
    still needs `latency_ms` from hand-over to being trainable (validation, the trainer's pull).
    """
    if newest < version:
        raise ValueError(f"version {version} is newer than the newest known {newest}")
    return newest_heard_ms + (version + async_level - newest) * interval_ms - max(latency_ms, 0)


def useful_submissions(now_ms: int, deadline_ms: int, generate_ms: int) -> int:
    """How many more submissions, built one after another from `now_ms`, are ready by the deadline."""
    if now_ms >= deadline_ms:
        return 0
    return (deadline_ms - now_ms) // max(generate_ms, 1)


def version_budget(used: int, cap: int, useful: int | None) -> int:
    """Counters to use on a held version: those already used plus those still useful, at most `cap`
    (the configured per-version budget), at least one (a worker never stalls on a version it holds);
    `useful` None: nothing measured yet, so time sets no limit."""
    if cap < 1:
        raise ValueError(f"a per-version cap of {cap} allows nothing")
    if useful is None:
        return cap
    return max(1, min(cap, used + max(useful, 0)))


def plan_budget(
    *,
    version: int,
    newest: int,
    newest_heard_ms: int,
    now_ms: int,
    stamps: Stamps,
    async_level: int,
    generate_ms: int | None,
    latency_ms: int | None,
    used: int,
    cap: int,
) -> int:
    """The counter bound for `version` now: `version_budget` with the time still useful for it, or the
    cap alone until the step interval and the worker's generation time have been measured."""
    interval = step_interval_ms(stamps)
    if interval is None or generate_ms is None or newest < version:
        return version_budget(used, cap, None)
    if version == newest and now_ms - newest_heard_ms > overdue_after_ms(interval, async_level):
        # The trainer is overdue: no newer version for that long means it lacks rows (a DiLoCo trainer
        # whose co-trainer died gets half of each version's), so time limits nothing on the newest
        # version; the share still bounds it.
        return version_budget(used, cap, None)
    deadline = version_deadline_ms(version, newest, newest_heard_ms, interval, async_level, latency_ms or 0)
    return version_budget(used, cap, useful_submissions(now_ms, deadline, generate_ms))


def overdue_after_ms(interval_ms: int | None, async_level: int) -> int:
    """How long the newest version stands before its trainer is overdue: `async_level + 1` step intervals,
    never less than `OVERDUE_MIN_MS` (the only bound while no interval is measured)."""
    if interval_ms is None:
        return OVERDUE_MIN_MS
    return max((async_level + 1) * interval_ms, OVERDUE_MIN_MS)


def stalled_cap(*, cap: int, run_max: int, stood_ms: int, overdue_ms: int) -> int:
    """The per-version cap on a newest version that has stood `stood_ms`: `cap` until the trainer is
    overdue, then `cap` more per overdue period begun, never above the run's `run_max`."""
    if cap < 1 or run_max < 1 or overdue_ms < 1:
        raise ValueError(f"no stalled cap for cap {cap}, run max {run_max}, overdue after {overdue_ms} ms")
    return min(run_max, cap * (1 + max(stood_ms, 0) // overdue_ms))


def stalled_cap_grows_in_ms(*, cap: int, run_max: int, stood_ms: int, overdue_ms: int) -> int | None:
    """How long until `stalled_cap` next grows (None: it is at the run's bound)."""
    if stalled_cap(cap=cap, run_max=run_max, stood_ms=stood_ms, overdue_ms=overdue_ms) >= run_max:
        return None
    return overdue_ms - max(stood_ms, 0) % overdue_ms


# --- the worker's share of a version -------------------------------------------------------------------


def note_worker(
    seen: Mapping[bytes, int], worker: bytes, version: int, *, limit: int = MAX_COUNTED_WORKERS
) -> dict[bytes, int]:
    """`seen` (worker -> newest version it had a submission accepted on) with this acceptance noted; the
    `limit` workers of the newest versions kept."""
    if limit < 1:
        raise ValueError(f"a worker count limited to {limit} counts nobody")
    noted = dict(seen)
    noted[worker] = max(version, noted.get(worker, version))
    if len(noted) > limit:
        noted = dict(sorted(noted.items(), key=lambda item: item[1])[-limit:])
    return noted


def active_workers(
    seen: Mapping[bytes, int], me: bytes, newest: int, *, window: int = WORKER_WINDOW_VERSIONS
) -> int:
    """The workers supplying the run: those accepted on a version within `window` of `newest`, and `me`."""
    return len({w for w, v in seen.items() if v > newest - window} | {me})


def share_draw(worker: bytes, version: int) -> int:
    """The worker's fixed draw for a version, uniform in [0, 2^32): which fraction of a share it rounds up."""
    if not 0 <= version < 1 << 64:
        raise ValueError(f"version {version} is not a u64")
    message = SHARE_DOMAIN + len(worker).to_bytes(4, "big") + worker + version.to_bytes(8, "big")
    return int.from_bytes(hashlib.sha256(message).digest()[:4], "big")


def share_budget(*, wanted: int, workers: int, draw: int, waited_ms: int, interval_ms: int) -> int:
    """floor(wanted / workers * max(1, waited / interval) + draw / 2^32): the counters this worker's share
    of a version allows after the version has stood `waited_ms`. Its mean over draws is the share itself,
    so N workers give `wanted` per version between them; a version that stands longer than an interval
    (the trainer lacks rows, or N was over-counted) gets proportionally more."""
    if wanted < 1 or workers < 1 or interval_ms < 1 or not 0 <= draw < DRAW_SPACE:
        raise ValueError(f"no share of {wanted} over {workers} workers per {interval_ms} ms, draw {draw}")
    grown = wanted * max(interval_ms, waited_ms) * DRAW_SPACE + draw * workers * interval_ms
    return grown // (workers * interval_ms * DRAW_SPACE)


def share_wait_ms(*, used: int, wanted: int, workers: int, draw: int, interval_ms: int) -> int:
    """How long a version must stand before `share_budget` exceeds `used` (0: it does already)."""
    if wanted < 1 or workers < 1 or interval_ms < 1 or not 0 <= draw < DRAW_SPACE:
        raise ValueError(f"no share of {wanted} over {workers} workers per {interval_ms} ms, draw {draw}")
    # smallest w >= 0 with wanted * max(interval, w) * 2^32 >= ((used + 1) * 2^32 - draw) * workers * interval
    needed = ((max(used, 0) + 1) * DRAW_SPACE - draw) * workers * interval_ms
    if wanted * interval_ms * DRAW_SPACE >= needed:
        return 0
    return -(-needed // (wanted * DRAW_SPACE))


# --- the trainer's side: a step waits for the rows that are on their way ---------------------------------

HOLD_MARGIN = 1.5  # a step waits 1.5 typical first-arrival lags after its oldest usable version went out
MAX_HOLD_MS = 60_000  # whatever was measured, a ready step never waits longer than this
LAG_HISTORY = 8  # versions whose first-arrival lag is kept


def note_lag(lags: tuple[int, ...], lag_ms: int, *, limit: int = LAG_HISTORY) -> tuple[int, ...]:
    """`lags` with one version's first-arrival lag (ms from its publication to its first accepted row)."""
    return note_sample(lags, lag_ms, limit=limit)


def hold_until_ms(
    oldest_published_ms: int | None, lags: Sequence[int], *, margin: float = HOLD_MARGIN
) -> int:
    """When a ready step may take its batch: `margin` typical first-arrival lags after its oldest usable
    version (step - async_level) was published, at most `MAX_HOLD_MS` after it; 0 (at once) with no such
    version or no lag measured.

    A trainer that steps as soon as one submission is there outruns its workers: with N of them building
    in parallel, one step per submission leaves each build about N steps old when it arrives, and beyond
    async_level steps it is dropped. Holding the step lets the rows of its oldest version arrive; they
    join the batch (`plan_batch` takes what is there), so the wait buys a bigger step, not an idle one.
    """
    typical = typical_ms(lags)
    if oldest_published_ms is None or typical is None:
        return 0
    return oldest_published_ms + min(round(margin * typical), MAX_HOLD_MS)
