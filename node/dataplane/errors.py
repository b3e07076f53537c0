"""Typed failures of the data plane, split by whose fault they are.

`PeerFault` subclasses mean the remote side misbehaved or went away: the downloader scores the source
down and tries another. `LocalFault` means our side failed (disk, a bug, our own cancellation): no peer is
blamed. `FailureKind` names each peer fault for scoring and statistics.
"""

from __future__ import annotations

from enum import StrEnum


class FailureKind(StrEnum):
    CONNECT = "connect"  # could not open a connection
    STALL = "stall"  # no byte for stall_timeout
    TRUNCATED = "truncated"  # closed before the announced length
    BAD_RESPONSE = "bad_response"  # malformed HTTP, wrong status, wrong length or range
    BAD_HASH = "bad_hash"  # bytes do not hash to the manifest's digest
    NOT_HELD = "not_held"  # 404 for a shard the source announced
    BUSY = "busy"  # 503: the source is at its connection limit


class DataPlaneError(Exception):
    """Base of every data-plane failure."""


class PeerFault(DataPlaneError):
    """The remote side is at fault (or gone); count it against that source."""

    kind: FailureKind = FailureKind.BAD_RESPONSE

    def __init__(self, endpoint: str, detail: str) -> None:
        super().__init__(f"{self.kind.value} from {endpoint}: {detail}")
        self.endpoint = endpoint
        self.detail = detail


class ConnectFailed(PeerFault):
    kind = FailureKind.CONNECT


class Stalled(PeerFault):
    kind = FailureKind.STALL


class Truncated(PeerFault):
    kind = FailureKind.TRUNCATED


class BadResponse(PeerFault):
    kind = FailureKind.BAD_RESPONSE


class HashMismatch(PeerFault):
    kind = FailureKind.BAD_HASH


class NotHeld(PeerFault):
    kind = FailureKind.NOT_HELD


class Busy(PeerFault):
    kind = FailureKind.BUSY


class LocalFault(DataPlaneError):
    """Our side failed: disk full, a file vanished under us, a checkpoint on disk no longer verifies."""


class CheckpointInvalid(LocalFault):
    """A checkpoint directory does not match its manifest: never load it."""
