"""Length-prefixed framing with deadlines, on in-memory streams and a virtual clock."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from swarmnode.node.p2p.reqresp import FrameError, read_frame, read_request_frame, write_frame


class Adapter:
    """A trio stream with libp2p's read(n)/write(data) surface."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream

    async def read(self, n: int | None = None) -> bytes:
        return await self.stream.receive_some(n)

    async def write(self, data: bytes) -> None:
        await self.stream.send_all(data)


def run(fn) -> None:  # type: ignore[no-untyped-def]
    trio.run(fn, clock=trio.testing.MockClock(autojump_threshold=0))


def test_roundtrip_in_small_pieces() -> None:
    async def main() -> None:
        left, right = trio.testing.memory_stream_pair()
        reader = Adapter(right)
        await write_frame(Adapter(left), b"hello world")
        assert await read_frame(reader, max_size=100) == b"hello world"

    run(main)


@pytest.mark.parametrize(
    "prefix, error", [(b"\xff\xff\xff\xff", "exceeds the cap"), (b"\x00\x00\x00\x00", "empty")]
)
def test_bad_length_prefixes(prefix: bytes, error: str) -> None:
    async def main() -> None:
        left, right = trio.testing.memory_stream_pair()
        await left.send_all(prefix)
        with pytest.raises(FrameError, match=error):
            await read_frame(Adapter(right), max_size=100)

    run(main)


def test_truncated_frame_and_clean_eof() -> None:
    async def main() -> None:
        left, right = trio.testing.memory_stream_pair()
        await left.send_all((10).to_bytes(4, "big") + b"abc")
        await left.aclose()
        with pytest.raises(FrameError, match="ended after 3 of 10"):
            await read_frame(Adapter(right), max_size=100)
        left, right = trio.testing.memory_stream_pair()
        await left.aclose()
        with pytest.raises(EOFError):
            await read_frame(Adapter(right), max_size=100)

    run(main)


def test_a_stalled_sender_times_out() -> None:
    async def main() -> None:
        left, right = trio.testing.memory_stream_pair()
        await left.send_all((10).to_bytes(4, "big") + b"abc")  # and then nothing
        start = trio.current_time()
        with pytest.raises(trio.TooSlowError), trio.fail_after(5):
            await read_frame(Adapter(right), max_size=100)
        assert trio.current_time() - start == pytest.approx(5)

    run(main)


def test_request_frame_deadline_scales_with_the_declared_length() -> None:
    """A sender must keep up `min_rate` after the grace period: a slow-loris is cut, a fast one is not."""

    async def trickle(left: trio.abc.Stream, body: bytes, per_second: int) -> None:
        await left.send_all(len(body).to_bytes(4, "big"))
        for i in range(0, len(body), per_second):
            await left.send_all(body[i : i + per_second])
            await trio.sleep(1)

    async def main() -> None:
        body = b"x" * 1000
        # 1000 bytes at min_rate 100 B/s with 2 s grace: 12 s allowed; sent at 250 B/s it arrives in 4 s
        left, right = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trickle, left, body, 250)
            got = await read_request_frame(Adapter(right), max_size=10_000, grace=2, min_rate=100)
        assert got == body
        # sent at 50 B/s it would take 20 s: cut at exactly 12 s
        left, right = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trickle, left, body, 50)
            start = trio.current_time()
            with pytest.raises(trio.TooSlowError):
                await read_request_frame(Adapter(right), max_size=10_000, grace=2, min_rate=100)
            assert trio.current_time() - start == pytest.approx(12)
            nursery.cancel_scope.cancel()

    run(main)


def test_request_frame_length_prefix_has_its_own_deadline() -> None:
    async def main() -> None:
        left, right = trio.testing.memory_stream_pair()
        await left.send_all(b"\x00\x00")  # half a length prefix, then nothing
        start = trio.current_time()
        with pytest.raises(trio.TooSlowError):
            await read_request_frame(Adapter(right), max_size=100, grace=3, min_rate=1)
        assert trio.current_time() - start == pytest.approx(3)
        left, right = trio.testing.memory_stream_pair()
        await left.send_all(b"\x00\x01\x00\x00")  # 64 KiB declared, cap 100: refused before any body read
        with pytest.raises(FrameError, match="exceeds the cap"):
            await read_request_frame(Adapter(right), max_size=100, grace=3, min_rate=1)

    run(main)
