"""GossipSub on the run's topics, with our validation in the pubsub hook and our own bounded queues.

py-libp2p's pubsub (site-packages/libp2p/pubsub) drops, leaks and spends CPU in ways a swarm at load
cannot live with; each module's docstring says what py-libp2p does there by default (file:line) and
what we do instead. One concern per module:

- `policy`: what each topic carries, its caps and rates (`TopicPolicy`, `DEFAULT_POLICIES`), and the
  router's settings (`GossipSettings`).
- `authority`: who may sign what on each topic, judged against the ledger view the runtime fills
  (`LedgerView`, `AuthorityView`, `authorise`, `check_ledger_entry`; spec/gossip.md, Authority).
- `checks`: the message rule of a topic, cheapest check first (`check_gossip_message`), and the message
  id (`content_id`; spec/gossip.md, Validation).
- `outbound`: a peer's outbound queue, batching and counted (`BatchingRpcQueue`, `CountingGossipSub`).
- `pubsub`: py-libp2p's Pubsub fixed for load: whole-frame reads (`take_frames`), serial writes, a
  peer-record cache, direct delivery (`SerialPubsub`, `GossipPubsub`).
- `hub`: the node's `Gossip` (validation hook, delivery queues, publish back-pressure, statistics).

Import from here: `from node.p2p.gossip import Gossip, Delivery, ...` is the public surface.
"""

from swarmnode.node.p2p.gossip.authority import (
    FORMER_GRACE_MS,
    VIEW_LAG_MS,
    AuthorityView,
    LedgerView,
    advance_ledger_view,
    authorise,
    check_ledger_entry,
)
from swarmnode.node.p2p.gossip.checks import check_gossip_message, content_id
from swarmnode.node.p2p.gossip.hub import Delivery, Gossip, Observer, TopicStats
from swarmnode.node.p2p.gossip.outbound import (
    OUTBOUND_BATCH_BYTES,
    OUTBOUND_QUEUE_RPCS,
    BatchingRpcQueue,
    CountingGossipSub,
    publish_size,
)
from swarmnode.node.p2p.gossip.policy import (
    DEFAULT_POLICIES,
    MAX_GOSSIP_ENVELOPE,
    GossipSettings,
    TopicPolicy,
)
from swarmnode.node.p2p.gossip.pubsub import (
    MAX_VARINT_BYTES,
    READ_CHUNK,
    RECORD_RECHECK_S,
    GossipPubsub,
    SerialPubsub,
    take_frames,
)

__all__ = [
    "DEFAULT_POLICIES",
    "FORMER_GRACE_MS",
    "MAX_GOSSIP_ENVELOPE",
    "MAX_VARINT_BYTES",
    "OUTBOUND_BATCH_BYTES",
    "OUTBOUND_QUEUE_RPCS",
    "READ_CHUNK",
    "RECORD_RECHECK_S",
    "VIEW_LAG_MS",
    "AuthorityView",
    "BatchingRpcQueue",
    "CountingGossipSub",
    "Delivery",
    "Gossip",
    "GossipPubsub",
    "GossipSettings",
    "LedgerView",
    "Observer",
    "SerialPubsub",
    "TopicPolicy",
    "TopicStats",
    "advance_ledger_view",
    "authorise",
    "check_gossip_message",
    "check_ledger_entry",
    "content_id",
    "publish_size",
    "take_frames",
]
