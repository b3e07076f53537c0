"""Every request/response protocol a node speaks, with its limits and who serves it: the one table.

The protocol ids are `protocol.ids`'; the message types and size caps are spec/messages.md's; the serving
limits (`max_inbound` streams handled at once, `max_per_peer`) bound what one peer can hold of a node
(spec/bounds.md). A role serves its endpoints (`RoleNet.serve`) and calls the others' by these specs, so no
role imports another role's module to talk to it.

| spec | served by | request -> response | timeout | limits |
| --- | --- | --- | --- | --- |
| HELLO | every node | Hello -> Hello | 5 s | default |
| PING | every node | Ping -> Pong | 5 s | default |
| SUBMIT | validators | RolloutSubmission -> SubmitAck | 60 s | 4 at once, 2 per peer |
| ACCEPTED | validators | AcceptedRequest -> AcceptedBatch (long poll) | 45 s | 32 at once, 2 per peer |
| MANIFEST | the lead trainer | ManifestRequest -> ManifestResponse | 10 s | default |
"""

from __future__ import annotations

from swarmnode.node.p2p.reqresp import ProtocolSpec
from swarmnode.protocol import ids
from swarmnode.protocol.messages import (
    AcceptedBatch,
    AcceptedRequest,
    Hello,
    ManifestRequest,
    ManifestResponse,
    Ping,
    Pong,
    RolloutSubmission,
    SubmitAck,
)

HELLO = ProtocolSpec(ids.HELLO, Hello, Hello, timeout=5.0)
PING = ProtocolSpec(ids.PING, Ping, Pong, timeout=5.0)
# Submissions are large (up to 16 MiB): at most 4 are handled at once, 2 streams per peer, 8 streams in all
# (about 128 MiB buffered); a sender whose stake was read as too low is refused before its frame is read.
SUBMIT = ProtocolSpec(ids.SUBMIT, RolloutSubmission, SubmitAck, timeout=60.0, max_inbound=4, max_per_peer=2)
# The trainer pulls accepted submissions from each validator with this (long poll, cursor). Long polls hold
# a serving slot up to 30 s: room for every trainer of a run (a lead and up to 15 co-trainers) and two
# streams each; others are refused before their frame is read (`admit`).
ACCEPTED = ProtocolSpec(
    ids.ACCEPTED, AcceptedRequest, AcceptedBatch, timeout=45.0, max_inbound=32, max_per_peer=2
)
MANIFEST = ProtocolSpec(ids.MANIFEST, ManifestRequest, ManifestResponse, timeout=10.0)
