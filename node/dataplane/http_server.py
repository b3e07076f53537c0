"""A small HTTP/1.1 server on trio and h11, made to move large files fast and survive rude clients.

Only GET and HEAD; every response carries Content-Length (no chunked bodies). File bodies go out with
`os.sendfile` straight from the page cache to the socket (h11 frames the head and counts the body through
`send_with_data_passthrough`), so serving costs no per-chunk Python copies.

No client can exhaust it (spec/shards.md, HTTP bounds). Connections are capped in total and per client
address (an IPv4 address or an IPv6 /64, `ratelimit.address_key`); a connection over its address's cap is
refused with a 503 at once, without taking anyone's slot. When the total is full, a newcomer takes the slot
of a connection that is waiting for a request (silent, idle or mid-head), from the address holding the most;
connections that are serving a request are never evicted. Every wait has a deadline: the first request head
within `head_timeout` of accept, later ones within `idle_timeout` to begin and `head_timeout` to complete, the
handler within `handler_timeout`, and the client must read each response at `min_send_rate` on average after
`send_grace` seconds (time we spend on our own upload cap is not held against it). Long polls (`wait=S` in the
query) are capped per address and in total below the connection cap, so they cannot take the slots shard
fetches need; a long poll over its cap gets a 503 with Retry-After on a connection that stays open.

One module (over 500 lines) because admission, eviction and the per-connection deadlines are one state
machine over the same counters (`HttpServer`'s connections by address and by phase): split, each part
would reach into the others' state.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Protocol
from urllib.parse import parse_qsl

import h11
import trio

from swarmnode.node.dataplane.ratelimit import LOOPBACK_NETWORKS, TokenBucket, address_key, in_networks
from swarmnode.node.p2p.ratelimit import Slots
from swarmnode.protocol.types import KIB, MIB

SERVER_NAME = "swarmnode"

# Bounds (spec/shards.md, HTTP bounds): every one is a ServerConfig field with this default.
MAX_CONNECTIONS = 256  # open connections, all clients together
MAX_CONNECTIONS_PER_ADDRESS = 16  # open connections from one address (IPv4, or IPv6 /64)
MAX_LONG_POLLS = 64  # long polls held at once, all clients together (at most half of MAX_CONNECTIONS)
MAX_LONG_POLLS_PER_ADDRESS = 4  # a follower's `latest` + `have`, a DiLoCo peer's round poll + `outer`
HEAD_TIMEOUT_S = 10.0  # accept → first request head complete; first byte → head complete on keep-alive
IDLE_TIMEOUT_S = 60.0  # a kept-alive connection waiting for its next request
HANDLER_TIMEOUT_S = 60.0  # a handler producing a response (long polls are capped at 30 s by their routes)
WRITE_TIMEOUT_S = 30.0  # no write progress at all
MIN_SEND_RATE = 32 * KIB  # bytes/s a client must read at, on average, once the grace is spent
SEND_GRACE_S = 10.0  # time blocked on a client's socket allowed before MIN_SEND_RATE applies
MAX_REFUSING = 64  # refusals (503 then close) in flight; past it a connection is closed without a word
REFUSE_TIMEOUT_S = 1.0  # to write a refusal
LINGER_S = 0.5  # after a refusal or a 400: drain the client's unread bytes so the answer is not reset away
BUSY_RETRY_AFTER_S = 1  # Retry-After when the server is full
ADDRESS_RETRY_AFTER_S = 5  # Retry-After when the client's own address holds its share
LONG_POLL_RETRY_AFTER_S = 2  # Retry-After for a long poll over its cap


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 0
    max_connections: int = MAX_CONNECTIONS
    max_connections_per_address: int = MAX_CONNECTIONS_PER_ADDRESS
    max_long_polls: int = MAX_LONG_POLLS
    max_long_polls_per_address: int = MAX_LONG_POLLS_PER_ADDRESS
    idle_timeout: float = IDLE_TIMEOUT_S
    head_timeout: float = HEAD_TIMEOUT_S
    handler_timeout: float = HANDLER_TIMEOUT_S
    write_timeout: float = WRITE_TIMEOUT_S
    min_send_rate: float = MIN_SEND_RATE
    send_grace: float = SEND_GRACE_S
    max_head_bytes: int = 16 * KIB
    chunk_size: int = 1 * MIB
    upload_rate: float | None = None  # bytes/s shared by all connections (None: unlimited)
    use_sendfile: bool = True
    # Clients here are uncapped per address (still counted in the totals): loopback is this host's own.
    exempt_networks: tuple[str, ...] = LOOPBACK_NETWORKS

    def __post_init__(self) -> None:
        counts: tuple[int, ...] = (self.max_connections, self.max_connections_per_address)
        counts += (self.max_long_polls, self.max_long_polls_per_address)
        if min(counts) < 1:
            raise ValueError("connection and long-poll caps must be at least 1")
        times = (self.idle_timeout, self.head_timeout, self.handler_timeout, self.write_timeout)
        if min(*times, self.min_send_rate) <= 0 or self.send_grace < 0:
            raise ValueError("timeouts and the minimum send rate must be positive")

    @property
    def long_poll_cap(self) -> int:
        """Long polls held at once: never more than half the connections, so fetches keep the rest."""
        return max(1, min(self.max_long_polls, self.max_connections // 2))

    @property
    def long_poll_cap_per_address(self) -> int:
        return max(1, min(self.max_long_polls_per_address, self.max_connections_per_address // 2))


@dataclass(frozen=True)
class Request:
    method: str
    target: str
    headers: dict[str, str]  # lower-case names; a repeated header keeps its last value
    client: str = ""  # the remote IP address


def is_long_poll(request: Request) -> bool:
    """A request that may be held: its query names `wait=S` with S > 0 (shards and DiLoCo routes alike)."""
    _, _, query = request.target.partition("?")
    pairs = parse_qsl(query, keep_blank_values=True)
    return any(k == "wait" and v.isdigit() and int(v) > 0 for k, v in pairs)


class Body(Protocol):
    """A response body of known length; the server closes it when done."""

    length: int

    def close(self) -> None: ...


@dataclass
class BytesBody:
    data: bytes
    length: int = field(init=False)

    def __post_init__(self) -> None:
        self.length = len(self.data)

    def close(self) -> None:
        pass


@dataclass
class FileBody:
    """`length` bytes of an open file from `offset`; the fd is owned by the body and closed after sending."""

    fd: int
    offset: int
    length: int

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@dataclass
class StreamBody:
    """A body produced chunk by chunk (fault injection, generated content): exactly `length` bytes."""

    length: int
    chunks: Callable[[], AsyncIterator[bytes]]

    def close(self) -> None:
        pass


@dataclass
class Response:
    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: Body = field(default_factory=lambda: BytesBody(b""))


Handler = Callable[[Request], Awaitable[Response]]


@dataclass
class ServerStats:
    connections_total: int = 0
    connections_open: int = 0
    rejected_busy: int = 0  # refused: the server was full and no waiting connection could be evicted
    rejected_address: int = 0  # refused: the client's address held its share of connections
    rejected_long_poll: int = 0  # long polls answered 503: the address's or the total long-poll cap
    refused_silently: int = 0  # closed without a 503: MAX_REFUSING refusals were already in flight
    long_polls_open: int = 0
    handler_timeouts: int = 0
    requests: int = 0
    bytes_served: int = 0  # body bytes written to sockets
    aborted: int = 0  # connections dropped mid-response or for a timeout / protocol error
    cut: Counter[str] = field(default_factory=Counter)  # connections we ended, by `Cut.reason`
    responses: Counter[int] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, object]:
        return {
            "connections_total": self.connections_total,
            "connections_open": self.connections_open,
            "rejected_busy": self.rejected_busy,
            "rejected_address": self.rejected_address,
            "rejected_long_poll": self.rejected_long_poll,
            "refused_silently": self.refused_silently,
            "long_polls_open": self.long_polls_open,
            "handler_timeouts": self.handler_timeouts,
            "requests": self.requests,
            "bytes_served": self.bytes_served,
            "aborted": self.aborted,
            "cut": dict(sorted(self.cut.items())),
            "responses": {str(k): v for k, v in sorted(self.responses.items())},
        }


class _Span:
    """Stands in for file bytes inside h11: h11 only needs the length to frame and count the body."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


class _ClientGone(Exception):
    """The client closed or reset the connection: ours to drop, nobody to tell."""


class _Cut(Exception):
    """We ended the connection: a deadline passed or a newcomer needed its slot. `reason` keys the stats."""

    HEAD_TIMEOUT = "head_timeout"  # no complete request head in time
    IDLE_TIMEOUT = "idle_timeout"  # a kept-alive connection said nothing for idle_timeout
    SLOW_READER = "slow_reader"  # read below min_send_rate, or not at all for write_timeout
    EVICTED = "evicted"  # waiting for a request when the server was full

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(eq=False)
class _Connection:
    """One admitted connection, as eviction sees it."""

    key: str  # `address_key` of the client
    waiting_since: float | None  # waiting for a request head since then; None while serving one
    scope: trio.CancelScope | None = None  # the current wait, cancelled to evict
    evicted: bool = False


class _Pace:
    """One response's demand on its client: the time we spend blocked on the client's socket may not pass
    `grace + sent / min_rate`, i.e. after the grace it must read at `min_rate` on average."""

    def __init__(self, min_rate: float, grace: float) -> None:
        self.min_rate = min_rate
        self.grace = grace
        self.blocked = 0.0
        self.sent = 0

    def allowance(self) -> float:
        return self.grace + self.sent / self.min_rate - self.blocked


def simple_response(status: int, text: str = "", headers: Sequence[tuple[str, str]] = ()) -> Response:
    body = text.encode()
    return Response(status, [("content-type", "text/plain; charset=utf-8"), *headers], BytesBody(body))


class HttpServer:
    """Serves one handler on one listening socket until cancelled.

    `long_poll` says which requests may be held by the handler (`is_long_poll` by default); those take a
    long-poll slot as well as their connection.
    """

    def __init__(
        self,
        handler: Handler,
        config: ServerConfig = ServerConfig(),
        *,
        long_poll: Callable[[Request], bool] = is_long_poll,
    ) -> None:
        self.handler = handler
        self.config = config
        self.long_poll = long_poll
        self.stats = ServerStats()
        self.port: int | None = None
        self._bucket = TokenBucket(config.upload_rate, config.chunk_size) if config.upload_rate else None
        self._slots = Slots(config.max_connections, config.max_connections_per_address)
        self._polls = Slots(config.long_poll_cap, config.long_poll_cap_per_address)
        self._open: set[_Connection] = set()
        self._refusing = 0

    def statistics(self) -> ServerStats:
        return self.stats

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen and serve forever; reports the bound port through `task_status.started`."""
        listeners = await trio.open_tcp_listeners(self.config.port, host=self.config.host)
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, self._serve_connection, listeners)
            task_status.started(self.port)

    # --- admission -----------------------------------------------------------------------------

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        stats = self.stats
        stats.connections_total += 1
        try:
            host = str(stream.socket.getpeername()[0])
        except OSError:  # already gone
            await _close_quietly(stream, linger=False)
            return
        key, exempt = address_key(host), in_networks(host, self.config.exempt_networks)
        if self._slots.key_full(key, exempt):
            stats.rejected_address += 1
            await self._refuse(stream, _ADDRESS_RESPONSE)
            return
        if self._slots.full() and not self._evict_for(key):
            stats.rejected_busy += 1
            await self._refuse(stream, _BUSY_RESPONSE)
            return
        self._slots.acquire(key)
        connection = _Connection(key, trio.current_time())
        self._open.add(connection)
        stats.connections_open += 1
        linger = False
        try:
            linger = await self._request_loop(stream, connection, host, exempt)
        except h11.ProtocolError:
            stats.aborted += 1
            linger = True  # a 400 went out; let the client read it
        except _Cut as cut:
            stats.cut[cut.reason] += 1
            stats.aborted += 1
        except (_ClientGone, trio.BrokenResourceError):
            stats.aborted += 1
        finally:
            self._open.discard(connection)
            self._slots.release(key)
            stats.connections_open -= 1
            await _close_quietly(stream, linger)

    def _evict_for(self, key: str) -> bool:
        """Make room for a newcomer from `key` by cancelling a connection that waits for a request: one
        from the address holding the most, longest waiting first, and only if that address holds at least
        as many as the newcomer would. Connections serving a request are never evicted."""
        waiting = [c for c in self._open if c.waiting_since is not None and not c.evicted]
        if not waiting:
            return False
        victim = max(waiting, key=lambda c: (self._slots.count(c.key), -(c.waiting_since or 0.0)))
        if self._slots.count(victim.key) < self._slots.count(key) + 1:
            return False
        victim.evicted = True
        if victim.scope is not None:
            victim.scope.cancel()
        return True

    async def _refuse(self, stream: trio.SocketStream, response: bytes) -> None:
        """Answer 503 before reading anything (h11 cannot answer a request it has not seen) and close.
        Refusals are bounded in number and time: past MAX_REFUSING at once the socket is just closed."""
        if self._refusing >= MAX_REFUSING:
            self.stats.refused_silently += 1
            await _close_quietly(stream, linger=False)
            return
        self._refusing += 1
        try:
            self.stats.responses[503] += 1
            with trio.move_on_after(REFUSE_TIMEOUT_S):
                try:
                    await stream.send_all(response)
                except trio.BrokenResourceError:
                    pass
            await _close_quietly(stream, linger=True)
        finally:
            self._refusing -= 1

    # --- one connection ------------------------------------------------------------------------

    async def _request_loop(
        self, stream: trio.SocketStream, connection: _Connection, client: str, exempt: bool
    ) -> bool:
        """Serve requests until either side ends the connection; True if we ended it after a response."""
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.config.max_head_bytes)
        first = True
        while True:
            event = await self._next_request(stream, conn, connection, first)
            if event is None:
                return False
            first = False
            self.stats.requests += 1
            request = Request(
                event.method.decode("ascii", "replace"),
                event.target.decode("ascii", "replace"),
                {k.decode("ascii", "replace").lower(): v.decode("latin-1") for k, v in event.headers},
                client,
            )
            if not _has_body(request.headers) and not isinstance(conn.next_event(), h11.EndOfMessage):
                raise h11.RemoteProtocolError("request head without its end of message")
            if request.method not in ("GET", "HEAD"):
                response = simple_response(405, "only GET and HEAD", [("allow", "GET, HEAD")])
            elif _has_body(request.headers):
                response = simple_response(400, "requests carry no body", [("connection", "close")])
            elif self.long_poll(request):
                response = await self._handle_long_poll(request, connection.key, exempt)
            else:
                response = await self._handle(request)
            await self._send_response(stream, conn, request.method == "HEAD", response)
            if conn.our_state is h11.MUST_CLOSE or conn.their_state is not h11.DONE:
                return True
            conn.start_next_cycle()
            connection.waiting_since = trio.current_time()

    async def _handle(self, request: Request) -> Response:
        """The handler's response, or 503 if it took longer than `handler_timeout`."""
        with trio.move_on_after(self.config.handler_timeout):
            return await self.handler(request)
        self.stats.handler_timeouts += 1
        return simple_response(503, "no response in time", [("retry-after", str(BUSY_RETRY_AFTER_S))])

    async def _handle_long_poll(self, request: Request, key: str, exempt: bool) -> Response:
        if not self._polls.try_acquire(key, exempt):
            self.stats.rejected_long_poll += 1
            retry = [("retry-after", str(LONG_POLL_RETRY_AFTER_S))]
            return simple_response(503, "too many long polls held; retry later", retry)
        self.stats.long_polls_open += 1
        try:
            return await self._handle(request)
        finally:
            self.stats.long_polls_open -= 1
            self._polls.release(key)

    async def _next_request(
        self, stream: trio.SocketStream, conn: h11.Connection, connection: _Connection, first: bool
    ) -> h11.Request | None:
        """The next request head, or None if the client closed cleanly between requests.

        A fresh connection must deliver its whole first head within `head_timeout`; a kept-alive one may
        wait `idle_timeout` for its next request, which must then complete within `head_timeout`. Until
        the head is complete the connection may be evicted (`_evict_for`).
        """
        started = trio.current_time()
        phase = _Cut.HEAD_TIMEOUT if first else _Cut.IDLE_TIMEOUT
        timeout = self.config.head_timeout if first else self.config.idle_timeout
        event: h11.Request | None = None
        with trio.CancelScope(deadline=started + timeout) as scope:
            connection.scope = scope
            if connection.evicted:
                scope.cancel()
            while True:
                try:
                    next_event = conn.next_event()
                except h11.RemoteProtocolError as exc:
                    await self._send_error(stream, conn, exc.error_status_hint)
                    raise
                if isinstance(next_event, h11.Request):
                    event = next_event
                    break
                if isinstance(next_event, h11.ConnectionClosed):
                    break
                if next_event is not h11.NEED_DATA:
                    raise h11.RemoteProtocolError(f"unexpected {type(next_event).__name__}")
                data = await stream.receive_some(self.config.max_head_bytes)
                if data and phase == _Cut.IDLE_TIMEOUT:  # the head has begun: it must now complete promptly
                    scope.deadline = min(scope.deadline, trio.current_time() + self.config.head_timeout)
                    phase = _Cut.HEAD_TIMEOUT
                conn.receive_data(data)
        connection.scope = None
        if connection.evicted:  # also when a pipelined head was already buffered: the slot is gone
            raise _Cut(_Cut.EVICTED)
        if scope.cancelled_caught:
            raise _Cut(phase)
        connection.waiting_since = None
        return event

    async def _send_error(self, stream: trio.SocketStream, conn: h11.Connection, status: int) -> None:
        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        response = simple_response(status, "malformed request", [("connection", "close")])
        try:
            await self._send_response(stream, conn, False, response)
        except (_ClientGone, _Cut, h11.LocalProtocolError):
            pass

    def _headers(self, response: Response) -> list[tuple[str, str]]:
        headers = [("server", SERVER_NAME), *response.headers]
        if response.status not in (204, 304):
            headers.append(("content-length", str(response.body.length)))
        return headers

    # --- writing -------------------------------------------------------------------------------

    async def _send_response(
        self, stream: trio.SocketStream, conn: h11.Connection, head_only: bool, response: Response
    ) -> None:
        body = response.body
        pace = _Pace(self.config.min_send_rate, self.config.send_grace)
        try:
            self.stats.responses[response.status] += 1
            head = conn.send(
                h11.Response(
                    status_code=response.status,
                    headers=self._headers(response),
                    reason=_reason(response.status),
                )
            )
            if head_only or body.length == 0:
                await self._send_all(stream, head or b"", pace)
            elif isinstance(body, BytesBody):
                data = (head or b"") + (conn.send(h11.Data(data=body.data)) or b"")
                await self._send_all(stream, data, pace)
                self.stats.bytes_served += body.length
            else:
                await self._send_all(stream, head or b"", pace)
                parts = conn.send_with_data_passthrough(h11.Data(data=_Span(body.length)))  # type: ignore[arg-type]
                if isinstance(body, FileBody):
                    await self._send_file(stream, body, parts, pace)
                else:
                    assert isinstance(body, StreamBody)
                    await self._send_stream(stream, body, pace)
            await self._send_all(stream, conn.send(h11.EndOfMessage()) or b"", pace)
        finally:
            body.close()

    async def _wait_writable(self, fd: int, pace: _Pace) -> None:
        """Wait until the client's socket takes bytes again; the wait is charged to its pace."""
        allowance = pace.allowance()
        limit = min(self.config.write_timeout, allowance)
        started = trio.current_time()
        with trio.move_on_after(max(limit, 0.0)) as scope:
            await trio.lowlevel.wait_writable(fd)
        pace.blocked += trio.current_time() - started
        if scope.cancelled_caught:
            raise _Cut(_Cut.SLOW_READER)

    async def _send_all(self, stream: trio.SocketStream, data: bytes, pace: _Pace) -> None:
        """Write all of `data`, crediting the pace with each part the kernel takes."""
        sock = stream.socket
        view = memoryview(data)
        while view:
            started = trio.current_time()
            sent = 0
            with trio.move_on_after(max(0.0, min(self.config.write_timeout, pace.allowance()))) as scope:
                try:
                    sent = await sock.send(view)
                except OSError as exc:  # EPIPE, ECONNRESET: the client went away
                    raise _ClientGone(str(exc)) from None
            pace.blocked += trio.current_time() - started
            if scope.cancelled_caught:
                raise _Cut(_Cut.SLOW_READER)
            pace.sent += sent
            view = view[sent:]

    async def _send_stream(self, stream: trio.SocketStream, body: StreamBody, pace: _Pace) -> None:
        sent = 0
        async for chunk in body.chunks():
            if self._bucket is not None:
                view = memoryview(chunk)
                while view:
                    n = await self._bucket.take(len(view))
                    await self._send_all(stream, bytes(view[:n]), pace)
                    view = view[n:]
            else:
                await self._send_all(stream, chunk, pace)
            sent += len(chunk)
            self.stats.bytes_served += len(chunk)
        if sent != body.length:
            raise _ClientGone(f"stream body produced {sent} of {body.length} bytes")  # close: length lied

    async def _send_file(
        self, stream: trio.SocketStream, body: FileBody, parts: list[bytes] | None, pace: _Pace
    ) -> None:
        # With Content-Length framing h11 adds nothing around the body: the passthrough list is our span.
        if not parts or len(parts) != 1 or not isinstance(parts[0], _Span):
            raise h11.LocalProtocolError("unexpected body framing")
        if self.config.use_sendfile and hasattr(os, "sendfile"):
            await self._sendfile(stream, body, pace)
        else:
            await self._copy_file(stream, body, pace)

    async def _sendfile(self, stream: trio.SocketStream, body: FileBody, pace: _Pace) -> None:
        """Zero-copy: the kernel moves page-cache pages to the socket; we only wait for writability."""
        sock = stream.socket
        out_fd = sock.fileno()
        offset, remaining = body.offset, body.length
        while remaining:
            allowance = min(remaining, self.config.chunk_size)
            if self._bucket is not None:
                allowance = await self._bucket.take(allowance)
            while allowance:
                try:
                    sent = os.sendfile(out_fd, body.fd, offset, allowance)
                except BlockingIOError:
                    await self._wait_writable(out_fd, pace)
                    continue
                except OSError as exc:  # EPIPE, ECONNRESET: the client went away
                    raise _ClientGone(str(exc)) from None
                if sent == 0:
                    raise _ClientGone("file ended early: it was truncated under us")
                offset += sent
                remaining -= sent
                allowance -= sent
                pace.sent += sent
                self.stats.bytes_served += sent
                await trio.lowlevel.checkpoint()

    async def _copy_file(self, stream: trio.SocketStream, body: FileBody, pace: _Pace) -> None:
        offset, remaining = body.offset, body.length
        while remaining:
            n = min(remaining, self.config.chunk_size)
            if self._bucket is not None:
                n = await self._bucket.take(n)
            chunk = await trio.to_thread.run_sync(os.pread, body.fd, n, offset)
            if not chunk:
                raise _ClientGone("file ended early: it was truncated under us")
            await self._send_all(stream, chunk, pace)
            offset += len(chunk)
            remaining -= len(chunk)
            self.stats.bytes_served += len(chunk)


def _refusal(text: str, retry_after_s: int) -> bytes:
    body = text.encode()
    return (
        b"HTTP/1.1 503 Service Unavailable\r\nserver: " + SERVER_NAME.encode() + b"\r\nretry-after: "
        + str(retry_after_s).encode() + b"\r\nconnection: close\r\ncontent-length: "
        + str(len(body)).encode() + b"\r\n\r\n" + body
    )


_BUSY_RESPONSE = _refusal("busy", BUSY_RETRY_AFTER_S)
_ADDRESS_RESPONSE = _refusal("too many connections from your address", ADDRESS_RETRY_AFTER_S)


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


def _has_body(headers: dict[str, str]) -> bool:
    return "transfer-encoding" in headers or headers.get("content-length", "0").strip() not in ("", "0")


async def _close_quietly(stream: trio.SocketStream, linger: bool) -> None:
    """Close; with `linger`, first stop sending and drain briefly, so that unread request bytes do not make
    the kernel answer with a reset that destroys the response we just sent (a 503, a 400)."""
    with trio.CancelScope(shield=True):
        if linger:
            with trio.move_on_after(LINGER_S):
                try:
                    await stream.send_eof()
                    while await stream.receive_some(64 * KIB):
                        pass
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pass
        with trio.move_on_after(1):
            await stream.aclose()
