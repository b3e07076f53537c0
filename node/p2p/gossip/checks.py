"""The message rule of a gossip topic (spec/gossip.md, Validation) and the message id.

Pure: the clock, the replay window and the authority view arrive as arguments. The service
(`node.p2p.gossip.hub`) runs `check_gossip_message` in the pubsub validator hook.
"""

from __future__ import annotations

from libp2p.pubsub.pb import rpc_pb2

from swarmnode.crypto.hashing import sha256
from swarmnode.node.p2p.gossip.authority import AuthorityView, authorise, check_ledger_entry
from swarmnode.node.p2p.gossip.policy import TopicPolicy
from swarmnode.protocol.codec import decode
from swarmnode.protocol.envelope import ENVELOPE_VERSION, Envelope, Opened, ReplayWindow, open_envelope
from swarmnode.protocol.errors import Reason, Reject
from swarmnode.protocol.ledger_messages import LedgerEntry


def _header_passes(header: Envelope, policy: TopicPolicy, run: str) -> bool:
    """The header checks open_envelope makes before the signature (spec/gossip.md, Validation 4-7)."""
    cls = policy.type_map.get(header.type)
    return (
        header.v == ENVELOPE_VERSION
        and cls is not None
        and len(header.body) <= int(cls.MAX_SIZE)  # type: ignore[attr-defined]
        and header.run == run
    )


def check_gossip_message(
    policy: TopicPolicy,
    data: bytes,
    *,
    run: str,
    now_ms: int,
    replay: ReplayWindow | None,
    authority: AuthorityView | None = None,
) -> Opened:
    """The message rule of a topic (spec/gossip.md, Validation), cheapest check first; raises Reject/Ignore.

    Size cap of the topic; then, given `authority`, the claimed signer's authority for the topic, read
    from the envelope header before any signature is verified or body decoded (a forged claim fails the
    signature next); then the signed envelope (version, type carried by the topic, body cap, run,
    signature, canonical body, clock skew, replay); then the topic's body rule (`TopicPolicy.check`: a
    `verdicts` batch is judged whole); then, on `ledger`, the entry's own operation.
    `authority=None` skips both authority checks (the message-rule vectors). Per-sender rates are applied
    after this, by the caller.
    """
    if len(data) > policy.max_bytes:
        raise Reject(Reason.OVERSIZED, f"{len(data)} bytes on {policy.kind}, cap {policy.max_bytes}")
    if authority is not None:
        header = decode(Envelope, data)
        if _header_passes(header, policy, run):  # else open_envelope says why not, as it always did
            authorise(policy.kind, header.sender, header.ts, authority)
    opened = open_envelope(data, run=run, now_ms=now_ms, replay=replay, types=policy.type_map)
    if policy.check is not None:
        policy.check(opened)
    if authority is not None and isinstance(opened.message, LedgerEntry):
        check_ledger_entry(opened.message, authority)
    return opened


def content_id(message: rpc_pb2.Message) -> bytes:
    """Gossip message id: sha256 of the envelope bytes (unique per sender and seq)."""
    return sha256(message.data)
