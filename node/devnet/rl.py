"""The devnet's training run: its ledger, the live work column, and the end-of-run facts.

`DevnetLedger` creates the run's ledger before any node starts (a signed log in the devnet folder, or the
contract on a local anvil chain the devnet starts itself) and stakes and registers every role node from
its own key, as each operator would with `swarmnode stake deposit` and `swarmnode register`; then the lead
trainer's key registers the run with every validator of the devnet in its set (`register_run`), as the
trainer itself does when it names its validators. The devnet's epochs are short (`DEVNET_PARAMS`,
`DEVNET_CHALLENGE_WINDOW_EPOCHS`) so that a cheater's slash is finalized, its stake taken, within the run.
After the run, `ledger_facts` reads the ledger back (stakes, slashes with their status, credits and
batches) and the held-out reward of the base and the final checkpoint is measured with the same tasks and
seeds (`node.rl.sync.eval_reward`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.ledger import Ledger
from swarmnode.ledger.types import SLASH_FINAL, SLASH_PENDING, SLASH_VOIDED, Params, RunInfo
from swarmnode.node.rl.tasks import Task
from swarmnode.protocol.ledger_messages import MAX_RUN_VALIDATORS, ComputeSpec

if TYPE_CHECKING:  # the episode rules import torch: only when a report measures
    from swarmnode.node.rl.environments.episodes import EpisodeRules

DEVNET_STAKE_GWEI = 2 * 10**9  # twice the devnet's minimum: one slash leaves a node eligible, three eject it
DEVNET_PARAMS = Params(
    min_stake_per_unit_gwei=10**9,
    unbonding_delay_epochs=24,
    slash_gwei=5 * 10**8,
    ejection_threshold=3,
    epoch_seconds=2,  # short epochs: a slash's challenge window passes within the run
)
DEVNET_CHALLENGE_WINDOW_EPOCHS = 2  # 4 to 6 s of review before a slash takes the stake
STAKED_ROLES = ("trainer", "relay", "worker", "validator")
EVAL_SAMPLES = 8


class DevnetLedger:
    """The ledger of one devnet: created, funded and populated before the nodes start."""

    def __init__(self, kind: str, folder: Path, *, host: str = "127.0.0.1") -> None:
        """`host`: the address nodes reach this machine at (a WAN's host address; a signed log is a file)."""
        if kind not in ("signed", "evm"):
            raise ValueError(f"ledger kind must be signed or evm, not {kind!r}")
        self.kind = kind
        self.folder = folder
        self.host = host
        self.anvil: Any = None
        self.harness: Any = None
        self.url = ""  # what nodes put in [node] ledger_url

    def create(self) -> None:
        if self.kind == "signed":
            from swarmnode.ledger.signedlog import SignedLog

            path = self.folder / "ledger.db"
            SignedLog.create(path, DEVNET_PARAMS, ledger_id="devnet").close()
            self.url = f"signed:{path}"
            return
        from swarmnode.testing.ledger import AnvilProcess, EvmHarness, find_anvil

        binary = find_anvil()
        if binary is None:
            raise RuntimeError("no anvil binary: run scripts/install_anvil.sh (make devnet does)")
        state = self.folder / "anvil-state.json"
        # on a WAN, bound on every address of this machine and named by the host link's
        self.anvil = AnvilProcess(
            binary, state=state, host=self.host, bind=None if self.host == "127.0.0.1" else "0.0.0.0"
        )
        self.harness = EvmHarness.anvil(self.anvil.url, DEVNET_PARAMS)
        contract = self.harness.ledger.address
        self.url = f"evm:{self.anvil.url}#{contract}"
        (self.folder / "contract.txt").write_text(contract + "\n")

    def keep_time(self) -> None:
        """An EVM devnet: mine an empty block when the newest is a second old or more.

        The contract reads the epoch from the newest block's timestamp, and anvil mines only when a
        transaction comes: on an idle chain (the run's end, or a busy machine between credit batches) the
        epoch stood still and a slash's challenge window never passed, so it stayed pending. A real chain
        makes blocks whatever happens; the devnet's chain now does too. A signed log reads the wall clock.
        """
        if self.harness is None:
            return
        w3 = self.harness.w3
        if time.time() - int(w3.eth.get_block("latest")["timestamp"]) >= 1:
            w3.provider.make_request("evm_mine", [])

    def open(self) -> Ledger:
        from swarmnode.node.roles.common import open_work_ledger

        ledger = open_work_ledger(self.url)
        assert ledger is not None
        return ledger

    def enroll(self, nodes: list[tuple[str, NodeIdentity]], peer_ids: dict[str, str]) -> None:
        """Fund (EVM), register and stake every role node from its own key."""
        if self.harness is not None:
            self.harness.fund(*(identity for _, identity in nodes))
        ledger = self.open()
        try:
            for role, identity in nodes:
                spec = ComputeSpec(accelerator="cpu", count=1, memory_gb=1, benchmark_gflops=0)
                ledger.register(identity, role, spec, peer_ids.get(identity.checksum_address))
                ledger.deposit(identity, DEVNET_STAKE_GWEI)
        finally:
            ledger.close()

    def register_run(
        self,
        owner: NodeIdentity,
        run: str,
        validators: Sequence[NodeIdentity],
        *,
        model: str = "",
        max_new_tokens: int | None = None,
        tasks: str = "",
        environment: str = "",
    ) -> RunInfo:
        """The lead trainer's key registers the run with (the first 16 of) the devnet's validators and the
        bounds of the run the trainer will describe: the devnet's GRPO recipe for `model` (a folder, ""
        for the built-in one), the parameters its weights files hold and, in a multi-turn run, the longest
        episode of `environment` on `tasks` (a file, "" for the devnet's additions)."""
        from swarmnode.node.rl.run import (
            DEVNET_MAX_NEW_TOKENS,
            DEVNET_MODEL,
            devnet_dataset,
            devnet_grpo,
            environment_for,
        )
        from swarmnode.node.rl.tasks.files import read_tasks
        from swarmnode.node.rl.tokenizer import load_tokenizer
        from swarmnode.node.roles.common import ensure_run, run_registration

        folder = Path(model) if model else DEVNET_MODEL
        tokens = DEVNET_MAX_NEW_TOKENS if max_new_tokens is None else max_new_tokens
        tokenizer, info = load_tokenizer(folder)
        grpo = devnet_grpo(info, tokens)
        terms = None
        if environment:
            dataset = read_tasks(Path(tasks)) if tasks else devnet_dataset()
            terms = environment_for(environment, dataset, tokenizer, info, grpo.max_new_tokens)
        members = [v.address for v in validators][:MAX_RUN_VALIDATORS]
        op = run_registration(run, grpo, members, model_parameters(folder), DEVNET_CHALLENGE_WINDOW_EPOCHS,
                              environment=terms)
        ledger = self.open()
        try:
            return ensure_run(ledger, owner, op)
        finally:
            ledger.close()

    def stop(self) -> None:
        if self.anvil is not None:
            self.anvil.stop()
            self.anvil = None


def model_parameters(folder: Path) -> int:
    """The parameters a model folder's weights files hold, read from their headers (nothing loaded)."""
    from safetensors import safe_open

    from swarmnode.node.rl.model import weight_files

    total = 0
    for name in weight_files(folder):
        with safe_open(str(folder / name), framework="pt", device="cpu") as f:
            for key in f.keys():
                shape = f.get_slice(key).get_shape()
                count = 1
                for size in shape:
                    count *= size
                total += count
    return total


@dataclass(frozen=True)
class LedgerFacts:
    stakes: dict[str, int]  # 0x address (lowercase) → gwei held: bonded + unbonding (ejection unbonds)
    slashes: list[dict[str, Any]]  # each with its status: pending, final (stake taken) or voided
    contributions: dict[str, int]  # 0x worker → credits
    verified: bool | None
    batches: int = 0  # CommitCredits batches
    credits: int = 0  # credits in them
    slashes_by_status: dict[str, int] | None = None  # pending / final / voided → slashes


def ledger_facts(devnet_ledger: DevnetLedger) -> LedgerFacts:
    """Stakes, slashes, batches and credits now; for a signed log, the full audit too."""
    from swarmnode.protocol.errors import Reason

    ledger = devnet_ledger.open()
    try:
        stakes = {"0x" + s.address.hex(): s.bonded_gwei + s.unbonding_gwei for s in ledger.stakes()}
        slashes: list[dict[str, Any]] = []
        for record in ledger.slashes():
            try:
                reason = Reason(record.reason_code).name
            except ValueError:
                reason = str(record.reason_code)
            slashes.append(
                {
                    "worker": "0x" + record.worker.hex(),
                    "validator": "0x" + record.validator.hex(),
                    "amount_gwei": record.taken_gwei,  # taken: 0 while pending or once voided
                    "requested_gwei": record.requested_gwei,
                    "status": record.status,
                    "reason_code": record.reason_code,
                    "reason": reason,
                }
            )
        contributions: dict[str, int] = {}
        for entry in ledger.contributions():
            key = "0x" + entry.worker.hex()
            contributions[key] = contributions.get(key, 0) + 1
        batches = ledger.batches()
        by_status = dict.fromkeys((SLASH_PENDING, SLASH_FINAL, SLASH_VOIDED), 0)
        for slash in slashes:
            by_status[slash["status"]] = by_status.get(slash["status"], 0) + 1
        verified = None
        if devnet_ledger.kind == "evm":  # what `swarmnode ledger verify --ledger evm:` checks
            from swarmnode.ledger.evm_audit import audit_chain

            verified = audit_chain(ledger).ok  # type: ignore[arg-type]
    finally:
        ledger.close()
    if devnet_ledger.kind == "signed":
        from swarmnode.ledger.signedlog import verify_log

        verified = verify_log(devnet_ledger.folder / "ledger.db").ok
    return LedgerFacts(
        stakes,
        slashes,
        contributions,
        verified,
        batches=len(batches),
        credits=sum(b.count for b in batches),
        slashes_by_status=by_status,
    )

def final_checkpoint(trainer_data: Path, run: str) -> tuple[int, dict[str, Any]] | None:
    """The newest complete checkpoint the trainer published: (version, state dict)."""
    from swarmnode.node.dataplane.checkpoint import load_checkpoint
    from swarmnode.node.dataplane.store import ShardStore
    from swarmnode.protocol.codec import decode
    from swarmnode.protocol.envelope import Envelope
    from swarmnode.protocol.messages import CheckpointManifest

    store = ShardStore(trainer_data / "checkpoints", run)
    complete = sorted(v for v, whole in store.versions_on_disk().items() if whole)
    if not complete:
        return None
    version = complete[-1]
    envelope = store.load_manifest(version)
    assert envelope is not None
    manifest = decode(CheckpointManifest, decode(Envelope, envelope).body)
    return version, load_checkpoint(store.complete_dir(version), manifest)


# The devnet's games (`devnet --env guess`): ranges of at most 16 integers, found in 4 guesses by halving,
# so that a run on the tiny model's 128 positions can win within its turns.
GAMES, EVAL_GAMES, GAMES_MAX_LOW, GAMES_MAX_SIZE = 512, 128, 20, 16


def write_games(folder: Path) -> tuple[Path, Path]:
    """Write the devnet's guess-the-number games and held-out games (other seeds) into `folder`."""
    from swarmnode.node.rl.environments.game import generate_tasks
    from swarmnode.node.rl.tasks.files import write_tasks

    folder.mkdir(parents=True, exist_ok=True)
    train = generate_tasks(GAMES, seed=1, max_low=GAMES_MAX_LOW, max_size=GAMES_MAX_SIZE)
    held_out = generate_tasks(EVAL_GAMES, seed=2, max_low=GAMES_MAX_LOW, max_size=GAMES_MAX_SIZE)
    return write_tasks(unique(train), folder / "games.jsonl"), write_tasks(unique(held_out),
                                                                           folder / "games-eval.jsonl")


DEVNET_CALC_TURN_TOKENS = 12  # the calculator devnet's turn budget: its call `<calc>37*48</calc>` and EOS fit


def write_products(folder: Path) -> tuple[Path, Path]:
    """Write the calculator devnet's two-digit products and their held-out set (`devnet --env calculator`):
    the tasks its model was warm-started for (scripts/make_devnet_model.py --env calculator)."""
    from swarmnode.node.rl.run import devnet_dataset, devnet_eval_tasks
    from swarmnode.node.rl.tasks.arithmetic import DEVNET_PRODUCTS
    from swarmnode.node.rl.tasks.files import write_tasks

    folder.mkdir(parents=True, exist_ok=True)
    return (write_tasks(devnet_dataset(DEVNET_PRODUCTS), folder / "products.jsonl"),
            write_tasks(devnet_eval_tasks(params=DEVNET_PRODUCTS), folder / "products-eval.jsonl"))


def unique(tasks: Sequence[Task]) -> list[Task]:
    """`tasks` without repeats (a dataset's ids are distinct), first occurrence kept."""
    return list({task.task_id: task for task in tasks}.values())


def stored_rules(trainer_dir: Path) -> EpisodeRules | None:
    """The episode rules of the run the trainer described (None for a single-turn run)."""
    from swarmnode.node.rl.environments.episodes import episode_rules
    from swarmnode.node.trainer.limits import DESCRIPTOR_FILE
    from swarmnode.protocol.codec import decode
    from swarmnode.protocol.messages import RunDescriptor

    return episode_rules(decode(RunDescriptor, (trainer_dir / DESCRIPTOR_FILE).read_bytes()))


def eval_tasks_of(tasks: str, eval_tasks: str) -> list[Task]:
    """The tasks the report measures on: `eval_tasks`, else the first 128 of `tasks` (not held out),
    else the devnet's held-out additions."""
    from swarmnode.node.rl.run import DEVNET_EVAL_SIZE, devnet_eval_tasks
    from swarmnode.node.rl.tasks.files import read_tasks

    if eval_tasks:
        return read_tasks(Path(eval_tasks))
    if tasks:
        return read_tasks(Path(tasks))[:DEVNET_EVAL_SIZE]
    return devnet_eval_tasks()


def held_out_rewards(
    final_state: dict[str, Any] | None, model: str, tasks: Sequence[Task], max_new_tokens: int,
    rules: EpisodeRules | None = None,
) -> tuple[float, float | None]:
    """Mean reward of the base model (`model`: a folder, "" for the devnet's) and of `final_state` on
    `tasks` (same tasks, same seeds both times); episodes of the run's environment under `rules`."""
    from swarmnode.node.rl.engine import TransformersEngine
    from swarmnode.node.rl.run import DEVNET_MODEL, devnet_grpo
    from swarmnode.node.rl.sync import eval_reward

    engine = TransformersEngine.from_folder(Path(model) if model else DEVNET_MODEL)
    grpo = devnet_grpo(engine.info, max_new_tokens)

    def measure() -> float:
        return eval_reward(
            engine,
            tasks,
            samples=EVAL_SAMPLES,
            max_new_tokens=grpo.max_new_tokens,
            temperature=grpo.temperature,
            rules=rules,
        )

    base = measure()
    if final_state is None:
        return base, None
    engine.load_weights(final_state)
    return base, measure()


def write_json(path: Path, document: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(document, indent=1, default=str))
    tmp.replace(path)
