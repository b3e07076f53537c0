#!/usr/bin/env python3
"""Write every conformance suite's vector files under spec/vectors (`make vectors`).

The suites are the table of node/conformance.py; each names the modules of tests/ whose `SUITES` (suite
name -> case generator) fill its directory, and this one script renders them all the same way. Never edit
a vector file by hand: change a case (or the protocol) and run this; each suite's tests fail while the
committed files and the cases disagree.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from swarmnode.node.conformance import SUITES, Suite, suite_named

ROOT = Path(__file__).resolve().parent.parent
VECTORS = ROOT / "spec" / "vectors"
GENERATED_BY = "scripts/gen_vectors.py"
sys.path.insert(0, str(ROOT))  # the generators are modules of tests/

Vector = dict[str, Any]


def generators_of(suite: Suite) -> dict[str, Callable[[], Iterable[Vector]]]:
    """Suite name -> case generator, over every module the suite names (a name given twice is an error)."""
    found: dict[str, Callable[[], Iterable[Vector]]] = {}
    for module_name in suite.generators:
        for name, generate in importlib.import_module(module_name).SUITES.items():
            if name in found:
                raise SystemExit(f"suite {name!r} defined twice")
            found[name] = generate
    return found


def render(name: str, cases: Iterable[Vector]) -> str:
    document = {"suite": name, "generated_by": GENERATED_BY, "cases": list(cases)}
    return json.dumps(document, indent=1) + "\n"


def write(suite: Suite, root: Path = VECTORS) -> None:
    """Render every file of `suite` into its directory and remove the files no generator names any more."""
    generators = generators_of(suite)
    folder = suite.folder(root)
    folder.mkdir(parents=True, exist_ok=True)
    wanted = {suite.file_for(root, name) for name in generators}
    for stale in set(folder.glob("*.json")) - wanted:
        stale.unlink()
    for name, generate in generators.items():
        cases = list(generate())
        suite.file_for(root, name).write_text(render(name, cases))
        print(f"{name}: {len(cases)} cases -> {suite.file_for(root, name).relative_to(root)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=VECTORS, help="vectors root (default: spec/vectors)")
    parser.add_argument("--suite", action="append", choices=[s.name for s in SUITES],
                        help="only this suite (repeatable; default: every suite)")
    args = parser.parse_args()
    for suite in [suite_named(name) for name in args.suite] if args.suite else SUITES:
        write(suite, args.out)


if __name__ == "__main__":
    main()
