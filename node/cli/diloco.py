"""DiLoCo trainers as processes: `swarmnode diloco plan|trainer ...`.

`plan` builds and signs the run (the owner's key, the trainers' addresses, the model folder, H, learning
rates, momentum, compression, timeouts) into a file. `trainer` runs one trainer (a fresh model of the folder's
config from `--model-seed`, pre-trained on arithmetic lines in the folder's tokens): a libp2p node that finds
the run's other trainers through the DHT, an HTTP data plane serving its contributions and outer states, and
the rounds. It prints JSON lines on stdout (`listening`, `joined`, `round_start`, `contributed`, `round_done`,
`resync`, `skipped`, `refused`, `done`, `final`, `stats`) and, once the run's rounds are done, keeps serving
(late joiners download the final outer state) until SIGTERM or SIGINT, which print `stats`.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from pathlib import Path

import safetensors.torch
import torch
import trio

from swarmnode.crypto.identity import NodeIdentity, parse_address
from swarmnode.node.cli.process_events import emit, hex_key, until_signalled
from swarmnode.node.config import LivenessSettings, NodeConfig
from swarmnode.node.dataplane.http_server import HttpServer, ServerConfig
from swarmnode.node.diloco.algorithm import LossFn, content_digest
from swarmnode.node.diloco.contribution_endpoints import DilocoService
from swarmnode.node.diloco.exchange import TrainerSettings
from swarmnode.node.diloco.holdings import Holdings
from swarmnode.node.diloco.participant import params_of
from swarmnode.node.diloco.plan import (
    build_plan,
    checkpoint_digest,
    fresh_model,
    plan_config_hash,
    read_plan,
    sign_plan,
)
from swarmnode.node.diloco.pretraining import LmBatch, lm_loss, pretraining_batches
from swarmnode.node.diloco.role import DilocoTrainer, DilocoWork
from swarmnode.node.diloco.rounds import DataInnerRound, DilocoTrainerWork
from swarmnode.node.diloco.weights import FINAL_FILE
from swarmnode.node.p2p.dht import DiscoverySettings
from swarmnode.node.rl.model import ModelFolderError
from swarmnode.node.rl.run import DEVNET_MODEL
from swarmnode.node.rl.tokenizer import load_tokenizer
from swarmnode.node.runtime import NodeRuntime, configure_logging
from swarmnode.protocol.types import MIB
from swarmnode.testing.straggler import straggling

# --- plan ----------------------------------------------------------------------------------------


def run_plan(args: argparse.Namespace) -> None:
    model = Path(args.model)
    try:
        plan = build_plan(
            args.run,
            [parse_address(a) for a in args.trainer],
            model=model,
            model_seed=args.model_seed,
            initial=checkpoint_digest(model) if args.base_weights else None,  # an RL run: θ_0 is its base
            rounds=args.rounds,
            inner_steps=args.inner_steps,
            inner_lr=args.inner_lr,
            outer_lr=args.outer_lr,
            outer_momentum=args.outer_momentum,
            nesterov=not args.no_nesterov,
            compression=args.compression,
            collect_timeout_ms=int(args.collect_timeout * 1000),
            vote_timeout_ms=int(args.vote_timeout * 1000),
        )
    except ModelFolderError as exc:
        raise SystemExit(str(exc)) from None
    owner = hex_key(args.owner_key)
    Path(args.out).write_bytes(sign_plan(owner, plan))
    emit(
        "plan",
        run=plan.run,
        owner=owner.checksum_address,
        trainers=["0x" + t.hex() for t in plan.trainers],
        initial_digest=plan.initial_digest.hex(),
        path=args.out,
    )


# --- trainer -------------------------------------------------------------------------------------




@dataclass
class Prepared:
    identity: NodeIdentity
    data_dir: Path
    holdings: Holdings
    trainer: DilocoTrainerWork


def prepare_trainer(args: argparse.Namespace) -> Prepared:
    """Everything blocking before the event loop: the verified run, the model, the data, the stores."""
    torch.set_num_threads(args.threads)
    identity = hex_key(args.key)
    data_dir = Path(args.data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    plan, plan_envelope = read_plan(Path(args.plan), parse_address(args.owner))
    folder = Path(args.model)
    try:
        if plan_config_hash(folder) != plan.model_config_hash:
            raise SystemExit(f"the run names another model config than {folder / 'config.json'}")
        tokenizer, info = load_tokenizer(folder)
        model = fresh_model(folder, args.model_seed)
    except ModelFolderError as exc:
        raise SystemExit(str(exc)) from None
    data = pretraining_batches(tokenizer, info, args.data_seed, args.batches, args.batch_size)
    holdings = Holdings(
        data_dir / "diloco", identity, plan, plan_envelope, shard_size=int(args.shard_mb * MIB)
    )
    settings = TrainerSettings(
        poll_wait_s=args.poll_wait,
        join_wait_s=args.join_wait,
        fetch_timeout_s=args.fetch_timeout,
        resync_timeout_s=args.resync_timeout,
    )
    loss_fn: LossFn[LmBatch] = lm_loss
    if args.straggle_seconds > 0:
        loss_fn = straggling(lm_loss, data, args.straggle_round, plan.inner_steps, args.straggle_seconds)
    inner = DataInnerRound(model, params_of(plan), data, loss_fn)
    trainer = DilocoTrainerWork(holdings, model, inner, settings=settings, emit=emit)
    return Prepared(identity, data_dir, holdings, trainer)


async def run_trainer(args: argparse.Namespace, prepared: Prepared) -> None:
    identity, data_dir, holdings, trainer = (
        prepared.identity,
        prepared.data_dir,
        prepared.holdings,
        prepared.trainer,
    )
    plan = holdings.plan

    async def finished(theta: dict[str, torch.Tensor] | None) -> None:
        if theta is None:  # a process of its own trains a whole model: it always holds θ
            raise TypeError("a DiLoCo trainer process finished without its weights")
        path = data_dir / FINAL_FILE
        await trio.to_thread.run_sync(lambda: safetensors.torch.save_file(theta, str(path)))
        emit("final", path=str(path), theta=content_digest(theta).hex(), round=trainer.round)

    service = DilocoService(holdings, extra_stats=trainer.status)
    server = HttpServer(service, ServerConfig(host=args.http_host, port=args.http_port))
    service.server_stats = server.stats
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.serve)
        endpoint = f"http://{args.http_host}:{port}"
        holdings.set_endpoint(endpoint)
        config = NodeConfig(
            identity=data_dir / "node.key",
            run=plan.run,
            role="trainer",
            data_dir=data_dir / "node",
            listen=args.listen,
            bootstrap=tuple(args.bootstrap),
            http_host=args.http_host,
            http_port=port,
            log_level=args.log_level,
            discovery=DiscoverySettings(
                early_refresh=(0.5, 1.0, 2.0, 4.0, 8.0), lookup_interval=args.lookup_interval
            ),
            liveness=LivenessSettings(interval=2.0, idle_after=4.0, max_strikes=3),
        )
        configure_logging(config)
        logging.getLogger("swarmnode.node.diloco").setLevel(args.log_level)
        runtime = NodeRuntime(config, identity, DilocoTrainer(DilocoWork(trainer, finished)))
        await nursery.start(until_signalled, nursery, service.statistics)
        await nursery.start(runtime.run)
        emit(
            "listening",
            endpoint=endpoint,
            address=identity.checksum_address,
            peer_id=identity.peer_id,
            addr=f"{args.listen}/p2p/{identity.peer_id}",
            run=plan.run,
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="swarmnode diloco", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plan", help="build and sign a DiLoCo run")
    p.add_argument("--owner-key", required=True, help="hex private key of the run's owner")
    p.add_argument("--run", required=True)
    p.add_argument("--trainer", action="append", required=True, help="a trainer's 0x address (repeat)")
    p.add_argument("--rounds", type=int, required=True)
    p.add_argument("--inner-steps", type=int, required=True)
    p.add_argument("--inner-lr", type=float, default=1e-3)
    p.add_argument("--outer-lr", type=float, default=0.7)
    p.add_argument("--outer-momentum", type=float, default=0.9)
    p.add_argument("--no-nesterov", action="store_true")
    p.add_argument("--compression", choices=("none", "fp16", "int8"), default="fp16")
    p.add_argument("--collect-timeout", type=float, default=30.0, help="seconds")
    p.add_argument("--vote-timeout", type=float, default=30.0, help="seconds")
    p.add_argument("--model", default=str(DEVNET_MODEL), help="the run's Hugging Face model folder")
    p.add_argument("--model-seed", type=int, default=0, help="θ_0 is a fresh model of the folder's config")
    p.add_argument(
        "--base-weights",
        action="store_true",
        help="an RL run: θ_0 is the folder's own weights, not a fresh model (--inner-lr must then be the "
        "run's GRPO learning rate)",
    )
    p.add_argument("--out", required=True)

    t = sub.add_parser("trainer", help="run one trainer of a DiLoCo run")
    t.add_argument("--key", required=True, help="hex private key of this trainer")
    t.add_argument("--plan", required=True, help="the owner-signed run file")
    t.add_argument("--owner", required=True, help="0x address of the run's owner (trust anchor)")
    t.add_argument("--data-dir", required=True)
    t.add_argument("--listen", required=True, help="libp2p multiaddr, e.g. /ip4/127.0.0.1/tcp/4101")
    t.add_argument("--bootstrap", action="append", default=[], help="multiaddr with /p2p/<peer id>")
    t.add_argument("--http-host", default="127.0.0.1")
    t.add_argument("--http-port", type=int, default=0)
    t.add_argument("--model", default=str(DEVNET_MODEL), help="the run's model folder (config, tokenizer)")
    t.add_argument("--model-seed", type=int, default=0)
    t.add_argument("--data-seed", type=int, required=True)
    t.add_argument("--batches", type=int, default=64)
    t.add_argument("--batch-size", type=int, default=8)
    t.add_argument("--shard-mb", type=float, default=8.0)
    t.add_argument("--threads", type=int, default=1)
    t.add_argument("--poll-wait", type=int, default=5)
    t.add_argument("--join-wait", type=float, default=10.0)
    t.add_argument("--fetch-timeout", type=float, default=30.0)
    t.add_argument("--resync-timeout", type=float, default=60.0)
    t.add_argument("--lookup-interval", type=float, default=2.0, help="DHT re-lookup of trainers, seconds")
    t.add_argument("--log-level", default="WARNING")
    t.add_argument("--straggle-round", type=int, default=0, help="fault injection: this round is slow")
    t.add_argument("--straggle-seconds", type=float, default=0.0, help="fault injection: by this much")

    args = parser.parse_args(argv)
    if args.command == "plan":
        run_plan(args)
    else:
        trio.run(run_trainer, args, prepare_trainer(args))
