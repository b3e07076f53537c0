"""Credits per second and gas per credit: batched CommitCredits against one credit per transaction.

    python benchmarks/bench_ledger.py [--quick] [--profile] [--workers W] [--batches B] [--singles S]

Workload: W workers (default 32), each credited K = 16 assignments per batch (4 checkpoint versions x 4
submission counters), so one batch is W x K = 512 credits (MAX_CREDITS_PER_BATCH); every batch credits
fresh versions. The first batch is timed on its own (it writes fresh storage: the run's per-worker totals
and, on chain, every worker's first bitmap slot), then B more (default 16) give the steady state. The
baseline, in the same run on the same ledger: S credits (default 512) of the same shape, one CommitCredits
of one credit per entry or transaction (a batch of one: the per-transaction path). Setup (registering the run
owner, validator and workers, staking, registering the run with the validator in its set) is not timed.

Signed log: each commit is `SignedLog.commit_credits`: sign the operation, append it (signature checks,
state machine, Merkle root over the credits, one WAL fsync). Then `verify_log` replays the file from
genesis re-checking every signature (the audit cost, per credit).
EVM: a real anvil (automine) and `EvmLedger.commit_credits`, which runs a preflight `eth_call` (the typed
refusal the signed log would give), signs, sends and waits for the receipt: that honest per-transaction
cost is in the figures. Gas is the receipts' gasUsed over the credits. Skipped with a note if anvil is not
installed (scripts/install_anvil.sh). Gas is split into calldata (from the input bytes) and execution.
`--profile` prints cProfile's top entries for each timed phase (on the EVM, where the time goes when it
is the Python client, not the chain; the profiler slows the phase it watches) and one batch's execution
gas by opcode (needs an anvil started with --steps-tracing; otherwise it says so). `--quick`: 2 steady
batches and 64 single credits, well under a minute.

The machine is shared: rates are wall clock over the whole phase. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hexbytes import HexBytes

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from swarmnode.crypto.identity import NodeIdentity  # noqa: E402
from swarmnode.ledger.interface import Ledger  # noqa: E402
from swarmnode.ledger.signedlog import SignedLog, verify_log  # noqa: E402
from swarmnode.ledger.types import Params, Receipt  # noqa: E402
from swarmnode.protocol.ledger_messages import MAX_CREDITS_PER_BATCH, CommitCredits  # noqa: E402
from swarmnode.protocol.runs import assignment_step  # noqa: E402
from swarmnode.testing import ledger as T  # noqa: E402

if TYPE_CHECKING:
    from web3 import Web3

PARAMS = Params(
    min_stake_per_unit_gwei=1_000,
    unbonding_delay_epochs=2,
    slash_gwei=400,
    ejection_threshold=3,
    epoch_seconds=3_600,
)
RUN = "bench-run"
VERSIONS_PER_BATCH = 4  # 4 versions share one bitmap slot on chain (ledger.batches.credit_slot)
COUNTERS_PER_VERSION = 4
# The goals: (what, JSON key, sense, target).
GOALS = (
    ("signed log, batched credits/s", "signed_log_credits_per_s_batched", ">=", 10_000),
    ("EVM, batched credits/s", "credits_per_s_batched", ">=", 1_000),
    ("EVM, batched vs single", "batched_vs_single_ratio", ">=", 50),
    ("EVM, gas per credit batched", "gas_per_credit_batched", "<=", 5_000),
)
PROFILE_TOP = 15


@dataclass(frozen=True)
class Workload:
    workers: int
    batches: int  # steady-state batches, after the first
    singles: int  # credits sent one per entry or transaction

    @property
    def per_worker(self) -> int:
        return VERSIONS_PER_BATCH * COUNTERS_PER_VERSION

    @property
    def per_batch(self) -> int:
        return self.workers * self.per_worker

    def describe(self) -> str:
        return (
            f"{self.workers} workers x {self.per_worker} credits ({VERSIONS_PER_BATCH} versions x "
            f"{COUNTERS_PER_VERSION} counters) = {self.per_batch} credits per batch; first batch + "
            f"{self.batches} steady batches; baseline {self.singles} credits one per commit"
        )


def batch_credits(workers: Sequence[bytes], index: int) -> CommitCredits:
    """Batch `index`: every worker's counters on versions [4 * index, 4 * index + 4), all fresh."""
    first = index * VERSIONS_PER_BATCH
    return T.batch(
        RUN,
        *(
            T.credit(worker, step=assignment_step(version, counter), tokens=100 + counter)
            for worker in workers
            for version in range(first, first + VERSIONS_PER_BATCH)
            for counter in range(COUNTERS_PER_VERSION)
        ),
    )


def single_credits(workers: Sequence[bytes], first_index: int, count: int) -> list[CommitCredits]:
    """`count` credits of the same shape as a batch (fresh versions after every batch), one per commit."""
    ops: list[CommitCredits] = []
    index = first_index
    while len(ops) < count:
        credits = batch_credits(workers, index).credits[: count - len(ops)]
        ops.extend(CommitCredits(RUN, (credit,)) for credit in credits)
        index += 1
    return ops


@dataclass
class Parties:
    owner: NodeIdentity
    validator: NodeIdentity
    workers: list[NodeIdentity]

    @classmethod
    def make(cls, workers: int) -> Parties:
        return cls(
            T.identity("bench-owner"),
            T.identity("bench-validator"),
            [T.identity(f"bench-worker-{i}") for i in range(workers)],
        )

    def everyone(self) -> list[NodeIdentity]:
        return [self.owner, self.validator, *self.workers]


def set_up(ledger: Ledger, parties: Parties) -> None:
    """Register and stake everyone, register the run with the validator in its set (not timed)."""
    roles = [(parties.owner, "trainer"), (parties.validator, "validator")]
    for who, role in roles + [(w, "worker") for w in parties.workers]:
        ledger.register(who, role, T.compute())
        ledger.deposit(who, PARAMS.min_stake_per_unit_gwei)
    ledger.register_run(parties.owner, T.register_run(RUN, (parties.validator,)))


@dataclass(frozen=True)
class Phase:
    credits: int
    seconds: float
    receipts: tuple[Receipt, ...]

    @property
    def per_s(self) -> float:
        return self.credits / self.seconds


def timed_commits(
    ledger: Ledger, validator: NodeIdentity, ops: Sequence[CommitCredits], profile: str | None = None
) -> Phase:
    """Commit `ops` one after another; with `profile`, print the phase's cProfile top entries."""
    profiler = cProfile.Profile() if profile else None
    receipts = []
    with profiler or nullcontext():
        start = time.perf_counter()
        for op in ops:
            receipts.append(ledger.commit_credits(validator, op))
        seconds = time.perf_counter() - start
    if profiler is not None:
        for order in ("cumulative", "tottime"):
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats(order).print_stats(PROFILE_TOP)
            print(f"--- cProfile, {profile} (top {PROFILE_TOP}, {order}) ---\n{out.getvalue()}")
    return Phase(sum(len(op.credits) for op in ops), seconds, tuple(receipts))


def run_phases(
    ledger: Ledger, parties: Parties, work: Workload, profile: Callable[[str], str | None]
) -> tuple[Phase, Phase, Phase]:
    """The first batch, the steady batches, then the one-credit-per-commit baseline, on one ledger."""
    addresses = [w.address for w in parties.workers]
    first = timed_commits(ledger, parties.validator, [batch_credits(addresses, 0)], profile("first batch"))
    steady_ops = [batch_credits(addresses, i) for i in range(1, work.batches + 1)]
    steady = timed_commits(ledger, parties.validator, steady_ops, profile("steady batches"))
    singles_ops = single_credits(addresses, work.batches + 1, work.singles)
    single = timed_commits(ledger, parties.validator, singles_ops, profile("one credit per commit"))
    return first, steady, single


def check_credited(ledger: Ledger, *phases: Phase) -> int:
    """The run's per-worker totals add up to every credit sent (a benchmark of refusals proves nothing)."""
    credited = sum(total.credits for total in ledger.totals(RUN))
    sent = sum(phase.credits for phase in phases)
    if credited != sent:
        raise SystemExit(f"the ledger credited {credited} contributions, not the {sent} sent")
    return credited


def bench_signed_log(directory: Path, work: Workload, profile: bool) -> dict[str, float | int]:
    parties = Parties.make(work.workers)
    path = directory / "bench.db"
    log = SignedLog.create(path, PARAMS, ledger_id="bench", epochs=lambda: 0)
    set_up(log, parties)
    first, steady, single = run_phases(
        log, parties, work, lambda name: f"signed log, {name}" if profile else None
    )
    batched_bytes = sum(len(log.entry(r.position)) for r in steady.receipts)
    single_bytes = sum(len(log.entry(r.position)) for r in single.receipts)
    credits = check_credited(log, first, steady, single)
    log.close()

    start = time.perf_counter()
    report = verify_log(path)
    verify_s = time.perf_counter() - start
    if not report.ok:
        raise SystemExit(f"verify_log failed on the benchmark's own log: {report.error}")
    return {
        "signed_log_credits_per_s_batched": steady.per_s,
        "signed_log_credits_per_s_first_batch": first.per_s,
        "signed_log_credits_per_s_single": single.per_s,
        "signed_log_batched_vs_single_ratio": steady.per_s / single.per_s,
        "signed_log_bytes_per_credit_batched": batched_bytes / steady.credits,
        "signed_log_bytes_per_credit_single": single_bytes / single.credits,
        "signed_log_verify_credits_per_s": credits / verify_s,
    }


def gas_used(w3: Web3, receipts: Sequence[Receipt]) -> int:
    return sum(int(w3.eth.get_transaction_receipt(HexBytes(r.ref))["gasUsed"]) for r in receipts)


def calldata_gas(w3: Web3, receipts: Sequence[Receipt]) -> int:
    """What the transactions' input bytes cost (16 gas a non-zero byte, 4 a zero byte): the rest of
    gasUsed, less 21,000 a transaction, is the contract's execution."""
    inputs = (bytes(w3.eth.get_transaction(HexBytes(r.ref))["input"]) for r in receipts)
    return sum(16 * (len(data) - data.count(0)) + 4 * data.count(0) for data in inputs)


def bench_evm(work: Workload, profile: bool) -> dict[str, float | int | str | None]:
    binary = T.find_anvil()
    if binary is None:
        return {"evm_note": "skipped: anvil not installed (run scripts/install_anvil.sh)"}
    parties = Parties.make(work.workers)
    with T.AnvilProcess(binary) as node:
        harness = T.EvmHarness.anvil(node.url, PARAMS)
        harness.fund(*parties.everyone())
        set_up(harness.ledger, parties)
        first, steady, single = run_phases(
            harness.ledger, parties, work, lambda name: f"EVM, {name}" if profile else None
        )
        check_credited(harness.ledger, first, steady, single)
        first_gas = gas_used(harness.w3, first.receipts)
        steady_gas = gas_used(harness.w3, steady.receipts)
        single_gas = gas_used(harness.w3, single.receipts)
        steady_calldata = calldata_gas(harness.w3, steady.receipts)
        steady_execution = steady_gas - steady_calldata - 21_000 * len(steady.receipts)
        if profile:
            print(opcode_gas(harness.w3, steady.receipts[-1], steady.credits // len(steady.receipts)))
        harness.close()
    return {
        "credits_per_s_batched": steady.per_s,
        "credits_per_s_first_batch": first.per_s,
        "credits_per_s_single": single.per_s,
        "batched_vs_single_ratio": steady.per_s / single.per_s,
        "gas_per_credit_batched": steady_gas / steady.credits,
        "gas_per_credit_first_batch": first_gas / first.credits,
        "gas_per_credit_single": single_gas / single.credits,
        "gas_per_batch": steady_gas / len(steady.receipts),
        "calldata_gas_per_credit_batched": steady_calldata / steady.credits,
        "execution_gas_per_credit_batched": steady_execution / steady.credits,
        "single_vs_batched_gas_ratio": (single_gas / single.credits) / (steady_gas / steady.credits),
    }


def opcode_gas(w3: Web3, receipt: Receipt, credits: int) -> str:
    """Where one batch's execution gas goes, by opcode (anvil's debug_traceTransaction struct logs)."""
    trace = w3.provider.make_request(
        "debug_traceTransaction",  # type: ignore[arg-type]
        ["0x" + receipt.ref.hex(), {"disableStack": True, "disableMemory": True, "disableStorage": True}],
    )
    steps = trace.get("result", {}).get("structLogs") or []
    if not steps:
        return "(no opcode breakdown: anvil keeps struct logs only when started with --steps-tracing)"
    by_op: dict[str, list[int]] = {}
    for step in steps:
        count_gas = by_op.setdefault(step["op"], [0, 0])
        count_gas[0] += 1
        count_gas[1] += int(step["gasCost"])
    top = sorted(by_op.items(), key=lambda item: -item[1][1])[:PROFILE_TOP]
    lines = [f"--- execution gas of one batch by opcode (top {PROFILE_TOP}; per credit of {credits}) ---"]
    lines += [f"{op:>14} x{count:>7}  {gas:>9} gas  {gas / credits:8.1f}/credit" for op, (count, gas) in top]
    return "\n".join(lines)


def goal_lines(result: dict[str, object]) -> list[str]:
    """Each of the issue's goals, measured figure against target; a goal with no figure says so."""
    lines = []
    for label, key, sense, target in GOALS:
        value = result.get(key)
        if not isinstance(value, float | int):
            lines.append(f"goal {label} {sense} {target}: not measured")
            continue
        met = value >= target if sense == ">=" else value <= target
        lines.append(f"goal {label} {sense} {target}: {value:.1f} ({'met' if met else 'MISSED'})")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a short run (CI): 2 steady batches, 64 singles")
    parser.add_argument("--profile", action="store_true", help="cProfile top entries of each timed phase")
    parser.add_argument("--workers", type=int, default=MAX_CREDITS_PER_BATCH // 16, help="workers per batch")
    parser.add_argument("--batches", type=int, default=None, help="steady-state batches after the first")
    parser.add_argument("--singles", type=int, default=None, help="credits sent one per commit (baseline)")
    parser.add_argument("--no-evm", action="store_true", help="the signed log only")
    args = parser.parse_args()
    work = Workload(
        workers=args.workers,
        batches=args.batches if args.batches is not None else (2 if args.quick else 16),
        singles=args.singles if args.singles is not None else (64 if args.quick else 512),
    )
    if not 1 <= work.per_batch <= MAX_CREDITS_PER_BATCH:
        parser.error(f"--workers gives {work.per_batch} credits per batch, not 1..{MAX_CREDITS_PER_BATCH}")
    if work.batches < 1 or work.singles < 1:
        parser.error("--batches and --singles must be at least 1")
    print(f"workload: {work.describe()}")

    result: dict[str, object] = {
        "workers": work.workers,
        "credits_per_worker_per_batch": work.per_worker,
        "credits_per_batch": work.per_batch,
        "steady_batches": work.batches,
        "single_credits": work.singles,
    }
    with tempfile.TemporaryDirectory(prefix="bench-ledger-") as tmp:
        result.update(bench_signed_log(Path(tmp), work, args.profile))
    print(
        f"signed log: {result['signed_log_credits_per_s_batched']:.0f} credits/s batched "
        f"(first batch {result['signed_log_credits_per_s_first_batch']:.0f}), "
        f"{result['signed_log_credits_per_s_single']:.0f} credits/s one per entry; "
        f"replay with signature checks {result['signed_log_verify_credits_per_s']:.0f} credits/s"
    )
    if args.no_evm:
        result["evm_note"] = "skipped: --no-evm"
    else:
        result.update(bench_evm(work, args.profile))
    if "credits_per_s_batched" in result:
        print(
            f"EVM on anvil: {result['credits_per_s_batched']:.0f} credits/s batched "
            f"(first batch {result['credits_per_s_first_batch']:.0f}), "
            f"{result['credits_per_s_single']:.1f} credits/s one per transaction; gas per credit "
            f"{result['gas_per_credit_batched']:.0f} batched (first batch "
            f"{result['gas_per_credit_first_batch']:.0f}), {result['gas_per_credit_single']:.0f} single; "
            f"batched: {result['calldata_gas_per_credit_batched']:.0f} calldata + "
            f"{result['execution_gas_per_credit_batched']:.0f} execution per credit"
        )
    else:
        print(f"EVM: {result['evm_note']}")
    for line in goal_lines(result):
        print(line)
    print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in result.items()}))


if __name__ == "__main__":
    main()
