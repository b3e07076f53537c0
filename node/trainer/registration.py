"""The run on the ledger: the lead registers it before publishing (`register_run`), a co-trainer waits
for the lead's registration; both refuse a run another key owns (`RunMismatch`).

A run registered before (a restart) is fine, its validator set updated if the operator changed it. A
ledger that cannot answer is asked again every `RUN_WAIT_S` (read from this module's globals).
"""

from __future__ import annotations

import logging

import trio

from swarmnode.ledger import Ledger
from swarmnode.ledger.types import RunInfo
from swarmnode.node.errors import RunMismatch
from swarmnode.node.roles.common import check_run_owner, ensure_run, is_refusal, read_run, run_registration
from swarmnode.node.trainer.limits import RUN_WAIT_S
from swarmnode.node.trainer.state import TrainerState
from swarmnode.protocol.messages import RunDescriptor
from swarmnode.protocol.runs import run_environment

log = logging.getLogger(__name__)


class Registration(TrainerState):
    """Registers the run on the ledger, or checks who owns it."""

    async def register_run(self, ledger: Ledger, descriptor: RunDescriptor, parameters: int) -> RunInfo:
        """The lead registers the run (or finds it its own); a co-trainer, or a lead that names no
        validators (the run registered beforehand, as the devnet does), checks the ledger's owner of it,
        waiting for the registration. RunMismatch for another owner or a refused registration; a ledger
        that cannot answer is asked again every `RUN_WAIT_S`."""
        lead = descriptor.trainer == self.identity.address
        op = None
        if lead and self.run_validators:
            window = self.challenge_window_epochs
            op = run_registration(descriptor.run, descriptor.grpo, self.run_validators, parameters, window,
                                  descriptor.max_submissions_per_version, run_environment(descriptor))
        waiting = False
        while True:
            try:
                async with self._ledger_lock:
                    if op is not None:
                        return await trio.to_thread.run_sync(ensure_run, ledger, self.identity, op)
                    info = await trio.to_thread.run_sync(read_run, ledger, descriptor.run)
            except RunMismatch:
                raise
            except Exception as exc:  # web3 and the OS raise anything: a refusal is decided, the rest passes
                if is_refusal(exc):
                    refused = f"the ledger refused to register run {descriptor.run!r}: {exc}"
                    raise RunMismatch(refused) from exc
                self.tallies.ledger_errors += 1
                log.warning("ledger unavailable for the run's registration", extra={"error": repr(exc)})
                await trio.sleep(RUN_WAIT_S)
                continue
            if info is not None:
                check_run_owner(info, descriptor)
                return info
            if lead:
                raise RunMismatch(
                    f"run {descriptor.run!r} is not on the ledger, and this trainer names no validators to "
                    "register it with ([trainer] run_validators)"
                )
            if not waiting:
                log.info("waiting for the lead to register the run", extra={"run": descriptor.run})
                waiting = True
            await trio.sleep(RUN_WAIT_S)
