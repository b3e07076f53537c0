"""DiLoCo benchmark: loss at equal compute, bytes per outer step, and (modelled) time spent communicating.

Usage: `python benchmarks/bench_diloco.py [--trainers 4] [--steps 500] [--inner-steps 1 10 50] [--threads 1]`.

Sections (each a function returning its own keys; `SECTIONS` runs them in order):
- loss: pre-training of the project's tiny model (the base checkpoint's config, fresh weights from a seed)
  on arithmetic lines (`node.rl.diloco.pretraining_batches`), held-out next-token loss on lines from
  another seed. Every configuration takes the same number of inner steps per trainer (`--steps`, so equal
  compute) on the same data: trainer k owns `--steps` batches of `--batch-size` lines.
  - DiLoCo with K=`--trainers` trainers for each H in `--inner-steps` (`--steps / H` rounds, fp16
    payloads, outer Nesterov SGD lr 0.7 momentum 0.9, inner AdamW), simulated in one process by
    `reference_diloco`; int8 payloads with error feedback at the largest H; and plain model averaging
    (outer lr 1, no momentum) at the largest H, to show what the outer optimizer adds.
  - ddp: the baseline that costs the same compute and sees the same data, synchronous data parallelism,
    which all-reduces a gradient every step. With K workers that is exactly one trainer on a K-times-larger
    batch (the K trainers' batches of a step concatenated), so it is simulated that way; it uses the same
    AdamW settings. This is the comparison DiLoCo is meant to win on bytes while staying close in loss.
  - single: one trainer alone with batch `--batch-size` for `--steps` steps on its own data (1/K of the
    data), run for each of the K trainers (mean, min, max: the spread is the noise level): what a trainer
    would reach without the others; DiLoCo should beat it.
- bytes: wire size of one trainer's payload per outer step (safetensors bytes, header included) for fp16
  and int8, against data-parallel training over the same H inner steps (one fp32 gradient per step,
  4 bytes per parameter); and the measured cost of compress + decompress + average + outer step.
- comm (modelled, not measured): the fraction of wall time spent communicating at 1 Gbit/s and
  100 Mbit/s per trainer link, from the compute time per inner step measured above and these assumptions:
  no overlap of compute and communication, no latency, full-duplex links; ddp all-reduces the fp32
  gradient with a ring (each worker moves 2(K-1)/K x 4P bytes per step, the bandwidth-optimal case);
  DiLoCo all-gathers the compressed payloads (each trainer receives K-1 payloads per outer step: the
  exact, order-fixed average needs every contribution). The tiny model moves few bytes per unit of
  compute (about 256 tokens per step per trainer); a larger model on a GPU has a far smaller compute time
  per byte, so its ddp fraction would be higher, not lower.

Measured (defaults: K=4, 500 inner steps per trainer, 16 lines per step, inner AdamW lr 1e-3, 1 thread,
about 2 minutes on 2 shared cores): held-out loss from 4.56 at init to 1.688 for ddp (64 lines per step)
and 1.774-1.779 for a lone trainer; DiLoCo fp16 H=1 2.058, H=10 1.765, H=50 1.790, H=50 int8 1.775,
H=50 with plain averaging (outer lr 1, no momentum) 1.760. So at this scale DiLoCo recovers at most about
a fifth of what synchronous data parallelism gains over a lone trainer (`*_gain_vs_ddp_gain_ratio`), the
OpenDiLoCo outer optimizer (lr 0.7, Nesterov 0.9) does no better than plain averaging over so few outer
steps (10-50), and H=1 with that outer optimizer is far worse than either (it multiplies AdamW's step by
up to lr/(1-momentum) = 7). A 2000-step run (H=50: 40 outer steps) gave the same picture (ddp 1.605,
lone 1.659, DiLoCo 1.658); inner lr 3e-3, a warm start from the base checkpoint and outer settings
(0.7, 0.5) or (1.0, 0.9) did not change it (H=10/H=50 between 1.75 and 1.89), (1.5, 0.9) was far worse
(2.06/2.70). int8 with error feedback costs nothing
measurable against fp16. Bytes: one fp16 payload is 0.505 of an fp32 gradient (int8 0.26), so per outer
step ddp moves 2H (fp16) or about 3.9H (int8) times more payload; with the comm model above, ddp spends
50% of its time communicating at 1 Gbit/s and 91% at 100 Mbit/s, DiLoCo fp16 at H=50 2% and 17%.

Progress goes to stderr; the last line on stdout is one JSON object (snake_case keys, ratios end in
`_ratio`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial

import torch
from safetensors.torch import save

from node.rl.diloco import (
    Compressor,
    DilocoParams,
    OuterOptimizer,
    RoundRecord,
    average,
    decompress,
    eval_loss,
    lm_loss,
    load_trainable,
    pretraining_batches,
    pseudo_gradient,
    reference_diloco,
    trainable_state,
)
from node.rl.model import build_model, load_checkpoint
from node.rl.run import BASE_CHECKPOINT

Section = Callable[[argparse.Namespace, dict[str, float | int]], dict[str, float | int]]
DATA_SEED = 1000  # trainer k's data seed is DATA_SEED + k
HELD_OUT_SEED = 99_000
MODEL_SEED = 0
LINKS = {"1gbit": 1e9 / 8, "100mbit": 1e8 / 8}  # bytes per second


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _setup(args: argparse.Namespace):
    cfg, _ = load_checkpoint(BASE_CHECKPOINT)
    factory = partial(build_model, cfg, MODEL_SEED)
    data = [pretraining_batches(DATA_SEED + k, args.steps, args.batch_size) for k in range(args.trainers)]
    held_out = pretraining_batches(HELD_OUT_SEED, args.eval_batches, 64)
    return factory, data, held_out


def _adamw_run(factory, batches, params: DilocoParams) -> tuple[torch.nn.Module, float]:
    model = factory()
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=params.inner_lr,
        betas=params.inner_betas,
        weight_decay=params.inner_weight_decay,
    )
    model.train()
    started = time.perf_counter()
    for batch in batches:
        opt.zero_grad(set_to_none=True)
        lm_loss(model, batch).backward()
        opt.step()
    return model.eval(), time.perf_counter() - started


def _diloco_run(
    args: argparse.Namespace, factory, data, held_out, name: str, params: DilocoParams
) -> tuple[float, float]:
    if args.steps % params.inner_steps:
        raise SystemExit(f"--steps {args.steps} is not a multiple of H={params.inner_steps}")
    rounds = args.steps // params.inner_steps
    every = max(1, rounds // 5)

    def report(rec: RoundRecord) -> None:
        if (rec.round + 1) % every == 0 or rec.round + 1 == rounds:
            _log(f"  {name} round {rec.round + 1}/{rounds}: inner loss {rec.inner_loss:.4f}")

    started = time.perf_counter()
    theta = reference_diloco(factory, data, params, rounds, lm_loss, on_round=report)
    wall = time.perf_counter() - started
    model = factory()
    load_trainable(model, theta)
    loss = eval_loss(model, held_out)
    _log(f"diloco {name}: held-out {loss:.4f} ({wall:.1f}s, {rounds} rounds)")
    return loss, wall


def loss_section(args: argparse.Namespace, result: dict[str, float | int]) -> dict[str, float | int]:
    factory, data, held_out = _setup(args)
    k, steps = args.trainers, args.steps
    base = DilocoParams(inner_lr=args.inner_lr)
    init = eval_loss(factory(), held_out)
    _log(f"loss: {k} trainers x {steps} inner steps x {args.batch_size} lines; held-out {len(held_out)}x64")
    _log(f"init held-out loss {init:.4f}")
    out: dict[str, float | int] = {
        "trainers": k,
        "inner_steps_per_trainer": steps,
        "batch_size": args.batch_size,
        "inner_lr": args.inner_lr,
        "outer_lr": base.outer_lr,
        "outer_momentum": base.outer_momentum,
        "init_loss": round(init, 4),
    }

    ddp_model, ddp_s = _adamw_run(factory, [torch.cat([d[t] for d in data]) for t in range(steps)], base)
    ddp = eval_loss(ddp_model, held_out)
    _log(f"ddp ({k * args.batch_size} lines per step): {ddp:.4f} ({ddp_s:.1f}s)")
    singles, single_s = [], []
    for trainer_data in data:
        model, wall = _adamw_run(factory, trainer_data, base)
        singles.append(eval_loss(model, held_out))
        single_s.append(wall)
    single = sum(singles) / k
    _log(f"single ({args.batch_size} lines per step, each trainer's data): {[round(x, 4) for x in singles]}")
    out.update(
        ddp_loss=round(ddp, 4),
        single_loss=round(single, 4),
        single_loss_min=round(min(singles), 4),
        single_loss_max=round(max(singles), 4),
        compute_s_per_inner_step=round(min(single_s) / steps, 5),
        ddp_compute_s_per_step=round(ddp_s / steps, 5),
    )

    h_max = max(args.inner_steps)
    runs = [(f"h{h}", DilocoParams(inner_steps=h, inner_lr=args.inner_lr)) for h in args.inner_steps]
    runs.append(
        (f"h{h_max}_int8", DilocoParams(inner_steps=h_max, compression="int8", inner_lr=args.inner_lr))
    )
    # the outer optimizer's share: plain model averaging (outer lr 1, no momentum) at the same H
    avg = DilocoParams(inner_steps=h_max, outer_lr=1.0, outer_momentum=0.0, inner_lr=args.inner_lr)
    runs.append((f"h{h_max}_avg", avg))
    for name, params in runs:
        loss, wall = _diloco_run(args, factory, data, held_out, name, params)
        out[f"{name}_loss"] = round(loss, 4)
        out[f"{name}_vs_ddp_loss_ratio"] = round(loss / ddp, 4)
        out[f"{name}_vs_single_loss_ratio"] = round(loss / single, 4)
        # how much of ddp's gain over a lone trainer DiLoCo recovers (1: all of it, <0: worse than alone)
        out[f"{name}_gain_vs_ddp_gain_ratio"] = round((single - loss) / (single - ddp), 4)
        out[f"{name}_wall_s"] = round(wall, 2)
    return out


def bytes_section(args: argparse.Namespace, result: dict[str, float | int]) -> dict[str, float | int]:
    factory, data, _ = _setup(args)
    k = args.trainers
    theta = trainable_state(factory())
    n_params = sum(t.numel() for t in theta.values())
    # a realistic pseudo-gradient: the weights after a few inner steps
    inner_model, _ = _adamw_run(factory, data[0][:5], DilocoParams(inner_lr=args.inner_lr))
    delta = pseudo_gradient(theta, trainable_state(inner_model))
    grad_bytes = 4 * n_params
    out: dict[str, float | int] = {
        "param_count": n_params,
        "param_tensors": len(theta),
        "fp32_grad_bytes": grad_bytes,
    }
    for kind in ("fp16", "int8"):
        payload = Compressor(kind).compress(delta)
        wire = len(save(payload))
        out[f"{kind}_payload_bytes"] = wire
        out[f"{kind}_vs_fp32_bytes_ratio"] = round(wire / grad_bytes, 4)
        back = decompress(payload, kind)
        rel = max(float((back[n] - delta[n]).norm() / delta[n].norm().clamp_min(1e-30)) for n in delta)
        out[f"{kind}_max_relative_error"] = round(rel, 6)
        # one trainer's outer step: compress, decompress K payloads, average, SGD (median of 7)
        outer = OuterOptimizer(theta, DilocoParams(compression=kind))
        times = []
        for _ in range(7):
            started = time.perf_counter()
            p = Compressor(kind).compress(delta)
            outer.step(average([decompress(p, kind, like=theta) for _ in range(k)]))
            times.append(time.perf_counter() - started)
        out[f"{kind}_outer_step_s"] = round(statistics.median(times), 5)
        _log(
            f"bytes {kind}: payload {wire} B ({wire / grad_bytes:.3f} of an fp32 gradient), rel err {rel:.2e}"
        )
    for h in args.inner_steps:
        # payload bytes: what one trainer puts on the wire per outer step, ddp: H fp32 gradients
        out[f"h{h}_ddp_bytes_per_outer_step"] = grad_bytes * h
        for kind in ("fp16", "int8"):
            out[f"h{h}_ddp_vs_{kind}_bytes_ratio"] = round(grad_bytes * h / out[f"{kind}_payload_bytes"], 2)
    # traffic per trainer per outer step under the comm model: ddp ring all-reduce, DiLoCo all-gather
    out["ddp_ring_bytes_per_inner_step"] = round(2 * (k - 1) / k * grad_bytes)
    for kind in ("fp16", "int8"):
        out[f"{kind}_allgather_bytes_per_outer_step"] = (k - 1) * out[f"{kind}_payload_bytes"]
        for h in args.inner_steps:
            ring = h * out["ddp_ring_bytes_per_inner_step"]
            out[f"h{h}_ddp_vs_{kind}_traffic_ratio"] = round(
                ring / out[f"{kind}_allgather_bytes_per_outer_step"], 2
            )
    return out


def comm_section(args: argparse.Namespace, result: dict[str, float | int]) -> dict[str, float | int]:
    step_s = float(result["compute_s_per_inner_step"])
    out: dict[str, float | int] = {}
    for link, bw in LINKS.items():
        ddp_comm = float(result["ddp_ring_bytes_per_inner_step"]) / bw
        out[f"modelled_ddp_comm_fraction_{link}"] = round(ddp_comm / (ddp_comm + step_s), 4)
        for h in args.inner_steps:
            for kind in ("fp16", "int8"):
                comm = float(result[f"{kind}_allgather_bytes_per_outer_step"]) / bw
                out[f"modelled_h{h}_{kind}_comm_fraction_{link}"] = round(comm / (comm + h * step_s), 4)
        _log(
            f"modelled at {link}: ddp {out[f'modelled_ddp_comm_fraction_{link}']:.3f}, "
            + ", ".join(
                f"H={h} fp16 {out[f'modelled_h{h}_fp16_comm_fraction_{link}']:.4f}" for h in args.inner_steps
            )
        )
    return out


SECTIONS: list[Section] = [loss_section, bytes_section, comm_section]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trainers", type=int, default=4, help="K, DiLoCo trainers (and ddp workers)")
    parser.add_argument("--steps", type=int, default=500, help="inner steps per trainer (equal compute)")
    parser.add_argument("--inner-steps", type=int, nargs="+", default=[1, 10, 50], help="H values")
    parser.add_argument("--batch-size", type=int, default=16, help="lines per inner step per trainer")
    parser.add_argument("--inner-lr", type=float, default=1e-3, help="inner AdamW learning rate")
    parser.add_argument("--eval-batches", type=int, default=8, help="held-out batches of 64 lines")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (1: the tiny model gains nothing from 2)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    result: dict[str, float | int] = {"torch_threads": torch.get_num_threads()}
    for section in SECTIONS:
        result.update(section(args, result))
    result["wall_s"] = round(time.perf_counter() - started, 3)
    print(json.dumps(result, sort_keys=False))


if __name__ == "__main__":
    main()
