"""Validator: accepts rollout submissions (SUBMIT), re-checks them on the claimed checkpoint and gossips
signed verdicts (`verdicts`).

Needs: the trainer (checkpoint manifests) and relays (shards to prefill with).
"""

from __future__ import annotations

from typing import ClassVar, Protocol

from libp2p.peer.id import ID

from swarmnode.node.p2p.endpoints import SUBMIT
from swarmnode.node.roles.base import IdleWork, RoleNet, RoleService, RoleWork
from swarmnode.protocol.codec import encode
from swarmnode.protocol.envelope import Opened, envelope_digest
from swarmnode.protocol.errors import Reason
from swarmnode.protocol.messages import SubmitAck


class ValidatorWork(RoleWork, Protocol):
    async def submit(self, peer: ID, submission: Opened, digest: bytes) -> SubmitAck:
        """Queue or refuse a signed submission; `digest` is sha256 of its envelope."""
        ...

    def admits_submitter(self, peer: ID) -> bool:
        """Whether `peer` may open a SUBMIT stream at all (asked before it takes a slot)."""
        ...


class IdleValidatorWork(IdleWork):
    def admits_submitter(self, peer: ID) -> bool:
        return True

    async def submit(self, peer: ID, submission: Opened, digest: bytes) -> SubmitAck:
        return SubmitAck(submission_digest=digest, status=int(Reason.NOT_FOR_US), detail="not validating yet")


class Validator(RoleService):
    ROLE: ClassVar[str] = "validator"
    SUBSCRIBES: ClassVar[tuple[str, ...]] = ("checkpoints", "shards", "verdicts", "ledger")
    NEEDS: ClassVar[tuple[str, ...]] = ("trainer", "relay")

    def __init__(self, work: ValidatorWork | None = None) -> None:
        self.validator_work: ValidatorWork = work if work is not None else IdleValidatorWork()
        super().__init__(self.validator_work)

    def register(self, net: RoleNet) -> None:
        async def on_submit(peer: ID, opened: Opened) -> SubmitAck:
            digest = envelope_digest(encode(opened.envelope))
            return await self.validator_work.submit(peer, opened, digest)

        net.serve(SUBMIT, on_submit, admit=self.validator_work.admits_submitter)
