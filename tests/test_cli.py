"""The CLI as an operator uses it: a real `swarmnode` process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from libp2p.crypto.secp256k1 import create_new_key_pair
from libp2p.peer.id import ID

from swarmnode.crypto.keystore import load_keystore


def swarmnode(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "swarmnode.node.cli.main", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env,
                          timeout=600)


def test_keys_new_then_show_gives_matching_address_and_peer_id(tmp_path):
    key = tmp_path / "node.key"
    env = {**os.environ, "SWARMNODE_PASSWORD": "correct horse", "SWARMNODE_KEY": str(key)}
    created = swarmnode("keys", "new", env=env)
    assert created.returncode == 0, created.stderr
    shown = swarmnode("keys", "show", "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    info = json.loads(shown.stdout)
    private_key = load_keystore(key, "correct horse").private_key
    assert info["peer_id"] == ID.from_pubkey(create_new_key_pair(private_key).public_key).to_base58()
    from eth_utils import is_checksum_address

    assert is_checksum_address(info["address"])
    again = swarmnode("keys", "new", env=env)
    assert again.returncode != 0 and "refusing to overwrite" in again.stderr
    wrong = swarmnode("keys", "show", env={**env, "SWARMNODE_PASSWORD": "wrong"})
    assert wrong.returncode != 0 and "wrong password" in wrong.stderr


def test_conformance_command_passes_and_fails_on_a_corrupted_vector(tmp_path):
    env = dict(os.environ)
    ok = swarmnode("conformance", env=env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    from tests.conformance.test_vectors import VECTORS

    document = json.loads((VECTORS / "envelope.json").read_text())
    case = next(c for c in document["cases"] if c["name"] == "envelope/valid/verdict")
    data = bytearray(bytes.fromhex(case["input"]["envelope"][2:]))
    data[40] ^= 0xFF
    case["input"]["envelope"] = "0x" + data.hex()
    (tmp_path / "envelope.json").write_text(json.dumps({"suite": "envelope", "cases": [case]}))
    bad = swarmnode("conformance", "--vectors", str(tmp_path), env=env)
    assert bad.returncode != 0
    assert "FAIL" in bad.stdout and "envelope/valid/verdict" in bad.stdout


def test_help_teaches():
    out = swarmnode("--help", env=dict(os.environ))
    assert out.returncode == 0 and "keys new" in out.stdout


@pytest.mark.slow  # two held-out evaluations (128 tasks x 8 samples) and a 256-completion step
def test_train_sync_reports_held_out_reward_before_and_after(tmp_path):
    args = ("train", "--sync", "--steps", "1", "--json", "--out", str(tmp_path / "out"))
    result = swarmnode(*args, env=dict(os.environ))
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines[0]["step"] == 1 and "mean_reward" in lines[0]
    final = lines[-1]
    assert 0 < final["base_eval_reward"] < 1 and 0 < final["final_eval_reward"] < 1
    assert any((tmp_path / "out").iterdir())


def test_calibrate_prints_bounds_for_the_engine_pair_and_refuses_an_engine_it_cannot_run():
    env = dict(os.environ)
    result = swarmnode("calibrate", "--workers", "1", "--submissions", "1", "--json", env=env)
    assert result.returncode == 0, result.stderr
    bounds = json.loads(result.stdout.strip().splitlines()[-1])
    assert bounds["honest_submissions"] == 1
    assert bounds["max_mean_exp_mismatches"] >= bounds["honest_max_mean_exp_mismatches"] >= 0
    import torch

    from swarmnode.node.rl.engines import vllm_installed

    if not (torch.cuda.is_available() and vllm_installed()):  # a clear refusal, never a silent fallback
        refused = swarmnode("calibrate", "--worker-engine", "vllm", env=env)
        assert refused.returncode != 0 and "vllm" in (refused.stdout + refused.stderr).lower()
