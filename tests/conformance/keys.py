"""Deterministic keys and fixtures for conformance vectors: vectors must be byte-stable."""

from __future__ import annotations

from swarmnode.crypto.hashing import sha256
from swarmnode.crypto.identity import NodeIdentity


def vector_identity(n: int) -> NodeIdentity:
    return NodeIdentity(sha256(f"swarmnode-vector-key-{n}".encode()))


RUN = "vector-run"
NOW_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
