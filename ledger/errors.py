"""Typed refusals of ledger operations.

Every refusal names whose fault it is through its class and carries a stable numeric code (the 7xx block
requested for `protocol.errors.Reason`), so a CLI can print it, a peer can be told it, and the conformance
suite can require the same class from both backends. A refused operation never changes the ledger.
"""

from __future__ import annotations


class LedgerError(Exception):
    """Base of every ledger refusal; `code` is stable across backends and releases."""

    code = 700

    def __init__(self, detail: str) -> None:
        super().__init__(f"{type(self).__name__} ({self.code}): {detail}")
        self.detail = detail


class UnknownNode(LedgerError):
    """The named address never registered."""

    code = 701


class AlreadyRegistered(LedgerError):
    code = 702


class NodeEjected(LedgerError):
    """The node was ejected after repeated slashes; it may only withdraw what is left."""

    code = 703


class WrongRole(LedgerError):
    """The node's registered role may not do this (for example a worker recording a contribution)."""

    code = 704


class InsufficientStake(LedgerError):
    code = 705


class InvalidAmount(LedgerError):
    """Zero, above the slash parameter, or not a whole number of gwei."""

    code = 706


class StillUnbonding(LedgerError):
    """Withdrawal before the release epoch: the stake is still slashable."""

    code = 707


class NothingToWithdraw(LedgerError):
    code = 708


class DuplicateContribution(LedgerError):
    code = 709


class InvalidEvidence(LedgerError):
    """A verdict or slash evidence that does not prove what the operation claims."""

    code = 710


class DuplicateSlash(LedgerError):
    code = 711


class BadSignature(LedgerError):
    """An operation envelope whose signature is malformed or does not match its sender (a forgery)."""

    code = 712


class ReplayedOperation(LedgerError):
    """An operation whose author nonce was already used (a replay of a signed operation or transaction)."""

    code = 713


class EpochRegression(LedgerError):
    """An entry stamped with an epoch earlier than the log's current one."""

    code = 714


class WrongLedger(LedgerError):
    """An operation signed for another ledger id, or a log file of another ledger."""

    code = 715


class MalformedOperation(LedgerError):
    """Bytes that do not decode as a canonical ledger operation."""

    code = 716


class UnknownRun(LedgerError):
    """A run-scoped operation names a run nobody registered."""

    code = 717


class RunExists(LedgerError):
    code = 718


class NotRunOwner(LedgerError):
    """Only the key that registered a run may change it or void its slashes outright."""

    code = 719


class NotRunValidator(LedgerError):
    """Credits, slashes and void votes in a run come only from the validators its owner named."""

    code = 721


class ExceedsRunBounds(LedgerError):
    """A credit above the run's limits (tokens per credit, flops per token)."""

    code = 722


class PeerIdMismatch(LedgerError):
    """A registration whose peer id is not derived from the registering key."""

    code = 723


class SlashNotPending(LedgerError):
    """No such slash, or it was already finalized or voided."""

    code = 724


class ChallengeWindowOpen(LedgerError):
    """A slash finalized before its challenge window ended."""

    code = 725


class ChallengeWindowClosed(LedgerError):
    """A void or a vote after the slash's challenge window ended."""

    code = 726


class AlreadyVoted(LedgerError):
    code = 727


class SlashPending(LedgerError):
    """A withdrawal while a slash against (or by) the node waits in its challenge window."""

    code = 728


class CorruptLog(LedgerError):
    """A stored log that fails its audit; `index` is the first bad entry (None: the header itself)."""

    code = 720

    def __init__(self, index: int | None, detail: str) -> None:
        where = "log header" if index is None else f"entry {index}"
        super().__init__(f"{where}: {detail}")
        self.index = index


class TruncatedLog(CorruptLog):
    """A stored log with fewer entries than its signed head counts; `index` is the first missing entry."""


class BackendError(LedgerError):
    """The backend failed for a reason outside the state machine (RPC down, transaction dropped)."""

    code = 730


ERRORS_BY_CODE: dict[int, type[LedgerError]] = {
    cls.code: cls
    for cls in (
        UnknownNode,
        AlreadyRegistered,
        NodeEjected,
        WrongRole,
        InsufficientStake,
        InvalidAmount,
        StillUnbonding,
        NothingToWithdraw,
        DuplicateContribution,
        InvalidEvidence,
        DuplicateSlash,
        BadSignature,
        ReplayedOperation,
        EpochRegression,
        WrongLedger,
        MalformedOperation,
        UnknownRun,
        RunExists,
        NotRunOwner,
        NotRunValidator,
        ExceedsRunBounds,
        PeerIdMismatch,
        SlashNotPending,
        ChallengeWindowOpen,
        ChallengeWindowClosed,
        AlreadyVoted,
        SlashPending,
    )
}
