"""The one table of conformance suites, and the replay `swarmnode conformance` runs over it.

A suite is one directory of vector files under spec/vectors (`core` is the top level itself). Each file is
`{"suite", "generated_by", "cases": [{name, kind, input, expect}]}`; a case passes when its suite's handler
for `kind` turns `input` into exactly `expect`. Handlers sit beside the code they replay: the pure rules'
in protocol/ and crypto/, the rest in the node package that owns the rule.

`generators` name the modules of tests/ whose `SUITES` (file's suite name -> cases) scripts/gen_vectors.py
renders into the directory: generation is a development tool that needs the tests' keys and fixtures,
replay ships with the package. A new vector directory is a new row here (tests/conformance/test_suites.py
fails until it is).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarmnode.crypto.toploc_conformance import TOPLOC_HANDLERS
from swarmnode.node.diloco.conformance import DILOCO_HANDLERS
from swarmnode.node.p2p.conformance import P2P_HANDLERS
from swarmnode.node.rl.conformance import ROLLOUT_HANDLERS
from swarmnode.protocol.errors import ProtocolError
from swarmnode.protocol.shards_conformance import SHARD_HANDLERS
from swarmnode.protocol.wire_conformance import WIRE_HANDLERS

Handler = Callable[[dict[str, Any]], dict[str, Any]]
Case = dict[str, Any]


@dataclass(frozen=True)
class Suite:
    name: str
    directory: str  # under the vectors root; "" is the root itself
    generators: tuple[str, ...]  # tests/ modules with `SUITES`, imported by scripts/gen_vectors.py only
    handlers: Mapping[str, Handler]  # case kind -> handler
    about: str

    def folder(self, root: Path) -> Path:
        return root / self.directory

    def file_for(self, root: Path, document: str) -> Path:
        """A document's file: its suite name less the directory's prefix (`diloco-run`: diloco/run.json)."""
        return self.folder(root) / f"{document.removeprefix(self.directory + '-')}.json"


SUITES: tuple[Suite, ...] = (
    Suite(
        "core",
        "",
        ("tests.conformance.cases_wire", "tests.conformance.cases_toploc"),
        {**WIRE_HANDLERS, **TOPLOC_HANDLERS},
        "identity, Merkle trees, codec, envelope, TOPLOC proofs (wire.md, toploc.md)",
    ),
    Suite("rollouts", "rollouts", ("tests.rl.cases_rollouts", "tests.rl.cases_episodes"), ROLLOUT_HANDLERS,
          "tasks, assignment, seeds, sampling, rewards, verdicts, multi-turn episodes (rollouts.md, "
          "validation.md, environments.md)"),
    Suite("diloco", "diloco", ("tests.diloco.cases_diloco",), DILOCO_HANDLERS,
          "DiLoCo rounds between trainers (diloco.md)"),
    Suite("shards", "shards", ("tests.dataplane.cases_shards",), SHARD_HANDLERS,
          "checkpoint manifests, heads, ranges, routes, retention (shards.md)"),
    Suite("p2p", "p2p", ("tests.p2p.cases_p2p",), P2P_HANDLERS,
          "DHT records, gossip topics, messages and authority (discovery.md, gossip.md)"),
)


def suite_named(name: str) -> Suite:
    for suite in SUITES:
        if suite.name == name:
            return suite
    raise KeyError(f"no conformance suite {name!r} (have {', '.join(s.name for s in SUITES)})")


@dataclass(frozen=True)
class CaseResult:
    suite: str  # the document's suite name (`diloco-run`)
    name: str
    passed: bool
    detail: str


def run_case(suite: Suite, document: str, case: Case) -> CaseResult:
    handler = suite.handlers.get(case["kind"])
    if handler is None:
        detail = f"no handler for kind {case['kind']!r} in suite {suite.name}"
        return CaseResult(document, case["name"], False, detail)
    try:
        got = handler(case["input"])
    except (ValueError, KeyError, AssertionError, ProtocolError) as exc:
        return CaseResult(document, case["name"], False, f"{type(exc).__name__}: {exc}")
    if got != case["expect"]:
        diff = {
            k: (case["expect"].get(k), got.get(k))
            for k in set(got) | set(case["expect"])
            if got.get(k) != case["expect"].get(k)
        }
        return CaseResult(document, case["name"], False, f"mismatch (expected, got): {diff}"[:500])
    return CaseResult(document, case["name"], True, "ok")


def load(suite: Suite, root: Path) -> list[tuple[str, list[Case]]]:
    """The documents of `suite` under the vectors root `root`, as (suite name, cases), in file order."""
    documents = []
    for path in sorted(suite.folder(root).glob("*.json")):
        document = json.loads(path.read_text())
        documents.append((document["suite"], document["cases"]))
    return documents


def replay(suites: Iterable[Suite], root: Path) -> list[CaseResult]:
    return [
        run_case(suite, document, case)
        for suite in suites
        for document, cases in load(suite, root)
        for case in cases
    ]
