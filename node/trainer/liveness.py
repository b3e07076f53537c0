"""Whether a waiting step can ever start: a run without learning signal says so instead of stalling.

A step waits for `need` groups with signal (a group whose completions did not all get the same reward;
online filtering drops the others). A swarm whose model always or never solves its tasks delivers groups
that all have zero advantage: the step waits forever while workers reach their per-version supply and stop.
The rule (spec/rollouts.md, Learning signal): a step is *starved* once it has waited `after_s` seconds and
the usable rows already hold at least `need` groups but fewer than `need` of them carry signal: the swarm
supplied a step's worth of work and it taught nothing. `after_s` is `[work] no_signal_after_s` (default
ten minutes: far above a healthy step's wait on a slow swarm, far below the hours a silent stall costs).
The trainer then logs why and what to do, puts the diagnosis in its status, and keeps waiting (signal may
still come); a devnet stops on it.

Pure: the rows, the times and the rewards are arguments; the step loop measures them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from swarmnode.node.trainer.inbox import InboxRow

REWARD_SAMPLE_ROWS = 16  # the diagnosis reads the rewards of at most this many rows (decoding costs)
NEVER_SOLVED = 1e-6  # a mean reward at most this: the model never solves the tasks it drew


@dataclass(frozen=True)
class SignalCheck:
    """What a waiting step has: its usable rows' groups, those with signal, and how long it waited."""

    step: int
    waited_s: float
    groups: int  # groups of the usable rows (versions in the step's window)
    signal_groups: int  # of those, groups with signal
    need: int  # signal groups the step waits for

    @property
    def starved_at(self) -> bool:
        """A step's worth of groups arrived and too few carry signal (the time is checked by `starved`)."""
        return self.groups >= self.need > self.signal_groups


def usable_counts(pending: Sequence[InboxRow], step: int, async_level: int) -> tuple[int, int]:
    """(groups, signal groups) of the rows step `step` could take (versions in [step - async_level, step])."""
    usable = [r for r in pending if step - async_level <= r.checkpoint_version <= step]
    return sum(r.groups for r in usable), sum(r.signal_groups for r in usable)


def starved(check: SignalCheck, after_s: float) -> bool:
    """The run has no learning signal: see the module docstring (`after_s` <= 0 turns the rule off)."""
    return after_s > 0 and check.waited_s >= after_s and check.starved_at


def diagnosis(check: SignalCheck, mean_reward: float | None) -> str:
    """One paragraph for the log and the status: what was seen, the likely cause, what to do."""
    seen = (
        f"no learning signal: step {check.step} waited {check.waited_s:.0f}s; the swarm delivered "
        f"{check.groups} groups and {check.signal_groups} had signal (a step needs {check.need}): "
        "every completion of a group got the same reward, so GRPO has nothing to learn from"
    )
    if mean_reward is None:
        cause = ""
    elif mean_reward <= NEVER_SOLVED:
        cause = f"; mean reward {mean_reward:.2f}: the model never solves these tasks"
    elif mean_reward >= 1 - NEVER_SOLVED:
        cause = f"; mean reward {mean_reward:.2f}: the model always solves these tasks"
    else:
        cause = f"; mean reward {mean_reward:.2f}: each task is always or never solved"
    advice = (
        ". Keep the tasks this model solves sometimes (`swarmnode tasks filter --model DIR --tasks FILE "
        "--out FILE`), or start from a model that solves some of them (`swarmnode model init --tasks FILE "
        "--warm-start-pass 0.3 DIR`)"
    )
    return seen + cause + advice


def mean_reward(rewards: Sequence[float]) -> float | None:
    return sum(rewards) / len(rewards) if rewards else None
