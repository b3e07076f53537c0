"""DiLoCo benchmark: loss at equal compute, bytes per outer step, and (modelled) time spent communicating.

Usage: `python benchmarks/bench_diloco.py [--model DIR] [--trainers 4] [--steps 500] [--inner-steps 1 10 50]
[--threads 1] [--network-trainers 2] [--network-rounds 20] [--network-inner-steps 10 50] [--no-network]`.

Sections (each a function returning its own keys; `SECTIONS` runs them in order):
- loss: pre-training of the project's tiny model (the config of the `--model` folder, the devnet's by
  default, with fresh weights from a seed: `node.diloco.plan.fresh_model`) on arithmetic lines in that
  folder's tokens (`node.diloco.pretraining.pretraining_batches`), held-out next-token loss on lines from
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
- network (measured; `--no-network` skips it): the real implementation, `--network-trainers` trainer
  processes (`swarmnode diloco trainer`, started by `testing.diloco.spawn_trainer`; libp2p
  discovery through the DHT, HTTP data plane on loopback, fp16 payloads, one torch thread each) run
  `--network-rounds` rounds for each H in `--network-inner-steps`, one fresh set of processes per H (the
  signed plan fixes H). The events carry wall-clock stamps (`t`) but no compute timings, so the phases
  come from the stamps (`round_phases`): compute = `round_start` → `contributed` (the H inner steps plus
  compressing, signing and writing the payload, all local), exchange = `contributed` → `round_done`
  (long-polling the others' contributions, fetching them, voting, averaging, the outer step, publishing
  the outer state: communication and coordination), wall = `round_start` → `round_done` (the gap to the
  next `round_start` is about a millisecond). `measured_h{H}_comm_fraction` is exchange / wall summed
  over trainers and rounds 1.. (round 0 holds the start-up skew between trainers); `_wait_s_per_round` is
  the part of exchange spent before the round's last trainer contributed (waiting for a slower peer).
  `_compute_vs_inner_steps_ratio` compares the compute phase with H x `compute_s_per_inner_step` timed
  alone in the loss section. Bytes are the trainers' HTTP servers' `bytes_served` (their `stats` event;
  on loopback every byte served is received by another trainer), per trainer per round, round 0
  included, against the comm model's all-gather of fp16 payloads (`_bytes_vs_fp16_allgather_ratio`).
  Loopback has no bandwidth limit worth the name, so this fraction is the implementation's own overhead
  (round trips, hashing, signatures, the outer step) on top of which a real link adds the modelled
  transfer time; on 2 shared cores the two trainers also compete with anything else running.

Measured (defaults, on a tiny Qwen2 folder as `swarmnode model init` writes it, tokenizer trained on the
devnet chats, vocabulary 461, 180,672 parameters; K=4, 500 inner steps per trainer, 16 lines per step, inner
AdamW lr 1e-3, 1 thread, 5.6 minutes on 2 shared cores with the network section): held-out loss from 6.095 at
init to 1.706 for ddp (64 lines per step) and 1.756-1.793 (mean 1.779) for a lone trainer; DiLoCo fp16 H=1
2.069, H=10 1.843, H=50 1.790, H=50 int8 1.793, H=50 with plain averaging (outer lr 1, no momentum) 1.748. So
at this scale DiLoCo with the OpenDiLoCo outer optimizer (lr 0.7, Nesterov 0.9) ends where a lone trainer does
(`h50_gain_vs_ddp_gain_ratio` -0.16; H=10 -0.88), plain averaging recovers about two fifths of what
synchronous data parallelism gains over a lone trainer (0.42), and H=1 with that outer optimizer is far worse
than either (it multiplies AdamW's step by up to lr/(1-momentum) = 7). The char-level model of the previous
version (99 characters, 136k parameters) gave the same picture (ddp 1.688, lone 1.774-1.779, H=50 1.790, plain
averaging 1.760); there a 2000-step run, inner lr 3e-3, a warm start and outer settings (0.7, 0.5) or (1.0,
0.9) did not change it, and (1.5, 0.9) was far worse. int8 with error feedback costs nothing measurable
against fp16 (relative error 4.2e-3 per tensor against 2.7e-4). Bytes: one fp16 payload is 0.504 of an fp32
gradient (int8 0.257), so per outer step ddp moves 2H (fp16) or about 3.9H (int8) times more payload; with the
comm model above (0.022 s per inner step), ddp spends 28% of its time communicating at 1 Gbit/s and 80% at 100
Mbit/s, DiLoCo fp16 at H=50 0.8% and 7.3%.

Network section (2 trainer processes, 20 rounds per H, 47 s): H=10 a round took 0.325 s, 0.262 s computing and
0.062 s exchanging (0.029 s of it waiting for the other trainer), so 19% of wall time went to communication
and coordination against a modelled 3.8% at 1 Gbit/s; H=50 0.810 s = 0.751 s + 0.059 s (0.029 s waiting), 7.2%
against a modelled 0.8%. Each trainer served 366,447 bytes per round in 4 requests: 1.007 times the one fp16
payload the comm model counts for K=2. The per-round exchange (about 60 ms on loopback, where bytes cost
almost nothing) is a fixed overhead the model leaves out: it exceeds the modelled transfer time of one payload
at 1 Gbit/s (2.9 ms) many times over. The compute phase against the same steps timed alone in the loss section
(`_compute_vs_inner_steps_ratio`) was 1.19 at H=10 and 0.68 at H=50: other work shared the 2 cores and slowed
the loss section's timing as much as the processes', so the measured numbers move with the machine's load, the
modelled ones hardly (the previous version measured 3-4 here under heavier load).

Progress goes to stderr; the last line on stdout is one JSON object (snake_case keys, ratios end in
`_ratio`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.node.diloco.algorithm import (
    DilocoParams,
    OuterOptimizer,
    RoundRecord,
    average,
    pseudo_gradient,
    reference_diloco,
)
from swarmnode.node.diloco.compression import Compressor, decompress
from swarmnode.node.diloco.plan import build_plan, fresh_model, sign_plan
from swarmnode.node.diloco.pretraining import LmBatch, eval_loss, lm_loss, pretraining_batches
from swarmnode.node.diloco.weights import load_trainable, trainable_state
from swarmnode.node.rl.run import DEVNET_MODEL
from swarmnode.node.rl.tokenizer import load_tokenizer
from swarmnode.testing.diloco import TrainerSpec, spawn_trainer, trainer_key
from swarmnode.testing.processes import RoleProcess, stop_all

Section = Callable[[argparse.Namespace, dict[str, float | int]], dict[str, float | int]]
DATA_SEED = 1000  # trainer k's data seed is DATA_SEED + k
HELD_OUT_SEED = 99_000
MODEL_SEED = 0
LINKS = {"1gbit": 1e9 / 8, "100mbit": 1e8 / 8}  # bytes per second
NETWORK_OWNER = NodeIdentity(
    (0xB0_0C0).to_bytes(32, "big")
)  # signs the benchmark's runs (never for real use)


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _setup(args: argparse.Namespace):
    factory = partial(fresh_model, args.model, MODEL_SEED)
    tokenizer, info = load_tokenizer(args.model)
    lines = partial(pretraining_batches, tokenizer, info)
    data = [lines(DATA_SEED + k, args.steps, args.batch_size) for k in range(args.trainers)]
    held_out = lines(HELD_OUT_SEED, args.eval_batches, 64)
    return factory, data, held_out


def _concat(batches: list[LmBatch]) -> LmBatch:
    """The K trainers' batches of one step as one batch (what data-parallel training sees)."""
    return LmBatch(torch.cat([b.ids for b in batches]), torch.cat([b.mask for b in batches]))


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

    ddp_model, ddp_s = _adamw_run(factory, [_concat([d[t] for d in data]) for t in range(steps)], base)
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


# --- measured on trainer processes ----------------------------------------------------------------------


def round_phases(events: list[list[dict[str, Any]]], skip: int = 1) -> dict[str, list[float]]:
    """Seconds per phase for every trainer and round from round `skip` on, from the events' `t` stamps.

    compute: `round_start` → `contributed` (inner steps, compress, sign and write the payload);
    exchange: `contributed` → `round_done` (collect the others' contributions, vote, fetch, average, outer
    step, publish the outer state); wait: the part of exchange spent before the round's last trainer
    contributed (waiting for a slower peer, not moving bytes). Round 0 is skipped by default: trainers
    leave the join at different times, so its wait is start-up skew.
    """
    stamps = {
        kind: [{e["round"]: e["t"] for e in trainer if e["event"] == kind} for trainer in events]
        for kind in ("round_start", "contributed", "round_done")
    }
    rounds = sorted(set.intersection(*(set(done) for done in stamps["round_done"])))
    phases: dict[str, list[float]] = {"wall": [], "compute": [], "exchange": [], "wait": []}
    for r in rounds[skip:]:
        last = max(c[r] for c in stamps["contributed"])
        for start, contributed, done in zip(*stamps.values(), strict=True):
            phases["wall"].append(done[r] - start[r])
            phases["compute"].append(contributed[r] - start[r])
            phases["exchange"].append(done[r] - contributed[r])
            phases["wait"].append(max(0.0, last - contributed[r]))
    return phases


def _network_run(
    args: argparse.Namespace, h: int, tmp: Path
) -> tuple[list[list[dict[str, Any]]], list[dict[str, Any]], float]:
    """Run `--network-trainers` trainer processes on loopback for `--network-rounds` rounds at H=h.

    Returns every trainer's events, its final `stats` and the seconds from spawning to the last `final`.
    """
    k, rounds = args.network_trainers, args.network_rounds
    common = (
        *("--batches", str(rounds * h), "--batch-size", str(args.batch_size)),
        *("--model", str(args.model), "--model-seed", str(MODEL_SEED), "--threads", "1", "--join-wait", "90"),
    )
    specs = [
        TrainerSpec(f"h{h}-trainer-{i}", trainer_key(i), tmp / f"h{h}-{i}", DATA_SEED + i, common)
        for i in range(k)
    ]
    plan = build_plan(
        f"bench-diloco-h{h}",
        [s.key.address for s in specs],
        model=args.model,
        model_seed=MODEL_SEED,
        rounds=rounds,
        inner_steps=h,
        inner_lr=args.inner_lr,
        compression="fp16",
    )
    path = tmp / f"h{h}-run.bin"
    path.write_bytes(sign_plan(NETWORK_OWNER, plan))
    started = time.perf_counter()
    owner = NETWORK_OWNER.address
    procs: list[RoleProcess] = []
    try:
        # trainer 0 is everyone's bootstrap peer: the others start once it listens, not before
        procs.append(spawn_trainer(specs[0], path, owner, [], timeout=120))
        procs += [spawn_trainer(s, path, owner, [specs[0].addr], timeout=None) for s in specs[1:]]
        for proc in procs[1:]:
            proc.endpoint = proc.wait_event("listening", 120)["endpoint"]
        for proc in procs:
            proc.wait_event("final", 120 + rounds * h)
        run_s = time.perf_counter() - started
        stats = [proc.stop() or {} for proc in procs]
    finally:
        stop_all(procs)
    return [proc.seen for proc in procs], stats, run_s


def network_section(args: argparse.Namespace, result: dict[str, float | int]) -> dict[str, float | int]:
    k, rounds = args.network_trainers, args.network_rounds
    if rounds < 2:
        raise SystemExit("--network-rounds must be at least 2 (round 0 is start-up and not counted)")
    step_s = float(result["compute_s_per_inner_step"])
    allgather = float(result["fp16_payload_bytes"]) * (k - 1)  # DiLoCo's share under the comm model
    out: dict[str, float | int] = {"network_trainers": k, "network_rounds": rounds}
    _log(f"network: {k} trainer processes on loopback, {rounds} rounds per H (round 0 not counted)")
    with tempfile.TemporaryDirectory(prefix="bench-diloco-") as tmp:
        for h in args.network_inner_steps:
            events, stats, run_s = _network_run(args, h, Path(tmp))
            phases = round_phases(events)
            per_round = {name: statistics.mean(values) for name, values in phases.items()}
            served = sum(int(s.get("server", {}).get("bytes_served", 0)) for s in stats)
            requests = sum(int(s.get("server", {}).get("requests", 0)) for s in stats)
            name = f"measured_h{h}"
            out.update(
                {
                    f"{name}_run_s": round(run_s, 2),
                    f"{name}_wall_s_per_round": round(per_round["wall"], 4),
                    f"{name}_compute_s_per_round": round(per_round["compute"], 4),
                    f"{name}_exchange_s_per_round": round(per_round["exchange"], 4),
                    f"{name}_wait_s_per_round": round(per_round["wait"], 4),
                    f"{name}_comm_fraction": round(sum(phases["exchange"]) / sum(phases["wall"]), 4),
                    # the compute phase against H inner steps timed alone in this process (loss section)
                    f"{name}_compute_vs_inner_steps_ratio": round(per_round["compute"] / (h * step_s), 3),
                    # every byte a trainer serves, another receives: per trainer per round, round 0 included
                    f"{name}_bytes_served_per_round": round(served / (k * rounds)),
                    f"{name}_requests_per_round": round(requests / (k * rounds), 1),
                    f"{name}_bytes_vs_fp16_allgather_ratio": round(served / (k * rounds) / allgather, 3),
                }
            )
            _log(
                f"network H={h}: round {per_round['wall']:.3f}s = compute {per_round['compute']:.3f}s"
                f" + exchange {per_round['exchange']:.3f}s (of which waiting {per_round['wait']:.3f}s);"
                f" comm fraction {out[f'{name}_comm_fraction']:.3f} (modelled at 1 Gbit/s"
                f" {result.get(f'modelled_h{h}_fp16_comm_fraction_1gbit', float('nan')):.4f});"
                f" {out[f'{name}_bytes_served_per_round']} B served per trainer per round ({run_s:.1f}s)"
            )
    return out


SECTIONS: list[Section] = [loss_section, bytes_section, comm_section, network_section]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEVNET_MODEL, help="model folder (config, tokenizer)")
    parser.add_argument("--trainers", type=int, default=4, help="K, DiLoCo trainers (and ddp workers)")
    parser.add_argument("--steps", type=int, default=500, help="inner steps per trainer (equal compute)")
    parser.add_argument("--inner-steps", type=int, nargs="+", default=[1, 10, 50], help="H values")
    parser.add_argument("--batch-size", type=int, default=16, help="lines per inner step per trainer")
    parser.add_argument("--inner-lr", type=float, default=1e-3, help="inner AdamW learning rate")
    parser.add_argument("--eval-batches", type=int, default=8, help="held-out batches of 64 lines")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (1: the tiny model gains nothing from 2)"
    )
    parser.add_argument(
        "--network-trainers", type=int, default=2, help="trainer processes for the measured section"
    )
    parser.add_argument("--network-rounds", type=int, default=20, help="rounds per H in the measured section")
    parser.add_argument(
        "--network-inner-steps", type=int, nargs="+", default=[10, 50], help="H values, measured section"
    )
    parser.add_argument("--no-network", action="store_true", help="skip the measured (process) section")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    result: dict[str, float | int] = {"torch_threads": torch.get_num_threads()}
    for section in SECTIONS:
        if args.no_network and section is network_section:
            continue
        result.update(section(args, result))
    result["wall_s"] = round(time.perf_counter() - started, 3)
    print(json.dumps(result, sort_keys=False))


if __name__ == "__main__":
    main()
