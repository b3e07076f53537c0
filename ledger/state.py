"""The ledger state machine (spec/ledger.md): pure functions over an explicit state.

Time is the epoch number passed in; no clock, no I/O. Each `process_*` function checks every rule first
and only then mutates, so a refused operation (a `LedgerError`) leaves the state exactly as it was. The
signed log replays these functions over its entries; the contract implements the same rules in the same
order, and the conformance suite holds the two to the same query results.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace

from swarmnode.crypto.identity import address_of_peer_id_text
from swarmnode.ledger.batches import batch_contributions, credit_leaf, credits_root
from swarmnode.ledger.errors import (
    AlreadyRegistered,
    AlreadyVoted,
    ChallengeWindowClosed,
    ChallengeWindowOpen,
    DuplicateContribution,
    DuplicateSlash,
    EpochRegression,
    ExceedsRunBounds,
    InsufficientStake,
    InvalidAmount,
    MalformedOperation,
    NodeEjected,
    NothingToWithdraw,
    NotRunOwner,
    NotRunValidator,
    PeerIdMismatch,
    RunExists,
    SlashNotPending,
    SlashPending,
    StillUnbonding,
    UnknownNode,
    UnknownRun,
    WrongRole,
)
from swarmnode.ledger.evidence import check_slash_evidence, check_slash_form, slash_digest
from swarmnode.ledger.types import (
    SLASH_FINAL,
    SLASH_PENDING,
    SLASH_VOIDED,
    BatchRecord,
    ContributionRecord,
    NodeInfo,
    Params,
    RunInfo,
    SlashRecord,
    Snapshot,
    StakeInfo,
    WorkerTotal,
)
from swarmnode.protocol.ledger_messages import (
    MAX_CHALLENGE_WINDOW_EPOCHS,
    MAX_VERSIONS_PER_EPOCH,
    CommitCredits,
    Credit,
    FinalizeSlash,
    RegisterNode,
    RegisterRun,
    SetRunValidators,
    Slash,
    StakeDeposit,
    StakeUnbond,
    StakeWithdraw,
    VoidSlash,
)
from swarmnode.protocol.runs import step_counter, step_version

Operation = (
    RegisterNode
    | StakeDeposit
    | StakeUnbond
    | StakeWithdraw
    | RegisterRun
    | SetRunValidators
    | CommitCredits
    | Slash
    | VoidSlash
    | FinalizeSlash
)
Assignment = tuple[str, bytes, int]  # (run, worker, step): what one credit pays for, once


@dataclass
class NodeState:
    info: NodeInfo
    bonded_gwei: int = 0
    unbonding_gwei: int = 0
    release_epoch: int = 0
    pending_slashes: int = 0  # pending slashes against it or made by it: no withdrawal meanwhile


@dataclass
class LedgerState:
    params: Params
    epoch: int = 0
    nodes: dict[bytes, NodeState] = field(default_factory=dict)  # insertion order = registration order
    runs: dict[str, RunInfo] = field(default_factory=dict)  # insertion order = registration order
    batches: list[BatchRecord] = field(default_factory=list)
    contributions: list[ContributionRecord] = field(default_factory=list)
    assignments: set[Assignment] = field(default_factory=set)  # (run, worker, step) already credited
    totals: dict[tuple[str, bytes], WorkerTotal] = field(default_factory=dict)  # first-credit order
    slashes: list[SlashRecord] = field(default_factory=list)
    slashed: set[bytes] = field(default_factory=set)  # submission signing digests already slashed
    voters: dict[int, set[bytes]] = field(default_factory=dict)  # pending slash index -> who voted

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


def get_run(state: LedgerState, run: str) -> RunInfo:
    info = state.runs.get(run)
    if info is None:
        raise UnknownRun(f"run {run!r} is not registered on the ledger; its owner registers it first")
    return info


def get_pending_slash(state: LedgerState, index: int) -> SlashRecord:
    if not 0 <= index < len(state.slashes):
        raise SlashNotPending(f"there is no slash {index} (the ledger holds {len(state.slashes)})")
    record = state.slashes[index]
    if record.status != SLASH_PENDING:
        raise SlashNotPending(f"slash {index} is already {record.status}")
    return record


def assignment_of(run: str, credit: Credit) -> Assignment:
    """The assignment a credit pays for. Credit is per assignment, never per envelope: a worker that
    seals one assignment twice (two digests) and sends each to another validator is paid once."""
    return (run, credit.worker, credit.step)


def describe_assignment(assignment: Assignment) -> str:
    run, worker, step = assignment
    version, counter = step_version(step), step_counter(step)
    return f"run {run!r}, worker {short(worker)}, step {step} (version {version}, counter {counter})"


def check_epoch(state: LedgerState, epoch: int) -> None:
    if epoch < state.epoch:
        raise EpochRegression(f"epoch {epoch} is before the ledger's current epoch {state.epoch}")


def check_active_validator(state: LedgerState, author: bytes) -> NodeState:
    """Credits, slashes and void votes need a registered, unejected validator holding its full stake."""
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


def check_run_validator(state: LedgerState, run: RunInfo, author: bytes) -> None:
    """An active validator that the run's owner named (the run's set, not the whole swarm)."""
    check_active_validator(state, author)
    if author not in run.validators:
        raise NotRunValidator(
            f"{short(author)} is not one of run {run.run!r}'s {len(run.validators)} validators"
        )


def check_validator_set(validators: tuple[bytes, ...]) -> None:
    if not validators:
        raise MalformedOperation("a run needs at least one validator")
    if any(b <= a for a, b in zip(validators, validators[1:], strict=False)):
        raise MalformedOperation("a run's validators must be strictly ascending addresses")


def take_stake(node: NodeState, amount: int, params: Params, epoch: int) -> tuple[int, bool]:
    """Take up to `amount` (bonded first, then unbonding), count one slash, eject at the threshold.
    Returns (taken, ejected now)."""
    taken = min(amount, node.bonded_gwei + node.unbonding_gwei)
    from_bonded = min(taken, node.bonded_gwei)
    node.bonded_gwei -= from_bonded
    node.unbonding_gwei -= taken - from_bonded
    count = node.info.slash_count + 1
    eject = not node.info.ejected and count >= params.ejection_threshold
    node.info = replace(node.info, slash_count=count, ejected=node.info.ejected or eject)
    if eject:  # the rest starts unbonding: still slashable for the delay
        node.unbonding_gwei += node.bonded_gwei
        node.bonded_gwei = 0
        node.release_epoch = epoch + params.unbonding_delay_epochs
    return taken, eject


# --- nodes and stake -------------------------------------------------------------------------------


def process_register(state: LedgerState, author: bytes, op: RegisterNode, epoch: int) -> None:
    check_epoch(state, epoch)
    existing = state.nodes.get(author)
    if existing is not None and existing.info.ejected:
        raise NodeEjected(f"{short(author)} was ejected and cannot register again")
    if existing is not None:
        raise AlreadyRegistered(f"{short(author)} is already registered as a {existing.info.role}")
    if address_of_peer_id_text(op.peer_id) != author:
        raise PeerIdMismatch(
            f"peer id {op.peer_id[:64]!r} is not derived from the key of {short(author)}; a node registers "
            "its own peer id"
        )
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
    if node.pending_slashes:
        raise SlashPending(
            f"{short(author)} is party to {node.pending_slashes} slash(es) still in their challenge window"
        )
    amount = node.unbonding_gwei
    node.unbonding_gwei = 0
    node.release_epoch = 0
    state.epoch = epoch
    return amount


# --- runs ------------------------------------------------------------------------------------------


def runs_held(state: LedgerState, owner: bytes) -> int:
    """The run ids `owner` holds (a lapsed id it lost to another owner is no longer its)."""
    return sum(1 for run in state.runs.values() if run.owner == owner)


def run_has_records(state: LedgerState, run: str) -> bool:
    """Whether anything was recorded in the run: a credit batch or a slash (records keep their run id)."""
    return any(b.run == run for b in state.batches) or any(s.run == run for s in state.slashes)


def is_lapsed(state: LedgerState, run: RunInfo) -> bool:
    """A run id its owner no longer holds (ledger.md §4.5): nothing was ever recorded in the run, and no
    stake stands behind it: the owner's bonded stake is below one minimum stake per run it holds and
    none of it is unbonding (what it unbonded has left, at least the unbonding delay later)."""
    owner = state.nodes[run.owner]
    backing = required_stake(state.params, owner) * runs_held(state, run.owner)
    return not run_has_records(state, run.run) and owner.unbonding_gwei == 0 and owner.bonded_gwei < backing


def process_register_run(state: LedgerState, author: bytes, op: RegisterRun, epoch: int) -> None:
    """The author, a registered trainer, becomes the run's owner (first come: a follower accepts the run
    only if its owner is the trainer that signed the RunDescriptor). Each run id an owner holds costs one
    minimum stake bonded, and an id whose owner's stake has gone lapses if nothing was recorded in it."""
    check_epoch(state, epoch)
    owner = get_node(state, author, "run owner")
    if owner.info.role != "trainer":
        raise WrongRole(f"{short(author)} is registered as a {owner.info.role}; a run's owner is a trainer")
    if owner.info.ejected:
        raise NodeEjected(f"trainer {short(author)} was ejected")
    existing = state.runs.get(op.run)
    if existing is not None and not is_lapsed(state, existing):
        raise RunExists(f"run {op.run!r} is already registered (owner {short(existing.owner)})")
    held = runs_held(state, author) - (existing is not None and existing.owner == author)  # its own lapsed id
    required = required_stake(state.params, owner) * (held + 1)
    if owner.bonded_gwei < required:  # run ids are first come: each costs a minimum stake bonded
        raise InsufficientStake(
            f"trainer {short(author)} has {owner.bonded_gwei} gwei bonded, needs {required} to hold "
            f"{held + 1} run(s): one minimum stake per run"
        )
    check_validator_set(op.validators)
    if op.challenge_window_epochs > MAX_CHALLENGE_WINDOW_EPOCHS:  # a window is how long a slash freezes stake
        raise MalformedOperation(
            f"a challenge window of {op.challenge_window_epochs} epochs is above the protocol's "
            f"{MAX_CHALLENGE_WINDOW_EPOCHS} (MAX_CHALLENGE_WINDOW_EPOCHS)"
        )
    state.runs[op.run] = RunInfo(
        run=op.run,
        owner=author,
        validators=op.validators,
        challenge_window_epochs=op.challenge_window_epochs,
        max_tokens_per_credit=op.max_tokens_per_credit,
        max_flops_per_token=op.max_flops_per_token,
        registered_epoch=epoch,
        max_submissions_per_version=op.max_submissions_per_version,
    )
    state.epoch = epoch


def check_owner_not_ejected(state: LedgerState, run: RunInfo) -> None:
    """An ejected owner keeps its run's records but loses its powers over the run."""
    if state.nodes[run.owner].info.ejected:
        raise NodeEjected(f"run {run.run!r}'s owner {short(run.owner)} was ejected")


def process_set_validators(state: LedgerState, author: bytes, op: SetRunValidators, epoch: int) -> None:
    check_epoch(state, epoch)
    run = get_run(state, op.run)
    if author != run.owner:
        raise NotRunOwner(f"only run {op.run!r}'s owner {short(run.owner)} may change its validators")
    check_owner_not_ejected(state, run)
    check_validator_set(op.validators)
    state.runs[op.run] = replace(run, validators=op.validators)
    state.epoch = epoch


# --- credits ---------------------------------------------------------------------------------------


def check_credit(state: LedgerState, run: RunInfo, credit: Credit, epoch: int) -> None:
    """One credit of a batch: an eligible worker, within the run's bounds (tokens, flops, an assignment
    that can exist: a counter below the run's per-version bound, a version the run's age allows), its
    assignment not yet paid."""
    worker = get_node(state, credit.worker, "worker")
    if worker.info.role != "worker":
        raise WrongRole(f"{short(credit.worker)} is registered as a {worker.info.role}, not a worker")
    if worker.info.ejected:
        raise NodeEjected(f"worker {short(credit.worker)} was ejected")
    required = required_stake(state.params, worker)
    if worker.bonded_gwei < required:
        raise InsufficientStake(
            f"worker {short(credit.worker)} has {worker.bonded_gwei} gwei bonded, needs {required}"
        )
    if credit.tokens > run.max_tokens_per_credit:
        raise ExceedsRunBounds(
            f"a credit of {credit.tokens} tokens is above run {run.run!r}'s {run.max_tokens_per_credit}"
        )
    if credit.flops > credit.tokens * run.max_flops_per_token:
        raise ExceedsRunBounds(
            f"{credit.flops} flops for {credit.tokens} tokens is above run {run.run!r}'s "
            f"{run.max_flops_per_token} flops per token"
        )
    version, counter = step_version(credit.step), step_counter(credit.step)
    if counter >= run.max_submissions_per_version:
        raise ExceedsRunBounds(
            f"assignment counter {counter} is not below run {run.run!r}'s {run.max_submissions_per_version} "
            "submissions per version"
        )
    newest = max_credit_version(run, epoch)
    if version > newest:
        raise ExceedsRunBounds(
            f"version {version} cannot exist yet in run {run.run!r}: at most {newest} at epoch {epoch} "
            f"(MAX_VERSIONS_PER_EPOCH per epoch since epoch {run.registered_epoch})"
        )
    assignment = assignment_of(run.run, credit)
    if assignment in state.assignments:
        raise DuplicateContribution(f"assignment ({describe_assignment(assignment)}) was already credited")


def max_credit_version(run: RunInfo, epoch: int) -> int:
    """The newest checkpoint version a credit of `run` may name at `epoch` (spec/ledger.md §4.7)."""
    return (epoch - run.registered_epoch + 1) * MAX_VERSIONS_PER_EPOCH


def check_commit(state: LedgerState, author: bytes, op: CommitCredits, epoch: int) -> RunInfo:
    """Every rule of a batch, in the contract's order; the first failing credit names the error."""
    check_epoch(state, epoch)
    run = get_run(state, op.run)
    check_run_validator(state, run, author)
    if not op.credits:
        raise MalformedOperation("a batch credits at least one submission")
    keys = [(c.worker, c.step) for c in op.credits]
    if any(b <= a for a, b in zip(keys, keys[1:], strict=False)):
        raise MalformedOperation("a batch's credits must be strictly ascending by (worker, step)")
    for credit in op.credits:
        check_credit(state, run, credit, epoch)
    return run


def process_commit(state: LedgerState, author: bytes, op: CommitCredits, epoch: int) -> BatchRecord:
    check_commit(state, author, op, epoch)
    batch = BatchRecord(
        index=len(state.batches),
        run=op.run,
        validator=author,
        root=credits_root([credit_leaf(c) for c in op.credits]),
        count=len(op.credits),
        first_contribution=len(state.contributions),
        epoch=epoch,
    )
    state.batches.append(batch)
    records = batch_contributions(batch, op.credits)
    state.contributions.extend(records)
    for credit, record in zip(op.credits, records, strict=True):
        state.assignments.add(assignment_of(op.run, credit))
        add_to_totals(state.totals, record)
    state.epoch = epoch
    return batch


# --- slashes ---------------------------------------------------------------------------------------


def check_slash(state: LedgerState, author: bytes, op: Slash, epoch: int) -> tuple[RunInfo, bytes]:
    """Every rule the contract enforces, in its order; returns the run and the cited signing digest.
    The signature itself (and what only the full submission shows) is `check_slash_evidence`."""
    check_epoch(state, epoch)
    run = get_run(state, op.run)
    check_run_validator(state, run, author)
    get_node(state, op.worker, "worker")
    if not 1 <= op.amount_gwei <= state.params.slash_gwei:
        raise InvalidAmount(f"a slash takes 1..{state.params.slash_gwei} gwei, not {op.amount_gwei}")
    check_slash_form(op)
    digest = slash_digest(op)
    if digest in state.slashed:
        raise DuplicateSlash(f"submission {digest.hex()} was already slashed")
    return run, digest


def process_slash(
    state: LedgerState, author: bytes, op: Slash, epoch: int, *, verify_evidence: bool = True
) -> SlashRecord:
    """File a slash: nothing is taken yet; it waits out the run's challenge window (FinalizeSlash)."""
    run, digest = check_slash(state, author, op, epoch)
    if verify_evidence:
        check_slash_evidence(op)
    record = SlashRecord(
        index=len(state.slashes),
        run=op.run,
        worker=op.worker,
        validator=author,
        requested_gwei=op.amount_gwei,
        taken_gwei=0,
        submission_digest=digest,
        failing_chunks=op.failing_chunks,
        reason_code=op.reason_code,
        epoch=epoch,
        final_epoch=epoch + run.challenge_window_epochs,
        status=SLASH_PENDING,
        votes=0,
        penalty_gwei=0,
        ejected=False,
    )
    state.slashes.append(record)
    state.slashed.add(digest)
    state.nodes[op.worker].pending_slashes += 1
    state.nodes[author].pending_slashes += 1
    state.epoch = epoch
    return record


def void_quorum(run: RunInfo, slasher: bytes) -> int:
    """A majority of the run's validators other than the one who slashed."""
    others = sum(1 for v in run.validators if v != slasher)
    return others // 2 + 1


def check_void(state: LedgerState, author: bytes, op: VoidSlash, epoch: int) -> tuple[SlashRecord, bool]:
    """Returns the slash and whether the author's act voids it (owner, or the vote that reaches quorum)."""
    check_epoch(state, epoch)
    record = get_pending_slash(state, op.slash_index)
    if epoch >= record.final_epoch:
        raise ChallengeWindowClosed(
            f"slash {record.index}'s challenge window ended at epoch {record.final_epoch}; now {epoch}"
        )
    run = get_run(state, record.run)
    if author == run.owner:
        check_owner_not_ejected(state, run)
        return record, True
    check_run_validator(state, run, author)
    if author == record.validator:
        raise NotRunValidator(f"{short(author)} made slash {record.index}; only the others vote on it")
    if author in state.voters.get(record.index, set()):
        raise AlreadyVoted(f"{short(author)} already voted to void slash {record.index}")
    return record, record.votes + 1 >= void_quorum(run, record.validator)


def process_void(state: LedgerState, author: bytes, op: VoidSlash, epoch: int) -> SlashRecord:
    """A vote, or the void: the worker keeps its stake. A quorum's void makes the validator who slashed pay
    what it asked; the owner's void costs no one (an owner risks no stake on a slash, so it may take none)."""
    record, voids = check_void(state, author, op, epoch)
    run = state.runs[record.run]
    by_owner = author == run.owner
    votes = record.votes if by_owner else record.votes + 1
    if not voids:
        state.voters.setdefault(record.index, set()).add(author)
        updated = replace(record, votes=votes)
    else:
        slasher = state.nodes[record.validator]
        penalty, ejected = (0, False) if by_owner else take_stake(
            slasher, record.requested_gwei, state.params, epoch
        )
        state.nodes[record.worker].pending_slashes -= 1
        slasher.pending_slashes -= 1
        state.voters.pop(record.index, None)
        updated = replace(record, votes=votes, status=SLASH_VOIDED, penalty_gwei=penalty, ejected=ejected)
    state.slashes[record.index] = updated
    state.epoch = epoch
    return updated


def check_finalize(state: LedgerState, op: FinalizeSlash, epoch: int) -> SlashRecord:
    check_epoch(state, epoch)
    record = get_pending_slash(state, op.slash_index)
    if epoch < record.final_epoch:
        raise ChallengeWindowOpen(
            f"slash {record.index} may be voided until epoch {record.final_epoch}; now {epoch}"
        )
    return record


def process_finalize(state: LedgerState, author: bytes, op: FinalizeSlash, epoch: int) -> SlashRecord:
    """Anyone may finalize: the stake is taken (burned) and the worker ejected at the threshold."""
    record = check_finalize(state, op, epoch)
    worker = state.nodes[record.worker]
    taken, ejected = take_stake(worker, record.requested_gwei, state.params, epoch)
    worker.pending_slashes -= 1
    state.nodes[record.validator].pending_slashes -= 1
    state.voters.pop(record.index, None)
    updated = replace(record, status=SLASH_FINAL, taken_gwei=taken, ejected=ejected)
    state.slashes[record.index] = updated
    state.epoch = epoch
    return updated


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
    if isinstance(op, RegisterRun):
        process_register_run(state, author, op, epoch)
        return None
    if isinstance(op, SetRunValidators):
        process_set_validators(state, author, op, epoch)
        return None
    if isinstance(op, CommitCredits):
        return process_commit(state, author, op, epoch)
    if isinstance(op, Slash):
        return process_slash(state, author, op, epoch, verify_evidence=verify_evidence)
    if isinstance(op, VoidSlash):
        return process_void(state, author, op, epoch)
    if isinstance(op, FinalizeSlash):
        return process_finalize(state, author, op, epoch)
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


def worker_totals(records: list[ContributionRecord], run: str | None = None) -> list[WorkerTotal]:
    """Per (run, worker) sums of credited contributions, in order of each pair's first credit."""
    totals: dict[tuple[str, bytes], WorkerTotal] = {}
    for r in records:
        if run is None or r.run == run:
            add_to_totals(totals, r)
    return list(totals.values())


def add_to_totals(totals: dict[tuple[str, bytes], WorkerTotal], record: ContributionRecord) -> None:
    """Count one credited contribution in its (run, worker) total (created at the pair's first credit)."""
    key = (record.run, record.worker)
    t = totals.get(key, WorkerTotal(record.run, record.worker, 0, 0, 0))
    totals[key] = replace(
        t, credits=t.credits + 1, tokens=t.tokens + record.tokens, flops=t.flops + record.flops
    )


def snapshot(state: LedgerState, epoch: int) -> Snapshot:
    return Snapshot(
        epoch=epoch,
        nodes=tuple(query_nodes(state)),
        stakes=tuple(query_stakes(state)),
        runs=tuple(state.runs.values()),
        batches=tuple(state.batches),
        contributions=tuple(state.contributions),
        totals=tuple(state.totals.values()),
        slashes=tuple(state.slashes),
    )
