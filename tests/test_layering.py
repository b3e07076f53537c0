"""node/ is layered, and its packages form no cycle (issue #33: one way through the house).

Every import of `swarmnode.node.*` in node/ (at the top of a module, inside a function, under
TYPE_CHECKING alike) goes from a unit to one of a lower layer of `LAYERS`. A unit is a sub-package
(`node/trainer/...`) or a top-level module (`node/config.py`). A new unit must be placed in the table
before any test passes, so where it sits is decided once, here. The pure packages (protocol/, crypto/,
ledger/) never import the node.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NODE = ROOT / "node"
PURE_PACKAGES = ("protocol", "crypto", "ledger")

# The intended layers, lowest first: a unit imports only units of lower layers (never its own layer's).
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    ("package root", frozenset({"__init__"})),  # node/__init__.py: runs before any module of node/
    ("status figures", frozenset({"dashboard"})),  # pure: the figures status and the dashboard page show
    ("foundation", frozenset({"errors", "metrics", "status_view", "p2p", "sandbox", "wan"})),
    ("settings and models", frozenset({"config", "rl"})),
    ("data plane", frozenset({"dataplane"})),
    ("role floor", frozenset({"roles"})),  # what every role shares: no role package
    ("node runtime", frozenset({"runtime"})),  # runs any role's service
    ("roles", frozenset({"trainer", "validator", "worker", "relay"})),
    ("multi-trainer runs", frozenset({"diloco"})),  # built on the trainer
    ("composition root", frozenset({"assemble", "conformance"})),  # assemble: the one importing every role
    ("devnet", frozenset({"devnet"})),
    ("cli", frozenset({"cli"})),
)
ROLE_PACKAGES = frozenset({"trainer", "validator", "worker", "relay", "diloco"})
LEVEL = {unit: level for level, (_, units) in enumerate(LAYERS) for unit in units}
LAYER_NAME = {unit: name for name, units in LAYERS for unit in units}


@dataclass(frozen=True)
class Import:
    path: Path  # the importing file
    line: int
    target: str  # the imported module, swarmnode.node....

    @property
    def source_unit(self) -> str:
        return unit_of_path(self.path)

    @property
    def target_unit(self) -> str:
        return unit_of_module(self.target)

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line} imports {self.target}"


def unit_of_path(path: Path) -> str:
    parts = path.relative_to(NODE).parts
    return parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")


def unit_of_module(module: str) -> str:
    parts = module.split(".")[2:]  # past swarmnode.node
    return parts[0] if parts else "__init__"


def imported_modules(statement: ast.stmt | ast.expr | ast.AST) -> list[str]:
    """The modules one statement imports: `from swarmnode.node import config` counts as
    swarmnode.node.config."""
    if isinstance(statement, ast.Import):
        return [alias.name for alias in statement.names]
    if isinstance(statement, ast.ImportFrom) and statement.level == 0 and statement.module:
        if statement.module == "swarmnode.node":
            return [f"swarmnode.node.{alias.name}" for alias in statement.names]
        return [statement.module]
    return []


def imports_in(path: Path, prefix: str) -> Iterator[Import]:
    """Every import in `path` of a module under `prefix`, wherever it stands in the file."""
    for statement in ast.walk(ast.parse(path.read_text(), str(path))):
        for module in imported_modules(statement):
            if module == prefix or module.startswith(prefix + "."):
                yield Import(path, statement.lineno, module)


def node_imports() -> list[Import]:
    """Imports between different units of node/."""
    found = [i for path in sorted(NODE.rglob("*.py")) for i in imports_in(path, "swarmnode.node")]
    return [i for i in found if i.source_unit != i.target_unit]


def units() -> set[str]:
    return {unit_of_path(path) for path in NODE.rglob("*.py")}


def package_graph(imports: list[Import]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {unit: set() for unit in units()}
    for i in imports:
        graph[i.source_unit].add(i.target_unit)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as [a, b, ..., a], or None when it has none (depth-first, three colours)."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(unit: str) -> list[str] | None:
        path.append(unit)
        on_path.add(unit)
        for target in sorted(graph.get(unit, ())):
            if target in on_path:
                return path[path.index(target):] + [target]
            if target not in done:
                cycle = visit(target)
                if cycle:
                    return cycle
        path.pop()
        on_path.discard(unit)
        done.add(unit)
        return None

    for unit in sorted(graph):
        if unit not in done:
            cycle = visit(unit)
            if cycle:
                return cycle
    return None


def test_every_unit_has_a_layer() -> None:
    unplaced = sorted(units() - LEVEL.keys())
    assert unplaced == [], f"place these units of node/ in LAYERS: {unplaced}"


def test_no_import_goes_up_or_sideways() -> None:
    wrong = [
        f"{i} ({LAYER_NAME[i.source_unit]} -> {LAYER_NAME[i.target_unit]})"
        for i in node_imports()
        if i.source_unit in LEVEL and i.target_unit in LEVEL and LEVEL[i.target_unit] >= LEVEL[i.source_unit]
    ]
    assert wrong == [], "imports not to a lower layer:\n" + "\n".join(wrong)


def test_role_floor_imports_no_role() -> None:
    wrong = [str(i) for i in node_imports() if i.source_unit == "roles" and i.target_unit in ROLE_PACKAGES]
    assert wrong == [], "node/roles/ must not import a role package:\n" + "\n".join(wrong)


def test_packages_form_no_cycle() -> None:
    imports = node_imports()
    cycle = find_cycle(package_graph(imports))
    if cycle is not None:
        edges = zip(cycle, cycle[1:], strict=False)
        lines = [str(next(i for i in imports if (i.source_unit, i.target_unit) == edge)) for edge in edges]
        raise AssertionError(f"cycle {' -> '.join(cycle)}:\n" + "\n".join(lines))


def test_find_cycle_reports_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_pure_packages_never_import_the_node() -> None:
    wrong = [
        str(i)
        for package in PURE_PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for i in imports_in(path, "swarmnode.node")
    ]
    assert wrong == [], "protocol/, crypto/ and ledger/ must not import swarmnode.node:\n" + "\n".join(wrong)


# the local devnet, the CLI's test-only process commands, and the composition root (a devnet cheat's conduct)
TESTING_USERS = frozenset({"assemble", "devnet", "cli"})


def test_only_the_devnet_and_the_cli_import_the_testing_package() -> None:
    """Harnesses, fakes, fault injectors (swarmnode.testing) are never part of a role or the pure code."""
    wrong = [
        str(i)
        for path in sorted(NODE.rglob("*.py"))
        if unit_of_path(path) not in TESTING_USERS
        for i in imports_in(path, "swarmnode.testing")
    ] + [
        str(i)
        for package in PURE_PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for i in imports_in(path, "swarmnode.testing")
    ]
    assert wrong == [], f"only {sorted(TESTING_USERS)} may import swarmnode.testing:\n" + "\n".join(wrong)
