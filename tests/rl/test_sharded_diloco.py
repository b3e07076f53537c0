"""DiLoCo between trainer groups: a 2-rank group computes the payloads and outer steps one process does,
while each rank holds only its share of the outer copy; payload directories of any split are read
tensor by tensor."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmnode.node.dataplane.checkpoint import build_manifest, load_checkpoint, plan_shards, shard_info
from swarmnode.node.dataplane.errors import CheckpointInvalid
from swarmnode.node.diloco.algorithm import (
    DilocoParams,
    OuterOptimizer,
    average,
    content_digest,
    content_digest_items,
    pseudo_gradient,
)
from swarmnode.node.diloco.compression import Compressor, decompress
from swarmnode.node.diloco.rank_files import (
    PayloadFiles,
    check_payload_names,
    deal_tensors,
    payload_keys,
    rank_file_name,
    stream_digest,
    stream_theta_digest,
)
from swarmnode.node.diloco.weights import load_trainable, trainable_state
from swarmnode.node.rl.learner import GrpoTrainer, OptimizerParams
from swarmnode.node.rl.model import load_model
from swarmnode.protocol.codec import encode
from swarmnode.protocol.messages import ShardInfo
from tests.rl.test_sharded import folder_state
from tests.test_trainer import fixed_groups, grpo_params
from tests.tinymodel import tiny_engine, tiny_folder

ROOT = Path(__file__).resolve().parents[2]
SHARD_SIZE = 20_000  # the embedding's int8 payload is cut into pieces; several files per rank
OTHER_SHARD_SIZE = 7_000  # the other trainers split their payloads differently
ROUNDS = 2
PARAMS = DilocoParams(inner_steps=2, compression="int8")
TOLERANCE = 3e-5  # inner GRPO steps: fp32 rounding of another reduction order (tests/rl/test_sharded.py)


# --- helpers -----------------------------------------------------------------------------------------


def write_payload(directory: Path, tensors: dict[str, torch.Tensor], shard_size: int, prefix=None) -> list:
    directory.mkdir(parents=True, exist_ok=True)
    infos = []
    for plan in plan_shards(tensors, shard_size):
        name = plan.name if prefix is None else rank_file_name(prefix, plan.name)
        data = plan.serialize()
        (directory / name).write_bytes(data)
        infos.append(shard_info(name, data))
    (directory / "infos.json").write_text(json.dumps([[i.name, i.size, i.sha256.hex()] for i in infos]))
    return infos


def loaded(directory: Path, infos: list[ShardInfo]) -> dict[str, torch.Tensor]:
    """A payload as any trainer loads it: every file verified against a manifest listing them."""
    manifest = build_manifest(
        run="job", version=1, parent_version=0, model_config_hash=bytes(32),
        shards=sorted(infos, key=lambda i: i.name), created_ms=0,
    )
    return load_checkpoint(directory, manifest)


def infos_of(rows) -> list[ShardInfo]:
    return [ShardInfo(n, s, bytes.fromhex(h)) for n, s, h in rows]


def fake_delta(theta: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {n: torch.randn(t.shape, generator=gen) * 1e-3 for n, t in theta.items()}


def run_group(tmp: Path, groups) -> dict:
    batch = tmp / "groups.msgpack"
    batch.write_bytes(msgpack.packb([encode(g) for g in groups]))
    argv = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        str(ROOT / "tests/rl/sharded_job.py"), "--model", str(tiny_folder()), "--groups", str(batch),
        "--grpo", json.dumps(dataclasses.asdict(grpo_params())), "--steps", "0",
        "--trainer-dir", str(tmp / "trainer"), "--out", str(tmp / "out"), "--shard-size", str(SHARD_SIZE),
        "--diloco", json.dumps(dataclasses.asdict(PARAMS)), "--rounds", str(ROUNDS),
        "--extra", str(tmp / "extra"),
    ]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads((tmp / "out" / "report.json").read_text())


# --- the group against one process ---------------------------------------------------------------


@pytest.mark.slow  # two torch processes: 13 s of the fast set
def test_a_two_rank_group_plays_the_rounds_one_process_plays(tmp_path):
    groups = fixed_groups(tiny_engine())
    theta = trainable_state(load_model(tiny_folder()))
    names = list(theta)
    owners = deal_tensors([(n, t.numel() * 4) for n, t in theta.items()], 2)
    # the other two trainers' payloads, per round, in their own file split
    others: list[list[dict[str, torch.Tensor]]] = []
    for r in range(ROUNDS):
        compressors = [Compressor("int8"), Compressor("int8")]
        payloads = [c.compress(fake_delta(theta, 10 * r + k)) for k, c in enumerate(compressors)]
        for k, payload in enumerate(payloads):
            write_payload(tmp_path / "extra" / f"round-{r}" / str(k), payload, OTHER_SHARD_SIZE)
        others.append([decompress(p, "int8") for p in payloads])
    # a payload that only rank 1 can find malformed: a NaN scale on one of its tensors
    bad = Compressor("int8").compress(fake_delta(theta, 99))
    victim = next(n for n in names if owners[n] == 1)
    bad[victim + ".scale"] = torch.tensor(float("nan"))
    write_payload(tmp_path / "extra" / "bad", bad, OTHER_SHARD_SIZE)

    report = run_group(tmp_path, groups)

    for attempt in ("checked", "refused"):
        assert report[attempt] is not None and report[attempt].startswith("rank 1:")
        assert victim + ".scale" in report[attempt]
    ref = GrpoTrainer(tiny_engine(), grpo_params(), optim=OptimizerParams())
    ref_outer, ref_compressor = OuterOptimizer(theta, PARAMS), Compressor("int8")
    for r, record in enumerate(report["rounds"]):
        # the same inner weights as one process taking the same GRPO steps from the same θ
        load_trainable(ref.engine.model, theta)
        for _ in range(PARAMS.inner_steps):
            ref.step(groups)
        inner = {n: t for n, t in folder_state(Path(record["inner"])).items() if n in theta}
        for name, tensor in trainable_state(ref.engine.model).items():
            torch.testing.assert_close(inner[name], tensor, atol=TOLERANCE, rtol=0)
        # on those weights, the payload one process compresses, bit for bit
        want = ref_compressor.compress(pseudo_gradient(theta, inner))
        got = loaded(Path(record["payload"]), infos_of(record["payload_infos"]))
        assert set(got) == set(want)
        for name in want:
            assert torch.equal(got[name], want[name]), name
        assert all(i[0].startswith(("rank-00000-", "rank-00001-")) for i in record["payload_infos"])
        # and the outer step one process takes over the three contributions, in content-digest order
        theta = ref_outer.step(average([decompress(want, "int8"), *others[r]]))
        after = folder_state(Path(record["outer"]))
        for name in names:
            assert torch.equal(after[name], theta[name]), name
    # the outer state the ranks wrote is one process's, and resuming from it changes nothing
    directory, rows = report["outer_state"]
    state = loaded(Path(directory), infos_of(rows))
    expected = ref_outer.state_dict()
    assert set(state) == set(expected)
    for name, tensor in expected.items():
        assert torch.equal(state[name], tensor), name
    files = PayloadFiles(Path(directory), infos_of(rows))
    assert stream_theta_digest(files, names) == content_digest(theta)
    reloaded = folder_state(Path(report["reloaded"]))
    for name in names:
        assert torch.equal(reloaded[name], theta[name]), name
    # each rank held θ, momentum and residual of its own tensors only
    total = sum(t.numel() * 4 for t in theta.values())
    largest = max(t.numel() * 4 for t in theta.values())
    shares = [sum(theta[n].numel() * 4 for n in names if owners[n] == rank) for rank in (0, 1)]
    memory = report["memory"]
    assert [m["theta"] for m in memory] == shares and sum(shares) == total
    for m in memory:
        assert m["theta"] <= total / 2 + largest < total
        assert m["held"] == 2 * m["theta"]  # θ and momentum: resuming dropped the int8 residual
        # during a round: θ, momentum, residual, and its slice of three decompressed payloads at most
        assert 3 * m["theta"] <= m["peak"] <= 6 * m["theta"]


# --- pure parts ----------------------------------------------------------------------------------


shapes = st.lists(st.integers(1, 40), min_size=0, max_size=2).map(tuple)
state_dicts = st.dictionaries(st.text("abcxyz.", min_size=1, max_size=6), shapes, min_size=1, max_size=8)


def make(shape_map: dict[str, tuple], seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=gen) for n, s in shape_map.items()}


@settings(max_examples=40, deadline=None)
@given(state_dicts, st.integers(0, 2**31), st.integers(8, 400), st.sampled_from(["none", "fp16", "int8"]),
       st.integers(1, 3))
def test_payload_files_read_any_split_as_one_process_loads_it(tmp_path_factory, shape_map, seed, shard, kind,
                                                              world):
    try:
        check_payload_names(shape_map, kind)
    except ValueError:
        return
    theta = make(shape_map, seed)
    payload = Compressor(kind).compress(theta)
    directory = tmp_path_factory.mktemp("payload")
    owners = deal_tensors([(n, t.numel() * 4) for n, t in theta.items()], world)
    infos = []
    for rank in range(world):  # as a group writes it
        mine = {k: payload[k] for n in theta if owners[n] == rank for k in payload_keys([n], kind)}
        if mine:
            infos += write_payload(directory, mine, shard, prefix=rank)
    files = PayloadFiles(directory, infos)
    files.check_names(payload_keys(list(theta), kind), "payload")
    whole = loaded(directory, infos)
    assert set(whole) == set(payload)
    for rank in range(world):
        keys = payload_keys([n for n in theta if owners[n] == rank], kind)
        for key, tensor in files.tensors(keys).items():
            assert torch.equal(tensor, payload[key]) and torch.equal(whole[key], payload[key])
    assert stream_digest(files, list(theta), kind) == content_digest(decompress(payload, kind))


@given(state_dicts, st.integers(0, 2**31))
def test_a_streamed_digest_is_the_content_digest(shape_map, seed):
    tensors = make(shape_map, seed)
    assert content_digest_items(sorted(tensors.items())) == content_digest(tensors)
    if len(tensors) > 1:
        with pytest.raises(ValueError, match="ascend"):
            content_digest_items(sorted(tensors.items(), reverse=True))


@given(st.lists(st.integers(1, 10_000), min_size=1, max_size=50), st.integers(1, 8))
def test_every_tensor_has_one_owner_and_shares_stay_even(sizes, world):
    named = [(f"t{i}", n) for i, n in enumerate(sizes)]
    owners = deal_tensors(named, world)
    assert set(owners) == {n for n, _ in named} and set(owners.values()) <= set(range(world))
    load = [sum(b for n, b in named if owners[n] == r) for r in range(world)]
    assert max(load) - min(load) <= max(sizes)
    assert deal_tensors(named, world) == owners


def test_payload_files_refuse_what_does_not_verify(tmp_path):
    theta = make({"a": (300,), "b": (3, 4)}, 1)
    payload = Compressor("fp16").compress(theta)
    infos = write_payload(tmp_path, payload, 100)  # "a" in six pieces
    files = PayloadFiles(tmp_path, infos)
    with pytest.raises(ValueError, match="missing"):
        files.check_names(payload_keys(["a", "b", "c"], "fp16"), "payload")
    with pytest.raises(ValueError, match="unexpected"):
        files.check_names(payload_keys(["a"], "fp16"), "payload")
    # a file whose bytes changed after download: its tensors are never read
    victim = next(i for i in infos if i.name.endswith(".safetensors"))
    data = bytearray((tmp_path / victim.name).read_bytes())
    data[-1] ^= 1
    (tmp_path / victim.name).write_bytes(bytes(data))
    with pytest.raises(CheckpointInvalid, match="does not match"):
        PayloadFiles(tmp_path, infos).tensors(["a", "b"])
    # a piece missing from the listing
    fresh = tmp_path / "fresh"
    infos = write_payload(fresh, payload, 100)
    pieces = [i for i in infos if i.name.endswith(".safetensors")]
    with pytest.raises(CheckpointInvalid, match="incomplete"):
        PayloadFiles(fresh, pieces[1:])
    # not a safetensors file at all
    (fresh / pieces[0].name).write_bytes(b"\xff" * 64)
    with pytest.raises(CheckpointInvalid, match="not a safetensors"):
        PayloadFiles(fresh, infos)


def test_an_int8_payload_cannot_name_a_tensor_like_a_scale():
    with pytest.raises(ValueError, match="scale"):
        check_payload_names(["w", "w.scale"], "int8")
    check_payload_names(["w", "w.scale"], "fp16")
