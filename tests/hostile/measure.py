"""What a hostile peer costs its victims, read from outside: RSS from /proc, disk from the data dirs.

Victims are separate node processes, so nothing here asks them: `/proc/<pid>/status` gives the resident
set now (VmRSS) and its high-water mark since the process started (VmHWM), and the data directory's
allocated blocks give what the node keeps on disk (like `du`). A `Sampler` thread polls both while the
attack runs, so a short spike (a frame decoded, then freed) is seen even if it is gone by the end: VmHWM
keeps the peak the polls miss.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

PAGE_KIB = 1024  # /proc/<pid>/status reports kB


def proc_status_bytes(pid: int, key: str) -> int | None:
    """A `kB` line of /proc/<pid>/status (VmRSS, VmHWM) in bytes; None when the process is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    for line in text.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * PAGE_KIB
    return None


def rss_bytes(pid: int) -> int | None:
    return proc_status_bytes(pid, "VmRSS")


def peak_rss_bytes(pid: int) -> int | None:
    """The process's peak resident set since it started (VmHWM)."""
    return proc_status_bytes(pid, "VmHWM")


def du_bytes(path: Path) -> int:
    """Bytes allocated under `path` (st_blocks, as `du` counts them); files vanishing mid-walk are skipped."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:
                continue
    return total


def node_pids(devnet_folder: Path) -> dict[str, int]:
    """name → pid of every devnet node that has written a status file."""
    pids: dict[str, int] = {}
    for status in sorted(devnet_folder.glob("*/data/status.json")):
        try:
            pid = json.loads(status.read_text()).get("pid")
        except (OSError, ValueError):
            continue
        if isinstance(pid, int):
            pids[status.parent.parent.name] = pid
    return pids


@dataclass
class NodeMeter:
    """One victim's figures over a sampling period."""

    pid: int
    data_dir: Path
    rss_first: int | None = None
    rss_last: int | None = None
    rss_max: int = 0
    hwm_first: int | None = None
    hwm_last: int | None = None
    disk_first: int | None = None
    disk_last: int | None = None
    disk_max: int = 0
    samples: int = 0
    gone: bool = False

    def sample_rss(self) -> None:
        rss, hwm = rss_bytes(self.pid), peak_rss_bytes(self.pid)
        if rss is None or hwm is None:
            self.gone = True
            return
        self.samples += 1
        self.rss_first = rss if self.rss_first is None else self.rss_first
        self.hwm_first = hwm if self.hwm_first is None else self.hwm_first
        self.rss_last, self.hwm_last = rss, hwm
        self.rss_max = max(self.rss_max, rss)

    def sample_disk(self) -> None:
        disk = du_bytes(self.data_dir)
        self.disk_first = disk if self.disk_first is None else self.disk_first
        self.disk_last = disk
        self.disk_max = max(self.disk_max, disk)

    @property
    def peak_rss(self) -> int:
        """The highest resident set seen: polled, or the kernel's high-water mark if it rose meanwhile."""
        rose = self.hwm_last is not None and self.hwm_first is not None and self.hwm_last > self.hwm_first
        return max(self.rss_max, self.hwm_last or 0) if rose else self.rss_max

    @property
    def rss_growth(self) -> int:
        """Peak resident set above the first sample."""
        return max(0, self.peak_rss - (self.rss_first or 0))

    @property
    def disk_growth(self) -> int:
        return max(0, self.disk_max - (self.disk_first or 0))

    def as_dict(self) -> dict[str, object]:
        return {
            "pid": self.pid,
            "rss_first": self.rss_first,
            "rss_last": self.rss_last,
            "peak_rss": self.peak_rss,
            "rss_growth": self.rss_growth,
            "disk_first": self.disk_first,
            "disk_last": self.disk_last,
            "disk_growth": self.disk_growth,
            "samples": self.samples,
            "gone": self.gone,
        }


@dataclass
class Sampler:
    """Polls RSS every `rss_interval` s and disk every `disk_interval` s of the given victims, in a thread."""

    meters: dict[str, NodeMeter]
    rss_interval: float = 0.05
    disk_interval: float = 1.0
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    @classmethod
    def of(cls, victims: Mapping[str, tuple[int, Path]], **kwargs: float) -> Sampler:
        """`victims`: name → (pid, data dir)."""
        return cls({name: NodeMeter(pid, data) for name, (pid, data) in victims.items()}, **kwargs)

    def _loop(self) -> None:
        next_disk = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            for meter in self.meters.values():
                if not meter.gone:
                    meter.sample_rss()
            if now >= next_disk:
                for meter in self.meters.values():
                    meter.sample_disk()
                next_disk = now + self.disk_interval
            self._stop.wait(self.rss_interval)

    def start(self) -> Sampler:
        for meter in self.meters.values():  # first samples now, so growth is measured from here
            meter.sample_rss()
            meter.sample_disk()
        self._thread = threading.Thread(target=self._loop, name="victim-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict[str, dict[str, object]]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for meter in self.meters.values():
            if not meter.gone:
                meter.sample_rss()
            meter.sample_disk()
        return {name: meter.as_dict() for name, meter in self.meters.items()}
