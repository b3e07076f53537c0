"""The one `Ledger` interface both backends implement (spec/ledger.md, Interface).

Writes take the author's `NodeIdentity`: the signed log signs an operation envelope with it, the EVM
backend signs a transaction with it. Refusals raise a `ledger.errors.LedgerError` subclass and change
nothing. Queries return the frozen dataclasses of `ledger.types`, equal across backends.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.ledger.batches import CreditProof
from swarmnode.ledger.types import (
    BatchRecord,
    ContributionRecord,
    NodeInfo,
    Params,
    Receipt,
    RunInfo,
    SlashRecord,
    Snapshot,
    StakeInfo,
    WorkerTotal,
)
from swarmnode.protocol.ledger_messages import (
    CommitCredits,
    ComputeSpec,
    RegisterRun,
    SetRunValidators,
    Slash,
)


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

    def register_run(self, identity: NodeIdentity, op: RegisterRun) -> Receipt: ...

    def set_run_validators(self, identity: NodeIdentity, op: SetRunValidators) -> Receipt: ...

    def commit_credits(self, identity: NodeIdentity, op: CommitCredits) -> Receipt: ...

    def slash(self, identity: NodeIdentity, op: Slash) -> Receipt: ...

    def void_slash(self, identity: NodeIdentity, slash_index: int) -> Receipt: ...

    def finalize_slash(self, identity: NodeIdentity, slash_index: int) -> Receipt: ...

    # queries
    def node(self, address: bytes) -> NodeInfo | None: ...

    def nodes(self) -> list[NodeInfo]: ...

    def stake(self, address: bytes) -> StakeInfo | None: ...

    def stakes(self) -> list[StakeInfo]: ...

    def run(self, run: str) -> RunInfo | None: ...

    def runs(self) -> list[RunInfo]: ...

    def batches(self, run: str | None = None) -> list[BatchRecord]: ...

    def contributions(
        self, node: bytes | None = None, run: str | None = None
    ) -> list[ContributionRecord]: ...

    def totals(self, run: str | None = None) -> list[WorkerTotal]: ...

    def is_credited(self, run: str, worker: bytes, step: int) -> bool: ...

    def prove_credit(self, contribution: int) -> CreditProof: ...

    def check_credit_proof(self, proof: CreditProof) -> bool: ...

    def slashes(self, node: bytes | None = None) -> list[SlashRecord]: ...

    def is_eligible(self, address: bytes) -> bool: ...

    def snapshot(self) -> Snapshot: ...

    def close(self) -> None: ...
