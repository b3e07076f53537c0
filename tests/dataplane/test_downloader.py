"""The downloader against several in-process servers, honest and not, in one trio.run each."""

from __future__ import annotations

import random

import trio

from swarmnode.node.dataplane.downloader import DownloadConfig, Downloader
from swarmnode.node.dataplane.http_client import ClientConfig, HttpClient
from swarmnode.node.dataplane.http_server import ServerConfig
from swarmnode.node.dataplane.sources import ScoringConfig, SourceBook
from swarmnode.node.dataplane.store import ShardStore
from tests.dataplane.helpers import ServedCopy, blobs, have_all, manifest_for, wait_until

SHARDS = blobs(8, 300_000)
MANIFEST = manifest_for(SHARDS)
FAST_SCORING = ScoringConfig(backoff_base=0.05, backoff_max=0.5)


def _downloader(book, stall=2.0, parallel=8, seed=0):
    client = HttpClient(ClientConfig(stall_timeout=stall))
    return Downloader(client, book, DownloadConfig(parallel, stall), rng=random.Random(seed))


async def _fetch(tmp_path, downloader, manifest=MANIFEST):
    store = ShardStore(tmp_path / "dst", manifest.run)
    verified = []
    await downloader.fetch(store, manifest, set(), verified.append)
    directory = store.finalize(manifest.version)
    for name, data in SHARDS:
        assert (directory / name).read_bytes() == data
    return sorted(verified)


def _scenario(tmp_path, servers, body, *, scoring=FAST_SCORING):
    """Start `servers` ({label: fault or None}), put them all in a book, run `body(copies, book)`."""

    async def main():
        async with trio.open_nursery() as nursery:
            copies = {}
            book = SourceBook(scoring)
            for label, (fault, config) in servers.items():
                copy = ServedCopy(tmp_path / label, SHARDS, MANIFEST, fault=fault, config=config)
                book.observe(have_all(await copy.start(nursery), MANIFEST))
                copies[label] = copy
            with trio.fail_after(20):
                await body(copies, book)
            nursery.cancel_scope.cancel()

    trio.run(main)


HONEST = (None, ServerConfig())


def test_shards_come_from_several_sources_in_parallel(tmp_path):
    async def body(copies, book):
        assert await _fetch(tmp_path, _downloader(book)) == list(range(8))
        served = [c.server.stats.bytes_served for c in copies.values()]
        assert all(s > 0 for s in served) and sum(served) == MANIFEST.total_size

    _scenario(tmp_path, {"a": HONEST, "b": HONEST}, body)


def _faulty(fault):
    def check(tmp_path, kind, stall=2.0):
        async def body(copies, book):
            downloader = _downloader(book, stall=stall)
            await _fetch(tmp_path, downloader)
            assert copies["bad"].server.stats.requests > 0
            return downloader

        result = {}

        async def wrapped(copies, book):
            result["downloader"] = await body(copies, book)
            result["book"] = book
            result["bad"] = copies["bad"].endpoint

        _scenario(tmp_path, {"bad": (fault, ServerConfig()), "good": HONEST}, wrapped)
        stats = result["downloader"].stats
        assert stats.failures.get(kind, 0) >= 1
        assert result["book"].get(result["bad"]).failures[kind] >= 1
        return result

    return check


def test_corrupt_bytes_are_discarded_and_the_source_banned(tmp_path):
    result = _faulty("corrupt")(tmp_path, "bad_hash")
    assert result["downloader"].stats.bytes_discarded > 0
    assert result["book"].get(result["bad"]).banned_until > 0


def test_a_truncated_transfer_resumes_from_its_last_byte_elsewhere(tmp_path):
    result = _faulty("truncate")(tmp_path, "truncated")
    # resumed, not restarted: at most the truncated halves were ever fetched twice
    assert result["downloader"].stats.bytes_received == MANIFEST.total_size


def test_a_stalled_transfer_is_abandoned_and_resumed(tmp_path):
    result = _faulty("stall")(tmp_path, "stall", stall=0.3)
    assert result["downloader"].stats.bytes_received == MANIFEST.total_size


def test_a_short_response_is_a_bad_response(tmp_path):
    _faulty("short")(tmp_path, "bad_response")


def test_a_source_killed_mid_transfer_is_survived(tmp_path):
    slow = (None, ServerConfig(upload_rate=1_000_000, chunk_size=64 * 1024))

    async def body(copies, book):
        # Only the slow source is known at first; it dies after serving some bytes, then another appears.
        dying, spare = copies["dying"], copies["spare"]
        book.remove(spare.endpoint)
        downloader = _downloader(book)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_fetch, tmp_path, downloader)
            await wait_until(lambda: dying.server.stats.bytes_served >= 500_000)
            dying.stop()
            book.observe(have_all(spare.endpoint, MANIFEST))
        assert downloader.stats.bytes_received == MANIFEST.total_size  # every byte before the kill kept
        assert spare.server.stats.responses[206] >= 1

    _scenario(tmp_path, {"dying": slow, "spare": HONEST}, body)


def test_with_only_liars_nothing_completes_and_nothing_hangs_on_one_source(tmp_path):
    async def body(copies, book):
        store = ShardStore(tmp_path / "dst", MANIFEST.run)
        downloader = _downloader(book)
        with trio.move_on_after(1.5) as scope:
            await downloader.fetch(store, MANIFEST, set(), lambda i: None)
        assert scope.cancelled_caught
        assert not store.is_complete(MANIFEST.version)
        assert store.verified_shards(MANIFEST) == set()
        assert downloader.stats.failures["bad_hash"] >= 2
        assert all(book.get(c.endpoint).banned_until > 0 for c in copies.values())

    _scenario(tmp_path, {"liar1": ("corrupt", ServerConfig()), "liar2": ("corrupt", ServerConfig())}, body)


def test_a_shard_no_source_has_waits_for_the_book(tmp_path):
    async def body(copies, book):
        late = copies["late"]
        book.remove(late.endpoint)
        downloader = _downloader(book)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_fetch, tmp_path, downloader)
            await trio.sleep(0.3)
            assert downloader.stats.bytes_received == 0
            book.observe(have_all(late.endpoint, MANIFEST))

    _scenario(tmp_path, {"late": HONEST}, body)


def _leave_part(tmp_path, index, data):
    """What a crash between a shard's last write and its rename leaves: a `.part` holding every byte."""
    store = ShardStore(tmp_path / "dst", MANIFEST.run)
    store.partial(MANIFEST.version, MANIFEST.shards[index]).part.write_bytes(data)


def test_a_part_file_holding_every_byte_is_committed_without_a_request(tmp_path):
    _, data = SHARDS[3]
    _leave_part(tmp_path, 3, data)

    async def body(copies, book):
        downloader = _downloader(book)
        assert await _fetch(tmp_path, downloader) == list(range(8))
        assert downloader.stats.bytes_received == MANIFEST.total_size - len(data)
        assert downloader.stats.failures == {}
        assert copies["a"].server.stats.bytes_served == MANIFEST.total_size - len(data)

    _scenario(tmp_path, {"a": HONEST}, body)


def test_a_full_part_file_with_wrong_bytes_is_fetched_again_and_blames_no_source(tmp_path):
    _, data = SHARDS[3]
    _leave_part(tmp_path, 3, bytes(len(data)))

    async def body(copies, book):
        downloader = _downloader(book)
        await _fetch(tmp_path, downloader)
        assert downloader.stats.bytes_received == MANIFEST.total_size
        source = book.get(copies["a"].endpoint)
        assert source.banned_until == 0 and not source.failures

    _scenario(tmp_path, {"a": HONEST}, body)
