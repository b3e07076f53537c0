"""Where one DiLoCo participant's outer state and payloads live (spec/diloco.md, Round protocol).

One process holds θ, the outer momentum and every payload whole (`WholeParticipant`); an FSDP2 trainer
group deals them over its ranks, which write and read the signed files themselves (`GroupParticipant`,
node/diloco/sharded.py). Their bytes on the wire are the same kind (a group's payload splits into other
files, so its Merkle root is its own), and both hold the same θ after each outer step. The round protocol
that drives either is `node.diloco.rounds.DilocoTrainerWork`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch
import trio

from swarmnode.node.dataplane.errors import CheckpointInvalid
from swarmnode.node.diloco.algorithm import (
    THETA_PREFIX,
    DilocoParams,
    OuterOptimizer,
    average,
    content_digest,
    pseudo_gradient,
)
from swarmnode.node.diloco.compression import Compressor, decompress
from swarmnode.node.diloco.holdings import HeldContribution, HeldOuter, Holdings
from swarmnode.node.diloco.payload import load_delta
from swarmnode.node.diloco.rank_files import PayloadFiles, outer_keys, stream_theta_digest
from swarmnode.node.diloco.sharded import ShardedDiloco
from swarmnode.node.diloco.weights import check_like, trainable_state
from swarmnode.protocol.diloco import Contribution, OuterState, max_delta_element
from swarmnode.protocol.errors import Reason, Reject
from swarmnode.protocol.messages import DilocoEntry, DilocoRun, ShardInfo

if TYPE_CHECKING:
    from swarmnode.node.trainer.sharded import ShardedGrpoTrainer


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
        bound = max_delta_element(self.plan.inner_steps, self.plan.inner_lr)

        def encode() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
            payload = self.compressor.compress(pseudo_gradient(theta, trained))
            # the bound every peer checks ours against (`load`): averaging our own delta unchecked while
            # they refuse it would leave this trainer's θ different from theirs
            return payload, decompress(payload, self.plan.compression, like=theta, max_abs=bound)

        payload, delta = await trio.to_thread.run_sync(encode)
        return await self.holdings.publish_contribution(r, base, payload, delta)

    def load(self, directory: Path, contribution: Contribution) -> dict[str, torch.Tensor]:
        bound = max_delta_element(self.plan.inner_steps, self.plan.inner_lr)
        return load_delta(directory, contribution, self.plan.compression, like=self._like, max_abs=bound)

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

