"""One DiLoCo trainer's rounds over the swarm (spec/diloco.md, Round protocol).

Round r, starting from the outer weights θ_r that every trainer of the lineage holds bit-identically:

1. Contribute: H inner steps on our own batches (`InnerTrainer`, in a thread), pseudo-gradient, compress,
   publish it as version r of our contribution namespace (signed manifest) with a signed
   `DilocoContribution` naming the round, θ_r's digest (`base`), the compression and the Merkle root.
2. Collect: long-poll every other trainer of the run for its contribution of round r, verify it, fetch its
   shards over HTTP (verified against the author's manifest), decompress; until every trainer's is held
   or `collect_timeout` after our own passed. A slow or dead trainer is left out of this round.
3. Vote: sign the list of what we hold (`DilocoVote`) and fetch the vote of every other trainer, until
   each reachable one answered or `vote_timeout` passed (a crashed trainer is not waited for).
4. Decide (`protocol.diloco.decide`): the contributions some voter other than their author holds; fetch
   any we lack from the voters that hold them. Average in the agreed order, apply the outer step, publish
   our outer state for round r+1 (θ, momentum) so a trainer that (re)joins can download it.

A trainer that sees more trainers on another θ than on its own (`winning_base`), or cannot fetch what the
votes named, leaves the round and resyncs: it downloads the newest outer state peers offer. A trainer that
(re)starts does the same before its first round. Peers come from a `PeerSource` (address → HTTP
endpoint): the DHT's verified `trainer` providers in a node (`DilocoTrainer`), a fixed map in tests.

What a participant holds, and where, is a `Participant`'s business (node/diloco/participant.py): one process
holds θ, the outer momentum and every payload whole, an FSDP2 trainer group deals them over its ranks.

This module is the round's control flow (`train`, `_play_round`); the phases' network work is in
`collect` (steps 2 to 4) and `resync` (joining and resync), bases of `DilocoTrainerWork` over the state
they share (`exchange`).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any, Generic, Protocol, TypeVar

import torch
import trio

from swarmnode.node.diloco.algorithm import DilocoParams, InnerTrainer, LossFn
from swarmnode.node.diloco.collect import Collecting
from swarmnode.node.diloco.exchange import Emit, OnOuter, PeerSource, TrainerSettings, hex_address
from swarmnode.node.diloco.holdings import HeldContribution, Holdings
from swarmnode.node.diloco.participant import Participant, WholeParticipant
from swarmnode.node.diloco.pretraining import round_batches
from swarmnode.node.diloco.resync import Resyncing
from swarmnode.node.errors import RunMismatch
from swarmnode.protocol import diloco as rules
from swarmnode.protocol.diloco import OuterState
from swarmnode.protocol.messages import DilocoEntry

log = logging.getLogger(__name__)

B = TypeVar("B")


class InnerRound(Protocol):
    """A trainer's H inner steps of one round: what it trains on is its own business (data, rollouts)."""

    async def __call__(
        self, round_index: int, theta: dict[str, torch.Tensor] | None
    ) -> dict[str, torch.Tensor] | None:
        """Start from the outer weights θ_r, take the round's inner steps, return the trained weights
        (None in and out for a trainer group: its ranks' model is set to θ_r and holds the result)."""
        ...

    def statistics(self) -> dict[str, Any]:
        """At least `last_round_mean_loss`."""
        ...


class DataInnerRound(Generic[B]):
    """Pre-training: H AdamW steps on this trainer's own batches, `round_batches(data, r, H)`."""

    def __init__(
        self, model: torch.nn.Module, params: DilocoParams, data: Sequence[B], loss_fn: LossFn[B]
    ) -> None:
        self.inner = InnerTrainer(model, params)
        self.data = data
        self.loss_fn = loss_fn
        self.inner_steps = params.inner_steps

    async def __call__(
        self, round_index: int, theta: dict[str, torch.Tensor] | None
    ) -> dict[str, torch.Tensor]:
        if theta is None:
            raise TypeError("pre-training rounds train a whole model in this process: they need θ")
        batches = round_batches(self.data, round_index, self.inner_steps)
        return await trio.to_thread.run_sync(self.inner.run_round, theta, batches, self.loss_fn)

    def statistics(self) -> dict[str, Any]:
        return dict(self.inner.statistics())


def _nothing(event: str, **fields: Any) -> None:
    pass


class DilocoTrainerWork(Collecting, Resyncing):
    """The rounds of one trainer; `train(peers)` returns once the run's last round is done.

    `model` is the participant's model in this process (a `WholeParticipant` is made of it) or a
    `Participant` (a trainer group). `inner` takes each round's inner steps; `on_outer(round, θ,
    contributors)`, when given, is awaited each time the trainer holds new outer weights (the start, every
    round, a resync, a skipped round), with the contributions the last round averaged (θ is None for a
    group: its ranks hold it): an RL run publishes θ there as the checkpoint workers follow, and settles
    which of its rollouts were trained into the run.
    """

    def __init__(
        self,
        holdings: Holdings,
        model: torch.nn.Module | Participant,
        inner: InnerRound,
        *,
        settings: TrainerSettings = TrainerSettings(),  # noqa: B008  (frozen: one shared default is safe)
        emit: Emit | None = None,
        on_outer: OnOuter | None = None,
    ) -> None:
        self.holdings = holdings
        self.plan = holdings.plan
        self.me = holdings.me
        self.inner = inner
        self.participant: Participant = (
            WholeParticipant(holdings, model) if isinstance(model, torch.nn.Module) else model
        )
        self.settings = settings
        self.emit: Emit = emit or _nothing
        self.on_outer = on_outer
        self.round = 0
        self.finished = trio.Event()
        self.verdicts: Counter[str] = Counter()
        self.history: list[dict[str, Any]] = []

    def status(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "rounds": self.plan.rounds,
            "finished": self.finished.is_set(),
            "verdicts": dict(self.verdicts),
            "contributors_per_round": [len(h["contributors"]) for h in self.history],
            "theta": self.history[-1]["theta"] if self.history else "",
            "history": self.history[-5:],
        }

    # --- the run -----------------------------------------------------------------------------------

    async def train(self, peers: PeerSource) -> dict[str, torch.Tensor] | None:
        """Play the run's rounds; the final θ where this process holds it (None for a group)."""
        await self._start(peers)
        while self.round < self.plan.rounds:
            if not await self._play_round(peers):
                await self._resync(peers)
        theta = await self.participant.weights()
        self.emit("done", round=self.round, theta=self.participant.base().hex())
        self.finished.set()
        return theta

    async def _start(self, peers: PeerSource) -> None:
        held = self.participant.restore()  # small files; touches trio state, so not in a thread
        if held is not None:
            self.round = held.state.message.round
            self.emit("restored", round=self.round, theta=held.state.message.theta.hex())
            if self.on_outer is not None:
                await self.on_outer(
                    self.round, await self.participant.weights(), held.state.message.contributors
                )
        else:
            if await self.participant.start() != self.plan.initial_digest:
                raise RunMismatch("our initial weights are not the ones the run names (initial_digest)")
            self.round = 0
            await self._publish_outer(rules.ZERO_DIGEST, ())
        await self._join(peers)

    # --- one round ---------------------------------------------------------------------------------

    async def _play_round(self, peers: PeerSource) -> bool:
        """Play round `self.round`; False when we must leave it and resync."""
        r = self.round
        base = self.participant.base()
        self.emit("round_start", round=r, theta=base.hex())
        own = self.holdings.contribution(r, self.me)
        if own is None or not self.participant.usable(own) or own.contribution.message.base != base:
            made = await self._contribute_unless_overtaken(r, base, peers)
            if made is None:
                self.emit("overtaken", round=r)
                return False
            own = made
        self.emit("contributed", round=r, digest=own.contribution.digest.hex())
        support: dict[bytes, set[bytes]] = {base: {self.me}}
        deadline = trio.current_time() + self.plan.collect_timeout_ms / 1000
        with trio.move_on_at(deadline):
            async with trio.open_nursery() as nursery:
                for trainer in self.plan.trainers:
                    if trainer != self.me:
                        nursery.start_soon(self._collect_from, r, base, trainer, peers, support)
        if rules.winning_base(base, support) != base:
            self.emit("fork", round=r, support={k.hex(): len(v) for k, v in support.items()})
            return False
        entries = self.holdings.entries(r)
        self.holdings.publish_vote(r, base, entries)
        votes: dict[bytes, tuple[DilocoEntry, ...]] = {}
        with trio.move_on_after(self.plan.vote_timeout_ms / 1000):
            await self._gather_votes(r, base, peers, support, votes)
        if rules.winning_base(base, support) != base:
            self.emit("fork", round=r, support={k.hex(): len(v) for k, v in support.items()})
            return False
        decision = rules.decide(self.me, entries, votes)
        if not decision or not await self._fetch_missing(r, base, decision, votes, peers):
            self.emit("incomplete", round=r, decided=[hex_address(e.trainer) for e in decision])
            return False
        held = [h for h in (self.holdings.by_digest(r, e) for e in decision) if h is not None]
        if len(held) != len(decision):
            raise AssertionError("a decided contribution is not held")
        await trio.to_thread.run_sync(self.participant.step, held)
        self.holdings.release(r)
        self.round = r + 1
        await self._publish_outer(base, decision)
        self.holdings.prune(self.round)
        new_theta = self.holdings.outer.state.message.theta if self.holdings.outer else b""
        record = {
            "round": r,
            "contributors": [hex_address(e.trainer) for e in decision],
            "held": [hex_address(e.trainer) for e in entries],
            "voters": sorted(hex_address(v) for v in votes),
            "theta": new_theta.hex(),
            "inner_loss": self.inner.statistics()["last_round_mean_loss"],
        }
        self.history.append(record)
        self.emit("round_done", **record)
        return True

    async def _contribute_unless_overtaken(
        self, r: int, base: bytes, peers: PeerSource
    ) -> HeldContribution | None:
        """Our contribution to round r, or None when a peer offers an outer state past r first.

        A trainer that came back late, or whose inner steps wait for data that no longer comes (rollouts
        of versions the run has left behind), would otherwise wait forever in a round the others closed
        without it; leaving it for a resync is what a crash would have done (the round's rows go back).
        """
        made: HeldContribution | None = None
        async with trio.open_nursery() as race:

            async def contribute() -> None:
                nonlocal made
                made = await self._contribute(r, base)
                race.cancel_scope.cancel()

            async def watch() -> None:
                while True:
                    offers: dict[bytes, tuple[OuterState, str]] = {}
                    await self._gather_newer(peers, r, offers)
                    if offers:
                        race.cancel_scope.cancel()
                        return
                    await trio.sleep(self.settings.retry_s)

            race.start_soon(contribute)
            race.start_soon(watch)
        return made

    async def _contribute(self, r: int, base: bytes) -> HeldContribution:
        trained = await self.inner(r, await self.participant.begin_inner())
        return await self.participant.contribute(r, base, trained)
