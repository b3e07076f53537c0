"""What a DiLoCo trainer holds and serves: contributions (its own and fetched), its votes, its outer state.

Shards live in the data plane's stores, one store namespace per (trainer, kind): contributions of trainer i
under run id `<run>.t<i>`, its outer states under `<run>.o<i>`, version = round (protocol.diloco; each a
`Namespace`, node/diloco/namespace.py). Our own are written by an `Origin` (sharded safetensors, signed
manifest); fetched ones by a `Downloader` that verifies every shard against the author's signed manifest, so a
fetched contribution is served again as soon as it is whole, and any trainer holding it can stand in for its
author. Our own signed messages are kept on disk under `messages/`, so a restarted trainer serves and reuses
them instead of signing a second, different contribution for a round.

Long polls (`wait_changed`) follow the `Catalog` pattern: one `trio.Event` swapped on every change.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import trio

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.node.dataplane.checkpoint import load_checkpoint, verify_file
from swarmnode.node.dataplane.downloader import DownloadConfig
from swarmnode.node.dataplane.errors import CheckpointInvalid
from swarmnode.node.dataplane.http_client import HttpClient
from swarmnode.node.dataplane.origin import Origin, Sealer
from swarmnode.node.diloco.namespace import Namespace
from swarmnode.node.diloco.payload import load_delta
from swarmnode.node.p2p.clock import wall_ms
from swarmnode.protocol.diloco import (
    KEEP_ROUNDS,
    Contribution,
    OuterState,
    contribution_namespace,
    is_round_retained,
    outer_namespace,
    plan_digest,
    trainer_index,
    verify_contribution,
    verify_outer_state,
)
from swarmnode.protocol.envelope import envelope_digest
from swarmnode.protocol.errors import ProtocolError
from swarmnode.protocol.messages import (
    CheckpointManifest,
    DilocoContribution,
    DilocoEntry,
    DilocoOuterState,
    DilocoRun,
    DilocoVote,
    ShardInfo,
)
from swarmnode.protocol.types import MIB

log = logging.getLogger(__name__)

MESSAGES_DIR = "messages"



@dataclass
class HeldContribution:
    contribution: Contribution
    envelope: bytes
    directory: Path
    delta: dict[str, torch.Tensor] | None  # the decompressed payload; dropped once the round is averaged

    def entry(self) -> DilocoEntry:
        return self.contribution.entry()


@dataclass
class HeldOuter:
    state: OuterState
    envelope: bytes
    directory: Path


class Holdings:
    """The served state of one trainer of one DiLoCo run (blocking file work is small or in threads)."""

    def __init__(
        self,
        root: Path,
        identity: NodeIdentity,
        plan: DilocoRun,
        plan_envelope: bytes,
        *,
        client: HttpClient | None = None,
        shard_size: int = 8 * MIB,
        download: DownloadConfig | None = None,
        keep_rounds: int = KEEP_ROUNDS,
        clock_ms: Callable[[], int] = wall_ms,
    ) -> None:
        self.root = Path(root)
        self.identity = identity
        self.me = identity.address
        self.plan = plan
        self.plan_envelope = plan_envelope
        self.plan_digest = plan_digest(plan)
        self.index = trainer_index(plan, self.me)
        self.client = client or HttpClient()
        self.shard_size = shard_size
        self.download = download or DownloadConfig()
        self.keep_rounds = keep_rounds
        self.clock_ms = clock_ms
        self.seal = Sealer(identity, plan.run, clock_ms)
        self.namespaces: dict[str, Namespace] = {}
        self.contributions: dict[int, dict[bytes, HeldContribution]] = {}
        self.votes: dict[int, bytes] = {}
        self.outer: HeldOuter | None = None
        self.endpoint = ""
        self._changed = trio.Event()
        self._origins: dict[str, Origin] = {}
        (self.root / MESSAGES_DIR).mkdir(parents=True, exist_ok=True)

    # --- namespaces --------------------------------------------------------------------------------

    def namespace(self, name: str) -> Namespace:
        ns = self.namespaces.get(name)
        if ns is None:
            ns = Namespace(
                self.root, name, Sealer(self.identity, name, self.clock_ms), self.client, self.download
            )
            ns.service.endpoint = self.endpoint
            self.namespaces[name] = ns
        return ns

    def _origin(self, name: str) -> Origin:
        origin = self._origins.get(name)
        if origin is None:
            ns = self.namespace(name)
            origin = Origin(
                Sealer(self.identity, name, self.clock_ms),
                ns.store,
                ns.catalog,
                shard_size=self.shard_size,
                async_level=self.keep_rounds,
                clock_ms=self.clock_ms,
            )
            self._origins[name] = origin
        return origin

    def set_endpoint(self, endpoint: str) -> None:
        self.endpoint = endpoint
        for ns in self.namespaces.values():
            ns.service.endpoint = endpoint

    # --- change notification -----------------------------------------------------------------------

    def _touch(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_changed(self) -> None:
        await self._changed.wait()

    # --- queries -----------------------------------------------------------------------------------

    def contribution(self, round: int, trainer: bytes) -> HeldContribution | None:
        return self.contributions.get(round, {}).get(trainer)

    def entries(self, round: int) -> tuple[DilocoEntry, ...]:
        """What we hold for `round`, ascending by author: the body of our vote."""
        held = self.contributions.get(round, {})
        return tuple(held[t].entry() for t in sorted(held))

    def by_digest(self, round: int, entry: DilocoEntry) -> HeldContribution | None:
        held = self.contribution(round, entry.trainer)
        return held if held is not None and held.contribution.digest == entry.digest else None

    def statistics(self) -> dict[str, object]:
        return {
            "endpoint": self.endpoint,
            "trainer_index": self.index,
            "contributions": {
                str(r): sorted("0x" + t.hex() for t in held) for r, held in self.contributions.items()
            },
            "votes": sorted(self.votes),
            "outer_round": None if self.outer is None else self.outer.state.message.round,
            "namespaces": {name: ns.catalog.statistics() for name, ns in self.namespaces.items()},
        }

    # --- our own messages --------------------------------------------------------------------------

    def _message_file(self, kind: str, round: int) -> Path:
        return self.root / MESSAGES_DIR / f"{kind}-{round}.msgpack"

    def _persist(self, kind: str, round: int, envelope: bytes) -> None:
        path = self._message_file(kind, round)
        tmp = path.with_name(path.name + ".part")
        tmp.write_bytes(envelope)
        os.replace(tmp, path)

    async def _fresh_version(self, name: str, round: int) -> Namespace:
        """The namespace `name`, with versions from `round` on dropped: written for another lineage before
        a restart or a resync, they are never served again."""
        ns = self.namespace(name)
        stale = [v for v in ns.catalog.versions() if v >= round]
        if stale:
            await trio.to_thread.run_sync(ns.drop, stale)
        return ns

    async def publish_contribution(
        self, round: int, base: bytes, payload: Mapping[str, torch.Tensor], delta: dict[str, torch.Tensor]
    ) -> HeldContribution:
        """Write our compressed payload as version `round` of our contribution namespace and sign it."""
        name = contribution_namespace(self.plan.run, self.index)
        await self._fresh_version(name, round)
        manifest, manifest_envelope = await self._origin(name).publish(
            payload,
            version=round,
            parent_version=max(round - 1, 0),
            model_config_hash=self.plan.model_config_hash,
        )
        return self._sign_contribution(round, base, manifest, manifest_envelope, delta)

    async def contribution_partial(self, round: int) -> Path:
        """An empty directory for the files of our contribution to `round` that a trainer group writes
        itself (`publish_contribution_written` signs them)."""
        return await self._empty_partial(contribution_namespace(self.plan.run, self.index), round)

    async def publish_contribution_written(
        self, round: int, base: bytes, shards: Sequence[ShardInfo]
    ) -> HeldContribution:
        """Sign our contribution to `round` whose files the ranks wrote into `contribution_partial(round)`;
        held without a loaded payload (the ranks read their tensors from the files)."""
        name = contribution_namespace(self.plan.run, self.index)
        manifest, manifest_envelope = await self._origin(name).publish_written(
            version=round,
            parent_version=max(round - 1, 0),
            model_config_hash=self.plan.model_config_hash,
            shards=shards,
        )
        return self._sign_contribution(round, base, manifest, manifest_envelope, None)

    def _sign_contribution(
        self,
        round: int,
        base: bytes,
        manifest: CheckpointManifest,
        manifest_envelope: bytes,
        delta: dict[str, torch.Tensor] | None,
    ) -> HeldContribution:
        message = DilocoContribution(
            run=self.plan.run,
            round=round,
            trainer=self.me,
            plan=self.plan_digest,
            base=base,
            compression=self.plan.compression,
            merkle_root=manifest.merkle_root,
            manifest=manifest_envelope,
        )
        envelope = self.seal(message)
        self._persist("contribution", round, envelope)
        contribution = Contribution(self.me, message, manifest, envelope_digest(envelope))
        ns = self.namespace(contribution_namespace(self.plan.run, self.index))
        held = HeldContribution(contribution, envelope, ns.store.complete_dir(round), delta)
        self.hold(round, held)
        return held

    def publish_vote(self, round: int, base: bytes, entries: tuple[DilocoEntry, ...]) -> bytes:
        envelope = self.seal(DilocoVote(self.plan.run, round, self.plan_digest, base, entries))
        self.votes[round] = envelope
        self._touch()
        return envelope

    async def publish_outer(
        self,
        round: int,
        state: Mapping[str, torch.Tensor],
        *,
        theta: bytes,
        parent: bytes,
        contributors: tuple[DilocoEntry, ...],
    ) -> HeldOuter:
        """Write θ and the outer momentum as version `round` of our outer namespace and sign them."""
        name = outer_namespace(self.plan.run, self.index)
        await self._fresh_version(name, round)
        manifest, manifest_envelope = await self._origin(name).publish(
            state,
            version=round,
            parent_version=max(round - 1, 0),
            model_config_hash=self.plan.model_config_hash,
        )
        return self._sign_outer(round, manifest, manifest_envelope, theta, parent, contributors)

    async def outer_partial(self, round: int) -> Path:
        """An empty directory for the files of our outer state of `round` that a trainer group writes
        itself (`publish_outer_written` signs them)."""
        return await self._empty_partial(outer_namespace(self.plan.run, self.index), round)

    async def _empty_partial(self, name: str, round: int) -> Path:
        ns = await self._fresh_version(name, round)
        await trio.to_thread.run_sync(ns.store.remove, [round])
        return ns.store.partial_dir(round)

    async def publish_outer_written(
        self,
        round: int,
        shards: Sequence[ShardInfo],
        *,
        theta: bytes,
        parent: bytes,
        contributors: tuple[DilocoEntry, ...],
    ) -> HeldOuter:
        """Sign our outer state of `round` whose files the ranks wrote into `outer_partial(round)`."""
        origin = self._origin(outer_namespace(self.plan.run, self.index))
        manifest, manifest_envelope = await origin.publish_written(
            version=round,
            parent_version=max(round - 1, 0),
            model_config_hash=self.plan.model_config_hash,
            shards=shards,
        )
        return self._sign_outer(round, manifest, manifest_envelope, theta, parent, contributors)

    def _sign_outer(
        self,
        round: int,
        manifest: CheckpointManifest,
        manifest_envelope: bytes,
        theta: bytes,
        parent: bytes,
        contributors: tuple[DilocoEntry, ...],
    ) -> HeldOuter:
        message = DilocoOuterState(
            run=self.plan.run,
            round=round,
            plan=self.plan_digest,
            theta=theta,
            parent=parent,
            contributors=contributors,
            merkle_root=manifest.merkle_root,
            manifest=manifest_envelope,
        )
        envelope = self.seal(message)
        self._persist("outer", round, envelope)
        ns = self.namespace(outer_namespace(self.plan.run, self.index))
        held = HeldOuter(
            OuterState(self.me, message, manifest, envelope_digest(envelope)),
            envelope,
            ns.store.complete_dir(round),
        )
        self.outer = held
        self._touch()
        return held

    # --- what others contributed -------------------------------------------------------------------

    def hold(self, round: int, held: HeldContribution) -> None:
        self.contributions.setdefault(round, {})[held.contribution.sender] = held
        self._touch()

    async def fetch_contribution(
        self, contribution: Contribution, envelope: bytes, sources: Iterable[str]
    ) -> Path:
        """Download a verified contribution's shards (resumable, from any of `sources`); not yet held."""
        index = trainer_index(self.plan, contribution.sender)
        ns = self.namespace(contribution_namespace(self.plan.run, index))
        return await ns.fetch(contribution.manifest, contribution.message.manifest, sources)

    async def fetch_outer(self, state: OuterState, sources: Iterable[str]) -> dict[str, torch.Tensor]:
        """Download and load another trainer's outer state (θ, momentum, step)."""
        directory = await self.fetch_outer_files(state, sources)
        return await trio.to_thread.run_sync(load_checkpoint, directory, state.manifest)

    async def fetch_outer_files(self, state: OuterState, sources: Iterable[str]) -> Path:
        """Download another trainer's outer state; its verified directory (a trainer group reads it)."""
        index = trainer_index(self.plan, state.sender)
        ns = self.namespace(outer_namespace(self.plan.run, index))
        return await ns.fetch(state.manifest, state.message.manifest, sources)

    def release(self, round: int) -> None:
        """Drop the decompressed payloads of an averaged round (the signed files stay, for serving)."""
        for held in self.contributions.get(round, {}).values():
            held.delta = None

    def prune(self, current: int) -> None:
        """Forget contributions and votes of rounds no longer retained, and fetched files with them."""
        old = [r for r in self.contributions if not is_round_retained(r, current, self.keep_rounds)]
        for round in old:
            for trainer in self.contributions.pop(round):
                if trainer == self.me:
                    continue
                ns = self.namespace(contribution_namespace(self.plan.run, trainer_index(self.plan, trainer)))
                ns.drop([round])
        for round in [r for r in self.votes if not is_round_retained(r, current, self.keep_rounds)]:
            del self.votes[round]
        for index, trainer in enumerate(self.plan.trainers):
            adopted = self.namespaces.get(outer_namespace(self.plan.run, index))
            if adopted is not None and trainer != self.me:  # only needed while loading it
                adopted.drop([v for v in adopted.catalog.versions() if v < current])

    # --- restart -----------------------------------------------------------------------------------

    def restore(self, *, load: bool = True) -> tuple[HeldOuter | None, dict[str, torch.Tensor] | None]:
        """Pick up our own signed messages from disk (blocking; before serving).

        Contributions come back into the holdings (re-served; reused for their round instead of signing
        another). The newest outer state that still verifies comes back with its tensors. A trainer group
        (`load=False`) loads no tensors here, neither payloads nor outer state, only checks every file
        against its manifest: its ranks read their own tensors from the files.
        """
        now = self.clock_ms()
        files = sorted((self.root / MESSAGES_DIR).glob("*.msgpack"))
        outers: list[tuple[int, bytes]] = []
        for path in files:
            kind, _, round_text = path.stem.partition("-")
            if not round_text.isdigit():
                continue
            envelope = path.read_bytes()
            if kind == "outer":
                outers.append((int(round_text), envelope))
            elif kind == "contribution":
                self._restore_contribution(int(round_text), envelope, now, load)
        for round, envelope in sorted(outers, reverse=True):
            try:
                state = verify_outer_state(envelope, plan=self.plan, digest=self.plan_digest, now_ms=now)
                if state.sender != self.me or state.message.round != round:
                    continue
                ns = self.namespace(outer_namespace(self.plan.run, self.index))
                directory = ns.store.complete_dir(round)
                tensors = _load_or_verify(directory, state.manifest, load)
            except (ProtocolError, CheckpointInvalid) as exc:
                log.warning("own outer state of round %d does not verify: %s", round, exc)
                continue
            ns.catalog.add(state.manifest, state.message.manifest, range(len(state.manifest.shards)))
            self.outer = HeldOuter(state, envelope, directory)
            return self.outer, tensors
        return None, None

    def _restore_contribution(self, round: int, envelope: bytes, now: int, load: bool) -> None:
        try:
            contribution = verify_contribution(
                envelope, plan=self.plan, digest=self.plan_digest, round=round, now_ms=now
            )
            if contribution.sender != self.me:
                return
            ns = self.namespace(contribution_namespace(self.plan.run, self.index))
            directory = ns.store.complete_dir(round)
            delta = None
            if load:
                delta = load_delta(directory, contribution, self.plan.compression, like=None)
            else:
                _load_or_verify(directory, contribution.manifest, load)
        except (ProtocolError, CheckpointInvalid, ValueError) as exc:
            log.warning("own contribution of round %d does not verify: %s", round, exc)
            return
        ns.catalog.add(
            contribution.manifest, contribution.message.manifest, range(len(contribution.manifest.shards))
        )
        self.hold(round, HeldContribution(contribution, envelope, directory, delta))


def _load_or_verify(
    directory: Path, manifest: CheckpointManifest, load: bool
) -> dict[str, torch.Tensor] | None:
    """The tensors of a verified directory, or (`load=False`) None once every file matches its hash."""
    if load:
        return load_checkpoint(directory, manifest)
    for info in manifest.shards:
        verify_file(directory, info)
    return None
