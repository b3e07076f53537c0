"""The audit of an EVM ledger's records (`swarmnode ledger verify --ledger evm:URL`).

The contract's storage says what it concluded (a batch's root and count, per-worker totals, a slash's digest,
its money counters); the transactions' calldata says what it was told. The audit re-derives every conclusion
from what it was told, off chain, and compares: the runtime code is the committed artifact's; every batch's
root and count come from its credits, which are ascending, within their run's bounds and each assignment's
only credit; the per-worker totals are the credits' sums; every slash's citation recomputes to its digest
and recovers to the slashed worker, with a slashable form and consistent status fields; every batch's and
slash's validator was in its run's set; and the money adds up (deposits - withdrawals = held + burned,
covered by the balance).

The checks are pure functions over fetched records, each returning the problems it found as sentences, so
tests can feed them tampered records; `audit_chain` fetches and runs them in that order and the report names
the first failure. What the chain keeps no record of is a note in the report, never passed off as checked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from swarmnode.crypto.identity import format_address
from swarmnode.crypto.signing import InvalidSignature, recover_address
from swarmnode.ledger.batches import credit_leaf, credits_root, run_key
from swarmnode.ledger.errors import InvalidEvidence, LedgerError
from swarmnode.ledger.evidence import SubmissionCitation, check_slash_form
from swarmnode.ledger.types import (
    SLASH_FINAL,
    SLASH_PENDING,
    SLASH_VOIDED,
    WEI_PER_GWEI,
    BatchRecord,
    Params,
    RunInfo,
    SlashRecord,
    StakeInfo,
    WorkerTotal,
)
from swarmnode.protocol.envelope import signing_digest_of_body_hash
from swarmnode.protocol.ledger_messages import Credit, Slash
from swarmnode.protocol.messages import RolloutSubmission

if TYPE_CHECKING:
    from swarmnode.ledger.evm import EvmLedger

VALIDATORS_EVENT = "RunValidatorsSet"  # (run_key indexed, validators, epoch): the set history, if emitted
SetHistory = Sequence[tuple[int, tuple[bytes, ...]]]  # (epoch it took effect, the set), oldest first


@dataclass(frozen=True)
class ChainReport:
    """What `audit_chain` checked, what it found wrong (in check order), and notes: what the chain cannot
    show and what is odd but harmless."""

    contract: str
    code_size: int
    runs: int
    batches: int
    credits: int
    slashes: int
    money: Mapping[str, int]
    failures: tuple[str, ...]
    notes: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def first_failure(self) -> str | None:
        return self.failures[0] if self.failures else None


def _a(address: bytes) -> str:
    return format_address(address)


# --- code ------------------------------------------------------------------------------------------


def check_code(code: bytes, expected_runtime: bytes) -> list[str]:
    """The deployed code starts with the committed runtime bytecode (immutables are appended after it)."""
    if not code:
        return ["there is no contract code at this address"]
    if code[: len(expected_runtime)] != expected_runtime:
        return [f"the deployed code ({len(code)} bytes) is not the committed SwarmLedger runtime bytecode"]
    return []


# --- batches and credits ---------------------------------------------------------------------------


def check_batch_sequence(batches: Sequence[BatchRecord]) -> list[str]:
    """Batches are numbered 0.. in order and their contributions follow one another without gaps."""
    problems, expected_first = [], 0
    for position, batch in enumerate(batches):
        if batch.index != position:
            problems.append(f"batch at position {position} claims index {batch.index}")
        if batch.first_contribution != expected_first:
            problems.append(
                f"batch {batch.index} starts at contribution {batch.first_contribution}, "
                f"expected {expected_first}"
            )
        expected_first = batch.first_contribution + batch.count
    return problems


def check_credit_bounds(run: RunInfo, credit: Credit) -> str | None:
    if not 1 <= credit.tokens <= run.max_tokens_per_credit:
        return f"{credit.tokens} tokens, outside run {run.run!r}'s 1..{run.max_tokens_per_credit}"
    if credit.flops > credit.tokens * run.max_flops_per_token:
        return (
            f"{credit.flops} flops for {credit.tokens} tokens, above run {run.run!r}'s "
            f"{run.max_flops_per_token} flops per token"
        )
    return None


def check_batch(batch: BatchRecord, credits: Sequence[Credit], run: RunInfo | None) -> list[str]:
    """A batch's stored root and count are those of its calldata credits, which its run allows."""
    where = f"batch {batch.index}"
    if run is None:
        return [f"{where} is in run {batch.run!r}, which is not registered"]
    if not credits:
        return [f"{where} has no credits in its transaction"]
    problems = []
    if len(credits) != batch.count:
        problems.append(f"{where} stores count {batch.count} but its transaction has {len(credits)} credits")
    keys = [(c.worker, c.step) for c in credits]
    if any(b <= a for a, b in zip(keys, keys[1:], strict=False)):
        problems.append(f"{where}'s credits are not strictly ascending by (worker, step)")
    root = credits_root([credit_leaf(c) for c in credits])
    if root != batch.root:
        problems.append(f"{where} stores root 0x{batch.root.hex()}, its credits give 0x{root.hex()}")
    for leaf, credit in enumerate(credits):
        bad = check_credit_bounds(run, credit)
        if bad is not None:
            problems.append(f"{where} leaf {leaf} (worker {_a(credit.worker)}, step {credit.step}): {bad}")
    return problems


def check_assignments(batches: Sequence[BatchRecord], credits: Mapping[int, Sequence[Credit]]) -> list[str]:
    """One credit per (run, worker, step) across every batch."""
    seen: dict[tuple[str, bytes, int], int] = {}
    problems = []
    for batch in batches:
        for credit in credits.get(batch.index, ()):
            key = (batch.run, credit.worker, credit.step)
            if key in seen:
                problems.append(
                    f"run {batch.run!r}, worker {_a(credit.worker)}, step {credit.step} is credited in batch "
                    f"{seen[key]} and again in batch {batch.index}"
                )
            else:
                seen[key] = batch.index
    return problems


def expected_totals(
    batches: Sequence[BatchRecord], credits: Mapping[int, Sequence[Credit]]
) -> dict[tuple[str, bytes], tuple[int, int, int]]:
    """(run, worker) -> (credits, tokens, flops) summed over the batches' calldata credits."""
    sums: dict[tuple[str, bytes], tuple[int, int, int]] = {}
    for batch in batches:
        for c in credits.get(batch.index, ()):
            n, tokens, flops = sums.get((batch.run, c.worker), (0, 0, 0))
            sums[(batch.run, c.worker)] = (n + 1, tokens + c.tokens, flops + c.flops)
    return sums


def check_totals(
    batches: Sequence[BatchRecord], credits: Mapping[int, Sequence[Credit]], totals: Sequence[WorkerTotal]
) -> list[str]:
    """The per-worker totals a reward split reads are the sums of the credited contributions."""
    expected = expected_totals(batches, credits)
    stored = {(t.run, t.worker): (t.credits, t.tokens, t.flops) for t in totals}
    problems = []
    for key in expected.keys() | stored.keys():
        want, have = expected.get(key, (0, 0, 0)), stored.get(key, (0, 0, 0))
        if want != have:
            run, worker = key
            problems.append(
                f"run {run!r} worker {_a(worker)}: stored totals (credits, tokens, flops) {have}, "
                f"its credits sum to {want}"
            )
    return sorted(problems)


# --- validator sets --------------------------------------------------------------------------------


def sets_in_force(history: SetHistory, epoch: int) -> frozenset[bytes]:
    """Every validator that was in the set at some moment of `epoch`: the set in force when it began and
    every set that took effect during it (records carry epochs, not blocks)."""
    members: set[bytes] = set()
    before = [validators for started, validators in history if started < epoch]
    if before:
        members.update(before[-1])
    for started, validators in history:
        if started == epoch:
            members.update(validators)
    return frozenset(members)


def check_membership(
    what: str, run: RunInfo, validator: bytes, epoch: int, history: SetHistory | None
) -> tuple[list[str], list[str]]:
    """(failures, notes): was `validator` in `run`'s set at `epoch`? Without a set history only the
    current set can be read, and a validator outside it may have been removed since: a note, not a pass."""
    if history is not None:
        if validator in sets_in_force(history, epoch):
            return [], []
        return [f"{what}: validator {_a(validator)} was not in run {run.run!r}'s set at epoch {epoch}"], []
    if validator in run.validators:
        return [], []
    return [], [
        f"{what}: validator {_a(validator)} is not in run {run.run!r}'s current set; the contract keeps no "
        f"set history ({VALIDATORS_EVENT} events), so whether it was at epoch {epoch} cannot be checked"
    ]


# --- slashes ---------------------------------------------------------------------------------------


def check_citation(record: SlashRecord, citation: SubmissionCitation) -> list[str]:
    """The citation recomputes to the recorded digest and its signature recovers to the slashed worker."""
    where = f"slash {record.index}"
    digest = signing_digest_of_body_hash(
        RolloutSubmission.TYPE, record.run, record.worker, citation.seq, citation.ts, citation.body_hash
    )
    problems = []
    if digest != citation.digest:
        problems.append(
            f"{where}'s citation names digest 0x{citation.digest.hex()}, it recomputes to 0x{digest.hex()}"
        )
    if digest != record.submission_digest:
        problems.append(
            f"{where} records digest 0x{record.submission_digest.hex()}, its citation gives 0x{digest.hex()}"
        )
    try:
        signer = recover_address(digest, citation.sig)
    except InvalidSignature as exc:
        return [*problems, f"{where}'s cited signature is invalid: {exc}"]
    if signer != record.worker:
        problems.append(
            f"{where}'s cited signature recovers to {_a(signer)}, not the slashed worker {_a(record.worker)}"
        )
    return problems


def check_slash_fields(record: SlashRecord, run: RunInfo | None, params: Params) -> list[str]:
    """A slashable form, an amount within the parameter, its window, and status fields that agree."""
    where = f"slash {record.index}"
    if run is None:
        return [f"{where} is in run {record.run!r}, which is not registered"]
    problems = []
    form = Slash(
        record.run, record.worker, record.requested_gwei, record.failing_chunks, record.reason_code, b""
    )
    try:
        check_slash_form(form)
    except InvalidEvidence as exc:
        problems.append(f"{where}: {exc.detail}")
    if not 1 <= record.requested_gwei <= params.slash_gwei:
        problems.append(f"{where} requests {record.requested_gwei} gwei, outside 1..{params.slash_gwei}")
    if record.final_epoch != record.epoch + run.challenge_window_epochs:
        problems.append(
            f"{where} is final at epoch {record.final_epoch}, not epoch {record.epoch} + run {run.run!r}'s "
            f"window of {run.challenge_window_epochs}"
        )
    taken_ok = record.taken_gwei == 0 or (
        record.status == SLASH_FINAL and record.taken_gwei <= record.requested_gwei
    )
    penalty_ok = record.penalty_gwei == 0 or (
        record.status == SLASH_VOIDED and record.penalty_gwei <= record.requested_gwei
    )
    if record.status not in (SLASH_PENDING, SLASH_FINAL, SLASH_VOIDED):
        problems.append(f"{where} has an unknown status {record.status!r}")
    elif not taken_ok or not penalty_ok or (record.status == SLASH_PENDING and record.ejected):
        problems.append(
            f"{where} is {record.status} with {record.taken_gwei} gwei taken, {record.penalty_gwei} gwei "
            f"penalty and ejected={record.ejected} (requested {record.requested_gwei})"
        )
    return problems


def check_unique_slashes(slashes: Sequence[SlashRecord]) -> list[str]:
    """A submission is slashed at most once."""
    first: dict[bytes, int] = {}
    problems = []
    for record in slashes:
        earlier = first.setdefault(record.submission_digest, record.index)
        if earlier != record.index:
            problems.append(
                f"slash {record.index} cites submission 0x{record.submission_digest.hex()}, "
                f"already slashed by slash {earlier}"
            )
    return problems


# --- money -----------------------------------------------------------------------------------------


def check_money(
    money: Mapping[str, int], stakes: Sequence[StakeInfo], slashes: Sequence[SlashRecord]
) -> tuple[list[str], list[str]]:
    """(failures, notes): deposited - withdrawn = held + burned; held is the nodes' stake; burned is what
    final slashes took plus what voided slashes cost; the balance covers deposited - withdrawn. A balance
    above it is a note: anyone can force ether into a contract (selfdestruct, block rewards)."""
    owed = money["deposited_gwei"] - money["withdrawn_gwei"]
    held = sum(s.bonded_gwei + s.unbonding_gwei for s in stakes)
    burned = sum(r.taken_gwei for r in slashes if r.status == SLASH_FINAL) + sum(
        r.penalty_gwei for r in slashes if r.status == SLASH_VOIDED
    )
    problems, notes = [], []
    if owed != money["held_gwei"] + money["burned_gwei"]:
        problems.append(
            f"deposited - withdrawn = {owed} gwei, but held + burned = "
            f"{money['held_gwei']} + {money['burned_gwei']} gwei"
        )
    if money["held_gwei"] != held:
        problems.append(
            f"the contract holds {money['held_gwei']} gwei of stake, its nodes' stakes sum to {held}"
        )
    if money["burned_gwei"] != burned:
        problems.append(
            f"the contract burned {money['burned_gwei']} gwei, its slash records account for {burned}"
        )
    balance, owed_wei = money["balance_wei"], owed * WEI_PER_GWEI
    if balance < owed_wei:
        problems.append(f"the balance {balance} wei is below deposited - withdrawn = {owed_wei} wei")
    elif balance > owed_wei:
        notes.append(f"the balance exceeds deposited - withdrawn by {balance - owed_wei} wei (forced in)")
    return problems, notes


# --- the audit -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChainRecords:
    """Everything the audit reads from a chain, fetched once; `audit_records` is pure over it."""

    params: Params
    runs: tuple[RunInfo, ...]
    history: Mapping[str, SetHistory] | None  # run -> its validator sets; None: the chain keeps none
    batches: tuple[BatchRecord, ...]
    credits: Mapping[int, tuple[Credit, ...]]  # batch index -> its transaction's credits
    totals: tuple[WorkerTotal, ...]
    slashes: tuple[SlashRecord, ...]
    citations: Mapping[int, SubmissionCitation]  # slash index -> its transaction's citation
    stakes: tuple[StakeInfo, ...]
    money: Mapping[str, int]
    unreadable: tuple[str, ...] = ()  # records whose transaction could not be read or decoded


def _membership(
    what: str, run: RunInfo, validator: bytes, epoch: int, records: ChainRecords
) -> tuple[list[str], list[str]]:
    history = None if records.history is None else records.history.get(run.run, ())
    return check_membership(what, run, validator, epoch, history)


def audit_records(records: ChainRecords) -> tuple[list[str], list[str]]:
    """(failures in check order, notes) over fetched records: batches, assignments, totals, slashes,
    money."""
    runs = {r.run: r for r in records.runs}
    failures: list[str] = list(records.unreadable)
    notes: list[str] = []
    failures += check_batch_sequence(records.batches)
    for batch in records.batches:
        if batch.index not in records.credits:
            continue  # named in `unreadable`
        failures += check_batch(batch, records.credits[batch.index], runs.get(batch.run))
        if batch.run in runs:
            bad, note = _membership(
                f"batch {batch.index}", runs[batch.run], batch.validator, batch.epoch, records
            )
            failures, notes = failures + bad, notes + note
    failures += check_assignments(records.batches, records.credits)
    failures += check_totals(records.batches, records.credits, records.totals)
    for slash in records.slashes:
        if slash.index in records.citations:
            failures += check_citation(slash, records.citations[slash.index])
        run = runs.get(slash.run)
        failures += check_slash_fields(slash, run, records.params)
        if run is not None:
            bad, note = _membership(f"slash {slash.index}", run, slash.validator, slash.epoch, records)
            failures, notes = failures + bad, notes + note
    failures += check_unique_slashes(records.slashes)
    bad, note = check_money(records.money, records.stakes, records.slashes)
    return failures + bad, notes + note


def expected_runtime() -> bytes:
    from swarmnode.ledger.artifact import load_artifact

    return bytes.fromhex(load_artifact()["bytecode_runtime"].removeprefix("0x"))


def validator_history(ledger: EvmLedger, runs: Sequence[RunInfo]) -> dict[str, SetHistory] | None:
    """Each run's validator sets from the contract's RunValidatorsSet events; None if it emits none."""
    if not any(e.get("type") == "event" and e.get("name") == VALIDATORS_EVENT for e in ledger.contract.abi):
        return None
    by_key = {run_key(r.run): r.run for r in runs}
    history: dict[str, list[tuple[int, tuple[bytes, ...]]]] = {r.run: [] for r in runs}
    event = getattr(ledger.contract.events, VALIDATORS_EVENT)()
    for log in event.get_logs(from_block=ledger.deploy_block):
        run = by_key.get(bytes(log["args"]["run_key"]))
        if run is not None:
            validators = tuple(bytes.fromhex(v[2:]) for v in log["args"]["validators"])
            history[run].append((int(log["args"]["epoch"]), validators))
    return dict(history)


def fetch_records(ledger: EvmLedger) -> ChainRecords:
    """Read the records and, from each batch's and slash's transaction, what the contract was told."""
    runs = tuple(ledger.runs())
    batches = tuple(ledger.batches())
    slashes = tuple(ledger.slashes())
    unreadable: list[str] = []
    credits: dict[int, tuple[Credit, ...]] = {}
    for batch in batches:
        try:
            credits[batch.index] = tuple(ledger.batch_credits(batch.index))
        except LedgerError as exc:
            unreadable.append(f"batch {batch.index}'s credits cannot be read from its transaction: {exc}")
    citations: dict[int, SubmissionCitation] = {}
    for slash in slashes:
        try:
            citations[slash.index] = ledger.slash_citation(slash.index)
        except LedgerError as exc:
            unreadable.append(f"slash {slash.index}'s citation cannot be read from its transaction: {exc}")
    return ChainRecords(
        params=ledger.params,
        runs=runs,
        history=validator_history(ledger, runs),
        batches=batches,
        credits=credits,
        totals=tuple(ledger.totals()),
        slashes=slashes,
        citations=citations,
        stakes=tuple(ledger.stakes()),
        money=dict(ledger.money()),
        unreadable=tuple(unreadable),
    )


def audit_chain(ledger: EvmLedger) -> ChainReport:
    """Check the code, then fetch the records and run every check; `ok` only when all pass."""
    code = bytes(ledger.w3.eth.get_code(ledger.address))
    failures = check_code(code, expected_runtime())
    if failures:  # another contract's views mean nothing: stop here
        return ChainReport(ledger.address, len(code), 0, 0, 0, 0, {}, tuple(failures), ())
    records = fetch_records(ledger)
    failures, notes = audit_records(records)
    return ChainReport(
        contract=ledger.address,
        code_size=len(code),
        runs=len(records.runs),
        batches=len(records.batches),
        credits=sum(len(c) for c in records.credits.values()),
        slashes=len(records.slashes),
        money=dict(records.money),
        failures=tuple(failures),
        notes=tuple(notes),
    )
