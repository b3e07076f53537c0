"""Download progress: a protocol the downloader reports to, a silent default and a rich terminal bar."""

from __future__ import annotations

from typing import Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)


class ProgressSink(Protocol):
    def begin(self, version: int, total: int, done: int) -> None: ...

    def advance(self, version: int, nbytes: int) -> None: ...

    def rewind(self, version: int, nbytes: int) -> None: ...

    def end(self, version: int) -> None: ...


class NullProgress:
    def begin(self, version: int, total: int, done: int) -> None:
        pass

    def advance(self, version: int, nbytes: int) -> None:
        pass

    def rewind(self, version: int, nbytes: int) -> None:
        pass

    def end(self, version: int) -> None:
        pass


class RichProgress:
    """One bar per checkpoint version on stderr; call `start()`/`stop()` around its use."""

    def __init__(self, console: Console | None = None) -> None:
        self._progress = Progress(
            TextColumn("checkpoint v{task.fields[version]}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=console or Console(stderr=True),
            transient=False,
        )
        self._tasks: dict[int, TaskID] = {}

    def start(self) -> None:
        self._progress.start()

    def stop(self) -> None:
        self._progress.stop()

    def begin(self, version: int, total: int, done: int) -> None:
        if version not in self._tasks:
            self._tasks[version] = self._progress.add_task("", total=total, completed=done, version=version)

    def advance(self, version: int, nbytes: int) -> None:
        task = self._tasks.get(version)
        if task is not None:
            self._progress.advance(task, nbytes)

    def rewind(self, version: int, nbytes: int) -> None:
        task = self._tasks.get(version)
        if task is not None:
            self._progress.advance(task, -nbytes)

    def end(self, version: int) -> None:
        task = self._tasks.pop(version, None)
        if task is not None:
            self._progress.stop_task(task)
