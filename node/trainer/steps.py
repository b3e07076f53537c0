"""The step loop: wait for a batch, mark its rows used, take the GRPO step, save, publish the next version.

Decisions:
- The rows are marked used by the step (and its record written) before the weights are saved, and a
  trainer that resumes at step s releases what steps >= s used, so a kill at any point neither loses an
  accepted rollout nor trains on one twice.
- A ready batch whose oldest usable version went out less than 1.5 median first-arrival lags ago waits
  for that version's rows on their way (`protocol.pacing.hold_until_ms`, at most 60 s).
- A step that waits on a step's worth of groups without signal for `work.no_signal_after_s` says so in
  the log and in the status (`liveness`), once, and keeps waiting; the wait re-checks every
  `SIGNAL_RECHECK_S` even when nothing arrives.
- After `work.steps` steps the loop ends (`done`); the node keeps serving.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace

import trio

from swarmnode.node.p2p.clock import wall_ms
from swarmnode.node.rl.learner import StepStats
from swarmnode.node.trainer.batch import BatchPlan, batch_limit, groups_of, plan_batch
from swarmnode.node.trainer.disk import prune_saves
from swarmnode.node.trainer.inbox import InboxRow, StepRecord
from swarmnode.node.trainer.limits import KEEP_SAVES
from swarmnode.node.trainer.liveness import (
    REWARD_SAMPLE_ROWS,
    SignalCheck,
    diagnosis,
    mean_reward,
    starved,
    usable_counts,
)
from swarmnode.node.trainer.publishing import Publishing
from swarmnode.node.trainer.state import Policy

log = logging.getLogger(__name__)

SIGNAL_RECHECK_S = 5.0  # a waiting step re-checks its signal this often, arrivals or not


class StepLoop(Publishing):
    """GRPO steps on the inbox's rows, each published as the next version."""

    def _finished(self) -> bool:
        steps = self.config.work.steps
        return self.trainer is not None and steps > 0 and self.trainer.step_count >= steps

    async def train(self) -> None:
        """GRPO steps until `work.steps` (forever when 0); each publishes the next version."""
        trainer, inbox, descriptor = self._parts()
        need = self.config.work.min_batch_groups or descriptor.grpo.prompts_per_step
        while not self._finished():
            step = trainer.step_count
            started = time.perf_counter()
            record, stats = await self._train_step(step, need)
            began = started + record.step_s - record.train_s  # when the GRPO step itself began
            await trio.to_thread.run_sync(self._save, trainer)
            trained = time.perf_counter() - began
            await self._publish(trainer.step_count)
            inbox.record_step(replace(record, train_s=trained, step_s=time.perf_counter() - started))
            log.info(
                "trained step",
                extra={
                    "step": step,
                    "submissions": record.submissions,
                    "groups": record.groups,
                    "signal_groups": stats.groups_used,
                    "mean_reward": round(stats.mean_reward, 4),
                    "loss": round(stats.loss, 5),
                    "wait_s": round(record.wait_s, 2),
                    "train_s": round(trained, 2),
                },
            )
        self.done = True
        log.info("training done; still serving", extra={"step": trainer.step_count})

    async def _train_step(
        self, step: int, need: int, *, version: int | None = None
    ) -> tuple[StepRecord, StepStats]:
        """Wait for a batch, mark its rows used by `step`, take the GRPO step, record it.

        The record goes in before any save: a resume that drops this step drops its record too.
        """
        trainer, inbox, _ = self._parts()
        started = time.perf_counter()
        plan = await self._wait_for_batch(step, need, version=version)
        waited = time.perf_counter() - started
        ids = [row.id for row in plan.take]
        groups = await trio.to_thread.run_sync(groups_of, inbox.submissions(ids))
        inbox.consume(ids, step)
        began = time.perf_counter()
        stats = await trio.to_thread.run_sync(trainer.step, groups)
        record = StepRecord(
            step=step,
            submissions=len(ids),
            groups=len(groups),
            signal_groups=stats.groups_used,
            mean_reward=stats.mean_reward,
            wait_s=waited,
            train_s=time.perf_counter() - began,
            step_s=time.perf_counter() - started,
        )
        inbox.record_step(record)
        return record, stats

    def _save(self, trainer: Policy) -> None:
        trainer.save(self.trainer_dir)
        prune_saves(self.trainer_dir, trainer.step_count - KEEP_SAVES + 1)

    async def _wait_for_batch(self, step: int, need: int, *, version: int | None = None) -> BatchPlan:
        """A batch for `step` of the policy `version` (the step itself when one step is one version)."""
        _, inbox, descriptor = self._parts()
        began = time.monotonic()
        while True:
            arrived = self._arrived
            current = step if version is None else version
            pending = inbox.pending()
            plan = plan_batch(pending, current, descriptor.async_level, need, batch_limit(need))
            if plan.stale:
                inbox.drop([row.id for row in plan.stale], step)
            if plan.ready:
                self.signal = {}
                hold_s = (self._hold_until_ms(current - descriptor.async_level) - wall_ms()) / 1000
                if hold_s <= 0:
                    return plan
                await trio.sleep(hold_s)  # rows of the oldest usable version on their way join the batch
                continue
            groups, signal_groups = usable_counts(pending, current, descriptor.async_level)
            check = SignalCheck(step, time.monotonic() - began, groups, signal_groups, need)
            if not self.signal and starved(check, self.config.work.no_signal_after_s):
                self._report_starved(check, current, pending)
            with trio.move_on_after(SIGNAL_RECHECK_S):
                await arrived.wait()

    def _report_starved(self, check: SignalCheck, version: int, pending: Sequence[InboxRow]) -> None:
        """Log and show, once per step, why the step cannot start (`node.trainer.liveness`). The mean reward
        is sampled from at most REWARD_SAMPLE_ROWS of the usable `pending` rows (decoded here, on the trio
        thread: the inbox's SQLite connection is this thread's, and the sample bounds the work)."""
        _, inbox, descriptor = self._parts()
        low = version - descriptor.async_level
        rows = [r.id for r in pending if low <= r.checkpoint_version <= version]
        rewards = [
            c.reward for g in groups_of(inbox.submissions(rows[:REWARD_SAMPLE_ROWS])) for c in g.completions
        ]
        mean = mean_reward(rewards)
        message = diagnosis(check, mean)
        self.signal = {
            "starved": True,
            "step": check.step,
            "waited_s": round(check.waited_s, 1),
            "groups": check.groups,
            "signal_groups": check.signal_groups,
            "need": check.need,
            "mean_reward": None if mean is None else round(mean, 4),
            "message": message,
        }
        log.warning(message, extra={"groups": check.groups, "signal_groups": check.signal_groups})
