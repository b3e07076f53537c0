"""A WAN leaves no work folder behind: `close()` removes its own, `destroy_stale()` those of dead runs."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmnode.node.wan import Link, Wan, WanUnavailable, check_available
from swarmnode.node.wan.harness import remove_stale_workdirs

PIDS = st.integers(min_value=1, max_value=4_000_000)
SUFFIX = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(
    runs=st.lists(st.tuples(PIDS, st.integers(1, 99), SUFFIX), max_size=8, unique_by=lambda r: r[0]),
    alive=st.sets(PIDS, max_size=8),
    strangers=st.lists(
        st.sampled_from(["swan12-1", "swan-1-ab", "swanx-1-ab", "other", "swan7-1-ab.txt", "xswan7-1-ab"]),
        unique=True,
    ),
)
def test_only_folders_of_dead_runs_are_removed(
    runs: list[tuple[int, int, str]], alive: set[int], strangers: list[str]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        folders = {}
        for pid, n, suffix in runs:
            folder = root / f"swan{pid}-{n}-{suffix}"
            folder.mkdir()
            (folder / "emu.log").write_text("log")
            folders[folder] = pid
        for name in strangers:  # not a WAN work folder (or not a folder): never touched
            path = root / name
            if name.endswith(".txt"):
                path.write_text("x")
            else:
                path.mkdir()
        removed = remove_stale_workdirs(root, alive=lambda pid: pid in alive)
        assert sorted(removed) == sorted(f for f, pid in folders.items() if pid not in alive)
        for folder, pid in folders.items():
            assert folder.exists() == (pid in alive)
        assert all((root / name).exists() for name in strangers)


def test_a_folder_whose_process_is_gone_is_removed_and_ours_is_kept(tmp_path: Path) -> None:
    """The real liveness check: a pid that has exited, and our own."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = tmp_path / f"swan{gone.pid}-1-abc"
    ours = tmp_path / f"swan{os.getpid()}-1-abc"
    for folder in (dead, ours):
        folder.mkdir()
        (folder / "emu.json").write_text("{}")
    assert remove_stale_workdirs(tmp_path) == [dead]
    assert not dead.exists() and ours.exists()


@pytest.mark.slow
def test_close_removes_the_work_folder_and_keeps_the_last_statistics() -> None:
    try:
        check_available()
    except WanUnavailable as err:
        pytest.skip(str(err))
    wan = Wan.create({"a": Link(10.0, 10.0, delay_ms=1.0)})
    workdir = wan._workdir
    assert (workdir / "emu.json").exists()
    deadline = time.monotonic() + 10
    while not wan.statistics() and time.monotonic() < deadline:  # its first counters, within a second
        time.sleep(0.1)
    written = wan.statistics()
    assert "dropped_loss" in written
    wan.close()
    assert not workdir.exists()
    stats = wan.statistics()  # what the emulator wrote last, kept past its folder
    assert stats.keys() == written.keys() and stats["wall_s"] >= written["wall_s"]
    wan.close()  # idempotent
    assert not workdir.exists()
