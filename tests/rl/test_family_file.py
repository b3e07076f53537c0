"""Family files: the hand-written TOML that names procedural families, checked before any generation."""

from __future__ import annotations

import json
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from swarmnode.node.cli.tasks import tasks_group
from swarmnode.node.rl.tasks import TaskFileError, dataset_hash, families, read_tasks, write_tasks
from swarmnode.node.rl.tasks.family_file import (
    MAX_FAMILY_FILE_BYTES,
    FamilyFileError,
    FamilySource,
    parse_family_document,
    read_family_file,
)
from tests.tinymodel import tiny_folder


def family_document(seed: int, chain_sums: int, arithmetics: int) -> str:
    return f"""
seed = {seed}

[[family]]
name = "chain_sum"
count = {chain_sums}
config = {{ min_terms = 2, max_terms = 3 }}

[[family]]
name = "basic_arithmetic"
count = {arithmetics}
"""


GOOD = family_document(7, 20, 5)


def test_a_family_file_gives_its_seed_and_families_in_order(tmp_path: Path) -> None:
    path = tmp_path / "families.toml"
    path.write_text(GOOD)
    seed, families = read_family_file(path)
    assert seed == 7
    assert families == [
        FamilySource("chain_sum", 20, {"min_terms": 2, "max_terms": 3}),
        FamilySource("basic_arithmetic", 5, {}),
    ]


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ('seed = 7\n', "no [[family]] table"),
        ('[[family]]\nname = "a"\ncount = 1\n', "seed must be an integer"),
        ('seed = -1\n[[family]]\nname = "a"\ncount = 1\n', "seed must be an integer"),
        ('seed = 1\nseeds = 2\n[[family]]\nname = "a"\ncount = 1\n', "unknown key 'seeds'"),
        ('seed = 1\n[[family]]\nname = "a"\ncount = 0\n', "count must be an integer from 1"),
        ('seed = 1\n[[family]]\nname = "a"\ncount = 1.5\n', "count must be an integer from 1"),
        ('seed = 1\n[[family]]\ncount = 1\n', "name must be"),
        ('seed = 1\n[[family]]\nname = "a"\ncount = 1\nsize = 3\n', "unknown key 'size'"),
        ('seed = 1\n[[family]]\nname = "a"\ncount = 1\nconfig = 3\n', "config must be a table"),
        ('seed = 1\n[[family]]\nname = "a"\ncount = 1\nconfig = { x = nan }\n', "not a finite number"),
        ('seed = 1\n[[family]]\nname = "a"\ncount = 1\nconfig = { x = { y = 1 } }\n', "must be a number"),
        ('seed = 1\n[[family]]\nname = "a"\ncount = true\n', "count must be an integer"),
    ],
)
def test_a_bad_family_file_is_refused_saying_why(text: str, complaint: str) -> None:
    with pytest.raises(FamilyFileError, match=None) as info:
        parse_family_document(tomllib.loads(text))
    assert complaint in str(info.value)


def test_an_oversized_or_garbled_family_file_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.toml"
    big.write_text(GOOD + "#" * MAX_FAMILY_FILE_BYTES)
    with pytest.raises(FamilyFileError, match="bytes, more than"):
        read_family_file(big)
    garbled = tmp_path / "garbled.toml"
    garbled.write_text("seed = = 7\n")
    with pytest.raises(FamilyFileError, match="not TOML"):
        read_family_file(garbled)


# ---------------------------------------------------------------------------- through read_tasks and the CLI

SMALL = family_document(11, 3, 2)


@pytest.fixture(scope="module")
def family_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("families") / "families.toml"
    path.write_text(SMALL)
    return path


@pytest.mark.slow  # sandbox runs
def test_a_family_file_reads_as_a_task_file_and_regenerates_the_same(family_path: Path) -> None:
    tasks = read_tasks(family_path)
    assert [t.kind for t in tasks] == [families.KIND] * 5
    assert [families.parse_target(t).family for t in tasks] == ["chain_sum"] * 3 + ["basic_arithmetic"] * 2
    assert read_tasks(family_path) == tasks  # every role regenerates the same tasks, hence the same hash


@pytest.mark.slow  # three regenerations in the sandbox: about 10 s
def test_family_tasks_written_out_read_back_and_a_changed_answer_is_named(
    family_path: Path, tmp_path: Path
) -> None:
    tasks = read_tasks(family_path)
    listed = write_tasks(tasks, tmp_path / "listed.jsonl")
    assert read_tasks(listed) == tasks
    entry = families.parse_target(tasks[0])
    forged = replace(tasks[0], target=families.family_target(replace(entry, answer=entry.answer + "1")))
    write_tasks([forged, *tasks[1:]], tmp_path / "forged.jsonl")
    with pytest.raises(TaskFileError, match="the regenerated answer"):
        read_tasks(tmp_path / "forged.jsonl")
    with pytest.raises(TaskFileError, match="must end in .jsonl, .json, .parquet"):
        write_tasks(tasks, tmp_path / "out.toml")


@pytest.mark.slow  # a tiny model's pass rates over a family: about 12 s
def test_tasks_show_and_filter_work_on_a_family_file(family_path: Path, tmp_path: Path) -> None:
    tasks = read_tasks(family_path)
    shown = CliRunner().invoke(tasks_group, ["show", str(family_path), "--json"])
    assert shown.exit_code == 0, shown.output
    doc = json.loads(shown.output)
    assert doc["tasks"] == 5 and doc["kinds"] == {families.KIND: 5}
    assert doc["dataset_hash"] == "0x" + dataset_hash(tasks).hex()
    # a random tiny model never writes <answer> tags: every task is too hard, which filter says and keeps none
    filtered = CliRunner().invoke(tasks_group, [
        "filter", "--model", str(tiny_folder()), "--tasks", str(family_path), "--samples", "2",
        "--max-new-tokens", "2", "--out", str(tmp_path / "kept.jsonl"), "--json"])  # fmt: skip
    assert filtered.exit_code == 1, filtered.output
    summary = json.loads(filtered.output.strip().splitlines()[-2])
    assert (summary["tasks"], summary["kept"], summary["dropped_hard"]) == (5, 0, 5)
    assert "no task kept" in filtered.output


@pytest.mark.slow  # sandbox runs
def test_a_family_file_naming_an_unknown_family_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "unknown.toml"
    path.write_text('seed = 1\n[[family]]\nname = "no_such_family"\ncount = 2\n')
    with pytest.raises(TaskFileError, match="no family 'no_such_family'"):
        read_tasks(path)
