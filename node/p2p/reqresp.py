"""Request/response over libp2p streams: one signed envelope each way, length-prefixed, always timed.

Frame: `u32 big-endian length || envelope bytes`. The length is checked against the protocol's cap
*before* anything is read, so a peer cannot make us buffer more than one message worth of bytes; every
read and write runs under a deadline (py-libp2p itself puts no timeout on stream I/O).

Inbound admission, in order (spec/wire.md, "Request/response limits"): a banned peer's stream is
reset; an `admit` predicate (role, stake) may refuse the peer; a stream slot is taken, at most
`max_per_peer` per peer and `max_streams` in total per protocol, so one peer never holds them all;
the request frame must arrive within `read_timeout + length / min_read_rate` (the length prefix
within `read_timeout`), so a slow-loris sender is cut and its slot freed; the envelope is opened
(size, header, signature, clock, replay, then the body); only then is a serving slot (`max_inbound`
in total) taken for the handler. Refusals reset the stream without charging the peer and are
counted in `statistics()`.

A stream carries exactly one request and one response, then closes. Faults are typed: `Reject` from the
envelope or the handler charges the peer through the `PeerGuard`; `Ignore` drops the stream without
blame; `RequestFailed` subclasses tell a caller whose fault a failed request was.
"""

from __future__ import annotations

import logging
import struct
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import trio
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.node.p2p.clock import SeqCounter, wall_ms
from swarmnode.node.p2p.host import TRANSPORT_ERRORS
from swarmnode.node.p2p.ratelimit import Slots
from swarmnode.node.p2p.scoring import Fault, PeerGuard
from swarmnode.protocol.envelope import ENVELOPE_OVERHEAD, Opened, ReplayWindow, open_envelope, seal
from swarmnode.protocol.errors import Ignore, ProtocolError, Reject

log = logging.getLogger(__name__)

LENGTH_PREFIX = struct.Struct(">I")
READ_TIMEOUT_S = 5.0  # the length prefix must arrive within this; the body within it plus length / rate
MIN_READ_RATE = 256 * 1024  # bytes/s a request body must arrive at, at least (cuts slow-loris senders)
WRITE_TIMEOUT_S = 5.0
MAX_INBOUND_PER_PROTOCOL = 32  # requests being handled at once, per protocol (after authentication)
MAX_PER_PEER = 2  # streams one peer may hold open at once on one protocol (reading or being served)
STREAMS_PER_SERVING_SLOT = 2  # max_streams defaults to this x max_inbound (frames being read + served)
STREAM_ERRORS: tuple[type[BaseException], ...] = (EOFError, *TRANSPORT_ERRORS)


class ByteStream(Protocol):
    """What framing needs from a stream (a libp2p INetStream, or a test adapter)."""

    async def read(self, n: int | None = None) -> bytes: ...

    async def write(self, data: bytes) -> None: ...


class FrameError(Exception):
    """The peer broke framing: a length over the cap, or the stream ended inside a frame."""


async def read_exact(stream: ByteStream, n: int) -> bytes:
    buffer = bytearray()
    while len(buffer) < n:
        try:
            chunk = await stream.read(n - len(buffer))
        except EOFError:
            chunk = b""
        if not chunk:
            if buffer:
                raise FrameError(f"stream ended after {len(buffer)} of {n} bytes")
            raise EOFError("stream ended before a frame")
        buffer += chunk
    return bytes(buffer)


async def read_frame(stream: ByteStream, *, max_size: int) -> bytes:
    """One frame, or FrameError / EOFError. Callers bound it with `trio.fail_after` (every call site does)."""
    (length,) = LENGTH_PREFIX.unpack(await read_exact(stream, LENGTH_PREFIX.size))
    if length > max_size:
        raise FrameError(f"frame of {length} bytes exceeds the cap of {max_size}")
    if length == 0:
        raise FrameError("empty frame")
    return await read_exact(stream, length)


async def read_request_frame(stream: ByteStream, *, max_size: int, grace: float, min_rate: float) -> bytes:
    """One frame from an untrusted peer, or FrameError / EOFError / trio.TooSlowError: the length
    prefix within `grace` seconds of the call, the whole frame by `grace + length / min_rate`."""
    deadline = trio.current_time() + grace
    with trio.fail_at(deadline):
        (length,) = LENGTH_PREFIX.unpack(await read_exact(stream, LENGTH_PREFIX.size))
    if length > max_size:
        raise FrameError(f"frame of {length} bytes exceeds the cap of {max_size}")
    if length == 0:
        raise FrameError("empty frame")
    with trio.fail_at(deadline + length / min_rate):
        return await read_exact(stream, length)


async def write_frame(stream: ByteStream, data: bytes) -> None:
    await stream.write(LENGTH_PREFIX.pack(len(data)) + data)


@dataclass(frozen=True)
class ProtocolSpec:
    """A request/response protocol: its id, message types and deadline (seconds)."""

    protocol: str
    request: type
    response: type
    timeout: float = 10.0
    max_inbound: int | None = None  # requests handled at once; None: ReqRespSettings.max_inbound_per_protocol
    max_per_peer: int | None = None  # streams per peer at once; None: ReqRespSettings.max_per_peer
    max_streams: int | None = None  # streams at once in total; None: STREAMS_PER_SERVING_SLOT x max_inbound

    @property
    def request_cap(self) -> int:
        return int(self.request.MAX_SIZE) + ENVELOPE_OVERHEAD  # type: ignore[attr-defined]

    @property
    def response_cap(self) -> int:
        return int(self.response.MAX_SIZE) + ENVELOPE_OVERHEAD  # type: ignore[attr-defined]


Handler = Callable[[ID, Opened], Awaitable[Any]]
"""Serves one request: returns the response message, or raises Reject / Ignore."""


class RequestFailed(Exception):
    """A request got no valid response. `our_fault` is False when the peer or the network failed it."""

    our_fault = False

    def __init__(self, peer: ID, protocol: str, detail: str) -> None:
        super().__init__(f"{protocol} to {peer}: {detail}")
        self.peer = peer
        self.protocol = protocol
        self.detail = detail


class PeerUnreachable(RequestFailed):
    """No connection or no stream: the peer is down, refuses the protocol, or the dial timed out."""


class RequestTimedOut(RequestFailed):
    """The peer accepted the stream but did not answer within the protocol's deadline."""


class BadResponse(RequestFailed):
    """The peer answered with bytes that failed framing or envelope checks (it is charged for it)."""

    def __init__(self, peer: ID, protocol: str, error: ProtocolError | FrameError) -> None:
        super().__init__(peer, protocol, str(error))
        self.error = error


@dataclass(frozen=True)
class ReqRespSettings:
    read_timeout: float = READ_TIMEOUT_S  # the length prefix within this; the body by this + length / rate
    min_read_rate: float = MIN_READ_RATE
    write_timeout: float = WRITE_TIMEOUT_S
    max_inbound_per_protocol: int = MAX_INBOUND_PER_PROTOCOL
    max_per_peer: int = MAX_PER_PEER


Admit = Callable[[ID], bool]
"""Whether a peer may use a protocol at all (its role, its stake), asked before it takes any slot."""


@dataclass
class _Inbound:
    """What one served protocol holds: its slots and the optional admission predicate."""

    streams: Slots
    serving: trio.CapacityLimiter
    admit: Admit | None


async def abort(stream: INetStream) -> None:
    """Reset a stream, ignoring a transport that is already gone."""
    try:
        await stream.reset()
    except TRANSPORT_ERRORS:
        pass


class RequestResponse:
    """Serves and issues the small control protocols (hello, ping, manifest, submit, ...)."""

    def __init__(
        self,
        host: IHost,
        identity: NodeIdentity,
        run: str,
        seq: SeqCounter,
        guard: PeerGuard,
        *,
        settings: ReqRespSettings | None = None,
        now_ms: Callable[[], int] = wall_ms,
        on_activity: Callable[[ID], None] | None = None,
    ) -> None:
        self.host = host
        self.identity = identity
        self.run_id = run
        self.seq = seq
        self.guard = guard
        self.settings = settings or ReqRespSettings()
        self.now_ms = now_ms
        self.on_activity = on_activity or (lambda peer: None)
        self.replay = ReplayWindow()
        self.stats: Counter[str] = Counter()
        self._specs: dict[str, ProtocolSpec] = {}
        self._inbound: dict[str, _Inbound] = {}

    def seal(self, message: Any) -> bytes:
        return seal(self.identity, message, run=self.run_id, seq=self.seq.next(), ts=self.now_ms())

    def serve(self, spec: ProtocolSpec, handler: Handler, *, admit: Admit | None = None) -> None:
        """Register `handler` for inbound requests of `spec` (replaces an earlier handler); `admit`,
        when given, refuses a peer before it takes a slot."""
        serving = spec.max_inbound or self.settings.max_inbound_per_protocol
        inbound = _Inbound(
            Slots(
                total=spec.max_streams or STREAMS_PER_SERVING_SLOT * serving,
                per_key=spec.max_per_peer or self.settings.max_per_peer,
            ),
            trio.CapacityLimiter(serving),
            admit,
        )
        self._specs[spec.protocol] = spec
        self._inbound[spec.protocol] = inbound

        async def on_stream(stream: INetStream) -> None:
            await self._serve_one(stream, spec, handler, inbound)

        self.host.set_stream_handler(TProtocol(spec.protocol), on_stream)

    async def _serve_one(
        self, stream: INetStream, spec: ProtocolSpec, handler: Handler, inbound: _Inbound
    ) -> None:
        peer = stream.muxed_conn.peer_id
        key = spec.protocol
        if self.guard.is_banned(peer):
            self.stats[f"{key}:refused_banned"] += 1
            await abort(stream)
            return
        if inbound.admit is not None and not inbound.admit(peer):
            self.stats[f"{key}:refused_unadmitted"] += 1
            await abort(stream)
            return
        if not inbound.streams.try_acquire(peer):
            over_share = inbound.streams.key_full(peer)
            self.stats[f"{key}:refused_peer_busy" if over_share else f"{key}:refused_busy"] += 1
            await abort(stream)
            return
        try:
            data = await read_request_frame(
                stream,
                max_size=spec.request_cap,
                grace=self.settings.read_timeout,
                min_rate=self.settings.min_read_rate,
            )
            opened = open_envelope(
                data, run=self.run_id, now_ms=self.now_ms(), replay=self.replay, expect=spec.request
            )
            del data
            try:
                inbound.serving.acquire_nowait()
            except trio.WouldBlock:
                self.stats[f"{key}:refused_serving_busy"] += 1
                await abort(stream)
                return
            try:
                response = await handler(peer, opened)
                with trio.fail_after(self.settings.write_timeout):
                    await write_frame(stream, self.seal(response))
            finally:
                inbound.serving.release()
            self.stats[f"{key}:served"] += 1
            self.on_activity(peer)
            await stream.close()
        except Reject as exc:
            self.stats[f"{key}:rejected"] += 1
            self.guard.report(peer, exc.reason, str(exc))
            await abort(stream)
        except Ignore:
            self.stats[f"{key}:ignored"] += 1
            await abort(stream)
        except FrameError as exc:
            self.stats[f"{key}:bad_frame"] += 1
            self.guard.report(peer, Fault.BAD_FRAME, str(exc))
            await abort(stream)
        except trio.TooSlowError:
            self.stats[f"{key}:stalled"] += 1
            self.guard.report(peer, Fault.STALLED, "request frame or response write missed its deadline")
            await abort(stream)
        except STREAM_ERRORS:
            self.stats[f"{key}:transport_error"] += 1
            await abort(stream)
        except Exception:  # a bug in a handler must cost one stream, never the connection or the node
            self.stats[f"{key}:handler_error"] += 1
            log.exception("request handler failed", extra={"protocol": spec.protocol, "peer": str(peer)})
            await abort(stream)
        finally:
            inbound.streams.release(peer)

    async def request(
        self, peer: ID, spec: ProtocolSpec, message: Any, *, sealed: bytes | None = None
    ) -> Opened:
        """Send one request and return the verified response; raises a RequestFailed subclass.

        `sealed` sends an envelope sealed earlier (`seal(message)`) instead of a fresh one: a retry of
        the same request to another peer then carries the same digest, so it counts once everywhere.
        """
        key = spec.protocol
        self.stats[f"{key}:requests"] += 1
        try:
            with trio.fail_after(spec.timeout):
                stream = await self.host.new_stream(peer, [TProtocol(spec.protocol)])
        except trio.TooSlowError:
            self.stats[f"{key}:unreachable"] += 1
            raise PeerUnreachable(peer, key, f"no stream within {spec.timeout}s") from None
        except TRANSPORT_ERRORS as exc:
            self.stats[f"{key}:unreachable"] += 1
            raise PeerUnreachable(peer, key, f"{type(exc).__name__}: {exc}") from None
        try:
            with trio.fail_after(self.settings.write_timeout):
                await write_frame(stream, sealed if sealed is not None else self.seal(message))
            with trio.fail_after(spec.timeout):
                data = await read_frame(stream, max_size=spec.response_cap)
            opened = open_envelope(
                data, run=self.run_id, now_ms=self.now_ms(), replay=self.replay, expect=spec.response
            )
        except trio.TooSlowError:
            self.stats[f"{key}:timed_out"] += 1
            await abort(stream)
            raise RequestTimedOut(peer, key, f"no response within {spec.timeout}s") from None
        except FrameError as exc:
            self.stats[f"{key}:bad_response"] += 1
            self.guard.report(peer, Fault.BAD_FRAME, str(exc))
            await abort(stream)
            raise BadResponse(peer, key, exc) from None
        except Reject as exc:
            self.stats[f"{key}:bad_response"] += 1
            self.guard.report(peer, exc.reason, str(exc))
            await abort(stream)
            raise BadResponse(peer, key, exc) from None
        except Ignore as exc:
            self.stats[f"{key}:ignored_response"] += 1
            await abort(stream)
            raise BadResponse(peer, key, exc) from None
        except STREAM_ERRORS as exc:
            self.stats[f"{key}:unreachable"] += 1
            await abort(stream)
            raise PeerUnreachable(peer, key, f"stream failed: {type(exc).__name__}: {exc}") from None
        self.stats[f"{key}:ok"] += 1
        self.on_activity(peer)
        try:
            await stream.close()
        except TRANSPORT_ERRORS:
            pass
        return opened

    def statistics(self) -> dict[str, int]:
        """Counters per protocol (served, refused_*, rejected, stalled, ...) and the slots in use now."""
        stats = dict(self.stats)
        for key, inbound in self._inbound.items():
            stats[f"{key}:streams_in_use"] = inbound.streams.statistics()["in_use"]
            stats[f"{key}:serving_in_use"] = inbound.serving.borrowed_tokens
        return stats
