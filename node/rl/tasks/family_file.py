"""A task file that names procedural families instead of listing tasks: every role regenerates the same tasks.

```toml
seed = 7                      # the dataset seed: with the library version it fixes every task

[[family]]
name = "chain_sum"            # a reasoning-gym dataset name
count = 200                   # tasks of this family, in dataset order after the families above
config = { min_terms = 2, max_terms = 3 }   # the family's own parameters (optional)
```

Why a file and not new descriptor fields: the tasks it generates carry their provenance in their target
(library version, family, config, seed, index), so the run's dataset hash commits to all of it as it does to
a listed file, the wire does not change, and `tasks show`, `tasks filter`, `[work] tasks` and
`devnet --tasks` take a family file wherever they take a task file. A node whose library generates other
tasks is refused by `families.check_family_tasks`, naming the difference.
"""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarmnode.node.rl.tasks.core import Task
from swarmnode.node.rl.tasks.families import family_tasks

FAMILY_SUFFIX = ".toml"
MAX_FAMILY_FILE_BYTES = 64 * 1024  # a family file is written by hand
MAX_FAMILIES = 64
MAX_FAMILY_TASKS = 100_000  # one family's count: generation runs on every role before it joins
MAX_SEED = 2**63 - 1
TOP_KEYS = frozenset({"seed", "family"})
FAMILY_KEYS = frozenset({"name", "count", "config"})
ConfigValue = bool | int | float | str | list[Any]


@dataclass(frozen=True)
class FamilySource:
    """One `[[family]]` table: `count` tasks of family `name` with `config`, from the file's seed."""

    name: str
    count: int
    config: Mapping[str, ConfigValue]


class FamilyFileError(ValueError):
    """What is wrong with a family file (the caller names the file)."""


def _integer(value: object, what: str, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:
        raise FamilyFileError(f"{what} must be an integer from {low} to {high}, not {value!r}")
    return value


def _config_value(key: str, value: object) -> ConfigValue:
    """Plain TOML scalars and lists of them: what a family's constructor takes and JSON keeps exactly."""
    if isinstance(value, list):
        return [_config_value(key, item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        raise FamilyFileError(f"config {key!r} is not a finite number")
    if isinstance(value, bool | int | float | str):
        return value
    raise FamilyFileError(f"config {key!r} must be a number, a string, a boolean or a list of them")


def parse_family_document(document: Mapping[str, Any]) -> tuple[int, list[FamilySource]]:
    """The seed and the families of a parsed family file, checked (pure)."""
    unknown = sorted(set(document) - TOP_KEYS)
    if unknown:
        raise FamilyFileError(f"unknown key {unknown[0]!r} (a family file has seed and [[family]] tables)")
    seed = _integer(document.get("seed"), "seed", 0, MAX_SEED)
    tables = document.get("family")
    if not isinstance(tables, list) or not tables:
        raise FamilyFileError("no [[family]] table")
    if len(tables) > MAX_FAMILIES:
        raise FamilyFileError(f"{len(tables)} families, at most {MAX_FAMILIES}")
    families = []
    for number, table in enumerate(tables, start=1):
        unknown = sorted(set(table) - FAMILY_KEYS)
        if unknown:
            raise FamilyFileError(f"family {number}: unknown key {unknown[0]!r} (name, count, config)")
        name = table.get("name")
        if not isinstance(name, str) or not name:
            raise FamilyFileError(f"family {number}: name must be a family's name")
        count = _integer(table.get("count"), f"family {name!r}: count", 1, MAX_FAMILY_TASKS)
        config = table.get("config", {})
        if not isinstance(config, dict):
            raise FamilyFileError(f"family {name!r}: config must be a table")
        families.append(
            FamilySource(name, count, {key: _config_value(key, value) for key, value in config.items()})
        )
    return seed, families


def read_family_file(path: str | os.PathLike[str]) -> tuple[int, list[FamilySource]]:
    """The seed and families of a family file; FamilyFileError says what is wrong."""
    path = Path(path)
    size = path.stat().st_size
    if size > MAX_FAMILY_FILE_BYTES:
        raise FamilyFileError(f"{size} bytes, more than {MAX_FAMILY_FILE_BYTES} for a family file")
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise FamilyFileError(f"not TOML: {exc}") from None
    return parse_family_document(document)


def generate_family_tasks(seed: int, families: list[FamilySource]) -> list[Task]:
    """Every family's tasks in file order: what each role regenerates from the same file."""
    tasks: list[Task] = []
    for family in families:
        tasks.extend(family_tasks(family.name, family.config, seed, family.count))
    return tasks
