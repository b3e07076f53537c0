"""A round's network phases before the outer step (spec/diloco.md, Round protocol, steps 2 to 4).

Collect: long-poll every other trainer for its contribution of the round and hold the verified ones. Vote:
fetch every reachable trainer's signed list of what it holds. Decide's fetch: whatever the decision names
that we lack, from the voters that hold it (or its author). A message on another θ (`base`) is not taken
but counted as support for that θ, which `DilocoTrainerWork._play_round` weighs (`winning_base`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import trio

from swarmnode.node.dataplane.errors import CheckpointInvalid
from swarmnode.node.diloco.exchange import Exchange, PeerSource
from swarmnode.node.diloco.holdings import HeldContribution
from swarmnode.protocol import diloco as rules
from swarmnode.protocol.diloco import Contribution
from swarmnode.protocol.errors import ProtocolError, Reason, Reject
from swarmnode.protocol.messages import DilocoEntry


class _Phase:
    """What the tasks of one waiting phase share: who answered for good, who failed, a change signal."""

    def __init__(self) -> None:
        self.done: set[bytes] = set()
        self.failed: set[bytes] = set()
        self._changed = trio.Event()

    def touch(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_changed(self) -> None:
        await self._changed.wait()


class Collecting(Exchange):
    """Collecting contributions, gathering votes, fetching the decided ones (a base of DilocoTrainerWork)."""

    async def _take(self, r: int, contribution: Contribution, envelope: bytes, sources: list[str]) -> bool:
        """Fetch, load and hold a verified contribution; False (and counted) when its payload is bad."""
        directory = await self.holdings.fetch_contribution(contribution, envelope, sources)
        try:
            delta = await trio.to_thread.run_sync(self.participant.load, directory, contribution)
        except (ValueError, CheckpointInvalid) as exc:
            self._count(Reject(Reason.RULE_VIOLATION, f"payload: {exc}"), "contribution", contribution.sender)
            return False
        self.holdings.hold(r, HeldContribution(contribution, envelope, directory, delta))
        return True

    def _verified_from(
        self, verify: Callable[..., Any], data: bytes, r: int, sender: bytes, kind: str
    ) -> Any:
        """A round-`r` message `verify` accepts and `sender` signed (we asked that trainer for its own);
        None, with the refusal counted against `sender`, otherwise."""
        try:
            found = verify(
                data, plan=self.plan, digest=self.holdings.plan_digest, round=r, now_ms=self._now()
            )
            if found.sender != sender:
                raise Reject(Reason.WRONG_SENDER, f"asked for one trainer's {kind}, got another's")
        except ProtocolError as verdict:
            self._count(verdict, kind, sender)
            return None
        return found

    async def _collect_from(
        self, r: int, base: bytes, trainer: bytes, peers: PeerSource, support: dict[bytes, set[bytes]]
    ) -> None:
        """Long-poll `trainer` for its contribution of round `r` until we hold it (the caller's deadline)."""
        wait = self.settings.poll_wait_s
        while self.holdings.contribution(r, trainer) is None:
            endpoint = peers().get(trainer)
            answer = None
            if endpoint:
                answer = await self._get(
                    endpoint, rules.contribution_path(self.plan.run, r, trainer, wait), wait
                )
            if answer is None or answer[0] != 200:
                if answer is None or answer[0] != 204:
                    await trio.sleep(self.settings.retry_s)
                continue
            assert endpoint is not None
            found = self._verified_from(rules.verify_contribution, answer[1], r, trainer, "contribution")
            if found is None:
                return
            if found.message.base != base:
                support.setdefault(found.message.base, set()).add(trainer)
                return
            await self._take(r, found, answer[1], [endpoint])
            return

    async def _gather_votes(
        self,
        r: int,
        base: bytes,
        peers: PeerSource,
        support: dict[bytes, set[bytes]],
        votes: dict[bytes, tuple[DilocoEntry, ...]],
    ) -> None:
        """Fetch the vote of every other trainer until each has answered or is unreachable.

        Unreachable: not discovered, or its last request failed below HTTP (refused, reset, silent). A
        trainer that crashed is not waited for; one that is merely slow is, up to the caller's deadline.
        """
        phase = _Phase()
        others = [t for t in self.plan.trainers if t != self.me]
        async with trio.open_nursery() as nursery:
            for voter in others:
                nursery.start_soon(self._vote_from, r, base, voter, peers, support, votes, phase)
            while True:
                known = peers()
                pending = [t for t in others if t not in phase.done and t in known and t not in phase.failed]
                if not pending:
                    nursery.cancel_scope.cancel()
                    return
                with trio.move_on_after(self.settings.retry_s):  # discovery changes without a signal
                    await phase.wait_changed()

    async def _vote_from(
        self,
        r: int,
        base: bytes,
        voter: bytes,
        peers: PeerSource,
        support: dict[bytes, set[bytes]],
        votes: dict[bytes, tuple[DilocoEntry, ...]],
        phase: _Phase,
    ) -> None:
        wait = self.settings.poll_wait_s
        try:
            await self._vote_loop(r, base, voter, peers, support, votes, phase, wait)
        finally:
            phase.done.add(voter)
            phase.touch()

    async def _vote_loop(
        self,
        r: int,
        base: bytes,
        voter: bytes,
        peers: PeerSource,
        support: dict[bytes, set[bytes]],
        votes: dict[bytes, tuple[DilocoEntry, ...]],
        phase: _Phase,
        wait: int,
    ) -> None:
        while True:
            endpoint = peers().get(voter)
            answer = None
            if endpoint:
                answer = await self._get(endpoint, rules.vote_path(self.plan.run, r, wait), wait)
            if answer is None:
                phase.failed.add(voter)
                phase.touch()
            else:
                phase.failed.discard(voter)
            if answer is None or answer[0] != 200:
                if answer is None or answer[0] != 204:
                    await trio.sleep(self.settings.retry_s)
                continue
            vote = self._verified_from(rules.verify_vote, answer[1], r, voter, "vote")
            if vote is None:
                return
            if vote.message.base != base:
                support.setdefault(vote.message.base, set()).add(voter)
            else:
                votes[voter] = vote.message.entries
            return

    async def _fetch_missing(
        self,
        r: int,
        base: bytes,
        decision: tuple[DilocoEntry, ...],
        votes: Mapping[bytes, Sequence[DilocoEntry]],
        peers: PeerSource,
    ) -> bool:
        """Fetch the decided contributions we lack from the voters that hold them (or their authors)."""
        missing = [e for e in decision if self.holdings.by_digest(r, e) is None]
        if not missing:
            return True
        with trio.move_on_after(self.settings.fetch_timeout_s):
            async with trio.open_nursery() as nursery:
                for entry in missing:
                    holders = [v for v, entries in sorted(votes.items()) if entry in entries]
                    nursery.start_soon(self._fetch_named, r, base, entry, [*holders, entry.trainer], peers)
        return all(self.holdings.by_digest(r, e) is not None for e in missing)

    async def _fetch_named(
        self, r: int, base: bytes, entry: DilocoEntry, holders: list[bytes], peers: PeerSource
    ) -> None:
        target = rules.contribution_path(self.plan.run, r, entry.trainer)
        while self.holdings.by_digest(r, entry) is None:
            known = peers()
            sources = [known[h] for h in holders if known.get(h)]
            for endpoint in sources:
                answer = await self._get(endpoint, target, 0)
                if answer is None or answer[0] != 200:
                    continue
                try:
                    found = rules.verify_contribution(
                        answer[1],
                        plan=self.plan,
                        digest=self.holdings.plan_digest,
                        round=r,
                        base=base,
                        now_ms=self._now(),
                    )
                    if found.entry() != entry:
                        raise Reject(Reason.RULE_VIOLATION, "served another contribution than the vote names")
                except ProtocolError as verdict:
                    self._count(verdict, "contribution", entry.trainer)
                    continue
                if await self._take(r, found, answer[1], sources):
                    return
            await trio.sleep(self.settings.retry_s)
