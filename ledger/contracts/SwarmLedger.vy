# pragma version 0.4.3
# pragma evm-version cancun
# pragma optimize gas
"""
@title SwarmLedger
@notice The swarmnode ledger state machine on an EVM chain (spec/ledger.md is normative).
        Stake is the chain's native currency, accounted in gwei (deposits must be whole gwei).
        Every check runs in the same order as ledger/state.py, and reverts with the same short
        code the Python client maps to the same typed error.
@dev    Trust: contributions and slashes are authorised by msg.sender being a registered, unejected,
        fully staked validator; the contract stores the digests of the verdict and of the slashed
        submission (evidence is verified off chain by ledger/evidence.py; spec/ledger.md, Trust).
"""

ROLE_TRAINER: constant(uint8) = 1
ROLE_RELAY: constant(uint8) = 2
ROLE_WORKER: constant(uint8) = 3
ROLE_VALIDATOR: constant(uint8) = 4
WEI_PER_GWEI: constant(uint256) = 10 ** 9
MAX_CHUNKS: constant(uint256) = 64
PAGE: constant(uint256) = 32
BAD_PROOF: constant(uint16) = 605
MALFORMED_ROLLOUT: constant(uint16) = 609

struct Node:
    addr: address
    role: uint8
    accelerator: String[32]
    count: uint32
    memory_gb: uint32
    benchmark_gflops: uint64
    peer_id: String[128]
    registered_epoch: uint64
    ejected: bool
    slash_count: uint32
    bonded: uint256
    unbonding: uint256
    release_epoch: uint64

struct Contribution:
    run: String[64]
    step: uint64
    worker: address
    validator: address
    tokens: uint64
    flops: uint64
    rollout_digest: bytes32
    verdict_digest: bytes32
    epoch: uint64

struct SlashRecord:
    run: String[64]
    worker: address
    validator: address
    requested: uint256
    taken: uint256
    submission_digest: bytes32
    failing_chunks: DynArray[uint32, MAX_CHUNKS]
    reason_code: uint16
    epoch: uint64
    ejected: bool

event Registered:
    node: indexed(address)
    role: uint8

event Deposited:
    node: indexed(address)
    amount_gwei: uint256

event Unbonded:
    node: indexed(address)
    amount_gwei: uint256
    release_epoch: uint64

event Withdrawn:
    node: indexed(address)
    amount_gwei: uint256

event ContributionRecorded:
    index: uint256
    worker: indexed(address)
    validator: indexed(address)
    rollout_digest: bytes32

event Slashed:
    index: uint256
    worker: indexed(address)
    validator: indexed(address)
    taken_gwei: uint256
    ejected: bool

MIN_STAKE_PER_UNIT: public(immutable(uint256))
UNBONDING_DELAY: public(immutable(uint64))
SLASH_AMOUNT: public(immutable(uint256))
EJECTION_THRESHOLD: public(immutable(uint32))
EPOCH_SECONDS: public(immutable(uint256))
GENESIS_TIME: public(immutable(uint256))

nodes: HashMap[address, Node]
node_at: public(HashMap[uint256, address])
node_count: public(uint256)
contributions: HashMap[uint256, Contribution]
contribution_count: public(uint256)
contributed: public(HashMap[bytes32, bool])
# keccak256(abi_encode(run, worker, step)) of every credited assignment: one credit per assignment
assignments: public(HashMap[bytes32, bool])
slash_records: HashMap[uint256, SlashRecord]
slash_count: public(uint256)
slashed: public(HashMap[bytes32, bool])
burned_gwei: public(uint256)


@deploy
def __init__(min_stake_per_unit: uint256, unbonding_delay: uint64, slash_amount: uint256,
             ejection_threshold: uint32, epoch_seconds: uint256):
    assert epoch_seconds > 0 and slash_amount > 0 and ejection_threshold > 0, "malformed"
    MIN_STAKE_PER_UNIT = min_stake_per_unit
    UNBONDING_DELAY = unbonding_delay
    SLASH_AMOUNT = slash_amount
    EJECTION_THRESHOLD = ejection_threshold
    EPOCH_SECONDS = epoch_seconds
    GENESIS_TIME = block.timestamp


@view
@internal
def _epoch() -> uint64:
    return convert((block.timestamp - GENESIS_TIME) // EPOCH_SECONDS, uint64)


@view
@internal
def _required(addr: address) -> uint256:
    return MIN_STAKE_PER_UNIT * convert(self.nodes[addr].count, uint256)


@view
@internal
def _check_validator(addr: address):
    # Field by field, not a whole-struct copy: each storage slot read costs gas.
    role: uint8 = self.nodes[addr].role
    assert role != 0, "unknown_node"
    assert role == ROLE_VALIDATOR, "wrong_role"
    assert not self.nodes[addr].ejected, "ejected"
    assert self.nodes[addr].bonded >= self._required(addr), "insufficient_stake"


@view
@external
def current_epoch() -> uint64:
    return self._epoch()


@view
@external
def get_node(addr: address) -> Node:
    return self.nodes[addr]


@view
@external
def get_nodes(start: uint256, count: uint256) -> DynArray[Node, PAGE]:
    out: DynArray[Node, PAGE] = []
    for i: uint256 in range(PAGE):
        if i >= count or start + i >= self.node_count:
            break
        out.append(self.nodes[self.node_at[start + i]])
    return out


@view
@external
def get_contributions(start: uint256, count: uint256) -> DynArray[Contribution, PAGE]:
    out: DynArray[Contribution, PAGE] = []
    for i: uint256 in range(PAGE):
        if i >= count or start + i >= self.contribution_count:
            break
        out.append(self.contributions[start + i])
    return out


@view
@external
def get_slashes(start: uint256, count: uint256) -> DynArray[SlashRecord, PAGE]:
    out: DynArray[SlashRecord, PAGE] = []
    for i: uint256 in range(PAGE):
        if i >= count or start + i >= self.slash_count:
            break
        out.append(self.slash_records[start + i])
    return out


@view
@external
def is_eligible(addr: address) -> bool:
    return self.nodes[addr].role != 0 and not self.nodes[addr].ejected \
        and self.nodes[addr].bonded >= self._required(addr)


@external
def register(role: uint8, accelerator: String[32], count: uint32, memory_gb: uint32,
             benchmark_gflops: uint64, peer_id: String[128]):
    assert role >= ROLE_TRAINER and role <= ROLE_VALIDATOR, "malformed"
    assert count >= 1 and memory_gb >= 1 and len(accelerator) >= 1, "malformed"
    if self.nodes[msg.sender].role != 0:
        assert not self.nodes[msg.sender].ejected, "ejected"
        raise "already_registered"
    self.nodes[msg.sender] = Node(
        addr=msg.sender, role=role, accelerator=accelerator, count=count, memory_gb=memory_gb,
        benchmark_gflops=benchmark_gflops, peer_id=peer_id, registered_epoch=self._epoch(),
        ejected=False, slash_count=0, bonded=0, unbonding=0, release_epoch=0)
    self.node_at[self.node_count] = msg.sender
    self.node_count += 1
    log Registered(node=msg.sender, role=role)


@payable
@external
def deposit():
    assert self.nodes[msg.sender].role != 0, "unknown_node"
    assert not self.nodes[msg.sender].ejected, "ejected"
    assert msg.value >= WEI_PER_GWEI and msg.value % WEI_PER_GWEI == 0, "invalid_amount"
    amount: uint256 = msg.value // WEI_PER_GWEI
    self.nodes[msg.sender].bonded += amount
    log Deposited(node=msg.sender, amount_gwei=amount)


@external
def unbond(amount_gwei: uint256):
    assert self.nodes[msg.sender].role != 0, "unknown_node"
    assert amount_gwei >= 1, "invalid_amount"
    bonded: uint256 = self.nodes[msg.sender].bonded
    assert amount_gwei <= bonded, "insufficient_stake"
    release: uint64 = self._epoch() + UNBONDING_DELAY
    self.nodes[msg.sender].bonded = bonded - amount_gwei
    self.nodes[msg.sender].unbonding += amount_gwei
    self.nodes[msg.sender].release_epoch = release
    log Unbonded(node=msg.sender, amount_gwei=amount_gwei, release_epoch=release)


@nonreentrant
@external
def withdraw():
    assert self.nodes[msg.sender].role != 0, "unknown_node"
    amount: uint256 = self.nodes[msg.sender].unbonding
    assert amount > 0, "nothing_to_withdraw"
    assert self._epoch() >= self.nodes[msg.sender].release_epoch, "still_unbonding"
    self.nodes[msg.sender].unbonding = 0
    self.nodes[msg.sender].release_epoch = 0
    log Withdrawn(node=msg.sender, amount_gwei=amount)
    raw_call(msg.sender, b"", value=amount * WEI_PER_GWEI)


@external
def record_contribution(run: String[64], step: uint64, worker: address, tokens: uint64, flops: uint64,
                        rollout_digest: bytes32, verdict_digest: bytes32):
    self._check_validator(msg.sender)
    role: uint8 = self.nodes[worker].role
    assert role != 0, "unknown_node"
    assert role == ROLE_WORKER, "wrong_role"
    assert not self.nodes[worker].ejected, "ejected"
    assert self.nodes[worker].bonded >= self._required(worker), "insufficient_stake"
    assert not self.contributed[rollout_digest], "duplicate_contribution"
    assignment: bytes32 = keccak256(abi_encode(run, worker, step))
    assert not self.assignments[assignment], "duplicate_assignment"
    index: uint256 = self.contribution_count
    self.contributions[index] = Contribution(
        run=run, step=step, worker=worker, validator=msg.sender, tokens=tokens, flops=flops,
        rollout_digest=rollout_digest, verdict_digest=verdict_digest, epoch=self._epoch())
    self.contributed[rollout_digest] = True
    self.assignments[assignment] = True
    self.contribution_count = index + 1
    log ContributionRecorded(index=index, worker=worker, validator=msg.sender, rollout_digest=rollout_digest)


@external
def slash(run: String[64], worker: address, amount_gwei: uint256, submission_digest: bytes32,
          failing_chunks: DynArray[uint32, MAX_CHUNKS], reason_code: uint16):
    self._check_validator(msg.sender)
    assert self.nodes[worker].role != 0, "unknown_node"
    assert amount_gwei >= 1 and amount_gwei <= SLASH_AMOUNT, "invalid_amount"
    assert not self.slashed[submission_digest], "duplicate_slash"
    assert (reason_code >= 602 and reason_code <= 606) or reason_code == MALFORMED_ROLLOUT, "invalid_evidence"
    for i: uint256 in range(1, MAX_CHUNKS):
        if i >= len(failing_chunks):
            break
        assert failing_chunks[i] > failing_chunks[i - 1], "invalid_evidence"
    assert reason_code != BAD_PROOF or len(failing_chunks) > 0, "invalid_evidence"

    epoch: uint64 = self._epoch()
    bonded: uint256 = self.nodes[worker].bonded
    unbonding: uint256 = self.nodes[worker].unbonding
    was_ejected: bool = self.nodes[worker].ejected
    taken: uint256 = min(amount_gwei, bonded + unbonding)
    from_bonded: uint256 = min(taken, bonded)
    bonded -= from_bonded
    unbonding -= taken - from_bonded
    release: uint64 = self.nodes[worker].release_epoch
    count: uint32 = self.nodes[worker].slash_count + 1
    eject: bool = not was_ejected and count >= EJECTION_THRESHOLD
    if eject:
        unbonding += bonded
        bonded = 0
        release = epoch + UNBONDING_DELAY
    self.nodes[worker].bonded = bonded
    self.nodes[worker].unbonding = unbonding
    self.nodes[worker].release_epoch = release
    self.nodes[worker].slash_count = count
    self.nodes[worker].ejected = was_ejected or eject
    self.burned_gwei += taken

    index: uint256 = self.slash_count
    self.slash_records[index] = SlashRecord(
        run=run, worker=worker, validator=msg.sender, requested=amount_gwei, taken=taken,
        submission_digest=submission_digest, failing_chunks=failing_chunks, reason_code=reason_code,
        epoch=epoch, ejected=eject)
    self.slashed[submission_digest] = True
    self.slash_count = index + 1
    log Slashed(index=index, worker=worker, validator=msg.sender, taken_gwei=taken, ejected=eject)
