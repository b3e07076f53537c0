"""Protocol ids, gossip topics and DHT key namespaces: one place, versioned."""

from __future__ import annotations

PROTOCOL_VERSION = "1.0.0"


def protocol_id(purpose: str) -> str:
    return f"/swarmnode/{purpose}/{PROTOCOL_VERSION}"


HELLO = protocol_id("hello")
PING = protocol_id("ping")
MANIFEST = protocol_id("manifest")
SUBMIT = protocol_id("submit")
LEDGER_SYNC = protocol_id("ledger-sync")
ACCEPTED = protocol_id("accepted")

TOPIC_KINDS = ("checkpoints", "shards", "verdicts", "ledger")


def topic(run: str, kind: str) -> str:
    if kind not in TOPIC_KINDS:
        raise ValueError(f"unknown topic kind {kind!r}; one of {TOPIC_KINDS}")
    return f"swarm/{run}/{kind}"
