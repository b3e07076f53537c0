"""Fakes and builders for testing ledgers (like `trio.testing`): no global state, all deterministic.

Used by the tests, the benchmark and the crash-test writer; nothing in `ledger` proper imports it.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from swarmnode.crypto.hashing import keccak256, sha256
from swarmnode.crypto.identity import NodeIdentity
from swarmnode.ledger.signedlog import SignedLog
from swarmnode.ledger.types import Params
from swarmnode.node.p2p.ports import free_port
from swarmnode.protocol.envelope import seal
from swarmnode.protocol.errors import Reason
from swarmnode.protocol.ledger_messages import (
    MAX_SUBMISSIONS_PER_VERSION_LIMIT,
    CommitCredits,
    ComputeSpec,
    Credit,
    RegisterRun,
    Slash,
)
from swarmnode.protocol.messages import Completion, RolloutGroup, RolloutSubmission
from swarmnode.protocol.runs import assignment_step

if TYPE_CHECKING:
    from web3 import Web3

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def identity(seed: str) -> NodeIdentity:
    """A deterministic key from a name, so tests and vectors are reproducible."""
    return NodeIdentity(keccak256(b"swarmnode-test-key/" + seed.encode()))


def compute(count: int = 1, accelerator: str = "cpu") -> ComputeSpec:
    return ComputeSpec(accelerator=accelerator, count=count, memory_gb=16, benchmark_gflops=1000)


@dataclass
class ManualEpochs:
    """An epoch clock the test moves by hand."""

    epoch: int = 0

    def __call__(self) -> int:
        return self.epoch


def submission_envelope(
    worker: NodeIdentity, *, run: str = "run-1", step: int = 1, nonce: int = 0, chunks: int = 8, ts: int = 0
) -> bytes:
    """A small, well-formed signed RolloutSubmission with `chunks` TOPLOC proof chunks in all."""
    proof = bytes(2 + 2 * 128)
    completions = tuple(
        Completion(
            token_ids=(1, 2, 3),
            logprobs=bytes(12),
            reward=1.0,
            advantage=0.0,
            seed=nonce * 1000 + i,
            ended_with_eos=True,
            proofs=(proof,),
        )
        for i in range(chunks)
    )
    group = RolloutGroup(task_id=sha256(b"task%d" % nonce), prompt_ids=(7, 8), completions=completions)
    submission = RolloutSubmission(
        run=run, step=step, checkpoint_version=1, checkpoint_root=bytes(32), groups=(group,)
    )
    return seal(worker, submission, run=run, seq=nonce, ts=ts)


def credit(
    worker: NodeIdentity | bytes,
    *,
    nonce: int = 0,
    step: int | None = None,
    tokens: int = 100,
    flops: int = 10**5,
    digest: bytes | None = None,
) -> Credit:
    """A credit for the worker's `nonce`-th submission: version 1, counter `nonce` unless `step` names one."""
    address = worker if isinstance(worker, bytes) else worker.address
    step = assignment_step(1, nonce) if step is None else step
    rollout_digest = sha256(b"submission" + address + step.to_bytes(8, "big")) if digest is None else digest
    return Credit(address, step, tokens, flops, rollout_digest)


def batch(run: str, *credits: Credit) -> CommitCredits:
    """A CommitCredits of these credits in the canonical (worker, step) order."""
    return CommitCredits(run, tuple(sorted(credits, key=lambda c: (c.worker, c.step))))


def register_run(
    run: str = "run-1",
    validators: tuple[NodeIdentity, ...] = (),
    *,
    window: int = 2,
    max_tokens: int = 4096,
    max_flops_per_token: int = 10**4,
    per_version: int = MAX_SUBMISSIONS_PER_VERSION_LIMIT,  # the widest: bitmap tests use big counters
) -> RegisterRun:
    return RegisterRun(
        run=run,
        validators=tuple(sorted(v.address for v in validators)),
        challenge_window_epochs=window,
        max_tokens_per_credit=max_tokens,
        max_flops_per_token=max_flops_per_token,
        max_submissions_per_version=per_version,
    )


def slash(
    worker: NodeIdentity,
    amount_gwei: int,
    *,
    nonce: int = 0,
    run: str = "run-1",
    failing_chunks: tuple[int, ...] = (1, 3),
    reason: Reason = Reason.BAD_PROOF,
    evidence: bytes | None = None,
) -> Slash:
    """A valid slash of the worker's `nonce`-th submission (the evidence it signed itself)."""
    return Slash(
        run=run,
        worker=worker.address,
        amount_gwei=amount_gwei,
        failing_chunks=failing_chunks,
        reason_code=int(reason),
        evidence=submission_envelope(worker, run=run, nonce=nonce) if evidence is None else evidence,
    )


# --- anvil -----------------------------------------------------------------------------------------


def find_anvil() -> str | None:
    """The anvil binary installed by scripts/install_anvil.sh, or one on PATH; None if neither."""
    local = PROJECT_ROOT / ".tools" / "anvil" / "node_modules"
    if local.is_dir():
        for candidate in sorted(local.glob("@foundry-rs/anvil-*/bin/anvil")):
            if candidate.is_file():
                return str(candidate)
    return shutil.which("anvil")


class AnvilProcess:
    """A real anvil node (optionally persisting to `state`), stopped on exit.

    `host`: the address clients reach it at (its `url`); `bind`: the address it listens on, `host` by
    default. A WAN devnet binds 0.0.0.0 and names the host link's address, which every node namespace
    routes to the machine (127.0.0.1 inside a namespace is the node itself).
    """

    def __init__(
        self,
        binary: str,
        *,
        state: Path | None = None,
        port: int | None = None,
        host: str = "127.0.0.1",
        bind: str | None = None,
    ) -> None:
        bind = host if bind is None else bind
        self.host = host
        self._listening_at = "127.0.0.1" if bind == "0.0.0.0" else bind  # where readiness is checked
        self.port = port or free_port(bind)
        self.url = f"http://{host}:{self.port}"
        args = [binary, "--host", bind, "--port", str(self.port), "--silent"]
        if state is not None:
            args += ["--state", str(state)]
        self._proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._wait_ready()

    def _wait_ready(self, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                err = self._proc.stderr.read().decode() if self._proc.stderr else ""
                raise RuntimeError(f"anvil exited with {self._proc.returncode}: {err}")
            try:
                with socket.create_connection((self._listening_at, self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"anvil did not listen on {self.url} within {timeout_s} s")

    def stop(self) -> None:
        """SIGTERM so anvil writes its --state file, then wait."""
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=30)  # dumping --state can take a while on a loaded machine
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc.stderr:
            self._proc.stderr.close()

    def __enter__(self) -> AnvilProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --- backend harnesses ----------------------------------------------------------------------------


@dataclass
class SignedHarness:
    """A fresh SignedLog in `directory` with a hand-moved epoch clock."""

    ledger: SignedLog
    clock: ManualEpochs

    @classmethod
    def create(cls, directory: Path, params: Params, *, ledger_id: str = "test") -> SignedHarness:
        clock = ManualEpochs()
        log = SignedLog.create(
            directory / "ledger.db",
            params,
            ledger_id=ledger_id,
            genesis_time_s=0,
            epochs=clock,
            now_ms=lambda: 0,
        )
        return cls(log, clock)

    name = "signed"

    def fund(self, *identities: NodeIdentity) -> None:
        """Signed-log stake is declared: nothing to fund."""

    def advance_to(self, epoch: int) -> None:
        self.clock.epoch = max(self.clock.epoch, epoch)

    def fingerprint(self) -> tuple[object, ...]:
        """Everything a refused operation must leave alone: state, size, head and tree head."""
        return (self.ledger.snapshot(), self.ledger.size(), self.ledger.head(), self.ledger.merkle_root())

    def close(self) -> None:
        self.ledger.close()


FUNDING_WEI = 10 * 10**18


class EvmHarness:
    """A fresh SwarmLedger deployment on an in-process EthereumTesterProvider or an anvil URL."""

    def __init__(self, w3: Web3, params: Params, *, name: str) -> None:
        from swarmnode.ledger.evm import EvmLedger  # web3 is heavy: only EVM tests pay for importing it

        self.w3 = w3
        self.name = name
        deployer = identity("deployer")
        self.fund(deployer)
        self.ledger = EvmLedger.deploy(w3, deployer, params)

    @classmethod
    def tester(cls, params: Params) -> EvmHarness:
        from web3 import EthereumTesterProvider, Web3

        return cls(Web3(EthereumTesterProvider()), params, name="evm-tester")

    @classmethod
    def anvil(cls, url: str, params: Params) -> EvmHarness:
        from web3 import Web3

        return cls(Web3(Web3.HTTPProvider(url)), params, name="evm-anvil")

    def fund(self, *identities: NodeIdentity) -> None:
        """Pay test keys from the node's pre-funded, unlocked account 0."""
        from web3.types import Wei

        source = self.w3.eth.accounts[0]
        for who in identities:
            tx = self.w3.eth.send_transaction(
                {"from": source, "to": who.checksum_address, "value": Wei(FUNDING_WEI)}
            )
            self.w3.eth.wait_for_transaction_receipt(tx)

    def advance_to(self, epoch: int) -> None:
        """Mine a block a tenth into `epoch` (never backwards), so `latest` is in that epoch."""
        if self.ledger.current_epoch() >= epoch:
            return
        target = (
            self.ledger.genesis_time
            + epoch * self.ledger.params.epoch_seconds
            + self.ledger.params.epoch_seconds // 10
        )
        provider = self.w3.provider
        tester = getattr(provider, "ethereum_tester", None)
        if tester is not None:
            tester.time_travel(target)
        else:
            provider.make_request("evm_setNextBlockTimestamp", [target])  # type: ignore[arg-type]
            provider.make_request("evm_mine", [])  # type: ignore[arg-type]

    def fingerprint(self) -> tuple[object, ...]:
        """State as the contract shows it, and the chain height: a refusal sends no transaction."""
        return (self.ledger.snapshot(), self.w3.eth.block_number)

    def close(self) -> None:
        self.ledger.close()
