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
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import torch
import trio

from node.dataplane.errors import CheckpointInvalid, PeerFault
from node.diloco.holdings import HeldContribution, Holdings
from node.diloco.payload import load_delta
from node.rl.diloco import (
    THETA_PREFIX,
    Compressor,
    DilocoParams,
    InnerTrainer,
    LossFn,
    OuterOptimizer,
    average,
    check_like,
    content_digest,
    decompress,
    pseudo_gradient,
    round_batches,
    trainable_state,
)
from protocol import diloco as rules
from protocol.diloco import Contribution, OuterState
from protocol.envelope import ENVELOPE_OVERHEAD
from protocol.errors import ProtocolError, Reason, Reject
from protocol.messages import DilocoEntry, DilocoOuterState, DilocoRun

log = logging.getLogger(__name__)

B = TypeVar("B")
PeerSource = Callable[[], Mapping[bytes, str]]
Emit = Callable[..., None]
OnOuter = Callable[[int, dict[str, torch.Tensor], tuple[DilocoEntry, ...]], Awaitable[None]]
MAX_MESSAGE_BYTES = DilocoOuterState.MAX_SIZE + ENVELOPE_OVERHEAD


@dataclass(frozen=True)
class TrainerSettings:
    poll_wait_s: int = 5  # how long one long-poll request is held by the peer
    retry_s: float = 0.25  # pause after a failed or empty answer
    join_wait_s: float = 10.0  # at start, how long to wait for every other trainer to answer
    fetch_timeout_s: float = 30.0  # fetching contributions the votes name that we lack; loading a state
    resync_timeout_s: float = 60.0  # waiting for a newer outer state before skipping the failed round
    resync_grace_s: float = 0.5  # after the first newer offer, how long to wait for the others' offers


class InnerRound(Protocol):
    """A trainer's H inner steps of one round: what it trains on is its own business (data, rollouts)."""

    async def __call__(self, round_index: int, theta: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Start from the outer weights θ_r, take the round's inner steps, return the trained weights."""
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

    async def __call__(self, round_index: int, theta: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        batches = round_batches(self.data, round_index, self.inner_steps)
        return await trio.to_thread.run_sync(self.inner.run_round, theta, batches, self.loss_fn)

    def statistics(self) -> dict[str, Any]:
        return dict(self.inner.statistics())


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


class RunMismatch(RuntimeError):
    """This trainer cannot take part in the run (another model, other initial weights)."""


def params_of(plan: DilocoRun) -> DilocoParams:
    """The algorithm's settings a signed run fixes."""
    return DilocoParams(
        inner_steps=plan.inner_steps,
        outer_lr=plan.outer_lr,
        outer_momentum=plan.outer_momentum,
        nesterov=plan.nesterov,
        compression=plan.compression,
        inner_lr=plan.inner_lr,
    )


def _hex(address: bytes) -> str:
    return "0x" + address.hex()


def _nothing(event: str, **fields: Any) -> None:
    pass


class DilocoTrainerWork:
    """The rounds of one trainer; `train(peers)` returns once the run's last round is done.

    `inner` takes each round's inner steps; `on_outer(round, θ, contributors)`, when given, is awaited
    each time the trainer holds new outer weights (the start, every round, a resync, a skipped round),
    with the contributions the last round averaged: an RL run publishes θ there as the checkpoint
    workers follow, and settles which of its rollouts were trained into the run.
    """

    def __init__(
        self,
        holdings: Holdings,
        model: torch.nn.Module,
        inner: InnerRound,
        *,
        settings: TrainerSettings = TrainerSettings(),
        emit: Emit | None = None,
        on_outer: OnOuter | None = None,
    ) -> None:
        self.holdings = holdings
        self.plan = holdings.plan
        self.me = holdings.me
        self.params = params_of(self.plan)
        self.inner = inner
        self.compressor = Compressor(self.plan.compression)
        self.settings = settings
        self.emit: Emit = emit or _nothing
        self.on_outer = on_outer
        self.outer: OuterOptimizer | None = None
        self.round = 0
        self.finished = trio.Event()
        self.verdicts: Counter[str] = Counter()
        self.history: list[dict[str, Any]] = []
        self._like = trainable_state(model)  # names and shapes every θ and payload must have

    # --- state -------------------------------------------------------------------------------------

    def theta(self) -> dict[str, torch.Tensor]:
        assert self.outer is not None, "train() first"
        return self.outer.theta()

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

    def _count(self, verdict: ProtocolError, what: str, peer: bytes) -> None:
        self.verdicts[f"{verdict.verdict}:{verdict.reason.name}"] += 1
        self.emit(
            "refused",
            what=what,
            peer=_hex(peer),
            verdict=verdict.verdict,
            reason=verdict.reason.name,
            detail=str(verdict),
        )

    # --- the run -----------------------------------------------------------------------------------

    async def train(self, peers: PeerSource) -> dict[str, torch.Tensor]:
        await self._start(peers)
        while self.round < self.plan.rounds:
            if not await self._play_round(peers):
                await self._resync(peers)
        theta = self.theta()
        self.emit("done", round=self.round, theta=content_digest(theta).hex())
        self.finished.set()
        return theta

    async def _start(self, peers: PeerSource) -> None:
        held, tensors = self.holdings.restore()  # small files; touches trio state, so not in a thread
        if held is not None and tensors is not None:
            self.outer = OuterOptimizer.from_state_dict(tensors, self.params)
            self.round = held.state.message.round
            self.emit("restored", round=self.round, theta=held.state.message.theta.hex())
            if self.on_outer is not None:
                await self.on_outer(self.round, self.outer.theta(), held.state.message.contributors)
        else:
            theta0 = dict(self._like)
            if content_digest(theta0) != self.plan.initial_digest:
                raise RunMismatch("our initial weights are not the ones the run names (initial_digest)")
            self.outer = OuterOptimizer(theta0, self.params)
            self.round = 0
            await self._publish_outer(rules.ZERO_DIGEST, ())
        await self._join(peers)

    async def _publish_outer(self, parent: bytes, contributors: tuple[DilocoEntry, ...]) -> None:
        assert self.outer is not None
        theta = content_digest(self.outer.theta())
        await self.holdings.publish_outer(
            self.round, self.outer.state_dict(), theta=theta, parent=parent, contributors=contributors
        )
        if self.on_outer is not None:
            await self.on_outer(self.round, self.outer.theta(), contributors)

    # --- HTTP --------------------------------------------------------------------------------------

    async def _get(self, endpoint: str, target: str, wait_s: int) -> tuple[int, bytes] | None:
        """Status and body, or None when the peer failed (unreachable, broken answer)."""
        try:
            status, _, body = await self.holdings.client.get(
                endpoint, target, MAX_MESSAGE_BYTES, head_timeout=wait_s + 5
            )
        except (PeerFault, ProtocolError):
            return None
        return status, body

    def _now(self) -> int:
        return self.holdings.clock_ms()

    # --- one round ---------------------------------------------------------------------------------

    async def _play_round(self, peers: PeerSource) -> bool:
        """Play round `self.round`; False when we must leave it and resync."""
        assert self.outer is not None
        r = self.round
        theta = self.outer.theta()
        base = content_digest(theta)
        self.emit("round_start", round=r, theta=base.hex())
        own = self.holdings.contribution(r, self.me)
        if own is None or own.delta is None or own.contribution.message.base != base:
            made = await self._contribute_unless_overtaken(r, theta, base, peers)
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
            self.emit("incomplete", round=r, decided=[_hex(e.trainer) for e in decision])
            return False
        held = [self.holdings.by_digest(r, e) for e in decision]
        deltas = [h.delta for h in held if h is not None and h.delta is not None]
        if len(deltas) != len(decision):
            raise AssertionError("a decided contribution is held without its payload")
        await trio.to_thread.run_sync(self._outer_step, deltas)
        self.holdings.release(r)
        self.round = r + 1
        await self._publish_outer(base, decision)
        self.holdings.prune(self.round)
        new_theta = self.holdings.outer.state.message.theta if self.holdings.outer else b""
        record = {
            "round": r,
            "contributors": [_hex(e.trainer) for e in decision],
            "held": [_hex(e.trainer) for e in entries],
            "voters": sorted(_hex(v) for v in votes),
            "theta": new_theta.hex(),
            "inner_loss": self.inner.statistics()["last_round_mean_loss"],
        }
        self.history.append(record)
        self.emit("round_done", **record)
        return True

    def _outer_step(self, deltas: list[dict[str, torch.Tensor]]) -> None:
        assert self.outer is not None
        self.outer.step(average(deltas))

    async def _contribute_unless_overtaken(
        self, r: int, theta: dict[str, torch.Tensor], base: bytes, peers: PeerSource
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
                made = await self._contribute(r, theta, base)
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

    async def _contribute(self, r: int, theta: dict[str, torch.Tensor], base: bytes) -> HeldContribution:
        inner = await self.inner(r, theta)

        def encode() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
            payload = self.compressor.compress(pseudo_gradient(theta, inner))
            return payload, decompress(payload, self.plan.compression, like=theta)

        payload, delta = await trio.to_thread.run_sync(encode)
        return await self.holdings.publish_contribution(r, base, payload, delta)

    # --- collecting --------------------------------------------------------------------------------

    async def _take(self, r: int, contribution: Contribution, envelope: bytes, sources: list[str]) -> bool:
        """Fetch, load and hold a verified contribution; False (and counted) when its payload is bad."""
        directory = await self.holdings.fetch_contribution(contribution, envelope, sources)
        try:
            delta = await trio.to_thread.run_sync(
                lambda: load_delta(directory, contribution, self.plan.compression, like=self._like)
            )
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

    # --- joining and resync ------------------------------------------------------------------------

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
        self.emit("joined", round=self.round, answered=sorted(_hex(t) for t in answered))
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
        tensors = await self.holdings.fetch_outer(state, [endpoint])
        theta = {k[len(THETA_PREFIX) :]: v for k, v in tensors.items() if k.startswith(THETA_PREFIX)}
        try:
            check_like(theta, self._like, what="outer weights")
            if content_digest(theta) != state.message.theta:
                raise Reject(Reason.BAD_HASH, "outer weights do not hash to the signed θ digest")
            outer = OuterOptimizer.from_state_dict(tensors, self.params)
        except ValueError as exc:
            self._count(Reject(Reason.RULE_VIOLATION, f"outer state: {exc}"), "outer state", state.sender)
            return False
        except ProtocolError as verdict:
            self._count(verdict, "outer state", state.sender)
            return False
        previous = self.round
        self.outer = outer
        self.round = state.message.round
        self.compressor.reset()
        await self._publish_outer(state.message.parent, state.message.contributors)
        self.holdings.prune(self.round)
        self.emit(
            "resync",
            round=self.round,
            previous=previous,
            source=_hex(state.sender),
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
        assert self.outer is not None
        theta = content_digest(self.outer.theta())
        self.round = r + 1
        await self._publish_outer(theta, ())
        self.holdings.prune(self.round)
        self.emit("skipped", round=r, theta=theta.hex())
