"""Engine choice (`[work] engine`) and opening an engine per role on a model folder."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from swarmnode.node.rl.engine import InferenceEngine, TransformersEngine
from swarmnode.node.rl.engines import (
    ENGINES,
    INSTALL_HINT,
    ROLES,
    EngineUnavailable,
    choose_engine,
    engine_dtype,
    open_engine,
    pick_engine,
    role_engine,
    vllm_cpu_build,
)
from swarmnode.node.rl.tokenizer import load_tokenizer
from tests.tinymodel import tiny_folder

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="about a machine without CUDA")


@given(st.sampled_from(ENGINES), st.booleans(), st.booleans(), st.booleans())
def test_pick_engine_over_every_machine(setting, cuda, vllm, cpu_build):
    vllm_cpu = vllm and cpu_build  # the CPU build is a vLLM
    if setting == "vllm" and not (cuda and vllm or vllm_cpu):
        with pytest.raises(EngineUnavailable) as err:
            pick_engine(setting, cuda=cuda, vllm=vllm, vllm_cpu=vllm_cpu)
        message = str(err.value)
        assert ("CUDA" in message) == (not cuda)
        assert (INSTALL_HINT in message) == (not vllm)
        assert 'engine = "transformers"' in message
        return
    kind = pick_engine(setting, cuda=cuda, vllm=vllm, vllm_cpu=vllm_cpu)
    auto = "vllm" if cuda and vllm and not vllm_cpu else "transformers"  # auto never picks the CPU build
    assert kind == {"transformers": "transformers", "vllm": "vllm", "auto": auto}[setting]


@pytest.mark.parametrize("setting", ["", "VLLM", "hf", "auto "])
def test_unknown_engine_names_the_choices(setting):
    with pytest.raises(ValueError, match="auto, transformers, vllm"):
        pick_engine(setting, cuda=True, vllm=True)


no_vllm_cpu = pytest.mark.skipif(vllm_cpu_build(), reason="about a machine without vLLM's CPU build")


@no_cuda
@no_vllm_cpu
def test_this_cpu_machine_runs_transformers_and_refuses_vllm():
    assert choose_engine("auto") == "transformers"
    assert choose_engine("transformers") == "transformers"
    with pytest.raises(EngineUnavailable, match="CUDA"):
        choose_engine("vllm")


def test_only_workers_run_vllm():
    assert [role_engine("vllm", r) for r in ROLES] == ["vllm", "transformers", "transformers"]
    assert {role_engine("transformers", r) for r in ROLES} == {"transformers"}
    with pytest.raises(ValueError, match="role"):
        role_engine("vllm", "relay")  # type: ignore[arg-type]


def test_dtype_per_role_and_device():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert [engine_dtype(r, cuda) for r in ROLES] == [torch.bfloat16, torch.bfloat16, torch.float32]
    assert {engine_dtype(r, cpu) for r in ROLES} == {torch.float32}
    with pytest.raises(ValueError, match="role"):
        engine_dtype("relay", cpu)  # type: ignore[arg-type]


@no_cuda
@pytest.mark.parametrize("role", ROLES)
def test_open_transformers_on_a_folder_per_role(role):
    folder = tiny_folder()
    engine = open_engine("transformers", folder, role=role)
    assert isinstance(engine, TransformersEngine) and isinstance(engine, InferenceEngine)
    assert engine.device == torch.device("cpu")
    assert {p.dtype for p in engine.model.parameters()} == {torch.float32}
    assert engine.info == load_tokenizer(folder)[1]
    prompt = engine.tokenizer.encode_prompt("12+7=")
    group = engine.generate_group(prompt, 2, [1, 2], 4, 1.0)
    assert [len(c.tokens) for c in group] == [len(c.hidden_rows) for c in group]


@no_cuda
@no_vllm_cpu
def test_open_vllm_on_the_cpu():
    folder = tiny_folder()
    with pytest.raises(EngineUnavailable, match="CUDA"):
        open_engine("vllm", folder, role="worker")
    # A validator or trainer of a vLLM node prefills and trains with transformers, which runs here.
    assert isinstance(open_engine("vllm", folder, role="validator"), TransformersEngine)


def test_open_engine_takes_a_resolved_kind_and_a_dtype_override():
    folder = tiny_folder()
    with pytest.raises(ValueError, match="choose_engine"):
        open_engine("auto", folder, role="worker")  # type: ignore[arg-type]
    engine = open_engine("transformers", folder, role="validator", device="cpu", dtype=torch.bfloat16)
    assert isinstance(engine, TransformersEngine)
    assert {p.dtype for p in engine.model.parameters()} == {torch.bfloat16}
