"""Model checkpoints in the Hugging Face layout: a relay's copy of a version loads in transformers as it is.

The model is a real tiny Qwen2 folder (tests.tinymodel); publishing goes through a real Origin into a real
store, and the relay case fetches it over HTTP with a real follower. Hostile manifests are trainer-signed
but break the layout: each must be refused by `load_checkpoint` before a tensor reaches an engine.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM

from swarmnode.crypto.merkle import merkle_root
from swarmnode.node.dataplane.catalog import Catalog
from swarmnode.node.dataplane.checkpoint import (
    MAX_INDEX_SIZE,
    MODEL_LAYOUT,
    PIECES_LAYOUT,
    WEIGHTS_FILE,
    WEIGHTS_INDEX_FILE,
    ShardPlan,
    load_checkpoint,
    pack_whole_tensors,
    plan_model_files,
    shard_info,
    state_digest,
)
from swarmnode.node.dataplane.errors import CheckpointInvalid
from swarmnode.node.dataplane.origin import Origin, Sealer, model_folder_files
from swarmnode.node.dataplane.roles import OriginNode
from swarmnode.node.dataplane.store import ShardStore
from swarmnode.node.rl.engine import TransformersEngine
from swarmnode.node.rl.model import ModelFolderError, file_sha256, tokenizer_files
from swarmnode.protocol.messages import CheckpointManifest, ShardInfo
from tests.dataplane.helpers import RUN, TRAINER, follower_node, now_ms, run_node
from tests.tinymodel import tiny_engine, tiny_folder

KIB = 1024
INPUT = torch.tensor([[1, 5, 9, 42, 17, 3, 8]])


@pytest.fixture(scope="module")
def model():
    engine = tiny_engine()
    state = {k: v.detach().clone() for k, v in engine.model.state_dict().items()}
    files = model_folder_files(tiny_folder())
    with torch.no_grad():
        logits = engine.model(INPUT).logits
    return state, files, logits


def _config_hash(files):
    return hashlib.sha256(files["config.json"]).digest()


async def _publish(root: Path, state, files, *, shard_size, version=1):
    store, catalog = ShardStore(root, RUN), Catalog(RUN)
    origin = Origin(Sealer(TRAINER, RUN), store, catalog, shard_size=shard_size)
    manifest, _ = await origin.publish(
        state,
        version=version,
        parent_version=0,
        model_config_hash=_config_hash(files),
        layout=MODEL_LAYOUT,
        files=files,
    )
    return manifest, store.complete_dir(version)


def _published(tmp_path, model, shard_size):
    state, files, _ = model
    return trio.run(lambda: _publish(tmp_path, state, files, shard_size=shard_size))


def _logits(directory):
    loaded = AutoModelForCausalLM.from_pretrained(str(directory), local_files_only=True, dtype=torch.float32)
    with torch.no_grad():
        return loaded.eval()(INPUT).logits


# --- a relay's copy is a model folder -----------------------------------------------------------------


def test_a_relays_copy_loads_in_transformers_and_the_engine(tmp_path, model):
    state, files, logits = model

    async def main():
        async with trio.open_nursery() as nursery:
            origin = OriginNode(tmp_path / "origin", TRAINER, RUN)
            await nursery.start(origin.run)
            relay = follower_node(tmp_path, "relay", 1, {origin.endpoint: 1.0}, worker=False)
            done_send, done = trio.open_memory_channel(1)
            await nursery.start(run_node, relay, done_send)
            manifest, _ = await origin.origin.publish(
                state,
                version=1,
                parent_version=0,
                model_config_hash=_config_hash(files),
                layout=MODEL_LAYOUT,
                files=files,
            )
            with trio.fail_after(30):
                got = await done.receive()
            nursery.cancel_scope.cancel()
        return manifest, got

    manifest, got = trio.run(main)
    names = [s.name for s in manifest.shards]
    assert names == sorted([WEIGHTS_FILE, *files])
    assert {"config.json", "generation_config.json", "tokenizer.json"} <= set(names)
    for name, data in files.items():  # byte for byte: the relay holds the run's own config and tokenizer
        assert (got.directory / name).read_bytes() == data
    assert torch.equal(_logits(got.directory), logits)
    engine = TransformersEngine.from_folder(got.directory)
    assert engine.info == tiny_engine().info
    assert state_digest(load_checkpoint(got.directory, got.manifest)) == state_digest(state)


def test_small_shards_write_an_index_and_still_load(tmp_path, model):
    state, files, logits = model
    manifest, directory = _published(tmp_path, model, shard_size=64 * KIB)
    weights = [s.name for s in manifest.shards if s.name.endswith(".safetensors")]
    assert len(weights) > 2 and weights[0] == f"model-00001-of-{len(weights):05d}.safetensors"
    index = json.loads((directory / WEIGHTS_INDEX_FILE).read_bytes())
    assert set(index["weight_map"]) == set(state) and set(index["weight_map"].values()) == set(weights)
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in state.values())
    assert torch.equal(_logits(directory), logits)
    assert state_digest(load_checkpoint(directory, manifest)) == state_digest(state)
    TransformersEngine.from_folder(directory)


def test_one_shard_is_model_safetensors_without_an_index(tmp_path, model):
    manifest, directory = _published(tmp_path, model, shard_size=1 << 30)
    assert WEIGHTS_INDEX_FILE not in [s.name for s in manifest.shards]
    header = json.loads(
        (directory / WEIGHTS_FILE).read_bytes()[8:][
            : int.from_bytes((directory / WEIGHTS_FILE).read_bytes()[:8], "little")
        ]
    )
    assert header["__metadata__"] == {"format": "pt"}


def test_tied_embeddings_load_back_strictly_and_in_transformers(tmp_path, model):
    state, files, _ = model
    tied = dict(state)
    tied["lm_head.weight"] = tied["model.embed_tokens.weight"]  # one storage under two names
    manifest, directory = trio.run(lambda: _publish(tmp_path, tied, files, shard_size=1 << 30))
    loaded = load_checkpoint(directory, manifest)
    assert torch.equal(loaded["lm_head.weight"], loaded["model.embed_tokens.weight"])
    engine = tiny_engine()
    engine.model.load_state_dict(loaded, strict=True)


# --- packing ------------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 300), min_size=1, max_size=20), shard_size=st.integers(4, 800))
def test_packing_keeps_whole_tensors_in_order_and_a_large_one_alone(sizes, shard_size):
    state = {f"t{i}": torch.zeros(n, dtype=torch.float32) for i, n in enumerate(sizes)}
    plans = pack_whole_tensors(state, shard_size)
    assert [k for p in plans for k in p.tensors] == list(state)  # every tensor once, in order, whole
    for plan in plans:
        assert plan.nbytes <= shard_size or len(plan.tensors) == 1
        assert plan.nbytes == sum(t.nbytes for t in plan.tensors.values())
    for before, after in zip(plans, plans[1:], strict=False):  # greedy: the next tensor did not fit
        assert before.nbytes + next(iter(after.tensors.values())).nbytes > shard_size
    if len(plans) == 1:
        assert plans[0].name == WEIGHTS_FILE
    else:
        assert [p.name for p in plans] == [
            f"model-{i:05d}-of-{len(plans):05d}.safetensors" for i in range(1, len(plans) + 1)
        ]


def test_a_tensor_larger_than_a_shard_sits_alone_in_its_shard(model):
    state = {"a": torch.ones(10), "big": torch.ones(1000), "b": torch.ones(10), "c": torch.ones(10)}
    plans = pack_whole_tensors(state, shard_size=100)
    assert [list(p.tensors) for p in plans] == [["a"], ["big"], ["b", "c"]]
    assert plans[1].nbytes == 4000 and plans[1].name == "model-00002-of-00003.safetensors"


@pytest.mark.parametrize(
    "files, match",
    [
        ({}, "config.json"),
        ({"config.json": b"{}", "model-x.safetensors": b"x"}, "weights file"),
        ({"config.json": b"{}", WEIGHTS_INDEX_FILE: b"{}"}, "weights file"),
        ({"config.json": b"{}", "../tokenizer.json": b"x"}, "plain file name"),
        ({"config.json": b"{}", "manifest.msgpack": b"x"}, "plain file name"),
        ({"config.json": b"{}", ".hidden": b"x"}, "plain file name"),
        ({"config.json": b""}, "bytes"),
    ],
)
def test_files_that_cannot_sit_beside_the_weights_are_refused(files, match):
    with pytest.raises(ValueError, match=match):
        plan_model_files({"w": torch.ones(2)}, 1024, files)


def test_origin_refuses_a_config_that_is_not_the_runs_and_writes_nothing(tmp_path, model):
    state, files, _ = model
    store = ShardStore(tmp_path, RUN)
    origin = Origin(Sealer(TRAINER, RUN), store, Catalog(RUN))

    async def publish(**kw):
        await origin.publish(state, version=1, parent_version=0, **kw)

    with pytest.raises(ValueError, match="config.json"):
        trio.run(lambda: publish(model_config_hash=bytes(32), layout=MODEL_LAYOUT, files=files))
    with pytest.raises(ValueError, match="config.json"):
        trio.run(lambda: publish(model_config_hash=_config_hash(files), layout=MODEL_LAYOUT))
    with pytest.raises(ValueError, match="only a model checkpoint"):
        trio.run(lambda: publish(model_config_hash=_config_hash(files), layout=PIECES_LAYOUT, files=files))
    assert store.versions_on_disk() == {} and not store.partial_dir(1).exists()


def test_model_folder_files_are_the_config_and_tokenizer_of_the_folder(tmp_path):
    folder = tiny_folder()
    files = model_folder_files(folder)
    assert sorted(files) == sorted(["config.json", "generation_config.json", *tokenizer_files(folder)])
    assert all(hashlib.sha256(files[n]).digest() == file_sha256(folder / n) for n in files)
    (tmp_path / "config.json").write_bytes(files["config.json"])
    with pytest.raises(ModelFolderError, match="tokenizer"):
        model_folder_files(tmp_path)
    with pytest.raises(ModelFolderError, match="config.json"):
        model_folder_files(tmp_path / "nothing")


# --- tampering and hostile layouts --------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["config.json", "tokenizer.json", "generation_config.json", WEIGHTS_INDEX_FILE, "weights"]
)
def test_a_tampered_file_of_any_kind_is_refused(tmp_path, model, name):
    manifest, directory = _published(tmp_path, model, shard_size=100 * KIB)
    names = [s.name for s in manifest.shards]
    name = name if name != "weights" else [n for n in names if n.endswith(".safetensors")][-1]
    assert name in names
    data = bytearray((directory / name).read_bytes())
    data[len(data) // 2] ^= 0x01
    (directory / name).write_bytes(bytes(data))
    with pytest.raises(CheckpointInvalid, match=name):
        load_checkpoint(directory, manifest)


def test_a_missing_tokenizer_file_is_refused(tmp_path, model):
    manifest, directory = _published(tmp_path, model, shard_size=1 << 30)
    (directory / "tokenizer_config.json").unlink()
    with pytest.raises(CheckpointInvalid, match="missing"):
        load_checkpoint(directory, manifest)


def _signed_as_is(directory: Path, entries: list[tuple[str, bytes]], config_hash: bytes):
    """A manifest over exactly these files, in this order, built without the layout check (as a faulty
    trainer could sign it)."""
    for name, data in entries:
        (directory / name).write_bytes(data)
    shards = tuple(shard_info(n, d) for n, d in entries)
    manifest = CheckpointManifest(
        run=RUN,
        version=1,
        parent_version=0,
        model_config_hash=config_hash,
        total_size=sum(s.size for s in shards),
        shards=shards,
        merkle_root=merkle_root([s.sha256 for s in shards]),
        created_ms=now_ms(),
    )
    return manifest


def _weights(**tensors) -> bytes:
    return ShardPlan("", dict(tensors)).serialize()


CONFIG = b'{"model_type": "qwen2"}'
A = {"a": torch.ones(3)}
B = {"b": torch.zeros(2)}


def _index(weight_map) -> bytes:
    return json.dumps({"metadata": {"total_size": 20}, "weight_map": weight_map}).encode()


HOSTILE = {
    "config is another model's": (
        [("config.json", b'{"model_type": "llama"}'), (WEIGHTS_FILE, _weights(**A))],
        "model config",
    ),
    "files out of name order": ([(WEIGHTS_FILE, _weights(**A)), ("config.json", CONFIG)], "name order"),
    "no weights at all": ([("config.json", CONFIG)], "alone"),
    "a second weights file without an index": (
        [("config.json", CONFIG), ("extra.safetensors", _weights(**B)), (WEIGHTS_FILE, _weights(**A))],
        "alone",
    ),
    "an index naming a file the manifest lacks": (
        [
            ("config.json", CONFIG),
            ("model-00001-of-00002.safetensors", _weights(**A)),
            (
                WEIGHTS_INDEX_FILE,
                _index({"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}),
            ),
        ],
        "names files",
    ),
    "a tensor in a file the index does not say": (
        [
            ("config.json", CONFIG),
            ("model-00001-of-00002.safetensors", _weights(**A, **B)),
            ("model-00002-of-00002.safetensors", _weights(c=torch.ones(1))),
            (
                WEIGHTS_INDEX_FILE,
                _index(
                    {
                        "a": "model-00001-of-00002.safetensors",
                        "b": "model-00002-of-00002.safetensors",
                        "c": "model-00002-of-00002.safetensors",
                    }
                ),
            ),
        ],
        "the index says",
    ),
    "an index listing a tensor no shard holds": (
        [
            ("config.json", CONFIG),
            ("model-00001-of-00002.safetensors", _weights(**A)),
            ("model-00002-of-00002.safetensors", _weights(**B)),
            (
                WEIGHTS_INDEX_FILE,
                _index(
                    {
                        "a": "model-00001-of-00002.safetensors",
                        "b": "model-00002-of-00002.safetensors",
                        "z": "model-00002-of-00002.safetensors",
                    }
                ),
            ),
        ],
        "no shard holds",
    ),
    "an index that is not an index": (
        [
            ("config.json", CONFIG),
            ("model-00001-of-00001.safetensors", _weights(**A)),
            (WEIGHTS_INDEX_FILE, b"[1, 2]"),
        ],
        "not a safetensors index",
    ),
    "a weight_map of numbers": (
        [
            ("config.json", CONFIG),
            ("model-00001-of-00001.safetensors", _weights(**A)),
            (WEIGHTS_INDEX_FILE, _index({"a": 1})),
        ],
        "maps tensor names",
    ),
    "pieces in a model checkpoint": (
        [
            ("config.json", CONFIG),
            (WEIGHTS_FILE, ShardPlan("", {"a#0": torch.ones(2)}, {"a#0": ("a", 0, 1, [2])}).serialize()),
        ],
        "not pieces",
    ),
    "the same tensor in two shards": (
        [
            ("config.json", CONFIG),
            ("model-00001-of-00002.safetensors", _weights(**A)),
            ("model-00002-of-00002.safetensors", _weights(**A, **B)),
            (
                WEIGHTS_INDEX_FILE,
                _index({"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}),
            ),
        ],
        "twice",
    ),
    "weights that are not safetensors": (
        [("config.json", CONFIG), (WEIGHTS_FILE, b"\xff" * 64)],
        "not a valid",
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_signed_manifest_that_breaks_the_layout_is_refused(tmp_path, case):
    entries, match = HOSTILE[case]
    config_hash = hashlib.sha256(CONFIG).digest()
    manifest = _signed_as_is(tmp_path, entries, config_hash)
    with pytest.raises(CheckpointInvalid, match=match):
        load_checkpoint(tmp_path, manifest)


def test_an_index_over_its_bound_is_refused_before_it_is_read(tmp_path):
    entries = [("config.json", CONFIG), ("model-00001-of-00001.safetensors", _weights(**A))]
    manifest = _signed_as_is(tmp_path, entries, hashlib.sha256(CONFIG).digest())
    big = ShardInfo(WEIGHTS_INDEX_FILE, MAX_INDEX_SIZE + 1, bytes(32))
    shards = (*manifest.shards, big)
    manifest = CheckpointManifest(
        run=RUN,
        version=1,
        parent_version=0,
        model_config_hash=manifest.model_config_hash,
        total_size=sum(s.size for s in shards),
        shards=shards,
        merkle_root=merkle_root([s.sha256 for s in shards]),
        created_ms=now_ms(),
    )
    with pytest.raises(CheckpointInvalid, match="exceeds"):
        load_checkpoint(tmp_path, manifest)


def test_a_pieces_payload_still_verifies_and_skips_a_file_that_holds_no_tensors(tmp_path):
    entries = [("notes.json", b'{"round": 3}'), ("shard-00001-of-00001.safetensors", _weights(**A))]
    manifest = _signed_as_is(tmp_path, entries, bytes(32))
    assert state_digest(load_checkpoint(tmp_path, manifest)) == state_digest(A)
    (tmp_path / "notes.json").write_bytes(b'{"round": 4}')
    with pytest.raises(CheckpointInvalid, match="notes.json"):
        load_checkpoint(tmp_path, manifest)
