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
- Pure: the clock, the measurements and the history arrive as arguments (milliseconds, integers).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

PACE_HISTORY = 16  # versions whose created_ms are kept: enough for a median, short enough to follow drift
SAMPLE_HISTORY = 16  # durations kept per measure (generation, submit latency)
MIN_STEP_INTERVAL_MS = 10
MAX_STEP_INTERVAL_MS = 86_400_000  # one day: beyond it, time stops limiting anything a worker does

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
    deadline = version_deadline_ms(version, newest, newest_heard_ms, interval, async_level, latency_ms or 0)
    return version_budget(used, cap, useful_submissions(now_ms, deadline, generate_ms))
