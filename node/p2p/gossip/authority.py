"""Who may sign what on each topic (spec/gossip.md, Authority).

py-libp2p's validator hook sees only bytes: authority is ours. Before forwarding, the claimed signer must
have authority for the topic (`authorise`: checkpoint heads from the run's trainer, verdicts from eligible
validators, shard announcements and ledger entries from registered nodes), judged from the envelope
header before the signature is checked (`node.p2p.gossip.checks`), against an `AuthorityView` the runtime
fills. A ledger entry is judged on its own operation too (`check_ledger_entry`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from swarmnode.ledger.errors import LedgerError
from swarmnode.ledger.log import authenticate
from swarmnode.protocol.errors import Ignore, Reason, Reject
from swarmnode.protocol.ledger_messages import LedgerEntry

VIEW_LAG_MS = 30_000
"""How long a registration may take to show in a fresh ledger read (EVM block time and RPC lag included).
A signer outside our view is charged only for a message it signed at least this long before the view
was read: had it been registered when it signed, the view would hold it."""

FORMER_GRACE_MS = 6 * 60_000
"""How long a signer dropped from a ledger set is Ignored rather than Rejected: peers whose views are
older still forward what it signed while it stood (the 5 min clock-skew window, plus a margin)."""


@dataclass(frozen=True)
class LedgerView:
    """What the node last read from its ledger, as sets of addresses (filled by the runtime)."""

    validators: frozenset[bytes]  # registered as validator, not ejected, fully staked
    registered: frozenset[bytes]  # registered in any role, not ejected
    former: Mapping[bytes, int]  # address -> wall ms it left a set, kept for FORMER_GRACE_MS
    as_of_ms: int  # wall clock of the read
    ledger_id: str | None = None  # the signed log's id (None on an EVM ledger: no entries to gossip)


@dataclass(frozen=True)
class AuthorityView:
    """The facts topic authority is judged on. Empty until the runtime learns them."""

    trainer: bytes | None = None  # the run's lead (RunDescriptor.trainer): signs its heads and manifests
    ledger: LedgerView | None = None  # None: the node has no ledger (open mode, spec/gossip.md)


def advance_ledger_view(
    previous: LedgerView | None,
    *,
    validators: frozenset[bytes],
    registered: frozenset[bytes],
    now_ms: int,
    ledger_id: str | None = None,
) -> LedgerView:
    """A new read of the ledger; members that left either set since `previous` enter `former`."""
    former = {} if previous is None else dict(previous.former)
    if previous is not None:
        for address in (previous.validators - validators) | (previous.registered - registered):
            former.setdefault(address, now_ms)
    for address in [a for a, left in former.items() if now_ms - left >= FORMER_GRACE_MS]:
        del former[address]
    for address in validators:  # back in the set it left (ejection, the way out of `registered`, is final)
        former.pop(address, None)
    return LedgerView(validators, registered, MappingProxyType(former), now_ms, ledger_id)


def _member(members: frozenset[bytes], ledger: LedgerView, kind: str, sender: bytes, ts_ms: int) -> None:
    if sender in members:
        return
    who = "0x" + sender.hex()
    if sender in ledger.former:
        raise Ignore(Reason.NOT_FOR_US, f"{kind}: {who} left the ledger set moments ago")
    if ts_ms > ledger.as_of_ms - VIEW_LAG_MS:
        raise Ignore(Reason.NOT_FOR_US, f"{kind}: {who} is not in a ledger view older than its message")
    raise Reject(Reason.UNAUTHORISED, f"{kind}: {who} has no authority on this topic")


def authorise(kind: str, sender: bytes, ts_ms: int, view: AuthorityView) -> None:
    """Whether `sender` may sign messages on topic `kind` (spec/gossip.md, Authority); raises Reject/Ignore.

    `ts_ms` is the envelope's timestamp: it decides whether a signer missing from the ledger view is
    provably unauthorised (Reject 502) or may have registered after the view was read (Ignore 205).
    """
    if kind == "checkpoints":
        if view.trainer is None:
            raise Ignore(Reason.NOT_FOR_US, "checkpoints: the run descriptor is not known yet")
        if sender != view.trainer:
            raise Reject(Reason.UNAUTHORISED, f"checkpoints: 0x{sender.hex()} is not the run's trainer")
        return
    ledger = view.ledger
    if kind == "verdicts":
        if ledger is not None:
            _member(ledger.validators, ledger, kind, sender, ts_ms)
        return
    if kind == "shards":
        if ledger is not None:
            _member(ledger.registered, ledger, kind, sender, ts_ms)
        return
    if kind == "ledger":
        if ledger is None or ledger.ledger_id is None:
            raise Ignore(Reason.NOT_FOR_US, "ledger: this node holds no signed log to judge entries by")
        _member(ledger.registered, ledger, kind, sender, ts_ms)
        return
    raise Ignore(Reason.NOT_FOR_US, f"no authority rule for topic kind {kind!r}")


def check_ledger_entry(entry: LedgerEntry, view: AuthorityView) -> None:
    """A gossiped entry is well-formed: its op is an operation of our ledger, signed by its author."""
    ledger_id = view.ledger.ledger_id if view.ledger is not None else None
    if ledger_id is None:
        raise Ignore(Reason.NOT_FOR_US, "ledger: this node holds no signed log to judge entries by")
    try:
        authenticate(entry.op, ledger_id)
    except LedgerError as exc:
        raise Reject(_ledger_reason(exc), f"ledger entry {entry.index}: {exc.detail}") from None


def _ledger_reason(exc: LedgerError) -> Reason:
    try:
        return Reason(exc.code)
    except ValueError:
        return Reason.MALFORMED_OPERATION
