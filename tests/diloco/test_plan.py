"""A DiLoCo run on a model folder: `swarmnode diloco plan` names the folder's config and
θ_0 (a fresh
model from a seed, or the folder's own weights), and a trainer refuses a plan for another model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swarmnode.node.cli.diloco import main
from swarmnode.node.diloco.algorithm import content_digest
from swarmnode.node.diloco.plan import (
    build_plan,
    checkpoint_digest,
    fresh_model,
    initial_digest,
    read_plan,
    sign_plan,
)
from swarmnode.node.diloco.weights import trainable_state
from swarmnode.node.rl.model import load_model, model_commitment
from tests.diloco.helpers import OWNER, identities
from tests.tinymodel import copy_folder, tiny_folder

KEYS = identities(2)


def plan_args(out: Path, model: Path, *extra: str) -> list[str]:
    trainers = [arg for k in KEYS for arg in ("--trainer", k.checksum_address)]
    return [
        *("plan", "--owner-key", OWNER.private_key.hex(), "--run", "plan-test", *trainers),
        *("--rounds", "2", "--inner-steps", "3", "--model", str(model), "--out", str(out), *extra),
    ]


def test_a_plan_names_the_folders_config_and_a_fresh_model_from_the_seed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tiny_folder()
    main(plan_args(tmp_path / "run.bin", folder, "--model-seed", "4"))
    plan, _ = read_plan(tmp_path / "run.bin", OWNER.address)
    assert plan.trainers == tuple(sorted(k.address for k in KEYS))
    assert plan.model_config_hash == model_commitment(folder).config_hash
    assert (
        plan.initial_digest
        == initial_digest(folder, 4)
        == content_digest(trainable_state(fresh_model(folder, 4)))
    )
    assert plan.initial_digest != initial_digest(folder, 5) != checkpoint_digest(folder)
    event = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert event["event"] == "plan" and event["initial_digest"] == plan.initial_digest.hex()


def test_an_rl_plan_starts_from_the_folders_own_weights(tmp_path: Path) -> None:
    folder = tiny_folder()
    main(plan_args(tmp_path / "run.bin", folder, "--base-weights"))
    plan, _ = read_plan(tmp_path / "run.bin", OWNER.address)
    assert plan.initial_digest == checkpoint_digest(folder)
    assert plan.initial_digest == content_digest(trainable_state(load_model(folder)))


def test_a_folder_that_is_not_a_supported_model_is_refused_by_name(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SystemExit, match="config.json"):
        main(plan_args(tmp_path / "run.bin", empty))
    gpt2 = copy_folder("qwen2", tmp_path / "gpt2")
    config = json.loads((gpt2 / "config.json").read_text())
    (gpt2 / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    with pytest.raises(SystemExit, match="gpt2"):
        main(plan_args(tmp_path / "run.bin", gpt2))
    assert not (tmp_path / "run.bin").exists()


def test_a_trainer_refuses_a_plan_for_another_model_config(tmp_path: Path) -> None:
    other = copy_folder("qwen2", tmp_path / "other")
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-5}))
    plan = build_plan(
        "plan-test", [k.address for k in KEYS], model=other, model_seed=0, rounds=1, inner_steps=1
    )
    (tmp_path / "run.bin").write_bytes(sign_plan(OWNER, plan))
    trainer = [
        *("trainer", "--key", KEYS[0].private_key.hex(), "--plan", str(tmp_path / "run.bin")),
        *("--owner", OWNER.checksum_address, "--data-dir", str(tmp_path / "data")),
        *("--listen", "/ip4/127.0.0.1/tcp/0", "--data-seed", "1", "--model", str(tiny_folder())),
    ]
    with pytest.raises(SystemExit, match="another model config"):
        main(trainer)
