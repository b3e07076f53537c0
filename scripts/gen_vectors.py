#!/usr/bin/env python3
"""Write spec/vectors/*.json from the conformance cases in tests/conformance/cases_*.py.

Never edit the vector files by hand: change a case (or the protocol) and run this script;
tests/conformance/test_vectors.py fails when the committed files and the cases disagree.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def collect_suites() -> dict[str, list[dict[str, Any]]]:
    suites: dict[str, list[dict[str, Any]]] = {}
    for path in sorted((ROOT / "tests" / "conformance").glob("cases_*.py")):
        module = importlib.import_module(f"tests.conformance.{path.stem}")
        for name, generate in module.SUITES.items():
            if name in suites:
                raise SystemExit(f"suite {name!r} defined twice")
            suites[name] = list(generate())
    return suites


def render(suite: str, cases: list[dict[str, Any]]) -> str:
    document = {"suite": suite, "generated_by": "scripts/gen_vectors.py", "cases": cases}
    return json.dumps(document, indent=1, sort_keys=False) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "spec" / "vectors")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    suites = collect_suites()
    for stale in args.out.glob("*.json"):
        if stale.stem not in suites:
            stale.unlink()
    for suite, cases in suites.items():
        (args.out / f"{suite}.json").write_text(render(suite, cases))
        print(f"{suite}: {len(cases)} cases")


if __name__ == "__main__":
    main()
