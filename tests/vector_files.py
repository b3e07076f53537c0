"""A directory of generated vector files, one file per suite (spec/README.md, "Conformance vectors").

Each `tests/**/cases_*.py` generator names its suites and where they go; this writes and renders them the
same way for all, so a replay test compares the committed file with `render(suite)` byte for byte.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class VectorFiles:
    directory: Path
    generator: str  # the module that writes them: `python -m <generator>`
    prefix: str  # suite names carry it, file names drop it
    suites: Mapping[str, Callable[[], Iterable[Any]]]

    def render(self, suite: str) -> str:
        document = {
            "suite": suite,
            "generated_by": f"python -m {self.generator}",
            "cases": list(self.suites[suite]()),
        }
        return json.dumps(document, indent=1) + "\n"

    def file_for(self, suite: str) -> Path:
        return self.directory / f"{suite.removeprefix(self.prefix)}.json"

    def write(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        for suite in self.suites:
            text = self.render(suite)
            self.file_for(suite).write_text(text)
            print(f"{suite}: {len(json.loads(text)['cases'])} cases -> {self.file_for(suite)}")
