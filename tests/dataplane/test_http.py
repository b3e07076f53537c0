"""The h11 server and client, in one trio.run: ranges, keep-alive, limits, and every deadline."""

from __future__ import annotations

import os
import socket

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarmnode.node.dataplane.errors import ConnectFailed, Stalled, Truncated
from swarmnode.node.dataplane.http_client import ClientConfig, HttpClient
from swarmnode.node.dataplane.http_server import (
    FileBody,
    HttpServer,
    Response,
    ServerConfig,
    StreamBody,
    simple_response,
)
from tests.dataplane.helpers import wait_until

DATA = os.urandom(3 * 1024 * 1024 + 17)


def _handler(path):
    async def handle(request):
        if request.target == "/file":
            fd = os.open(path, os.O_RDONLY)
            return Response(200, [("accept-ranges", "bytes")], FileBody(fd, 0, len(DATA)))
        if request.target == "/tail":
            fd = os.open(path, os.O_RDONLY)
            return Response(206, [], FileBody(fd, 1000, len(DATA) - 1000))
        if request.target == "/stall":

            async def chunks():
                yield DATA[:1000]
                await trio.sleep_forever()

            return Response(200, [], StreamBody(len(DATA), chunks))
        if request.target == "/truncate":

            async def chunks():
                yield DATA[:5000]

            return Response(200, [], StreamBody(len(DATA), chunks))
        if request.target.startswith("/trickle"):  # /trickle/<piece bytes>/<pause ms>: DATA[:64 KiB], paced
            _, _, piece, pause = request.target.split("/")
            body = DATA[: 64 * 1024]

            async def chunks():
                for start in range(0, len(body), int(piece)):
                    yield body[start : start + int(piece)]
                    await trio.sleep(int(pause) / 1000)

            return Response(200, [], StreamBody(len(body), chunks))
        if request.target == "/slow-head":
            await trio.sleep(5)
        return simple_response(404, "no")

    return handle


def run_with_server(tmp_path, test, server_config=None, client_config=None):
    path = tmp_path / "blob"
    path.write_bytes(DATA)

    async def main():
        server = HttpServer(_handler(path), server_config or ServerConfig())
        async with trio.open_nursery() as nursery:
            port = await nursery.start(server.serve)
            client = HttpClient(client_config or ClientConfig())
            try:
                await test(server, client, f"http://127.0.0.1:{port}", port)
            finally:
                await client.aclose()
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_get_streams_the_file_and_reuses_the_connection(tmp_path):
    async def test(server, client, url, port):
        for _ in range(3):
            status, headers, body = await client.get(url, "/file", len(DATA))
            assert status == 200 and body == DATA
        status, _, body = await client.get(url, "/tail", len(DATA))
        assert status == 206 and body == DATA[1000:]
        assert client.connections_opened == 1
        assert server.stats.bytes_served == 4 * len(DATA) - 1000
        assert server.stats.responses[200] == 3

    run_with_server(tmp_path, test)


def test_a_pooled_connection_the_server_closed_is_replaced_transparently(tmp_path):
    async def test(server, client, url, port):
        assert (await client.get(url, "/nope", 100))[0] == 404
        await trio.sleep(0.5)  # past the server's idle timeout: the pooled connection is dead
        assert (await client.get(url, "/nope", 100))[0] == 404
        assert client.connections_opened == 2

    run_with_server(tmp_path, test, ServerConfig(idle_timeout=0.2))


def test_head_sends_the_length_but_no_body(tmp_path):
    async def test(server, client, url, port):
        async with client.request(url, "HEAD", "/file") as response:
            assert response.status == 200
            assert response.headers["content-length"] == str(len(DATA))
            assert await response.read(0) == b""
        status, _, body = await client.get(url, "/file", len(DATA))  # the connection is still in sync
        assert body == DATA and client.connections_opened == 1

    run_with_server(tmp_path, test)


def test_chunks_are_large_and_bounded(tmp_path):
    async def test(server, client, url, port):
        sizes = []
        async with client.request(url, "GET", "/file") as response:
            async for chunk in response.chunks():
                sizes.append(len(chunk))
        assert sum(sizes) == len(DATA) and max(sizes) == 1 << 20 and len(sizes) == 4

    run_with_server(tmp_path, test)


def test_a_stalled_body_raises_stalled_after_the_bytes_it_sent(tmp_path):
    async def test(server, client, url, port):
        got = 0
        with pytest.raises(Stalled):
            async with client.request(url, "GET", "/stall") as response:
                async for chunk in response.chunks(stall_timeout=0.3):
                    got += len(chunk)
        assert got == 1000

    run_with_server(tmp_path, test)


def test_a_truncated_body_raises_truncated_after_the_bytes_it_sent(tmp_path):
    async def test(server, client, url, port):
        got = b""
        with pytest.raises(Truncated):
            async with client.request(url, "GET", "/truncate") as response:
                async for chunk in response.chunks():
                    got += bytes(chunk)
        assert got == DATA[:5000]
        status, _, _ = await client.get(url, "/nope", 100)  # a fresh connection replaces the broken one
        assert status == 404 and client.connections_opened == 2

    run_with_server(tmp_path, test)


def test_a_slow_response_head_times_out(tmp_path):
    async def test(server, client, url, port):
        with pytest.raises(Stalled):
            await client.get(url, "/slow-head", 100, head_timeout=0.2)

    run_with_server(tmp_path, test)


def test_connecting_to_a_closed_port_fails_fast(tmp_path):
    async def test(server, client, url, port):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        free = sock.getsockname()[1]
        sock.close()
        with pytest.raises(ConnectFailed):
            await client.get(f"http://127.0.0.1:{free}", "/", 10)

    run_with_server(tmp_path, test)


async def _raw(port, data, read=True):
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(data)
    out = b""
    if read:
        with trio.move_on_after(2):
            while chunk := await stream.receive_some(65536):
                out += chunk
    await stream.aclose()
    return out


def test_methods_other_than_get_and_head_get_405(tmp_path):
    async def test(server, client, url, port):
        reply = await _raw(port, b"DELETE /file HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        assert reply.startswith(b"HTTP/1.1 405") and b"allow: GET, HEAD" in reply

    run_with_server(tmp_path, test)


def test_a_request_with_a_body_is_refused(tmp_path):
    async def test(server, client, url, port):
        reply = await _raw(port, b"GET /file HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\n\r\nabc")
        assert reply.startswith(b"HTTP/1.1 400")

    run_with_server(tmp_path, test)


def test_garbage_gets_400_and_a_close(tmp_path):
    async def test(server, client, url, port):
        reply = await _raw(port, b"\x00\x01 garbage\r\n\r\n")
        assert reply.startswith(b"HTTP/1.1 400")

    run_with_server(tmp_path, test)


def test_an_oversized_head_is_refused(tmp_path):
    async def test(server, client, url, port):
        reply = await _raw(port, b"GET /file HTTP/1.1\r\nx: " + b"a" * 40_000 + b"\r\n\r\n")
        assert reply.startswith(b"HTTP/1.1 431") or reply.startswith(b"HTTP/1.1 400")

    run_with_server(tmp_path, test)


def test_slowloris_and_idle_connections_are_dropped(tmp_path):
    async def test(server, client, url, port):
        slow = await trio.open_tcp_stream("127.0.0.1", port)
        await slow.send_all(b"GET /file HTTP/1.1\r\n")  # never finishes its head
        idle = await trio.open_tcp_stream("127.0.0.1", port)  # never says anything
        with trio.fail_after(3):
            assert await slow.receive_some(100) == b""
            assert await idle.receive_some(100) == b""
        assert server.stats.aborted == 2

    run_with_server(tmp_path, test, ServerConfig(idle_timeout=0.5, head_timeout=0.2))


def test_a_client_that_stops_reading_is_dropped(tmp_path):
    async def test(server, client, url, port):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        sock.sendall(b"GET /file HTTP/1.1\r\nhost: x\r\n\r\n")
        with trio.fail_after(5):
            await wait_until(lambda: server.stats.aborted > 0)
        sock.close()
        assert server.stats.bytes_served < len(DATA)

    run_with_server(tmp_path, test, ServerConfig(write_timeout=0.3))


def test_connections_past_the_limit_get_503_when_every_slot_is_serving(tmp_path):
    async def test(server, client, url, port):
        holders = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(2)]
        for stream in holders:  # each is mid-request (its handler sleeps): not evictable
            await stream.send_all(b"GET /slow-head HTTP/1.1\r\nhost: x\r\n\r\n")
        await trio.sleep(0.1)
        reply = await _raw(port, b"GET /file HTTP/1.1\r\nhost: x\r\n\r\n")
        assert reply.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in reply
        assert server.stats.rejected_busy == 1
        for stream in holders:
            await stream.aclose()

    run_with_server(tmp_path, test, ServerConfig(max_connections=2))


def test_upload_rate_is_capped(tmp_path):
    async def test(server, client, url, port):
        started = trio.current_time()
        status, _, body = await client.get(url, "/file", len(DATA))
        elapsed = trio.current_time() - started
        assert body == DATA and elapsed > 0.25  # 3 MiB at 8 MiB/s with a 1 MiB burst: ≥ 0.27 s

    run_with_server(tmp_path, test, ServerConfig(upload_rate=8 * 1024 * 1024))


def test_the_copy_path_without_sendfile_serves_the_same_bytes(tmp_path):
    async def test(server, client, url, port):
        status, _, body = await client.get(url, "/file", len(DATA))
        assert body == DATA

    run_with_server(tmp_path, test, ServerConfig(use_sendfile=False))


def test_a_body_read_sets_the_low_water_mark_and_a_reused_connection_gets_it_back_at_one(tmp_path):
    async def test(server, client, url, port):
        marks = []
        async with client.request(url, "GET", "/file") as response:
            sock = response._stream.socket
            async for _ in response.chunks():
                marks.append(sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT))
        assert min(marks) > 1  # woken per mark, not per segment
        assert max(marks) <= max(1024, sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 8)
        (pooled,) = client._idle[next(iter(client._idle))]
        assert pooled.socket.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == 1  # heads wake at once
        assert (await client.get(url, "/nope", 100))[0] == 404 and client.connections_opened == 1

    run_with_server(tmp_path, test, client_config=ClientConfig(recv_low_water=64 * 1024))


def test_bytes_below_the_mark_are_read_at_the_stall_deadline_not_reported_as_a_stall(tmp_path):
    async def test(server, client, url, port):
        started = trio.current_time()
        async with client.request(url, "GET", "/trickle/4096/100") as response:  # 16 pieces, 0.1 s apart
            got = b"".join([bytes(c) async for c in response.chunks(stall_timeout=0.3)])
        assert got == DATA[: 64 * 1024]
        assert trio.current_time() - started < 5
        assert response.reads <= 16  # never more wake-ups than pieces

    run_with_server(tmp_path, test, client_config=ClientConfig(recv_low_water=1 << 20))


def test_a_paced_body_costs_far_fewer_reads_with_the_mark(tmp_path):
    """1448-byte pieces 1 ms apart (a 10 Mbit/s link's segments): without the mark a reader wakes for about
    every piece; with it, once per mark (a loaded machine can only merge reads, never split them)."""

    async def test(server, client, url, port):
        async with client.request(url, "GET", "/trickle/1448/1") as response:
            assert sum([len(c) async for c in response.chunks()]) == 64 * 1024
        assert response.reads <= 8  # 64 KiB in marks of 16 KiB, plus the tail and a deadline or two

    run_with_server(tmp_path, test, client_config=ClientConfig(recv_low_water=16 * 1024))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    piece=st.sampled_from([64, 700, 1448, 9000, 65536]),
    pause_ms=st.sampled_from([0, 1, 20]),
    low_water=st.sampled_from([1, 1000, 64 * 1024, 1 << 20]),
)
def test_any_pacing_and_mark_deliver_the_exact_body(tmp_path, piece, pause_ms, low_water):
    if piece < 700:
        pause_ms = 0  # 1,024 paced pieces would take too long: unpaced tiny pieces cover that case

    async def test(server, client, url, port):
        async with client.request(url, "GET", f"/trickle/{piece}/{pause_ms}") as response:
            got = b"".join([bytes(c) async for c in response.chunks(stall_timeout=2)])
        assert got == DATA[: 64 * 1024]
        assert client.statistics()["body_reads"] == response.reads > 0
        assert (await client.get(url, "/tail", len(DATA)))[2] == DATA[1000:]  # the pooled connection works
        assert client.connections_opened == 1

    # One process plays both ends: the server's pace would charge it the client's turns on a loaded machine.
    lenient = ServerConfig(send_grace=300)
    run_with_server(tmp_path, test, lenient, ClientConfig(recv_low_water=low_water))
