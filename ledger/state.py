"""The ledger state machine (spec/ledger.md): pure functions over an explicit state.

Time is the epoch number passed in; no clock, no I/O. Each `process_*` function checks every rule first
and only then mutates, so a refused operation (a `LedgerError`) leaves the state exactly as it was. The
signed log replays these functions over its entries; the contract implements the same rules in the same
order, and the conformance suite holds the two to the same query results.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace

from crypto.hashing import sha256
from ledger.errors import (
    AlreadyRegistered,
    DuplicateContribution,
    DuplicateSlash,
    EpochRegression,
    InsufficientStake,
    InvalidAmount,
    NodeEjected,
    NothingToWithdraw,
    StillUnbonding,
    UnknownNode,
    WrongRole,
)
from ledger.evidence import check_slash_evidence, check_slash_form, check_verdict
from ledger.types import ContributionRecord, NodeInfo, Params, SlashRecord, Snapshot, StakeInfo
from protocol.ledger_messages import (
    RecordContribution,
    RegisterNode,
    Slash,
    StakeDeposit,
    StakeUnbond,
    StakeWithdraw,
)
from protocol.runs import step_counter, step_version

Operation = RegisterNode | StakeDeposit | StakeUnbond | StakeWithdraw | RecordContribution | Slash
Assignment = tuple[str, bytes, int]  # (run, worker, step): what one credit pays for, once


@dataclass
class NodeState:
    info: NodeInfo
    bonded_gwei: int = 0
    unbonding_gwei: int = 0
    release_epoch: int = 0


@dataclass
class LedgerState:
    params: Params
    epoch: int = 0
    nodes: dict[bytes, NodeState] = field(default_factory=dict)  # insertion order = registration order
    contributions: list[ContributionRecord] = field(default_factory=list)
    contributed: set[bytes] = field(default_factory=set)  # rollout digests already credited
    assignments: set[Assignment] = field(default_factory=set)  # (run, worker, step) already credited
    slashes: list[SlashRecord] = field(default_factory=list)
    slashed: set[bytes] = field(default_factory=set)  # submission digests already slashed

    def copy(self) -> LedgerState:
        return copy.deepcopy(self)


def short(address: bytes) -> str:
    return "0x" + address.hex()


# --- predicates and accessors ---------------------------------------------------------------------


def required_stake(params: Params, node: NodeState) -> int:
    """Minimum bonded stake: the per-unit minimum times the declared compute units."""
    return params.min_stake_per_unit_gwei * node.info.compute.count


def is_eligible(params: Params, node: NodeState) -> bool:
    """A node gets work (and may vouch, if a validator) only while registered, not ejected, fully bonded."""
    return not node.info.ejected and node.bonded_gwei >= required_stake(params, node)


def get_node(state: LedgerState, address: bytes, who: str = "node") -> NodeState:
    node = state.nodes.get(address)
    if node is None:
        raise UnknownNode(f"{who} {short(address)} is not registered")
    return node


def assignment_of(op: RecordContribution) -> Assignment:
    """The assignment a contribution pays for. Credit is per assignment, never per envelope: a worker
    that seals one assignment twice (two digests) and sends each to another validator is paid once."""
    return (op.run, op.worker, op.step)


def describe_assignment(assignment: Assignment) -> str:
    run, worker, step = assignment
    version, counter = step_version(step), step_counter(step)
    return f"run {run!r}, worker {short(worker)}, step {step} (version {version}, counter {counter})"


def check_epoch(state: LedgerState, epoch: int) -> None:
    if epoch < state.epoch:
        raise EpochRegression(f"epoch {epoch} is before the ledger's current epoch {state.epoch}")


def check_active_validator(state: LedgerState, author: bytes) -> NodeState:
    """Contributions and slashes need a registered, unejected validator holding its full stake."""
    node = get_node(state, author, "validator")
    if node.info.role != "validator":
        raise WrongRole(f"{short(author)} is registered as a {node.info.role}, not a validator")
    if node.info.ejected:
        raise NodeEjected(f"validator {short(author)} was ejected")
    required = required_stake(state.params, node)
    if node.bonded_gwei < required:
        raise InsufficientStake(
            f"validator {short(author)} has {node.bonded_gwei} gwei bonded, needs {required}"
        )
    return node


# --- operations ------------------------------------------------------------------------------------


def process_register(state: LedgerState, author: bytes, op: RegisterNode, epoch: int) -> None:
    check_epoch(state, epoch)
    existing = state.nodes.get(author)
    if existing is not None and existing.info.ejected:
        raise NodeEjected(f"{short(author)} was ejected and cannot register again")
    if existing is not None:
        raise AlreadyRegistered(f"{short(author)} is already registered as a {existing.info.role}")
    info = NodeInfo(author, op.role, op.compute, op.peer_id, epoch, ejected=False, slash_count=0)
    state.nodes[author] = NodeState(info)
    state.epoch = epoch


def process_deposit(state: LedgerState, author: bytes, op: StakeDeposit, epoch: int) -> None:
    check_epoch(state, epoch)
    node = get_node(state, author)
    if node.info.ejected:
        raise NodeEjected(f"{short(author)} was ejected; it cannot stake again")
    if op.amount_gwei < 1:
        raise InvalidAmount("a deposit must be at least 1 gwei")
    node.bonded_gwei += op.amount_gwei
    state.epoch = epoch


def process_unbond(state: LedgerState, author: bytes, op: StakeUnbond, epoch: int) -> None:
    """Move bonded stake into the (single) unbonding bucket; a new unbond restarts the delay for all of it."""
    check_epoch(state, epoch)
    node = get_node(state, author)
    if op.amount_gwei < 1:
        raise InvalidAmount("an unbond must be at least 1 gwei")
    if op.amount_gwei > node.bonded_gwei:
        raise InsufficientStake(f"cannot unbond {op.amount_gwei} gwei: only {node.bonded_gwei} gwei bonded")
    node.bonded_gwei -= op.amount_gwei
    node.unbonding_gwei += op.amount_gwei
    node.release_epoch = epoch + state.params.unbonding_delay_epochs
    state.epoch = epoch


def process_withdraw(state: LedgerState, author: bytes, op: StakeWithdraw, epoch: int) -> int:
    """Release the unbonded stake once no slash can still reach it; returns the amount released."""
    check_epoch(state, epoch)
    node = get_node(state, author)
    if node.unbonding_gwei == 0:
        raise NothingToWithdraw(f"{short(author)} has no unbonded stake; unbond first")
    if epoch < node.release_epoch:
        raise StillUnbonding(
            f"{node.unbonding_gwei} gwei stays slashable until epoch {node.release_epoch}; now {epoch}"
        )
    amount = node.unbonding_gwei
    node.unbonding_gwei = 0
    node.release_epoch = 0
    state.epoch = epoch
    return amount


def check_contribution(state: LedgerState, author: bytes, op: RecordContribution, epoch: int) -> None:
    """Every stateful rule of a contribution, in the contract's order; the verdict check comes last."""
    check_epoch(state, epoch)
    check_active_validator(state, author)
    worker = get_node(state, op.worker, "worker")
    if worker.info.role != "worker":
        raise WrongRole(f"{short(op.worker)} is registered as a {worker.info.role}, not a worker")
    if worker.info.ejected:
        raise NodeEjected(f"worker {short(op.worker)} was ejected")
    required = required_stake(state.params, worker)
    if worker.bonded_gwei < required:
        raise InsufficientStake(
            f"worker {short(op.worker)} has {worker.bonded_gwei} gwei bonded, needs {required}"
        )
    if op.rollout_digest in state.contributed:
        raise DuplicateContribution(f"submission {op.rollout_digest.hex()} was already credited")
    assignment = assignment_of(op)
    if assignment in state.assignments:
        raise DuplicateContribution(
            f"assignment ({describe_assignment(assignment)}) was already credited"
        )


def process_contribution(
    state: LedgerState, author: bytes, op: RecordContribution, epoch: int, *, verify_evidence: bool = True
) -> ContributionRecord:
    check_contribution(state, author, op, epoch)
    verdict_digest = check_verdict(op, author) if verify_evidence else sha256(op.verdict)
    return apply_contribution(state, author, op, verdict_digest, epoch)


def apply_contribution(
    state: LedgerState, author: bytes, op: RecordContribution, verdict_digest: bytes, epoch: int
) -> ContributionRecord:
    record = ContributionRecord(
        index=len(state.contributions),
        run=op.run,
        step=op.step,
        worker=op.worker,
        validator=author,
        tokens=op.tokens,
        flops=op.flops,
        rollout_digest=op.rollout_digest,
        verdict_digest=verdict_digest,
        epoch=epoch,
    )
    state.contributions.append(record)
    state.contributed.add(op.rollout_digest)
    state.assignments.add(assignment_of(op))
    state.epoch = epoch
    return record


def check_slash(state: LedgerState, author: bytes, op: Slash, epoch: int) -> None:
    """Every stateful and stateless rule of a slash the contract enforces, in its order."""
    check_epoch(state, epoch)
    check_active_validator(state, author)
    get_node(state, op.worker, "worker")
    if not 1 <= op.amount_gwei <= state.params.slash_gwei:
        raise InvalidAmount(f"a slash takes 1..{state.params.slash_gwei} gwei, not {op.amount_gwei}")
    if op.submission_digest in state.slashed:
        raise DuplicateSlash(f"submission {op.submission_digest.hex()} was already slashed")
    check_slash_form(op)


def process_slash(
    state: LedgerState, author: bytes, op: Slash, epoch: int, *, verify_evidence: bool = True
) -> SlashRecord:
    check_slash(state, author, op, epoch)
    if verify_evidence:
        check_slash_evidence(op)
    return apply_slash(state, author, op, epoch)


def apply_slash(state: LedgerState, author: bytes, op: Slash, epoch: int) -> SlashRecord:
    """Take from bonded stake first, then from unbonding stake; eject at the threshold."""
    node = state.nodes[op.worker]
    taken = min(op.amount_gwei, node.bonded_gwei + node.unbonding_gwei)
    from_bonded = min(taken, node.bonded_gwei)
    node.bonded_gwei -= from_bonded
    node.unbonding_gwei -= taken - from_bonded
    count = node.info.slash_count + 1
    eject = not node.info.ejected and count >= state.params.ejection_threshold
    node.info = replace(node.info, slash_count=count, ejected=node.info.ejected or eject)
    if eject:
        node.unbonding_gwei += node.bonded_gwei
        node.bonded_gwei = 0
        node.release_epoch = epoch + state.params.unbonding_delay_epochs
    record = SlashRecord(
        index=len(state.slashes),
        run=op.run,
        worker=op.worker,
        validator=author,
        requested_gwei=op.amount_gwei,
        taken_gwei=taken,
        submission_digest=op.submission_digest,
        failing_chunks=op.failing_chunks,
        reason_code=op.reason_code,
        epoch=epoch,
        ejected=eject,
    )
    state.slashes.append(record)
    state.slashed.add(op.submission_digest)
    state.epoch = epoch
    return record


def process_operation(
    state: LedgerState, author: bytes, op: Operation, epoch: int, *, verify_evidence: bool = True
) -> object:
    """Dispatch one authenticated operation; returns what the operation produced (record or amount)."""
    if isinstance(op, RegisterNode):
        process_register(state, author, op, epoch)
        return None
    if isinstance(op, StakeDeposit):
        process_deposit(state, author, op, epoch)
        return None
    if isinstance(op, StakeUnbond):
        process_unbond(state, author, op, epoch)
        return None
    if isinstance(op, StakeWithdraw):
        return process_withdraw(state, author, op, epoch)
    if isinstance(op, RecordContribution):
        return process_contribution(state, author, op, epoch, verify_evidence=verify_evidence)
    if isinstance(op, Slash):
        return process_slash(state, author, op, epoch, verify_evidence=verify_evidence)
    raise TypeError(f"not a ledger operation: {type(op).__name__}")


# --- queries ---------------------------------------------------------------------------------------


def stake_info(params: Params, node: NodeState) -> StakeInfo:
    return StakeInfo(
        address=node.info.address,
        bonded_gwei=node.bonded_gwei,
        unbonding_gwei=node.unbonding_gwei,
        release_epoch=node.release_epoch,
        required_gwei=required_stake(params, node),
        eligible=is_eligible(params, node),
    )


def query_nodes(state: LedgerState) -> list[NodeInfo]:
    return [n.info for n in state.nodes.values()]


def query_stakes(state: LedgerState) -> list[StakeInfo]:
    return [stake_info(state.params, n) for n in state.nodes.values()]


def filter_contributions(
    records: list[ContributionRecord], node: bytes | None = None, run: str | None = None
) -> list[ContributionRecord]:
    """`node` matches either side: the credited worker or the recording validator."""
    return [
        r
        for r in records
        if (node is None or node in (r.worker, r.validator)) and (run is None or r.run == run)
    ]


def filter_slashes(records: list[SlashRecord], node: bytes | None = None) -> list[SlashRecord]:
    return [r for r in records if node is None or node in (r.worker, r.validator)]


def snapshot(state: LedgerState, epoch: int) -> Snapshot:
    return Snapshot(
        epoch=epoch,
        nodes=tuple(query_nodes(state)),
        stakes=tuple(query_stakes(state)),
        contributions=tuple(state.contributions),
        slashes=tuple(state.slashes),
    )
