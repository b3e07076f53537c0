"""Joining and resync: continuing from the newest outer state the other trainers offer (spec/diloco.md).

A trainer that (re)starts asks every peer for its newest outer state before its first round (`_join`); one
that left a round (a fork, a decision it could not fetch, a peer already past it) long-polls for a newer
one (`_resync`) and, when none comes in time, skips the round on its own θ. Either adopts the offer
`protocol.diloco.choose_outer_state` picks, downloaded and checked by the participant, and publishes its
copy so others can take it from here.
"""

from __future__ import annotations

from collections.abc import Mapping

import trio

from swarmnode.node.diloco.exchange import Exchange, PeerSource, hex_address
from swarmnode.protocol import diloco as rules
from swarmnode.protocol.diloco import OuterState
from swarmnode.protocol.errors import ProtocolError, Reason, Reject


class Resyncing(Exchange):
    """Joining the run and resyncing to a newer outer state (a base of `DilocoTrainerWork`)."""

    async def _ask_outer(
        self,
        trainer: bytes,
        endpoint: str,
        after: int | None,
        wait: int,
        offers: dict[bytes, tuple[OuterState, str]],
    ) -> bool:
        """Ask one peer for its newest outer state (newer than `after`); True when it answered at all."""
        answer = await self._get(endpoint, rules.outer_path(self.plan.run, after, wait), wait)
        if answer is None:
            return False
        if answer[0] != 200:
            return answer[0] in (204, 404)
        try:
            state = rules.verify_outer_state(
                answer[1], plan=self.plan, digest=self.holdings.plan_digest, now_ms=self._now()
            )
            if state.sender != trainer:
                raise Reject(Reason.WRONG_SENDER, "asked for one trainer's outer state, got another's")
        except ProtocolError as verdict:
            self._count(verdict, "outer state", trainer)
            return True
        if after is None or state.message.round > after:
            offers[trainer] = (state, endpoint)
        return True

    async def _join(self, peers: PeerSource) -> None:
        """Before the first round: adopt a newer outer state if the other trainers are past ours."""
        others = set(self.plan.trainers) - {self.me}
        if not others:
            return
        answered: set[bytes] = set()
        offers: dict[bytes, tuple[OuterState, str]] = {}

        async def ask(trainer: bytes, endpoint: str) -> None:
            with trio.move_on_after(self.settings.poll_wait_s + 1):
                if await self._ask_outer(trainer, endpoint, None, 0, offers):
                    answered.add(trainer)

        with trio.move_on_after(self.settings.join_wait_s):
            while others - answered:
                known = {t: ep for t, ep in peers().items() if t in others - answered and ep}
                async with trio.open_nursery() as nursery:
                    for trainer, endpoint in known.items():
                        nursery.start_soon(ask, trainer, endpoint)
                if others - answered:
                    await trio.sleep(self.settings.retry_s)
        self.emit("joined", round=self.round, answered=sorted(hex_address(t) for t in answered))
        await self._adopt_best(offers)

    async def _adopt_best(self, offers: Mapping[bytes, tuple[OuterState, str]]) -> bool:
        choice = rules.choose_outer_state(
            [(s, state.message.round, state.message.theta) for s, (state, _) in offers.items()]
        )
        if choice is None or choice[0] <= self.round:
            return False
        for _, (state, endpoint) in sorted(offers.items(), key=lambda item: item[0]):
            if (state.message.round, state.message.theta) != choice:
                continue
            with trio.move_on_after(self.settings.fetch_timeout_s):
                if await self._adopt(state, endpoint):
                    return True
        return False

    async def _adopt(self, state: OuterState, endpoint: str) -> bool:
        """Download and check a peer's outer state, continue from it, and publish our copy of it."""
        try:
            await self.participant.adopt(state, [endpoint])
        except ValueError as exc:
            self._count(Reject(Reason.RULE_VIOLATION, f"outer state: {exc}"), "outer state", state.sender)
            return False
        except ProtocolError as verdict:
            self._count(verdict, "outer state", state.sender)
            return False
        previous = self.round
        self.round = state.message.round
        await self._publish_outer(state.message.parent, state.message.contributors)
        self.holdings.prune(self.round)
        self.emit(
            "resync",
            round=self.round,
            previous=previous,
            source=hex_address(state.sender),
            theta=state.message.theta.hex(),
        )
        return True

    async def _gather_newer(
        self, peers: PeerSource, after: int, offers: dict[bytes, tuple[OuterState, str]]
    ) -> None:
        """Long-poll every peer for an outer state newer than `after`; stop shortly after the first one."""
        wait = self.settings.poll_wait_s
        first = trio.Event()

        async def ask(trainer: bytes, endpoint: str) -> None:
            await self._ask_outer(trainer, endpoint, after, wait, offers)
            if trainer in offers:
                first.set()

        async with trio.open_nursery() as window:

            async def asks() -> None:
                async with trio.open_nursery() as nursery:
                    for trainer, endpoint in peers().items():
                        if trainer != self.me and endpoint:
                            nursery.start_soon(ask, trainer, endpoint)
                window.cancel_scope.cancel()

            async def grace() -> None:
                await first.wait()
                await trio.sleep(self.settings.resync_grace_s)
                window.cancel_scope.cancel()

            window.start_soon(asks)
            window.start_soon(grace)

    async def _resync(self, peers: PeerSource) -> None:
        """After leaving round r: adopt the newest outer state peers offer; none in time → skip the round."""
        r = self.round
        with trio.move_on_after(self.settings.resync_timeout_s):
            while True:
                offers: dict[bytes, tuple[OuterState, str]] = {}
                await self._gather_newer(peers, r, offers)
                if await self._adopt_best(offers):
                    return
                await trio.sleep(self.settings.retry_s)
        theta = self.participant.base()
        self.round = r + 1
        await self._publish_outer(theta, ())
        self.holdings.prune(self.round)
        self.emit("skipped", round=r, theta=theta.hex())
