"""`load_run_setup`: a node takes part in a run only with the model folder and tasks its descriptor names.

The descriptor commits to the bytes of config.json, of each tokenizer file and of each weights file; a
folder that differs in any of them is refused with RunMismatch naming the file, and nothing is loaded.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmnode.crypto.merkle import merkle_root
from swarmnode.node.errors import RunMismatch
from swarmnode.node.rl.model import (
    build_model,
    file_sha256,
    load_model,
    model_commitment,
    save_model_folder,
    tokenizer_files,
    weight_files,
)
from swarmnode.node.rl.run import describe_run, devnet_policy, devnet_run, load_run_setup
from swarmnode.node.rl.tasks import Task
from swarmnode.node.rl.tasks.arithmetic import DEVNET_PARAMS, generate_tasks
from tests.tinymodel import copy_folder, tiny_folder

TRAINER = b"\x01" * 20
TASKS = generate_tasks(DEVNET_PARAMS, 5, 12)


@pytest.fixture(scope="module")
def run():
    return devnet_run(TRAINER, tiny_folder(), created_ms=1, tasks=TASKS)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return copy_folder("qwen2", tmp_path / "model")


def refused(run, folder: Path, tasks=TASKS) -> str:
    with pytest.raises(RunMismatch) as err:
        load_run_setup(run.descriptor, folder, tasks)
    assert "'devnet'" in str(err.value)  # names the run
    return str(err.value)


def names(message: str, name: str) -> bool:
    """`message` names the file `name` (not merely a longer name ending in it: tokenizer_config.json)."""
    return re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w.-])", message) is not None


def test_the_runs_own_folder_and_tasks_are_accepted(run, folder):
    setup = load_run_setup(run.descriptor, folder, TASKS)
    assert setup.descriptor == run.descriptor and setup.tasks == TASKS
    assert setup.dataset_ids == [t.task_id for t in TASKS]
    d, commitment = run.descriptor, model_commitment(folder)
    assert d.model_config_hash == file_sha256(folder / "config.json") == commitment.config_hash
    assert [f.name for f in d.tokenizer_files] == tokenizer_files(folder) == sorted(tokenizer_files(folder))
    assert all(f.sha256 == file_sha256(folder / f.name) for f in d.tokenizer_files)
    assert d.base_checkpoint_hash == merkle_root([file_sha256(folder / n) for n in weight_files(folder)])


def test_a_config_with_another_field_is_refused_naming_config_json(run, folder):
    config = json.loads((folder / "config.json").read_text())
    config["rope_theta"] = 500000.0  # same shapes, same weights: another model all the same
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    message = refused(run, folder)
    assert names(message, "config.json") and "tokenizer" not in message


def test_a_reformatted_config_is_refused_too(run, folder):
    """Bytes are committed, not parsed values: the same JSON written differently is another file."""
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True))
    assert names(refused(run, folder), "config.json")


def test_a_tokenizer_json_with_one_byte_changed_is_refused_naming_it(run, folder):
    path = folder / "tokenizer.json"
    data = bytearray(path.read_bytes())
    at = data.index(b'"<|im_end|>"') + 2
    data[at] ^= 0x20  # "<|IM_end|>": the EOS token renamed
    path.write_bytes(bytes(data))
    message = refused(run, folder)
    assert names(message, "tokenizer.json") and "differs" in message


def test_a_missing_tokenizer_file_is_refused_naming_it(run, folder):
    (folder / "chat_template.jinja").unlink()
    message = refused(run, folder)
    assert names(message, "chat_template.jinja") and "missing" in message


def test_an_extra_tokenizer_file_is_refused_naming_it(run, folder):
    """A file the tokenizer loader would read (here a special-tokens map) changes the tokenizer."""
    (folder / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    message = refused(run, folder)
    assert names(message, "special_tokens_map.json") and "not part" in message


def test_other_weights_are_refused_naming_the_weights_file(run, folder):
    other = build_model(load_model(folder).config, seed=8)
    save_model_folder(other, None, folder)
    (folder / "config.json").write_bytes((tiny_folder() / "config.json").read_bytes())  # only weights differ
    message = refused(run, folder)
    assert names(message, "model.safetensors") and "base weights" in message


def test_a_folder_without_config_is_refused(run, folder):
    (folder / "config.json").unlink()
    assert names(refused(run, folder), "config.json")


def test_another_dataset_is_refused(run, folder):
    message = refused(run, folder, TASKS[:-1])
    assert "dataset" in message
    assert "dataset" in refused(run, folder, list(reversed(TASKS)))  # order is part of the dataset


def test_tasks_no_grader_knows_are_refused(folder):
    tasks = [*TASKS, Task(kind="astrology", prompt="Will it rain?", target="yes")]
    run = devnet_run(TRAINER, folder, created_ms=1, tasks=tasks)
    message = refused(run, folder, tasks)
    assert "astrology" in message


def test_a_sharded_folder_commits_to_every_shard(run, tmp_path):
    """Weights split over several files (as large models are): the root covers each shard, in name order."""
    source = tiny_folder()
    sharded = save_model_folder(load_model(source), source, tmp_path / "sharded", max_shard_size="200KB")
    shards = weight_files(sharded)
    assert len(shards) >= 2 and (sharded / "model.safetensors.index.json").is_file()
    commitment = model_commitment(sharded)
    assert commitment.weights_root == merkle_root([file_sha256(sharded / n) for n in shards])
    descriptor = describe_run(
        run="devnet",
        trainer=TRAINER,
        model=commitment,
        tasks=TASKS,
        grpo=run.descriptor.grpo,
        policy=devnet_policy(),
        created_ms=1,
    )
    assert load_run_setup(descriptor, sharded, TASKS).descriptor == descriptor
    last = sharded / shards[-1]
    data = bytearray(last.read_bytes())
    data[-1] ^= 1
    last.write_bytes(bytes(data))
    with pytest.raises(RunMismatch) as err:
        load_run_setup(descriptor, sharded, TASKS)
    assert names(str(err.value), shards[-1])


# --- any byte of any committed file ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def shared_folder(tmp_path_factory) -> Path:
    """One copy for every example: each example restores the byte it flipped."""
    return copy_folder("qwen2", tmp_path_factory.mktemp("run-setup") / "model")


@settings(max_examples=40, deadline=None, derandomize=True)
@given(data=st.data())
def test_flipping_any_byte_of_any_committed_file_is_refused_naming_it(run, shared_folder, data):
    folder = shared_folder
    committed = ["config.json", *tokenizer_files(folder), *weight_files(folder)]
    name = data.draw(st.sampled_from(committed))
    path = folder / name
    original = path.read_bytes()
    at = data.draw(st.integers(0, len(original) - 1))
    flipped = bytearray(original)
    flipped[at] ^= data.draw(st.integers(1, 255))
    path.write_bytes(bytes(flipped))
    try:
        assert names(refused(run, folder), name)
    finally:
        path.write_bytes(original)
    assert load_run_setup(run.descriptor, folder, TASKS).tasks == TASKS  # restored: accepted again
