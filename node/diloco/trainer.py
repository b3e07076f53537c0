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

What a participant holds, and where, is a `Participant`'s business: one process holds θ, the outer momentum
and every payload whole (`WholeParticipant`); an FSDP2 trainer group deals them over its ranks, which
write and read the signed files themselves (`GroupParticipant`, node/diloco/sharded.py). Their bytes
on the wire are the same kind (a group's payload splits into other files, so its Merkle root is its own),
and both hold the same θ after each outer step.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import torch
import trio

from swarmnode.node.dataplane.errors import CheckpointInvalid, PeerFault
from swarmnode.node.diloco.algorithm import (
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
from swarmnode.node.diloco.holdings import HeldContribution, HeldOuter, Holdings
from swarmnode.node.diloco.payload import load_delta
from swarmnode.node.diloco.sharded import PayloadFiles, ShardedDiloco, outer_keys, stream_theta_digest
from swarmnode.protocol import diloco as rules
from swarmnode.protocol.diloco import Contribution, OuterState
from swarmnode.protocol.envelope import ENVELOPE_OVERHEAD
from swarmnode.protocol.errors import ProtocolError, Reason, Reject
from swarmnode.protocol.messages import DilocoEntry, DilocoOuterState, DilocoRun, ShardInfo

if TYPE_CHECKING:
    from swarmnode.node.trainer.sharded import ShardedGrpoTrainer

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


class Participant(Protocol):
    """Where one DiLoCo participant's outer state and payloads live: whole in this process
    (`WholeParticipant`), or dealt over the ranks of an FSDP2 trainer group (`GroupParticipant`, each rank
    its tensors). The round protocol (`DilocoTrainerWork`) is the same for both; blocking methods are
    called in a thread."""

    def restore(self) -> HeldOuter | None:
        """Our own newest outer state on disk, continued from (blocking); None when there is none."""
        ...

    async def start(self) -> bytes:
        """Take the model's weights as θ_0; their content digest (the run's `initial_digest`)."""
        ...

    def base(self) -> bytes:
        """The content digest of θ: the round's `base`, a published outer state's `theta`."""
        ...

    async def weights(self) -> dict[str, torch.Tensor] | None:
        """θ where this process holds it whole; None for a group (its ranks' model holds it)."""
        ...

    async def begin_inner(self) -> dict[str, torch.Tensor] | None:
        """θ for the inner round to start from; None where the model is set to θ instead (a group)."""
        ...

    def usable(self, held: HeldContribution) -> bool:
        """Whether a contribution we hold can be averaged as it is."""
        ...

    async def contribute(
        self, r: int, base: bytes, trained: dict[str, torch.Tensor] | None
    ) -> HeldContribution:
        """Compress, write and sign our pseudo-gradient for round `r` from the inner round's weights."""
        ...

    def load(self, directory: Path, contribution: Contribution) -> dict[str, torch.Tensor] | None:
        """A fetched contribution's payload (None where it stays on disk); ValueError or CheckpointInvalid
        when it is not a valid payload for the model (blocking)."""
        ...

    def step(self, decided: Sequence[HeldContribution]) -> None:
        """Average the decided contributions and take the outer step (blocking)."""
        ...

    async def publish_outer(
        self, round: int, parent: bytes, contributors: tuple[DilocoEntry, ...]
    ) -> dict[str, torch.Tensor] | None:
        """Publish θ and the outer momentum as our outer state of `round`; θ where this process holds it."""
        ...

    async def adopt(self, state: OuterState, sources: Sequence[str]) -> None:
        """Continue from a peer's outer state: ValueError or ProtocolError (nothing changed) when it is not
        a valid one for the model or its θ does not hash to the signed digest."""
        ...


class WholeParticipant:
    """The participant in one process: θ, the outer momentum and every payload held whole."""

    def __init__(self, holdings: Holdings, model: torch.nn.Module) -> None:
        self.holdings = holdings
        self.plan = holdings.plan
        self.params = params_of(self.plan)
        self.compressor = Compressor(self.plan.compression)
        self.outer: OuterOptimizer | None = None
        self._like = trainable_state(model)  # names and shapes every θ and payload must have

    def _outer(self) -> OuterOptimizer:
        if self.outer is None:
            raise RuntimeError("the participant has no outer state yet (start or restore first)")
        return self.outer

    def restore(self) -> HeldOuter | None:
        held, tensors = self.holdings.restore()
        if held is None or tensors is None:
            return None
        self.outer = OuterOptimizer.from_state_dict(tensors, self.params)
        return held

    async def start(self) -> bytes:
        theta0 = dict(self._like)
        self.outer = OuterOptimizer(theta0, self.params)
        return content_digest(theta0)

    def base(self) -> bytes:
        return content_digest(self._outer().theta())

    async def weights(self) -> dict[str, torch.Tensor]:
        return self._outer().theta()

    async def begin_inner(self) -> dict[str, torch.Tensor]:
        return self._outer().theta()

    def usable(self, held: HeldContribution) -> bool:
        return held.delta is not None

    async def contribute(
        self, r: int, base: bytes, trained: dict[str, torch.Tensor] | None
    ) -> HeldContribution:
        if trained is None:
            raise TypeError("the inner round of a one-process participant must return its weights")
        theta = self._outer().theta()

        def encode() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
            payload = self.compressor.compress(pseudo_gradient(theta, trained))
            return payload, decompress(payload, self.plan.compression, like=theta)

        payload, delta = await trio.to_thread.run_sync(encode)
        return await self.holdings.publish_contribution(r, base, payload, delta)

    def load(self, directory: Path, contribution: Contribution) -> dict[str, torch.Tensor]:
        return load_delta(directory, contribution, self.plan.compression, like=self._like)

    def step(self, decided: Sequence[HeldContribution]) -> None:
        deltas = [h.delta for h in decided if h.delta is not None]
        if len(deltas) != len(decided):
            raise AssertionError("a decided contribution is held without its payload")
        self._outer().step(average(deltas))

    async def publish_outer(
        self, round: int, parent: bytes, contributors: tuple[DilocoEntry, ...]
    ) -> dict[str, torch.Tensor]:
        outer = self._outer()
        theta = content_digest(outer.theta())
        await self.holdings.publish_outer(
            round, outer.state_dict(), theta=theta, parent=parent, contributors=contributors
        )
        return outer.theta()

    async def adopt(self, state: OuterState, sources: Sequence[str]) -> None:
        tensors = await self.holdings.fetch_outer(state, sources)
        theta = {k[len(THETA_PREFIX) :]: v for k, v in tensors.items() if k.startswith(THETA_PREFIX)}
        check_like(theta, self._like, what="outer weights")
        if content_digest(theta) != state.message.theta:
            raise Reject(Reason.BAD_HASH, "outer weights do not hash to the signed θ digest")
        self.outer = OuterOptimizer.from_state_dict(tensors, self.params)
        self.compressor.reset()


class GroupParticipant:
    """The participant as an FSDP2 trainer group (node/diloco/sharded.py), run from rank 0: θ, the
    outer momentum and every payload are dealt over the ranks' files and never whole in this process.

    Payload and outer-state files are written by the ranks straight into our origin's partial directories
    and signed here (`Holdings.publish_*_written`); fetched ones are read by the ranks from the verified
    directories. θ's digest is streamed from the outer-state files, one tensor at a time.
    """

    def __init__(self, holdings: Holdings, group: ShardedDiloco, names: Sequence[str]) -> None:
        self.holdings = holdings
        self.group = group
        self.names = sorted(names)
        self._base: bytes | None = None  # digest of θ; None from the outer step until it is written
        self._written: tuple[int, list[ShardInfo]] | None = None  # an outer state written, not signed
        self._model_is_theta = True  # False once inner steps may have changed the model

    @classmethod
    def start_group(cls, holdings: Holdings, trainer: ShardedGrpoTrainer) -> GroupParticipant:
        """Deal the group model's current weights to its ranks as θ (blocking: a collective)."""
        names = [n for n, p in trainer.policy.model.named_parameters() if p.requires_grad]
        return cls(holdings, ShardedDiloco.start(trainer, params_of(holdings.plan)), names)

    def restore(self) -> HeldOuter | None:
        held, _ = self.holdings.restore(load=False)
        if held is None:
            return None
        self.group.load_outer(held.directory, held.state.manifest.shards)
        self._base, self._model_is_theta = held.state.message.theta, True
        return held

    async def _write_outer(self, round: int) -> bytes:
        partial = await self.holdings.outer_partial(round)
        infos = await trio.to_thread.run_sync(self.group.write_outer, partial, self.holdings.shard_size)
        digest = await trio.to_thread.run_sync(self._theta_digest, partial, infos)
        self._written, self._base = (round, infos), digest
        return digest

    def _theta_digest(self, directory: Path, infos: Sequence[ShardInfo]) -> bytes:
        try:
            files = PayloadFiles(directory, infos)
            files.check_names(outer_keys(self.names), "outer state")
            return stream_theta_digest(files, self.names)
        except CheckpointInvalid as exc:
            raise ValueError(str(exc)) from exc

    async def start(self) -> bytes:
        return await self._write_outer(0)

    def base(self) -> bytes:
        if self._base is None:
            raise RuntimeError("θ after an outer step has no digest until it is published")
        return self._base

    async def weights(self) -> None:
        return None

    async def begin_inner(self) -> None:
        if not self._model_is_theta:  # a round left after its inner steps: they changed the model
            await trio.to_thread.run_sync(self.group.put_theta)
        self._model_is_theta = False
        return None

    def usable(self, held: HeldContribution) -> bool:
        return True  # its files are on disk, verified

    async def contribute(
        self, r: int, base: bytes, trained: dict[str, torch.Tensor] | None
    ) -> HeldContribution:
        if trained is not None:
            raise TypeError("a trainer group's inner round leaves its weights in the ranks' model")
        partial = await self.holdings.contribution_partial(r)
        infos = await trio.to_thread.run_sync(self.group.contribute, partial, self.holdings.shard_size)
        return await self.holdings.publish_contribution_written(r, base, infos)

    def load(self, directory: Path, contribution: Contribution) -> None:
        self.group.check(directory, contribution.manifest.shards)
        return None

    def step(self, decided: Sequence[HeldContribution]) -> None:
        self.group.apply([(h.directory, h.contribution.manifest.shards) for h in decided])
        self._base, self._written, self._model_is_theta = None, None, True

    async def publish_outer(self, round: int, parent: bytes, contributors: tuple[DilocoEntry, ...]) -> None:
        if not self._model_is_theta:  # a skipped round: the model is published next, as θ
            await trio.to_thread.run_sync(self.group.put_theta)
            self._model_is_theta = True
        if self._written is None or self._written[0] != round:
            await self._write_outer(round)
        assert self._written is not None and self._base is not None
        infos, self._written = self._written[1], None
        await self.holdings.publish_outer_written(
            round, infos, theta=self._base, parent=parent, contributors=contributors
        )
        return None

    async def adopt(self, state: OuterState, sources: Sequence[str]) -> None:
        directory = await self.holdings.fetch_outer_files(state, sources)
        infos = state.manifest.shards
        if await trio.to_thread.run_sync(self._theta_digest, directory, infos) != state.message.theta:
            raise Reject(Reason.BAD_HASH, "outer weights do not hash to the signed θ digest")
        await trio.to_thread.run_sync(self.group.load_outer, directory, infos)
        self._base, self._written, self._model_is_theta = state.message.theta, None, True


class DilocoTrainerWork:
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
        settings: TrainerSettings = TrainerSettings(),
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

    async def _publish_outer(self, parent: bytes, contributors: tuple[DilocoEntry, ...]) -> None:
        theta = await self.participant.publish_outer(self.round, parent, contributors)
        if self.on_outer is not None:
            await self.on_outer(self.round, theta, contributors)

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
            self.emit("incomplete", round=r, decided=[_hex(e.trainer) for e in decision])
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
            "contributors": [_hex(e.trainer) for e in decision],
            "held": [_hex(e.trainer) for e in entries],
            "voters": sorted(_hex(v) for v in votes),
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

    # --- collecting --------------------------------------------------------------------------------

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
        theta = self.participant.base()
        self.round = r + 1
        await self._publish_outer(theta, ())
        self.holdings.prune(self.round)
        self.emit("skipped", round=r, theta=theta.hex())
