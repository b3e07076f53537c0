"""A trio HTTP/1.1 client on h11, made for large bodies: keep-alive reuse, deadlines, zero-copy reads.

h11 writes the request and parses the response head; a body of known Content-Length is then read with
`readv` into one reusable buffer and handed out in chunks of up to `chunk_size` bytes, so a 50 MB shard
costs a few dozen Python steps per MiB rather than h11's buffer copies. Every wait has a deadline: connect,
response head, and a stall deadline on each body read (no byte for `stall_timeout` seconds → `Stalled`).
A response whose body was read to the end goes back to a per-endpoint pool for reuse.

On a slow link a reader woken for every segment pays the event loop's round trip per 1.4 KB: measured on
the WAN devnet, a worker at 50 Mbit/s spent half a core in that loop. A body read therefore sets the
socket's `SO_RCVLOWAT` (`recv_low_water`, 16 KiB: about 11 segments per wake-up instead of 1, and far
below any window, see RECV_LOW_WATER), and the kernel wakes us once that much has arrived, at a FIN or
error, or when the window is nearly closed; bytes below the mark are still read when the stall deadline
comes. The mark goes back to 1 before the connection is reused.
"""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import h11
import trio

from swarmnode.node.dataplane.errors import BadResponse, ConnectFailed, PeerFault, Stalled, Truncated
from swarmnode.protocol.shards import Endpoint, parse_endpoint
from swarmnode.protocol.types import KIB, MIB

USER_AGENT = "swarmnode"
# A body read wakes once this much has arrived (or at its end, a FIN, a stall). Kept far below any receive
# window: a mark near the window stops the sender until we read, and the kernel then sizes the window by what
# we read per round trip, so it never grows (measured: 256 KiB held relays at 5 MB/s on a 1 Gbit/s link).
RECV_LOW_WATER = 16 * KIB


@dataclass(frozen=True)
class ClientConfig:
    connect_timeout: float = 5.0
    head_timeout: float = 15.0  # request sent → complete response head (long polls pass their own)
    stall_timeout: float = 10.0  # no body byte for this long aborts the transfer
    chunk_size: int = 1 * MIB
    recv_low_water: int = RECV_LOW_WATER  # SO_RCVLOWAT while a body is read (1: wake on every segment)
    max_head_bytes: int = 16 * KIB
    max_idle_per_endpoint: int = 16
    local_address: str | None = None  # source IP for outgoing connections (a multi-homed node; tests)


class _Retry(Exception):
    """A pooled connection turned out closed before any response byte: retry once on a fresh one."""


class ClientResponse:
    """A response head plus its unread body; valid inside `HttpClient.request`'s context."""

    def __init__(
        self,
        endpoint: Endpoint,
        stream: trio.SocketStream,
        status: int,
        headers: dict[str, str],
        length: int,
        prefix: bytes,
        config: ClientConfig,
    ) -> None:
        self.endpoint = endpoint
        self.status = status
        self.headers = headers
        self.content_length = length
        self._stream = stream
        self._prefix = prefix
        self._config = config
        self._unread = length
        self._iterating = False
        self.reads = 0  # reads that returned body bytes (a wake-up each): the cost of a slow link

    @property
    def _url(self) -> str:
        return self.endpoint.url()

    @property
    def complete(self) -> bool:
        return self._unread == 0

    async def read(self, max_bytes: int) -> bytes:
        """The whole body; BadResponse if the server announced more than `max_bytes`."""
        if self.content_length > max_bytes:
            raise BadResponse(self._url, f"body of {self.content_length} bytes exceeds {max_bytes}")
        out = bytearray()
        async for chunk in self.chunks():
            out += chunk
        return bytes(out)

    async def chunks(self, stall_timeout: float | None = None) -> AsyncGenerator[memoryview, None]:
        """Yield the body in chunks of up to `chunk_size` bytes.

        Each chunk is a view into a buffer reused for the next one: consume it before iterating on.
        Bytes received before a stall or an early close are yielded first, then Stalled or Truncated is
        raised, so a caller can keep them and resume from the next byte elsewhere.
        """
        if self._iterating:
            raise RuntimeError("the body is already being read")
        self._iterating = True
        stall = self._config.stall_timeout if stall_timeout is None else stall_timeout
        size = min(self._config.chunk_size, max(self._unread, 1))
        buf = bytearray(size)
        view = memoryview(buf)
        fill = len(self._prefix)
        view[:fill] = self._prefix
        self._prefix = b""
        self._unread -= fill
        mark = _LowWater(self._stream.socket, self._config.recv_low_water)
        try:
            while self._unread or fill:
                failure = None
                while fill < size and self._unread:
                    want = min(size - fill, self._unread)
                    n = await self._recv(mark, view[fill : fill + want], stall)
                    if isinstance(n, Exception):
                        failure = n
                        break
                    fill += n
                    self._unread -= n
                if fill:
                    yield view[:fill]
                    fill = 0
                if failure is not None:
                    raise failure
                await trio.lowlevel.checkpoint()  # bytes always ready (loopback) must not starve the loop
        finally:
            mark.reset()

    async def _recv(self, mark: _LowWater, view: memoryview, stall: float) -> int | PeerFault:
        """Bytes read into `view`, or the peer's failure (nothing for `stall` seconds, a close, a reset)."""
        deadline = trio.current_time() + stall
        mark.set(len(view))
        while True:
            try:
                got = os.readv(mark.fd, [view])
            except BlockingIOError:
                got = -1
            except OSError as exc:  # ECONNRESET: the peer died mid-body
                return Truncated(self._url, f"connection broke {self._unread} bytes short: {exc}")
            if got == 0:
                return Truncated(self._url, f"closed {self._unread} bytes before the end")
            if got > 0:
                self.reads += 1
                return got
            if trio.current_time() >= deadline:  # nothing at all, below the mark too: stalled
                return Stalled(self._url, f"no byte for {stall:g} s, {self._unread} bytes short")
            with trio.move_on_at(deadline):
                await trio.lowlevel.wait_readable(mark.fd)


class _LowWater:
    """A socket's SO_RCVLOWAT while one body is read: `set` before each wait, `reset` before reuse."""

    def __init__(self, sock: trio.socket.SocketType, low_water: int) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.low_water = max(1, low_water)
        self.value = 1

    def set(self, wanted: int) -> None:
        """Wake for `wanted` bytes, at most `low_water` and an eighth of the receive buffer (a mark above
        half of it makes Linux grow the buffer and clamp the window to the mark: a slow start on a WAN)."""
        if self.low_water == 1:
            return
        rcvbuf = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        value = max(1, min(wanted, self.low_water, rcvbuf // 8))
        if value != self.value:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, value)
            self.value = value

    def reset(self) -> None:
        if self.value != 1:
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
            except OSError:  # already closed: nothing to reuse
                pass
            self.value = 1


class HttpClient:
    """Connections to many endpoints, kept alive and reused; one request per connection at a time."""

    def __init__(self, config: ClientConfig = ClientConfig()) -> None:
        self.config = config
        self._idle: dict[Endpoint, list[trio.SocketStream]] = {}
        self.connections_opened = 0
        self.requests = 0
        self.body_reads = 0

    def statistics(self) -> dict[str, int]:
        return {
            "connections_opened": self.connections_opened,
            "requests": self.requests,
            "body_reads": self.body_reads,
            "idle_connections": sum(len(v) for v in self._idle.values()),
        }

    async def aclose(self) -> None:
        idle, self._idle = self._idle, {}
        for streams in idle.values():
            for stream in streams:
                await _close_quietly(stream)

    @asynccontextmanager
    async def request(
        self,
        endpoint: Endpoint | str,
        method: str,
        target: str,
        headers: Sequence[tuple[str, str]] = (),
        head_timeout: float | None = None,
    ) -> AsyncIterator[ClientResponse]:
        """Send one request and yield its response; the connection is pooled again if its body was read."""
        ep = parse_endpoint(endpoint) if isinstance(endpoint, str) else endpoint
        self.requests += 1
        deadline = self.config.head_timeout if head_timeout is None else head_timeout
        response, reusable = None, False
        for attempt in (0, 1):
            stream, reused = await self._checkout(ep, fresh=attempt > 0)
            try:
                response, reusable = await self._exchange(
                    ep, stream, method, target, headers, deadline, reused
                )
                break
            except _Retry:
                await _close_quietly(stream)
                if attempt:
                    raise Truncated(ep.url(), "connection closed before the response") from None
            except BaseException:
                await _close_quietly(stream)
                raise
        assert response is not None
        try:
            yield response
        finally:
            self.body_reads += response.reads
            if reusable and response.complete:
                self._checkin(ep, response._stream)
            else:
                await _close_quietly(response._stream)

    async def get(
        self, endpoint: Endpoint | str, target: str, max_bytes: int, head_timeout: float | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        """A small GET: status, headers and the whole body (at most `max_bytes`)."""
        async with self.request(endpoint, "GET", target, head_timeout=head_timeout) as response:
            body = await response.read(max_bytes)
            return response.status, response.headers, body

    # --- connections ---------------------------------------------------------------------------

    async def _checkout(self, ep: Endpoint, fresh: bool) -> tuple[trio.SocketStream, bool]:
        idle = self._idle.get(ep)
        if idle and not fresh:
            return idle.pop(), True
        with trio.move_on_after(self.config.connect_timeout) as scope:
            try:
                stream = await trio.open_tcp_stream(
                    ep.host, ep.port, local_address=self.config.local_address
                )
            except OSError as exc:
                raise ConnectFailed(ep.url(), str(exc)) from None
        if scope.cancelled_caught:
            raise ConnectFailed(ep.url(), f"no connection within {self.config.connect_timeout:g} s")
        self.connections_opened += 1
        return stream, False

    def _checkin(self, ep: Endpoint, stream: trio.SocketStream) -> None:
        idle = self._idle.setdefault(ep, [])
        if len(idle) < self.config.max_idle_per_endpoint:
            idle.append(stream)
        else:
            stream.socket.close()

    async def _exchange(
        self,
        ep: Endpoint,
        stream: trio.SocketStream,
        method: str,
        target: str,
        headers: Sequence[tuple[str, str]],
        head_timeout: float,
        reused: bool,
    ) -> tuple[ClientResponse, bool]:
        url = ep.url()
        conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=self.config.max_head_bytes)
        request = h11.Request(
            method=method,
            target=target,
            headers=[("host", f"{ep.host}:{ep.port}"), ("user-agent", USER_AGENT), *headers],
        )
        data = (conn.send(request) or b"") + (conn.send(h11.EndOfMessage()) or b"")
        received_any = False
        head: h11.Response | None = None
        with trio.move_on_after(head_timeout) as scope:
            try:
                await stream.send_all(data)
                while True:
                    try:
                        event = conn.next_event()
                    except h11.RemoteProtocolError as exc:
                        if reused and not received_any:
                            raise _Retry() from None
                        raise BadResponse(url, f"malformed response head: {exc}") from None
                    if isinstance(event, h11.Response):
                        head = event
                        break
                    if isinstance(event, h11.ConnectionClosed):
                        if reused and not received_any:
                            raise _Retry()
                        raise Truncated(url, "closed before the response head")
                    if event is h11.NEED_DATA:
                        chunk = await stream.receive_some(self.config.max_head_bytes)
                        received_any = received_any or bool(chunk)
                        conn.receive_data(chunk)
                    # InformationalResponse (1xx): keep reading
            except (trio.BrokenResourceError, OSError) as exc:
                if reused and not received_any:
                    raise _Retry() from None
                raise Truncated(url, f"connection broke: {exc}") from None
        if scope.cancelled_caught or head is None:
            raise Stalled(url, f"no response head within {head_timeout:g} s")
        response_headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in head.headers}
        length = _body_length(url, method, head.status_code, response_headers)
        prefix, _ = conn.trailing_data
        reusable = (
            head.http_version == b"1.1" and "close" not in response_headers.get("connection", "").lower()
        )
        if len(prefix) > length:
            prefix, reusable = prefix[:length], False  # bytes past the body: the server is confused
        response = ClientResponse(
            ep, stream, head.status_code, response_headers, length, prefix, self.config
        )
        return response, reusable


def _body_length(url: str, method: str, status: int, headers: dict[str, str]) -> int:
    if method == "HEAD" or status in (204, 304):
        return 0
    text = headers.get("content-length")
    if text is None or not text.strip().isdigit():
        raise BadResponse(url, "response without a valid Content-Length (chunked bodies are not spoken here)")
    return int(text)


async def _close_quietly(stream: trio.SocketStream) -> None:
    with trio.CancelScope(shield=True), trio.move_on_after(1):
        await stream.aclose()
