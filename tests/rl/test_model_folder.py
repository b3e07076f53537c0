"""Model folders: `swarmnode model init|show`, what transformers loads, what a run's commitment refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from swarmnode.node.cli.model import describe_folder, model_group
from swarmnode.node.rl.model import (
    ModelFolderError,
    ModelMismatch,
    check_commitment,
    file_sha256,
    model_commitment,
    read_config,
)
from swarmnode.node.rl.tasks import write_tasks
from swarmnode.node.rl.tasks.arithmetic import DEVNET_PARAMS, generate_tasks
from swarmnode.node.rl.tokenizer import load_tokenizer
from tests.tinymodel import copy_folder, tiny_folder

ARCHS = ("qwen2", "llama", "qwen3")


@pytest.fixture(scope="module")
def task_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tasks = list({t.task_id: t for t in generate_tasks(DEVNET_PARAMS, 3, 300)}.values())
    return write_tasks(tasks, tmp_path_factory.mktemp("tasks") / "tasks.jsonl")


def cli(*args: str) -> Result:
    return CliRunner().invoke(model_group, list(args))


def init(out: Path, task_file: Path, *extra: str) -> Result:
    return cli("init", "--tasks", str(task_file), *extra, str(out))


# --- model init ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_init_writes_a_folder_that_transformers_loads(tmp_path: Path, task_file: Path, arch: str) -> None:
    out = tmp_path / "model"
    result = init(out, task_file, "--arch", arch, "--seed", "3", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)

    model = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    assert model.config.model_type == arch == doc["model"]["model_type"]
    assert doc["parameters"] == sum(p.numel() for p in model.parameters())
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "12+7="}], add_generation_prompt=True,
                                         tokenize=False)
    assert chat == "<|im_start|>user\n12+7=<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer(chat, return_tensors="pt").input_ids
    assert model(ids).logits.shape == (1, ids.shape[1], model.config.vocab_size)

    commitment = model_commitment(out)
    digests = doc["commitment"]
    assert digests["model_config_hash"] == "0x" + commitment.config_hash.hex()
    assert digests["base_checkpoint_hash"] == "0x" + commitment.weights_root.hex()
    assert [f["name"] for f in digests["tokenizer_files"]] == [f.name for f in commitment.tokenizer_files]
    assert not [p for p in tmp_path.iterdir() if p.name != "model"]  # no scratch folder left behind


def test_init_is_reproducible_from_the_seed(tmp_path: Path, task_file: Path) -> None:
    folders = {}
    for name, seed in (("a", "5"), ("b", "5"), ("c", "6")):
        assert init(tmp_path / name, task_file, "--seed", seed).exit_code == 0
        folders[name] = model_commitment(tmp_path / name)
    assert folders["a"] == folders["b"]
    assert folders["c"].weights_root != folders["a"].weights_root
    assert folders["c"].tokenizer_files == folders["a"].tokenizer_files  # the seed is the weights' only


def test_init_refuses_a_non_empty_directory_unless_forced(tmp_path: Path, task_file: Path) -> None:
    out = tmp_path / "model"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    result = init(out, task_file)
    assert result.exit_code == 1 and "not empty" in result.output and "--force" in result.output
    assert [p.name for p in out.iterdir()] == ["notes.txt"]

    result = init(out, task_file, "--force")
    assert result.exit_code == 0, result.output
    assert not (out / "notes.txt").exists() and (out / "config.json").is_file()
    load_tokenizer(out)


def test_init_refuses_bad_arguments_and_writes_nothing(tmp_path: Path, task_file: Path) -> None:
    out = tmp_path / "model"
    assert init(out, task_file, "--arch", "gpt2").exit_code == 2
    assert init(out, task_file, "--size", "huge").exit_code == 2
    assert init(out, task_file, "--warm-start-pass", "1.5").exit_code == 2
    assert init(out, task_file, "--vocab-size", "100").exit_code == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "arithmetic", "prompt": "1+1=", "answer": "2", "colour": "red"}\n')
    result = init(out, bad)
    assert result.exit_code == 1 and "colour" in result.output
    assert not out.exists()


def test_warm_start_that_misses_its_target_writes_nothing(tmp_path: Path, task_file: Path) -> None:
    out = tmp_path / "model"
    result = init(out, task_file, "--warm-start-pass", "0.9", "--max-steps", "2")
    assert result.exit_code == 1 and "at best (step 2 of 2), not 0.9" in result.output
    assert "--keep-best" in result.output and "warm start: step 2" in result.stderr
    assert not out.exists() and not list(tmp_path.iterdir())


def test_keep_best_writes_the_model_of_a_missed_warm_start(tmp_path: Path, task_file: Path) -> None:
    out = tmp_path / "model"
    result = init(out, task_file, "--warm-start-pass", "0.9", "--max-steps", "2", "--keep-best")
    assert result.exit_code == 0, result.output
    assert "warm start missed 0.9: writing the model of its pass rate" in result.stderr
    assert AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True) is not None


# --- model show ----------------------------------------------------------------------------------------


def test_show_reports_info_digests_and_weights() -> None:
    folder = tiny_folder("qwen2")
    result = cli("show", "--json", str(folder))
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc == describe_folder(folder)
    _, info = load_tokenizer(folder)
    assert doc["model"]["eos_token_ids"] == list(info.eos_token_ids)
    assert doc["model"]["vocab_size"] == info.vocab_size
    assert doc["weights_files"][0]["name"] == "model.safetensors"
    assert doc["parameters"] == sum(t.numel() for t in load_file(str(folder / "model.safetensors")).values())

    text = cli("show", str(folder))
    assert text.exit_code == 0
    assert doc["commitment"]["base_checkpoint_hash"] in text.output
    assert all(f["name"] in text.output for f in doc["commitment"]["tokenizer_files"])


def test_show_refuses_a_folder_that_is_not_a_model(tmp_path: Path) -> None:
    result = cli("show", str(tmp_path))
    assert result.exit_code == 1 and "no tokenizer.json" in result.output
    folder = copy_folder("qwen2", tmp_path / "m")
    (folder / "model.safetensors").unlink()
    result = cli("show", str(folder))
    assert result.exit_code == 1 and "no model.safetensors" in result.output


# --- refusals: architecture, chat template, commitment ---------------------------------------------------


def _edit_config(folder: Path, **fields: object) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | fields))


def test_unsupported_architecture_is_refused_by_name(tmp_path: Path) -> None:
    folder = copy_folder("qwen2", tmp_path / "m")
    _edit_config(folder, model_type="gpt2", architectures=["GPT2LMHeadModel"])
    with pytest.raises(ModelFolderError, match="model_type 'gpt2' is not supported"):
        read_config(folder)
    with pytest.raises(ModelFolderError, match="'gpt2'"):
        load_tokenizer(folder)
    result = cli("show", str(folder))
    assert result.exit_code == 1 and "'gpt2' is not supported" in result.output


def test_folder_without_a_chat_template_is_refused(tmp_path: Path) -> None:
    folder = copy_folder("qwen2", tmp_path / "m")
    (folder / "chat_template.jinja").unlink()
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ModelFolderError, match="no chat template"):
        load_tokenizer(folder)
    result = cli("show", str(folder))
    assert result.exit_code == 1 and "no chat template" in result.output


def _append(path: Path) -> None:
    path.write_bytes(path.read_bytes() + b" ")


def _perturb_weights(path: Path) -> None:
    state = load_file(str(path))
    name = sorted(state)[0]
    state[name] = state[name] + 1e-3
    save_file(state, str(path), metadata={"format": "pt"})


def _extra_tokenizer_file(folder: Path) -> None:
    (folder / "added_tokens.json").write_text("{}")


EDITS = {
    "config.json": (lambda f: _append(f / "config.json"), "config.json differs"),
    "tokenizer.json": (lambda f: _append(f / "tokenizer.json"), "tokenizer.json differs"),
    "tokenizer_config.json": (lambda f: _append(f / "tokenizer_config.json"), "tokenizer_config.json diff"),
    "weights": (lambda f: _perturb_weights(f / "model.safetensors"), r"model\.safetensors\) differ"),
    "extra tokenizer file": (_extra_tokenizer_file, "added_tokens.json is not part of the run's tokenizer"),
    "missing tokenizer file": (lambda f: (f / "chat_template.jinja").unlink(), "template.jinja is missing"),
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_commitment_refuses_an_edited_folder_naming_the_file(tmp_path: Path, edit: str) -> None:
    expected = model_commitment(tiny_folder("qwen2"))
    folder = copy_folder("qwen2", tmp_path / "m")
    check_commitment(folder, expected)  # an unedited copy is the run's model
    change, message = EDITS[edit]
    change(folder)
    with pytest.raises(ModelMismatch, match=message):
        check_commitment(folder, expected)


def test_commitment_covers_exactly_the_file_bytes(tmp_path: Path) -> None:
    folder = copy_folder("qwen2", tmp_path / "m")
    commitment = model_commitment(folder)
    assert commitment.config_hash == file_sha256(folder / "config.json")
    assert {f.name: f.sha256 for f in commitment.tokenizer_files} == {
        name: file_sha256(folder / name)
        for name in ("chat_template.jinja", "tokenizer.json", "tokenizer_config.json")
    }
    (folder / "README.md").write_text("not part of the model")  # files outside the model are not committed
    assert model_commitment(folder) == commitment
