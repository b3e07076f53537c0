"""A small HTTP/1.1 server on trio and h11, made to move large files fast and survive rude clients.

Only GET and HEAD; every response carries Content-Length (no chunked bodies). File bodies go out with
`os.sendfile` straight from the page cache to the socket (h11 frames the head and counts the body through
`send_with_data_passthrough`), so serving costs no per-chunk Python copies. Every read has a deadline
(idle keep-alive, request head) and every write a progress deadline, so a slow or silent client cannot pin
a connection. Connections are bounded: past the limit a client gets 503 and the connection is closed.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Protocol

import h11
import trio

from node.dataplane.ratelimit import TokenBucket
from protocol.types import KIB, MIB

SERVER_NAME = "swarmnode"


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 0
    max_connections: int = 256
    idle_timeout: float = 60.0  # keep-alive connection waiting for its next request
    head_timeout: float = 10.0  # from the first byte of a request to its complete head
    write_timeout: float = 30.0  # no write progress for this long drops the connection
    max_head_bytes: int = 16 * KIB
    chunk_size: int = 1 * MIB
    upload_rate: float | None = None  # bytes/s shared by all connections (None: unlimited)
    use_sendfile: bool = True


@dataclass(frozen=True)
class Request:
    method: str
    target: str
    headers: dict[str, str]  # lower-case names; a repeated header keeps its last value


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
    rejected_busy: int = 0
    requests: int = 0
    bytes_served: int = 0  # body bytes written to sockets
    aborted: int = 0  # connections dropped mid-response or for a timeout / protocol error
    responses: Counter[int] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, object]:
        return {
            "connections_total": self.connections_total,
            "connections_open": self.connections_open,
            "rejected_busy": self.rejected_busy,
            "requests": self.requests,
            "bytes_served": self.bytes_served,
            "aborted": self.aborted,
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
    """The client closed or reset the connection, or stopped reading: ours to drop, nobody to tell."""


def simple_response(status: int, text: str = "", headers: Sequence[tuple[str, str]] = ()) -> Response:
    body = text.encode()
    return Response(status, [("content-type", "text/plain; charset=utf-8"), *headers], BytesBody(body))


class HttpServer:
    """Serves one handler on one listening socket until cancelled."""

    def __init__(self, handler: Handler, config: ServerConfig = ServerConfig()) -> None:
        self.handler = handler
        self.config = config
        self.stats = ServerStats()
        self.port: int | None = None
        self._bucket = TokenBucket(config.upload_rate, config.chunk_size) if config.upload_rate else None

    def statistics(self) -> ServerStats:
        return self.stats

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen and serve forever; reports the bound port through `task_status.started`."""
        listeners = await trio.open_tcp_listeners(self.config.port, host=self.config.host)
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, self._serve_connection, listeners)
            task_status.started(self.port)

    # --- one connection ------------------------------------------------------------------------

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        stats = self.stats
        stats.connections_total += 1
        if stats.connections_open >= self.config.max_connections:
            stats.rejected_busy += 1
            await self._reject_busy(stream)
            return
        stats.connections_open += 1
        linger = False
        try:
            linger = await self._request_loop(stream)
        except h11.ProtocolError:
            stats.aborted += 1
            linger = True  # a 400 went out; let the client read it
        except (_ClientGone, trio.BrokenResourceError, trio.TooSlowError):
            stats.aborted += 1
        finally:
            stats.connections_open -= 1
            await _close_quietly(stream, linger)

    async def _reject_busy(self, stream: trio.SocketStream) -> None:
        """Answer 503 before reading anything (h11 cannot answer a request it has not seen) and close."""
        self.stats.responses[503] += 1
        with trio.move_on_after(self.config.write_timeout):
            try:
                await stream.send_all(_BUSY_RESPONSE)
            except trio.BrokenResourceError:
                pass
        await _close_quietly(stream, linger=True)

    async def _request_loop(self, stream: trio.SocketStream) -> bool:
        """Serve requests until either side ends the connection; True if we ended it after a response."""
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.config.max_head_bytes)
        while True:
            event = await self._next_request(stream, conn)
            if event is None:
                return False
            self.stats.requests += 1
            request = Request(
                event.method.decode("ascii", "replace"),
                event.target.decode("ascii", "replace"),
                {k.decode("ascii", "replace").lower(): v.decode("latin-1") for k, v in event.headers},
            )
            if not _has_body(request.headers) and not isinstance(conn.next_event(), h11.EndOfMessage):
                raise h11.RemoteProtocolError("request head without its end of message")
            if request.method not in ("GET", "HEAD"):
                response = simple_response(405, "only GET and HEAD", [("allow", "GET, HEAD")])
            elif _has_body(request.headers):
                response = simple_response(400, "requests carry no body", [("connection", "close")])
            else:
                response = await self.handler(request)
            await self._send_response(stream, conn, request.method == "HEAD", response)
            if conn.our_state is h11.MUST_CLOSE or conn.their_state is not h11.DONE:
                return True
            conn.start_next_cycle()

    async def _next_request(self, stream: trio.SocketStream, conn: h11.Connection) -> h11.Request | None:
        """The next request head, or None if the client closed cleanly between requests."""
        deadline_set = False
        with trio.fail_after(self.config.idle_timeout) as scope:
            while True:
                try:
                    event = conn.next_event()
                except h11.RemoteProtocolError as exc:
                    await self._send_error(stream, conn, exc.error_status_hint)
                    raise
                if isinstance(event, h11.Request):
                    return event
                if isinstance(event, h11.ConnectionClosed):
                    return None
                if event is not h11.NEED_DATA:
                    raise h11.RemoteProtocolError(f"unexpected {type(event).__name__}")
                data = await stream.receive_some(self.config.max_head_bytes)
                if data and not deadline_set:  # the head has begun: it must now complete promptly
                    scope.deadline = trio.current_time() + self.config.head_timeout
                    deadline_set = True
                conn.receive_data(data)
        return None  # unreachable: fail_after raises

    async def _send_error(self, stream: trio.SocketStream, conn: h11.Connection, status: int) -> None:
        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        response = simple_response(status, "malformed request", [("connection", "close")])
        with trio.move_on_after(self.config.write_timeout):
            try:
                await self._send_response(stream, conn, False, response)
            except (_ClientGone, trio.BrokenResourceError, h11.LocalProtocolError):
                pass

    def _headers(self, response: Response) -> list[tuple[str, str]]:
        headers = [("server", SERVER_NAME), *response.headers]
        if response.status not in (204, 304):
            headers.append(("content-length", str(response.body.length)))
        return headers

    async def _send_response(
        self, stream: trio.SocketStream, conn: h11.Connection, head_only: bool, response: Response
    ) -> None:
        body = response.body
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
                await self._send_all(stream, head or b"")
            elif isinstance(body, BytesBody):
                await self._send_all(stream, (head or b"") + (conn.send(h11.Data(data=body.data)) or b""))
                self.stats.bytes_served += body.length
            else:
                await self._send_all(stream, head or b"")
                parts = conn.send_with_data_passthrough(h11.Data(data=_Span(body.length)))  # type: ignore[arg-type]
                if isinstance(body, FileBody):
                    await self._send_file(stream, body, parts)
                else:
                    assert isinstance(body, StreamBody)
                    await self._send_stream(stream, body)
            await self._send_all(stream, conn.send(h11.EndOfMessage()) or b"")
        finally:
            body.close()

    async def _send_all(self, stream: trio.SocketStream, data: bytes) -> None:
        if not data:
            return
        with trio.move_on_after(self.config.write_timeout) as scope:
            await stream.send_all(data)
        if scope.cancelled_caught:
            raise _ClientGone("write timed out")

    async def _send_stream(self, stream: trio.SocketStream, body: StreamBody) -> None:
        sent = 0
        async for chunk in body.chunks():
            if self._bucket is not None:
                view = memoryview(chunk)
                while view:
                    n = await self._bucket.take(len(view))
                    await self._send_all(stream, bytes(view[:n]))
                    view = view[n:]
            else:
                await self._send_all(stream, chunk)
            sent += len(chunk)
            self.stats.bytes_served += len(chunk)
        if sent != body.length:
            raise _ClientGone(f"stream body produced {sent} of {body.length} bytes")  # close: length lied

    async def _send_file(self, stream: trio.SocketStream, body: FileBody, parts: list[bytes] | None) -> None:
        # With Content-Length framing h11 adds nothing around the body: the passthrough list is just our span.
        if not parts or len(parts) != 1 or not isinstance(parts[0], _Span):
            raise h11.LocalProtocolError("unexpected body framing")
        if self.config.use_sendfile and hasattr(os, "sendfile"):
            await self._sendfile(stream, body)
        else:
            await self._copy_file(stream, body)

    async def _sendfile(self, stream: trio.SocketStream, body: FileBody) -> None:
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
                    sent = -1
                except OSError as exc:  # EPIPE, ECONNRESET: the client went away
                    raise _ClientGone(str(exc)) from None
                if sent == 0:
                    raise _ClientGone("file ended early: it was truncated under us")
                if sent < 0:
                    with trio.move_on_after(self.config.write_timeout) as scope:
                        await trio.lowlevel.wait_writable(out_fd)
                    if scope.cancelled_caught:
                        raise _ClientGone("client stopped reading")
                    continue
                offset += sent
                remaining -= sent
                allowance -= sent
                self.stats.bytes_served += sent
                await trio.lowlevel.checkpoint()

    async def _copy_file(self, stream: trio.SocketStream, body: FileBody) -> None:
        offset, remaining = body.offset, body.length
        while remaining:
            n = min(remaining, self.config.chunk_size)
            if self._bucket is not None:
                n = await self._bucket.take(n)
            chunk = await trio.to_thread.run_sync(os.pread, body.fd, n, offset)
            if not chunk:
                raise _ClientGone("file ended early: it was truncated under us")
            await self._send_all(stream, chunk)
            offset += len(chunk)
            remaining -= len(chunk)
            self.stats.bytes_served += len(chunk)


_BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\nserver: " + SERVER_NAME.encode() + b"\r\nretry-after: 1\r\n"
    b"connection: close\r\ncontent-length: 4\r\n\r\nbusy"
)


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
            with trio.move_on_after(0.5):
                try:
                    await stream.send_eof()
                    while await stream.receive_some(64 * KIB):
                        pass
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pass
        with trio.move_on_after(1):
            await stream.aclose()
