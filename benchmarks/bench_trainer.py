#!/usr/bin/env python3
"""The trainer on 1 vs N ranks: GRPO step time on the same global batch, and memory per rank.

Usage: `python benchmarks/bench_trainer.py [--size small] [--nproc 2] [--steps 5] [--completions 64]
[--tokens 48]`.

Baseline, measured in the same run: the one-process trainer (`GrpoTrainer`, the node's default) on the
same model folder and the same batch, with as many torch threads as the N ranks have together, in its own
process. The group runs `node.trainer.sharded` under torch.distributed.run (gloo on the CPU, NCCL on
GPUs), one thread per rank. Each process reports its median step time after one warm-up step, the bytes of its
parameters and AdamW state (for a rank: its shards; FSDP2 divides them by N, the goal is a ratio near
1/N), and its peak RSS (which also holds torch, transformers and the full model each rank loads before
sharding it, so it does not shrink as 1/N on a model this small).

On two CPU cores the group is not expected to be faster (the ranks share the cores the baseline used and
add gloo collectives); the figure is there to be compared on a machine with a device per rank.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgpack
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from swarmnode.node.rl.grpo import group_advantages  # noqa: E402
from swarmnode.node.rl.rollouts import pack_logprobs  # noqa: E402
from swarmnode.protocol.codec import decode, encode  # noqa: E402
from swarmnode.protocol.messages import Completion, GrpoParams, RolloutGroup  # noqa: E402

GROUP = 8


def synthetic_groups(vocab: int, completions: int, tokens: int, seed: int = 0) -> list[RolloutGroup]:
    """Random prompts and completions with mixed rewards: the step's cost, not its learning, is measured."""
    gen = torch.Generator().manual_seed(seed)
    groups = []
    for g in range(max(1, completions // GROUP)):
        prompt = tuple(int(t) for t in torch.randint(1, vocab, (16,), generator=gen))
        rewards = [float(i % 2) for i in range(GROUP)]
        advantages = group_advantages(torch.tensor(rewards)).tolist()
        items = []
        for i in range(GROUP):
            ids = tuple(int(t) for t in torch.randint(1, vocab, (tokens,), generator=gen))
            logprobs = -torch.rand(tokens, generator=gen) * 3
            items.append(
                Completion(
                    token_ids=ids, logprobs=pack_logprobs(logprobs), reward=rewards[i],
                    advantage=advantages[i], seed=i, ended_with_eos=False, proofs=(),
                )
            )
        groups.append(RolloutGroup(bytes([g % 256]) * 32, prompt, tuple(items)))
    return groups


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def grpo_for(info, completions: int, tokens: int) -> GrpoParams:
    from swarmnode.node.rl.run import devnet_grpo

    base = devnet_grpo(info)
    return GrpoParams(
        **{**base.__dict__, "group_size": GROUP, "prompts_per_step": max(1, completions // GROUP),
           "max_new_tokens": tokens, "token_budget": completions * tokens}
    )


def job(args: argparse.Namespace) -> None:
    """One measuring process: the one-process trainer, or one rank of the group (rank 0 reports)."""
    from swarmnode.node.rl.tokenizer import load_tokenizer
    from swarmnode.node.trainer.commands import serve_rank
    from swarmnode.node.trainer.group import launched_rank
    from swarmnode.node.trainer.sharded import ShardedGrpoTrainer

    torch.set_num_threads(args.threads)
    if launched_rank() not in (None, 0):
        serve_rank()
        return
    groups = [decode(RolloutGroup, g) for g in msgpack.unpackb(args.groups.read_bytes())]
    info = load_tokenizer(args.model)[1]
    grpo = grpo_for(info, args.completions, args.tokens)
    times = []
    if launched_rank() is None:
        from swarmnode.node.rl.engine import TransformersEngine
        from swarmnode.node.rl.learner import GrpoTrainer

        trainer = GrpoTrainer(TransformersEngine.from_folder(args.model), grpo)
        for _ in range(args.steps + 1):
            started = time.perf_counter()
            trainer.step(groups)
            times.append(time.perf_counter() - started)
        params = sum(p.numel() * p.element_size() for p in trainer.engine.model.parameters())
        optim = sum(
            v.numel() * v.element_size()
            for s in trainer.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)
        )
        report = {"ranks": 1, "state_bytes": [params + optim], "peak_rss_mb": [peak_rss_mb()]}
    else:
        sharded = ShardedGrpoTrainer.start(args.out / "trainer", args.model, grpo)
        for _ in range(args.steps + 1):
            started = time.perf_counter()
            sharded.step(groups)
            times.append(time.perf_counter() - started)
        memory = sharded.measure()
        report = {
            "ranks": len(memory),
            "state_bytes": [m.state_bytes for m in memory],
            "peak_rss_mb": [m.peak_rss_bytes / 2**20 for m in memory],
        }
        sharded.close()
    report["step_s"] = statistics.median(times[1:])
    (args.out / f"report-{report['ranks']}.json").write_text(json.dumps(report))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small", help="Model size of `model init` (tiny, small).")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--completions", type=int, default=64, help="Completions in the global batch.")
    parser.add_argument("--tokens", type=int, default=48, help="Tokens per completion.")
    parser.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--groups", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job:
        job(args)
        return
    from swarmnode.node.rl.modelinit import chat_texts, init_model_folder
    from swarmnode.node.rl.tasks.arithmetic import DEVNET_PARAMS, generate_tasks
    from swarmnode.node.rl.tokenizer import load_tokenizer

    with tempfile.TemporaryDirectory(prefix="bench-trainer-") as scratch:
        out = Path(scratch)
        texts = chat_texts((t.prompt, t.target) for t in generate_tasks(DEVNET_PARAMS, 1, 1000))
        model = init_model_folder(out / "model", texts, size=args.size, seed=1)
        vocab = load_tokenizer(model)[1].vocab_size
        groups = synthetic_groups(vocab, args.completions, args.tokens)
        (out / "groups.msgpack").write_bytes(msgpack.packb([encode(g) for g in groups]))
        common = [
            "--job", "--model", str(model), "--groups", str(out / "groups.msgpack"), "--out", str(out),
            "--steps", str(args.steps), "--completions", str(args.completions), "--tokens", str(args.tokens),
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        print(f"one process, {args.nproc} threads ...", flush=True)
        subprocess.run(
            [sys.executable, __file__, *common, "--threads", str(args.nproc)], check=True, env=env, cwd=ROOT
        )
        print(f"{args.nproc} ranks, 1 thread each ...", flush=True)
        subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
             __file__, *common, "--threads", "1"],
            check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        one = json.loads((out / "report-1.json").read_text())
        group = json.loads((out / f"report-{args.nproc}.json").read_text())
    single_state = one["state_bytes"][0]
    per_rank = max(group["state_bytes"])
    print(f"model {args.size}: {single_state / 2**20:.1f} MiB of parameters + AdamW state in one process")
    print(f"step (global batch {args.completions} x {args.tokens} tokens): one process "
          f"{one['step_s']:.3f} s, {args.nproc} ranks {group['step_s']:.3f} s")
    print(f"state per rank {per_rank / 2**20:.1f} MiB ({per_rank / single_state:.3f} of one process); "
          f"peak RSS one process {one['peak_rss_mb'][0]:.0f} MiB, ranks "
          + ", ".join(f"{m:.0f}" for m in group["peak_rss_mb"]) + " MiB")
    print(json.dumps({
        "model_size": args.size,
        "nproc": args.nproc,
        "global_completions": args.completions,
        "tokens_per_completion": args.tokens,
        "step_s_one_process": round(one["step_s"], 4),
        "step_s_group": round(group["step_s"], 4),
        "group_vs_one_process_step_ratio": round(group["step_s"] / one["step_s"], 3),
        "state_bytes_one_process": single_state,
        "state_bytes_per_rank": group["state_bytes"],
        "state_per_rank_vs_one_process_ratio": round(per_rank / single_state, 4),
        "peak_rss_mb_one_process": round(one["peak_rss_mb"][0], 1),
        "peak_rss_mb_per_rank": [round(m, 1) for m in group["peak_rss_mb"]],
        "device": "cuda" if torch.cuda.is_available() else "cpu",
    }))


if __name__ == "__main__":
    main()
    from swarmnode.node.trainer.group import exit_rank

    exit_rank(0)  # skip torch's racy C++ teardown at exit
