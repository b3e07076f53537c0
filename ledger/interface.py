"""The one `Ledger` interface both backends implement (spec/ledger.md, Interface).

Writes take the author's `NodeIdentity`: the signed log signs an operation envelope with it, the EVM
backend signs a transaction with it. Refusals raise a `ledger.errors.LedgerError` subclass and change
nothing. Queries return the frozen dataclasses of `ledger.types`, equal across backends.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from crypto.identity import NodeIdentity
from ledger.types import ContributionRecord, NodeInfo, Params, Receipt, SlashRecord, Snapshot, StakeInfo
from protocol.ledger_messages import ComputeSpec, RecordContribution, Slash


@runtime_checkable
class Ledger(Protocol):
    @property
    def params(self) -> Params: ...

    def current_epoch(self) -> int: ...

    # writes
    def register(
        self, identity: NodeIdentity, role: str, compute: ComputeSpec, peer_id: str | None = None
    ) -> Receipt: ...

    def deposit(self, identity: NodeIdentity, amount_gwei: int) -> Receipt: ...

    def unbond(self, identity: NodeIdentity, amount_gwei: int) -> Receipt: ...

    def withdraw(self, identity: NodeIdentity) -> Receipt: ...

    def record_contribution(self, identity: NodeIdentity, op: RecordContribution) -> Receipt: ...

    def slash(self, identity: NodeIdentity, op: Slash) -> Receipt: ...

    # queries
    def node(self, address: bytes) -> NodeInfo | None: ...

    def nodes(self) -> list[NodeInfo]: ...

    def stake(self, address: bytes) -> StakeInfo | None: ...

    def stakes(self) -> list[StakeInfo]: ...

    def contributions(
        self, node: bytes | None = None, run: str | None = None
    ) -> list[ContributionRecord]: ...

    def slashes(self, node: bytes | None = None) -> list[SlashRecord]: ...

    def is_eligible(self, address: bytes) -> bool: ...

    def snapshot(self) -> Snapshot: ...

    def close(self) -> None: ...
