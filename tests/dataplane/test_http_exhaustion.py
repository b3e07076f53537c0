"""One client cannot exhaust the HTTP data plane: real sockets from distinct loopback addresses
(127.0.0.x, which Linux accepts as source addresses) against the real server, with an honest client
fetching a file throughout. Caps are shrunk so each flood is a handful of sockets."""

from __future__ import annotations

import os
import socket

import pytest
import trio

from swarmnode.node.dataplane.http_client import ClientConfig, HttpClient
from swarmnode.node.dataplane.http_server import (
    FileBody,
    HttpServer,
    Response,
    ServerConfig,
    simple_response,
)
from tests.dataplane.helpers import wait_until

DATA = os.urandom(1024 * 1024 + 3)
HONEST = "127.0.0.9"
FETCH_BOUND_S = 3.0  # an honest fetch of DATA on loopback under each flood must finish within this

# Small caps; loopback is not exempt here so that 127.0.0.x addresses are capped like remote ones.
SMALL = dict(
    max_connections=8,
    max_connections_per_address=3,
    max_long_polls=4,
    max_long_polls_per_address=1,
    exempt_networks=(),
)


def _handler(path):
    async def handle(request):
        if request.target == "/file":
            return Response(200, [], FileBody(os.open(path, os.O_RDONLY), 0, path.stat().st_size))
        if request.target.startswith("/poll?wait="):
            await trio.sleep(int(request.target.rsplit("=", 1)[1]))
            return Response(204)
        if request.target == "/hang":
            await trio.sleep_forever()
        if request.target == "/whoami":
            return simple_response(200, request.client)
        return simple_response(404, "no")

    return handle


def run_with_server(tmp_path, test, data=DATA, **config):
    path = tmp_path / "blob"
    path.write_bytes(data)

    async def main():
        server = HttpServer(_handler(path), ServerConfig(**{**SMALL, **config}))
        async with trio.open_nursery() as nursery:
            port = await nursery.start(server.serve)
            client = HttpClient(ClientConfig(local_address=HONEST))
            try:
                await test(server, client, f"http://127.0.0.1:{port}", port)
            finally:
                await client.aclose()
            nursery.cancel_scope.cancel()

    trio.run(main)


async def _connect(port, source):
    return await trio.open_tcp_stream("127.0.0.1", port, local_address=source)


async def _read_all(stream, timeout=2.0):  # noqa: ASYNC109 - a caller's scope would discard what arrived
    """What the peer sent until it closed or `timeout` passed: the bytes so far are the result either way."""
    out = b""
    with trio.move_on_after(timeout):
        while chunk := await stream.receive_some(65536):
            out += chunk
    return out


async def _honest_fetch(client, url, data=DATA):
    started = trio.current_time()
    with trio.fail_after(FETCH_BOUND_S):
        status, _, body = await client.get(url, "/file", len(data))
    assert status == 200 and body == data
    return trio.current_time() - started


async def _all_released(server, client):
    """Every slot comes back on every exit path, once the honest client's pooled connection is closed."""
    await client.aclose()
    with trio.fail_after(5):
        await wait_until(lambda: server.stats.connections_open == 0 and server.stats.long_polls_open == 0)
    assert server._slots.in_use == 0 and server._slots.held == {}
    assert server._polls.in_use == 0 and server._polls.held == {}


def test_the_handler_sees_the_client_address(tmp_path):
    async def test(server, client, url, port):
        status, _, body = await client.get(url, "/whoami", 100)
        assert (status, body) == (200, HONEST.encode())

    run_with_server(tmp_path, test)


def test_one_address_is_held_to_its_share_and_the_rest_is_refused_at_once(tmp_path):
    async def test(server, client, url, port):
        held = [await _connect(port, "127.0.0.2") for _ in range(3)]
        await wait_until(lambda: server.stats.connections_open == 3)
        refused = []
        for _ in range(5):
            stream = await _connect(port, "127.0.0.2")
            with trio.fail_after(1):  # refused before it sends anything: no deadline involved
                refused.append(await _read_all(stream))
            await stream.aclose()
        assert all(r.startswith(b"HTTP/1.1 503") and b"retry-after: 5" in r for r in refused)
        assert server.stats.rejected_address == 5 and server.stats.connections_open == 3
        assert await _honest_fetch(client, url) < FETCH_BOUND_S
        for stream in held:
            await stream.aclose()
        await _all_released(server, client)

    run_with_server(tmp_path, test, head_timeout=30)


def test_silent_connections_from_many_addresses_give_way_to_requests(tmp_path):
    async def test(server, client, url, port):
        silent = [await _connect(port, f"127.0.0.{2 + i % 4}") for i in range(8)]  # 2 per address: full
        await wait_until(lambda: server.stats.connections_open == 8)
        others = [HttpClient(ClientConfig(local_address=f"127.0.0.{n}")) for n in (10, 11)]
        for honest in [client, *others]:  # each keeps its connection: every fetch must evict a silent one
            assert await _honest_fetch(honest, url) < FETCH_BOUND_S
        assert server.stats.cut["evicted"] == 3 and server.stats.rejected_busy == 0
        gone = 0
        for stream in silent:
            with trio.move_on_after(0.2):
                gone += await stream.receive_some(10) == b""
            await stream.aclose()
        assert gone == 3
        for honest in others:
            await honest.aclose()
        await _all_released(server, client)

    run_with_server(tmp_path, test, head_timeout=30)


def test_a_newcomer_cannot_evict_an_address_holding_fewer_than_it_would(tmp_path):
    async def test(server, client, url, port):
        silent = [await _connect(port, f"127.0.0.{2 + i}") for i in range(8)]  # one each: full
        await wait_until(lambda: server.stats.connections_open == 8)
        first = await _connect(port, "127.0.0.20")  # holds 0: may evict an address holding 1
        await wait_until(lambda: server.stats.cut["evicted"] == 1)
        second = await _connect(port, "127.0.0.20")  # would hold 2: no address holds that many
        assert (await _read_all(second)).startswith(b"HTTP/1.1 503")
        assert server.stats.rejected_busy == 1 and server.stats.cut["evicted"] == 1
        for stream in [*silent, first, second]:
            await stream.aclose()
        await _all_released(server, client)

    run_with_server(tmp_path, test, head_timeout=30)


@pytest.mark.parametrize("first_bytes", [b"", b"GET /file HTTP/1.1\r\nhost: x\r\n"])
def test_a_head_not_complete_within_the_deadline_of_accept_is_cut(tmp_path, first_bytes):
    async def test(server, client, url, port):
        stream = await _connect(port, "127.0.0.2")
        started = trio.current_time()
        if first_bytes:
            await stream.send_all(first_bytes)
        with trio.fail_after(2):
            assert await stream.receive_some(100) == b""
        assert 0.25 <= trio.current_time() - started < 1.5
        assert server.stats.cut["head_timeout"] == 1
        await stream.aclose()
        await _all_released(server, client)

    run_with_server(tmp_path, test, head_timeout=0.3)


def test_a_trickled_head_is_cut_at_the_deadline_however_steady(tmp_path):
    async def test(server, client, url, port):
        stream = await _connect(port, "127.0.0.2")
        started = trio.current_time()
        closed = False
        with trio.fail_after(3):
            for byte in b"GET /file HTTP/1.1\r\nx-pad: " + b"a" * 1000:
                try:
                    await stream.send_all(bytes([byte]))
                except trio.BrokenResourceError:
                    closed = True
                    break
                await trio.sleep(0.02)
                if trio.current_time() - started > 1.5:
                    break
            closed = closed or await _read_all(stream, 1.0) == b""
        assert closed and server.stats.cut["head_timeout"] == 1
        await stream.aclose()

    run_with_server(tmp_path, test, head_timeout=0.5)


def test_a_kept_alive_connection_is_cut_after_the_idle_timeout(tmp_path):
    async def test(server, client, url, port):
        stream = await _connect(port, "127.0.0.2")
        await stream.send_all(b"GET /whoami HTTP/1.1\r\nhost: x\r\n\r\n")
        started = trio.current_time()
        with trio.fail_after(3):
            reply = await _read_all(stream)
        assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"127.0.0.2")
        assert 0.4 <= trio.current_time() - started < 2
        assert server.stats.cut["idle_timeout"] == 1
        await stream.aclose()

    run_with_server(tmp_path, test, idle_timeout=0.5, head_timeout=5)


def test_a_client_reading_below_the_minimum_rate_is_cut(tmp_path):
    """It reads steadily (so no write stall ever fires), just slowly: 4 KiB every 20 ms."""
    big = os.urandom(48 * 1024 * 1024)

    async def test(server, client, url, port):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        sock.bind(("127.0.0.2", 0))
        sock.connect(("127.0.0.1", port))
        sock.setblocking(False)
        sock.sendall(b"GET /file HTTP/1.1\r\nhost: x\r\n\r\n")
        started = trio.current_time()
        got = 0
        with trio.fail_after(10):
            while True:
                try:
                    chunk = sock.recv(4096)
                except BlockingIOError:
                    chunk = None
                except ConnectionResetError:
                    break
                if chunk == b"":
                    break
                got += len(chunk or b"")
                await trio.sleep(0.02)
        sock.close()
        assert server.stats.cut["slow_reader"] == 1
        assert got < len(big) and server.stats.bytes_served < len(big)
        assert trio.current_time() - started < 8
        await _honest_fetch(client, url, big)  # a reader at full speed is untouched by the same bound

    run_with_server(
        tmp_path, test, data=big, min_send_rate=8 * 1024 * 1024, send_grace=0.3, write_timeout=30
    )


def test_long_polls_are_capped_per_address_and_in_total_and_fetches_go_on(tmp_path):
    async def test(server, client, url, port):
        replies = {}

        async def poll(source, i):
            stream = await _connect(port, source)
            await stream.send_all(b"GET /poll?wait=2 HTTP/1.1\r\nhost: x\r\n\r\n")
            replies[source, i] = (await _read_all(stream, 3)).split(b"\r\n", 1)[0]
            await stream.aclose()

        async with trio.open_nursery() as nursery:
            for i in range(3):  # one address: 1 held, 2 refused
                nursery.start_soon(poll, "127.0.0.2", i)
            await wait_until(lambda: server.stats.rejected_long_poll == 2)
            for n in range(3, 7):  # four more addresses: 3 held (total 4), 1 refused
                nursery.start_soon(poll, f"127.0.0.{n}", 0)
            await wait_until(lambda: server.stats.rejected_long_poll == 3)
            assert server.stats.long_polls_open == 4
            assert await _honest_fetch(client, url) < 1.5  # while every long-poll slot is held
        statuses = sorted(replies.values())
        assert statuses.count(b"HTTP/1.1 204 No Content") == 4
        assert statuses.count(b"HTTP/1.1 503 Service Unavailable") == 3
        await _all_released(server, client)

    run_with_server(tmp_path, test, max_connections_per_address=4, max_long_polls_per_address=1)


def test_a_refused_long_poll_leaves_its_connection_usable(tmp_path):
    async def test(server, client, url, port):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.get, url, "/poll?wait=1", 10)
            await wait_until(lambda: server.stats.long_polls_open == 1)
            status, headers, _ = await client.get(url, "/poll?wait=1", 100)
            assert status == 503 and headers["retry-after"] == "2"
            assert (await client.get(url, "/whoami", 100))[0] == 200
        assert client.connections_opened == 2  # the refused poll's connection was reused

    run_with_server(tmp_path, test)


def test_a_handler_that_never_answers_gets_a_503_and_frees_its_slot(tmp_path):
    async def test(server, client, url, port):
        status, headers, _ = await client.get(url, "/hang", 100)
        assert status == 503 and "retry-after" in headers
        assert server.stats.handler_timeouts == 1
        assert (await client.get(url, "/whoami", 100))[0] == 200
        await _all_released(server, client)

    run_with_server(tmp_path, test, handler_timeout=0.2)


def test_a_refusal_storm_is_bounded_and_closes_the_excess_without_a_word(tmp_path):
    async def test(server, client, url, port):
        held = [await _connect(port, "127.0.0.2") for _ in range(3)]
        await wait_until(lambda: server.stats.connections_open == 3)
        storm = [await _connect(port, "127.0.0.2") for _ in range(80)]  # they never read or close
        with trio.fail_after(3):
            await wait_until(lambda: server.stats.rejected_address == 80)
        assert server.stats.refused_silently >= 80 - 64
        assert await _honest_fetch(client, url) < FETCH_BOUND_S
        for stream in [*held, *storm]:
            await stream.aclose()
        await _all_released(server, client)

    run_with_server(tmp_path, test, head_timeout=30)


def test_statistics_report_refusals_and_cuts(tmp_path):
    async def test(server, client, url, port):
        stream = await _connect(port, "127.0.0.2")
        with trio.fail_after(2):
            assert await stream.receive_some(10) == b""
        await stream.aclose()
        stats = server.statistics().as_dict()
        assert stats["cut"] == {"head_timeout": 1}
        for key in ("rejected_address", "rejected_busy", "rejected_long_poll", "refused_silently"):
            assert stats[key] == 0
        assert stats["long_polls_open"] == 0 and stats["handler_timeouts"] == 0

    run_with_server(tmp_path, test, head_timeout=0.2)
