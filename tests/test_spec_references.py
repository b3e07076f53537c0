"""Every reference from spec/*.md to the code resolves (issue #17: a reader finds a rule's code in one hop).

A move or a rename that leaves the spec pointing at nothing fails here, naming the spec file, the line and
the reference. The forms checked:

- a backticked dotted name rooted at one of the installed packages, `node.rl.validation.check_fields` or
  `ledger.types.Params`: the longest importable prefix is imported as `swarmnode.<prefix>`, the rest is
  looked up as attributes (a class, a method);
- a path from the repository root, backticked or bare, `node/rl/validation.py`, `node/validator/`,
  `spec/vectors/*.json` (a glob must match something): it exists. Only names ending in `/` or with a file
  suffix are paths (`ledger/2` is a protocol version);
- a backticked file name alone, `policy.py`: it exists in the folder the same paragraph last named;
- a module given by `python -m tests.rl.cases_rollouts`: its file exists;
- a name right after a module's path, "(`protocol/runs.py`, `check_descriptor`)": the module has it;
- a function name the spec uses on its own, `judge_total` or `derive_seed(run, worker, ...)`: looked up
  where `BARE_NAMES` says, a mapping kept by hand. Other backticked identifiers (fields, config keys,
  constants, error names) are not checked;
- a link to another spec document, `[rollouts.md](rollouts.md#vectors)`: the file exists.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "spec"
PACKAGES = ("node", "protocol", "crypto", "ledger")  # installed as swarmnode.<name>
FOLDERS = (*PACKAGES, "scripts", "tests", "benchmarks", "spec")

# Function names the spec uses bare, `name` or `name(args)`, without its module nearby:
# spec file -> name -> where it is defined.
BARE_NAMES: dict[str, dict[str, str]] = {
    "diloco.md": {
        "check_rl_plan": "protocol.diloco",
        "rollout_owner": "protocol.diloco",
        "winning_base": "protocol.diloco",
        "choose_outer_state": "protocol.diloco",
        "run_trainers": "protocol.runs",
        "initial_digest": "node.diloco.plan",
        "checkpoint_digest": "node.diloco.plan",
    },
    "discovery.md": {
        "open_envelope": "protocol.envelope",
        "find_providers": "node.p2p.dht.Discovery",
    },
    "gossip.md": {"authorise": "node.p2p.gossip.authority"},
    "ledger.md": {
        "check_active_validator": "ledger.state",
        "check_validator_set": "ledger.state",
        "check_run_validator": "ledger.state",
        "take_stake": "ledger.state",
        "worker_totals": "ledger.state",
        "check_slash_form": "ledger.evidence",
        "check_slash_evidence": "ledger.evidence",
        "cite_submission": "ledger.evidence",
        "run_key": "ledger.batches",
        "credit_slot": "ledger.batches",
        "credit_path": "ledger.batches",
        "root_from_path": "ledger.batches",
        "check_credit_proof": "ledger.interface.Ledger",
        "append_envelope": "ledger.signedlog.SignedLog",
    },
    "rollouts.md": {"derive_seed": "node.rl.sampling", "run_trainers": "protocol.runs"},
    "shards.md": {
        "verify_head": "protocol.shards",
        "check_head": "protocol.shards",
        "check_manifest_matches_head": "protocol.shards",
        "is_retained": "protocol.shards",
    },
    "validation.md": {"judge_total": "node.rl.validation", "derive_seed": "node.rl.sampling"},
}

_PKG = "|".join(PACKAGES)
DOTTED = re.compile(rf"`((?:{_PKG})(?:\.\w+)+)`")
PATH = re.compile(rf"(?<![\w/.-])((?:{'|'.join(FOLDERS)})/[\w./*-]*)")
FILE_NAME = re.compile(r"`(\w+\.py)`")
RUN_MODULE = re.compile(r"python -m ([\w.]+)")
NAME_AFTER_MODULE = re.compile(rf"`((?:{_PKG})/[\w/]+)\.py`,\s*`(\w+)`")
BACKTICKED = re.compile(r"`(\w+)[`(]")
LINK = re.compile(r"\]\(([^)#\s:]+)(?:#[^)]*)?\)")


def _is_path(text: str) -> bool:
    return text.endswith("/") or "." in text.rsplit("/", 1)[-1]


def collect() -> list[tuple[str, str, str]]:
    """(where, kind, target) of every reference in the spec, in order; `where` is file:line."""
    refs: list[tuple[str, str, str]] = []
    for doc in sorted(SPEC.glob("*.md")):
        folder: str | None = None  # the folder the current paragraph last named
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            where = f"{doc.name}:{number}"
            if not line.strip():
                folder = None
            found: list[tuple[int, str, str]] = []  # (column, kind, target)
            for m in DOTTED.finditer(line):
                found.append((m.start(), "name", m.group(1)))
            for m in PATH.finditer(line):
                path = m.group(1).rstrip(".,;:")
                if _is_path(path):
                    found.append((m.start(), "path", path))
            for m in FILE_NAME.finditer(line):
                found.append((m.start(), "file", m.group(1)))
            for m in RUN_MODULE.finditer(line):
                found.append((m.start(), "path", m.group(1).replace(".", "/") + ".py"))
            for m in NAME_AFTER_MODULE.finditer(line):
                found.append((m.start(), "name", f"{m.group(1).replace('/', '.')}.{m.group(2)}"))
            for m in BACKTICKED.finditer(line):
                module = BARE_NAMES.get(doc.name, {}).get(m.group(1))
                if module:
                    found.append((m.start(), "name", f"{module}.{m.group(1)}"))
            for m in LINK.finditer(line):
                found.append((m.start(), "link", m.group(1)))
            for _, kind, target in sorted(found):
                if kind == "file":
                    target = f"{folder}{target}" if folder else f"(no folder named before) {target}"
                    kind = "path"
                elif kind == "path":
                    folder = target if target.endswith("/") else target.rsplit("/", 1)[0] + "/"
                refs.append((where, kind, target))
    return refs


REFERENCES = collect()


def resolve(dotted: str) -> object:
    """`swarmnode.` + the longest importable prefix of `dotted`, then the rest as attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = "swarmnode." + ".".join(parts[:cut])
        try:
            obj: object = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name is None or not (module == exc.name or module.startswith(exc.name + ".")):
                raise  # a dependency is missing, not the spec's module
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def test_the_spec_has_references():
    kinds = {kind for _, kind, _ in REFERENCES}
    assert kinds == {"name", "path", "link"}, kinds
    assert len(REFERENCES) > 100


@pytest.mark.parametrize(("where", "kind", "target"), REFERENCES, ids=[f"{w} {t}" for w, _, t in REFERENCES])
def test_reference_resolves(where: str, kind: str, target: str):
    if kind == "name":
        try:
            resolve(target)
        except (ImportError, AttributeError) as exc:
            pytest.fail(f"spec/{where}: `{target}` does not resolve: {exc}")
    elif kind == "path":
        assert any(ROOT.glob(target)), f"spec/{where}: {target} does not exist"
    else:
        assert (SPEC / target).is_file(), f"spec/{where}: link to {target}, which does not exist"
