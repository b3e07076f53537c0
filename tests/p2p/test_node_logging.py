"""What a node's log shows of py-libp2p: its own errors, but not the duplicates of failures it raises to
our code, which handles them (issue #32: peers that stop normally left dozens of ERROR lines)."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmnode.node.config import load_config
from swarmnode.node.runtime import configure_logging

# as py-libp2p 0.8.1's BasicHost.new_stream logs it, just before raising StreamFailure
FAILED_STREAM = (
    "Failed to open stream to peer 16Uiu2HAmS8cNScGLUyty3btZ3sosrLqecLQ2bj4zUpv475zJombX:\n"
    "  Error: protocol read failed: fail to read from multiselect communicator, "
    "protocol=/swarmnode/submit/1.0.0\n  Protocols: ['/swarmnode/submit/1.0.0']"
)


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in root.handlers:
        handler.close()
    root.handlers[:], root.level = handlers, level


def _node_log(tmp_path: Path, level: str, libp2p_level: str = "ERROR") -> io.StringIO:
    config = load_config(None, {"identity": tmp_path / "k", "run": "r", "role": "worker",
                                "data_dir": tmp_path, "log_level": level,
                                "libp2p_log_level": libp2p_level})
    stream = io.StringIO()
    configure_logging(config, stream=stream)
    return stream


def test_a_stream_failure_libp2p_raises_to_us_is_not_an_error_line(tmp_path: Path, restore_logging) -> None:
    stream = _node_log(tmp_path, "INFO")
    basic_host = logging.getLogger("libp2p.host.basic_host")
    basic_host.error(FAILED_STREAM)
    basic_host.error("some other failure libp2p keeps to itself")
    shown = stream.getvalue()
    assert "Failed to open stream" not in shown
    assert "ERROR libp2p.host.basic_host: some other failure libp2p keeps to itself" in shown
    assert "Failed to open stream" not in (tmp_path / "node.log").read_text()


def test_at_debug_the_stream_failure_is_shown_as_debug(tmp_path: Path, restore_logging) -> None:
    stream = _node_log(tmp_path, "DEBUG", "DEBUG")
    logging.getLogger("libp2p.host.basic_host").error(FAILED_STREAM)
    assert "DEBUG libp2p.host.basic_host: Failed to open stream to peer" in stream.getvalue()
    configure_logging(load_config(None, {"identity": tmp_path / "k", "run": "r", "role": "worker",
                                         "data_dir": tmp_path}), stream=io.StringIO())
    filters = logging.getLogger("libp2p.host.basic_host").filters
    assert len(filters) == 1  # configuring twice (a restart in one process) adds it once
