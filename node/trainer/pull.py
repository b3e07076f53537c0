"""Pulling over the network: one long-poll ACCEPTED loop per validator in good standing, each batch
verified (`checks`) and stored with its cursor in one inbox transaction (`ingest_batch`; `ingest`, which
wakes the step loop).

Decisions:
- With a ledger, only validators registered there as validators, unejected and fully staked are pulled
  from, read again every `TRUST_CHECK_S`; one that loses its standing stops being pulled from (what it
  delivered stays stored). A failed read counts as not trusted yet.
- A batch whose handling fails unexpectedly is logged, counted and reported (unless our own storage
  failed), and the loop backs off (`PULL_BACKOFF_S`): it never stops the trainer.
- A validator with `rows_per_validator` rows held in the inbox is not pulled from until a prune deletes
  some (`validators.pull_limit`).
- The cadences are read from this module's globals (tests shorten them here).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import trio
from libp2p.peer.id import ID

from swarmnode.node.p2p.clock import wall_ms
from swarmnode.node.p2p.endpoints import ACCEPTED
from swarmnode.node.p2p.reqresp import RequestFailed
from swarmnode.node.rl.model import ModelInfo
from swarmnode.node.roles.base import RoleNet
from swarmnode.node.trainer.checks import check_batch
from swarmnode.node.trainer.inbox import InboxEntry, RolloutInbox, Stored
from swarmnode.node.trainer.limits import (
    PEER_SCAN_S,
    PULL_BACKOFF_S,
    PULL_EMPTY_PAUSE_S,
    PULL_WAIT_MS,
    TRUST_CHECK_S,
)
from swarmnode.node.trainer.state import TrainerState
from swarmnode.node.trainer.validators import (
    LEDGER_FAILURES,
    ValidatorPull,
    pull_limit,
    track_validators,
    validator_in_good_standing,
)
from swarmnode.protocol.errors import Reason
from swarmnode.protocol.messages import AcceptedBatch, AcceptedRequest, EnvironmentTerms, GrpoParams
from swarmnode.protocol.runs import run_environment

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Ingested:
    stored: Stored
    cursor: int
    refused: tuple[tuple[int, Reason, str], ...]


def ingest_batch(
    inbox: RolloutInbox,
    validator: bytes,
    batch: AcceptedBatch,
    *,
    run: str,
    grpo: GrpoParams,
    cfg: ModelInfo,
    roots: Mapping[int, bytes],
    now_ms: int,
    terms: EnvironmentTerms | None = None,
) -> Ingested:
    """Verify a pulled batch and store its good items with the advanced cursor, in one transaction."""
    checked = check_batch(
        batch,
        inbox.cursor(validator),
        run=run,
        validator=validator,
        grpo=grpo,
        cfg=cfg,
        roots=roots,
        now_ms=now_ms,
        terms=terms,
    )
    return Ingested(inbox.store(validator, checked.entries, checked.cursor), checked.cursor, checked.refused)


class Pulling(TrainerState):
    """Pulls accepted rollouts from the run's validators into the inbox."""

    # --- hooks a multi-trainer run (node.diloco.rl) overrides ----------------------------------

    async def _before_check(self, batch: AcceptedBatch) -> None:
        """Wait, if need be, until a pulled batch can be checked (nothing to wait for here)."""

    def _mine(self, entries: Sequence[InboxEntry]) -> Sequence[InboxEntry]:
        """The verified items this trainer trains on: all of them here."""
        return entries

    def _blames(self, reason: Reason) -> bool:
        """Whether an item refused for `reason` is the delivering validator's fault."""
        return reason.error_class != "ignore"  # stale items are nobody's fault

    # --- receiving rollouts --------------------------------------------------------------------------

    async def ingest(self, validator: bytes, batch: AcceptedBatch) -> Ingested:
        """Verify (in a thread) and store one pulled batch; wakes the step loop when something arrived.

        One caller per validator at a time (its pull loop), so the cursor cannot move in between.
        """
        _, inbox, descriptor = self._parts()
        assert self.model_config is not None
        await self._before_check(batch)
        before = inbox.cursor(validator)
        checked = await trio.to_thread.run_sync(
            partial(
                check_batch,
                batch,
                before,
                run=descriptor.run,
                validator=validator,
                grpo=descriptor.grpo,
                terms=run_environment(descriptor),
                cfg=self.model_config,
                roots=self.published_roots(),
                now_ms=wall_ms(),
            )
        )
        await trio.lowlevel.checkpoint_if_cancelled()  # shutting down: the inbox may be closed by now
        stored = inbox.store(validator, self._mine(checked.entries), checked.cursor)
        result = Ingested(stored, checked.cursor, checked.refused)
        if result.cursor < before:
            self.tallies.cursor_resets += 1
            log.warning(
                "validator's index fell below our cursor; pulling from the start",
                extra={"validator": "0x" + validator.hex(), "cursor": before, "newest": batch.newest},
            )
        self.tallies.duplicates += result.stored.duplicates
        for _, reason, _ in result.refused:
            self.tallies.refused[reason.name] += 1
        if result.stored.inserted:
            self._note_arrivals({e.checkpoint_version for e in checked.entries}, wall_ms())
            self._arrived.set()
            self._arrived = trio.Event()
        return result

    async def _trusted(self, address: bytes, state: ValidatorPull) -> bool:
        """Whether to pull from `address`: its ledger standing, read again every `TRUST_CHECK_S`."""
        if self.ledger is None:
            state.trusted = True
            return True
        now = trio.current_time()
        if state.checked_at is not None and now - state.checked_at < TRUST_CHECK_S:
            return state.trusted
        ledger = self.ledger
        async with self._ledger_lock:
            try:
                trusted = await trio.to_thread.run_sync(validator_in_good_standing, ledger, address)
            except LEDGER_FAILURES as exc:
                self.tallies.ledger_errors += 1
                log.warning(
                    "ledger check of a validator failed",
                    extra={"validator": "0x" + address.hex(), "error": str(exc)},
                )
                trusted = False
        state.checked_at = trio.current_time()
        state.trusted = trusted
        return trusted

    async def _pull_validators(self, net: RoleNet) -> None:
        """One pull loop per validator found and (with a ledger) in good standing; keep records current.

        A validator that loses its standing stops being pulled from (what it delivered stays stored).
        """
        async with trio.open_nursery() as nursery:
            while True:
                found = net.peers("validator")
                track_validators(self.validators, found, trio.current_time(), self.bounds.tracked_validators)
                for address, state in list(self.validators.items()):
                    trusted = await self._trusted(address, state)
                    if trusted and state.scope is None:
                        state.scope = trio.CancelScope()
                        nursery.start_soon(self._pull_in, state.scope, net, address)
                    elif not trusted and state.scope is not None:
                        log.warning(
                            "validator not in good standing in the ledger; no longer pulling from it",
                            extra={"validator": "0x" + address.hex()},
                        )
                        state.scope.cancel()
                        state.scope = None
                await trio.sleep(PEER_SCAN_S)

    async def _pull_in(self, scope: trio.CancelScope, net: RoleNet, validator: bytes) -> None:
        with scope:
            await self._pull(net, validator)

    async def _pull(self, net: RoleNet, validator: bytes) -> None:
        _, inbox, _ = self._parts()
        state = self.validators[validator]
        pause = PULL_BACKOFF_S[0]
        while True:
            peer = ID.from_base58(state.record.peer_id)
            limit = pull_limit(inbox.held_from(validator), self.bounds.rows_per_validator)
            if not limit:
                await trio.sleep(PULL_EMPTY_PAUSE_S)
                continue
            request = AcceptedRequest(net.run, inbox.cursor(validator), limit, PULL_WAIT_MS)
            state.pulls += 1
            try:
                opened = await net.request(peer, ACCEPTED, request)
            except RequestFailed as exc:
                state.failures += 1
                log.debug("pull failed", extra={"validator": "0x" + validator.hex(), "error": str(exc)})
                await trio.sleep(pause)
                pause = min(pause * 2, PULL_BACKOFF_S[1])
                continue
            batch: AcceptedBatch = opened.message
            try:
                before = request.after
                result = await self.ingest(validator, batch)
            except Exception as exc:  # one bad batch must not stop the trainer (nothing of it was stored)
                state.errors += 1
                self.tallies.pull_errors += 1
                log.exception("handling a pulled batch failed", extra={"validator": "0x" + validator.hex()})
                if not isinstance(exc, sqlite3.Error | OSError):  # our storage failing: not its fault
                    net.report(peer, Reason.RULE_VIOLATION, f"accepted batch could not be handled: {exc}")
                await trio.sleep(pause)
                pause = min(pause * 2, PULL_BACKOFF_S[1])
                continue
            pause = PULL_BACKOFF_S[0]
            state.stored += result.stored.inserted
            state.refused += len(result.refused)
            for index, reason, detail in result.refused:
                if self._blames(reason):
                    net.report(peer, reason, f"accepted item {index}: {detail}")
            if not batch.items or result.cursor == before:  # nothing new, or nothing we could pass
                await trio.sleep(PULL_EMPTY_PAUSE_S)
