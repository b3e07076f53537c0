# pragma version 0.4.3
# pragma evm-version cancun
# pragma optimize gas
"""
@title SwarmLedger
@notice The swarmnode ledger state machine on an EVM chain (spec/ledger.md is normative).
        Stake is the chain's native currency, accounted in gwei (deposits must be whole gwei).
        Every check runs in the same order as ledger/state.py, and reverts with the same short
        code the Python client maps to the same typed error.
@dev    Trust (spec/ledger.md, Trust): a run's owner names the validators it trusts; only they credit
        or slash in it. A slash cites the worker's own signature (checked here with ecrecover) and waits
        out the run's challenge window, during which the owner or a majority of the run's other
        validators can void it at the slasher's cost. Credits are committed in batches: the contract
        keeps the batch's Merkle root, one bit per credited assignment and per-worker totals; the
        credits themselves stay in the transaction's calldata (hence commit_credits is EOA-only).
"""

ROLE_TRAINER: constant(uint256) = 1
ROLE_RELAY: constant(uint256) = 2
ROLE_WORKER: constant(uint256) = 3
ROLE_VALIDATOR: constant(uint256) = 4
WEI_PER_GWEI: constant(uint256) = 10 ** 9
MAX_CHUNKS: constant(uint256) = 64
MAX_VALIDATORS: constant(uint256) = 16
MAX_CREDITS: constant(uint256) = 512
MAX_PROOF_DEPTH: constant(uint256) = 16
MERKLE_LEVELS: constant(uint256) = 10  # ceil(log2(MAX_CREDITS)) + 1
RUN_LIMIT_MAX: constant(uint256) = 2 ** 32 - 1  # protocol/ledger_messages.py: max tokens per credit
FLOPS_PER_TOKEN_MAX: constant(uint256) = 2 ** 40 - 1
MAX_CHALLENGE_WINDOW_EPOCHS: constant(uint32) = 720  # protocol/ledger_messages.py: how long a slash may pend
MAX_SUBMISSIONS_PER_VERSION_LIMIT: constant(uint32) = 2 ** 16  # protocol/ledger_messages.py
MAX_VERSIONS_PER_EPOCH: constant(uint256) = 3600  # protocol/ledger_messages.py: a credit's version bound
PAGE: constant(uint256) = 32
BAD_PROOF: constant(uint16) = 605
MALFORMED_ROLLOUT: constant(uint16) = 609
FABRICATED_ENV_TURN: constant(uint16) = 611
# the secp256k1 group order n; a signature's s must be at most n // 2 (no malleable twin)
SECP256K1_N: constant(uint256) = 115792089237316195423570985008687907852837564279074904382605163141518161494337
SECP256K1_HALF_N: constant(uint256) = SECP256K1_N // 2
# lp("swarmnode/rollout_submission/v1"): the signing domain of a worker's submission (protocol/envelope.py)
SUBMISSION_DOMAIN: constant(Bytes[35]) = b"\x00\x00\x00\x1fswarmnode/rollout_submission/v1"
# libp2p peer id of a secp256k1 key: identity multihash of protobuf PublicKey{Type=2, Data=33 bytes}
PEER_ID_PREFIX: constant(Bytes[6]) = b"\x00\x25\x08\x02\x12\x21"
LOW_COUNTERS: constant(uint256) = 32  # ledger/batches.py credit_slot: counters 0..31 of 8 versions per slot
SLASH_PENDING: constant(uint8) = 1
SLASH_FINAL: constant(uint8) = 2
SLASH_VOIDED: constant(uint8) = 3
# A credit's own checks, in state.check_credit's order (commit_credits reverts after its pass)
FAIL_UNKNOWN_NODE: constant(uint256) = 1
FAIL_WRONG_ROLE: constant(uint256) = 2
FAIL_EJECTED: constant(uint256) = 3
FAIL_INSUFFICIENT_STAKE: constant(uint256) = 4
FAIL_EXCEEDS_RUN_BOUNDS: constant(uint256) = 5
FAIL_DUPLICATE_ASSIGNMENT: constant(uint256) = 6

# A node's status word, all a credit check reads in one SLOAD:
#   bits 0..7 role | bit 8 ejected | 16..47 compute units | 48..79 slash count | 128..255 bonded gwei
ST_EJECTED: constant(uint256) = 1 << 8
MASK_32: constant(uint256) = 2 ** 32 - 1
MASK_128: constant(uint256) = 2 ** 128 - 1

# A (run, worker) total: credits (bits 224..255) | tokens (128..223) | flops (0..127). Tokens per credit
# are at most 2^32 - 1 and flops at most 2^64 - 1, so neither field can carry into the next before the
# credit count overflows the word (a checked add reverts first).
TOTAL_CREDIT: constant(uint256) = 1 << 224


struct NodeRecord:
    accelerator: String[32]
    memory_gb: uint32
    benchmark_gflops: uint64
    peer_id: Bytes[39]
    registered_epoch: uint64
    unbonding: uint256
    release_epoch: uint64
    pending_slashes: uint256  # pending slashes against it or made by it: no withdrawal meanwhile

struct NodeView:
    addr: address
    role: uint8
    accelerator: String[32]
    count: uint32
    memory_gb: uint32
    benchmark_gflops: uint64
    peer_id: Bytes[39]
    registered_epoch: uint64
    ejected: bool
    slash_count: uint32
    bonded: uint256
    unbonding: uint256
    release_epoch: uint64
    pending_slashes: uint256

struct Run:
    run: String[64]
    owner: address
    validators: DynArray[address, MAX_VALIDATORS]
    challenge_window_epochs: uint32
    max_tokens_per_credit: uint64
    max_flops_per_token: uint64
    registered_epoch: uint64
    max_submissions_per_version: uint32

struct CreditIn:
    worker: address
    step: uint64
    tokens: uint64
    flops: uint64
    rollout_digest: bytes32

struct Batch:
    run_key: bytes32
    validator: address
    root: bytes32
    count: uint256
    first_contribution: uint256
    epoch: uint64

struct SlashRecord:
    run_key: bytes32
    worker: address
    validator: address
    requested: uint256
    taken: uint256
    submission_digest: bytes32
    failing_chunks: DynArray[uint32, MAX_CHUNKS]
    reason_code: uint16
    epoch: uint64
    final_epoch: uint64
    status: uint8
    votes: uint32
    penalty: uint256
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

event RunRegistered:
    run_key: indexed(bytes32)
    owner: indexed(address)
    run: String[64]

event RunValidatorsSet:
    run_key: indexed(bytes32)
    validators: DynArray[address, MAX_VALIDATORS]
    epoch: uint64  # the set is in force from this epoch

event CreditsCommitted:
    index: uint256
    run_key: indexed(bytes32)
    validator: indexed(address)
    root: bytes32
    count: uint256
    first: uint256

# The citation (the worker's envelope header, body hash and signature) travels in the event, so an
# audit re-checks every slash's signature from logs alone.
event Slashed:
    index: uint256
    run_key: indexed(bytes32)
    worker: indexed(address)
    validator: indexed(address)
    amount_gwei: uint256
    submission_digest: bytes32
    seq: uint64
    ts: uint64
    body_hash: bytes32
    sig: Bytes[65]

event SlashVoted:
    index: uint256
    voter: indexed(address)
    votes: uint32

event SlashVoided:
    index: uint256
    by: indexed(address)
    penalty_gwei: uint256
    ejected: bool

event SlashFinalized:
    index: uint256
    taken_gwei: uint256
    ejected: bool

MIN_STAKE_PER_UNIT: public(immutable(uint256))
UNBONDING_DELAY: public(immutable(uint64))
SLASH_AMOUNT: public(immutable(uint256))
EJECTION_THRESHOLD: public(immutable(uint32))
EPOCH_SECONDS: public(immutable(uint256))
GENESIS_TIME: public(immutable(uint256))
DEPLOY_BLOCK: public(immutable(uint256))  # where a client starts reading logs

status_word: HashMap[address, uint256]
node_records: HashMap[address, NodeRecord]
node_at: HashMap[uint256, address]
node_count: public(uint256)

runs: HashMap[bytes32, Run]
run_at: HashMap[uint256, bytes32]
run_count: public(uint256)
is_run_validator: HashMap[bytes32, HashMap[address, bool]]
runs_held: HashMap[address, uint256]  # state.runs_held: run ids each owner holds
run_recorded: HashMap[bytes32, bool]  # state.run_has_records: a batch or a slash names the run

# A batch in four slots: run key, root, meta = validator | count << 160 | epoch << 176, first contribution
batch_run: HashMap[uint256, bytes32]
batch_root: HashMap[uint256, bytes32]
batch_meta: HashMap[uint256, uint256]
batch_first: HashMap[uint256, uint256]
batch_count: public(uint256)
contribution_count: public(uint256)
# ledger/batches.py credit_slot: keccak256(run_key, worker, group, bucket) -> 256 assignment bits
credited: public(HashMap[bytes32, uint256])
totals: HashMap[bytes32, HashMap[address, uint256]]

slash_records: HashMap[uint256, SlashRecord]
slash_count: public(uint256)
slashed: public(HashMap[bytes32, bool])
voted: HashMap[uint256, HashMap[address, bool]]

burned_gwei: public(uint256)
total_deposited_gwei: public(uint256)
total_withdrawn_gwei: public(uint256)


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
    DEPLOY_BLOCK = block.number


# --- the status word ------------------------------------------------------------------------------

@pure
@internal
def _role(st: uint256) -> uint256:
    return st & 255


@pure
@internal
def _count(st: uint256) -> uint256:
    return (st >> 16) & MASK_32


@pure
@internal
def _slash_count(st: uint256) -> uint256:
    return (st >> 48) & MASK_32


@pure
@internal
def _bonded(st: uint256) -> uint256:
    return st >> 128


@pure
@internal
def _with_bonded(st: uint256, bonded: uint256) -> uint256:
    assert bonded <= MASK_128, "invalid_amount"
    return (st & MASK_128) | (bonded << 128)


@view
@internal
def _required(st: uint256) -> uint256:
    return MIN_STAKE_PER_UNIT * self._count(st)


@view
@internal
def _epoch() -> uint64:
    return convert((block.timestamp - GENESIS_TIME) // EPOCH_SECONDS, uint64)


@view
@internal
def _check_validator(addr: address):
    """A registered, unejected validator holding its full stake (state.check_active_validator)."""
    st: uint256 = self.status_word[addr]
    role: uint256 = self._role(st)
    assert role != 0, "unknown_node"
    assert role == ROLE_VALIDATOR, "wrong_role"
    assert st & ST_EJECTED == 0, "ejected"
    assert self._bonded(st) >= self._required(st), "insufficient_stake"


@view
@internal
def _check_run_validator(run_key: bytes32, addr: address):
    self._check_validator(addr)
    assert self.is_run_validator[run_key][addr], "not_run_validator"


@internal
def _take_stake(addr: address, amount: uint256, epoch: uint64) -> (uint256, bool):
    """Take up to `amount` (bonded first, then unbonding), count a slash, eject at the threshold."""
    st: uint256 = self.status_word[addr]
    bonded: uint256 = self._bonded(st)
    unbonding: uint256 = self.node_records[addr].unbonding
    taken: uint256 = min(amount, bonded + unbonding)
    from_bonded: uint256 = min(taken, bonded)
    bonded -= from_bonded
    unbonding -= taken - from_bonded
    count: uint256 = self._slash_count(st) + 1
    assert count <= MASK_32, "malformed"
    was_ejected: bool = st & ST_EJECTED != 0
    eject: bool = not was_ejected and count >= convert(EJECTION_THRESHOLD, uint256)
    st = (st & ~(MASK_32 << 48)) | (count << 48)
    if eject:
        st = st | ST_EJECTED
        unbonding += bonded
        bonded = 0
        self.node_records[addr].release_epoch = epoch + UNBONDING_DELAY
    self.status_word[addr] = self._with_bonded(st, bonded)
    self.node_records[addr].unbonding = unbonding
    self.burned_gwei += taken
    return taken, eject


@pure
@internal
def _check_validator_set(validators: DynArray[address, MAX_VALIDATORS]):
    assert len(validators) > 0, "malformed"
    for i: uint256 in range(1, MAX_VALIDATORS):
        if i >= len(validators):
            break
        assert convert(validators[i], uint256) > convert(validators[i - 1], uint256), "malformed"


@pure
@internal
def _check_run_id(run: String[64]):
    """The RunId pattern [a-z0-9][a-z0-9._-]{0,63} (protocol/types.py)."""
    raw: Bytes[64] = convert(run, Bytes[64])
    assert len(raw) > 0, "malformed"
    for i: uint256 in range(64):
        if i >= len(raw):
            break
        c: uint256 = convert(slice(raw, i, 1), uint256)
        alnum: bool = (c >= 97 and c <= 122) or (c >= 48 and c <= 57)
        assert alnum or (i > 0 and (c == 46 or c == 95 or c == 45)), "malformed"


# --- views ----------------------------------------------------------------------------------------

@view
@external
def current_epoch() -> uint64:
    return self._epoch()


@view
@internal
def _node_view(addr: address) -> NodeView:
    st: uint256 = self.status_word[addr]
    rec: NodeRecord = self.node_records[addr]
    return NodeView(
        addr=addr, role=convert(self._role(st), uint8), accelerator=rec.accelerator,
        count=convert(self._count(st), uint32), memory_gb=rec.memory_gb,
        benchmark_gflops=rec.benchmark_gflops, peer_id=rec.peer_id, registered_epoch=rec.registered_epoch,
        ejected=st & ST_EJECTED != 0, slash_count=convert(self._slash_count(st), uint32),
        bonded=self._bonded(st), unbonding=rec.unbonding, release_epoch=rec.release_epoch,
        pending_slashes=rec.pending_slashes)


@view
@external
def get_node(addr: address) -> NodeView:
    return self._node_view(addr)


@view
@external
def get_nodes(start: uint256, count: uint256) -> DynArray[NodeView, PAGE]:
    out: DynArray[NodeView, PAGE] = []
    for i: uint256 in range(PAGE):
        if i >= count or start + i >= self.node_count:
            break
        out.append(self._node_view(self.node_at[start + i]))
    return out


@view
@external
def is_eligible(addr: address) -> bool:
    st: uint256 = self.status_word[addr]
    return self._role(st) != 0 and st & ST_EJECTED == 0 and self._bonded(st) >= self._required(st)


@view
@external
def get_run(run: String[64]) -> Run:
    return self.runs[keccak256(run)]


@view
@external
def get_runs(start: uint256, count: uint256) -> DynArray[Run, PAGE]:
    out: DynArray[Run, PAGE] = []
    for i: uint256 in range(PAGE):
        if i >= count or start + i >= self.run_count:
            break
        out.append(self.runs[self.run_at[start + i]])
    return out


@view
@internal
def _batch(index: uint256) -> Batch:
    meta: uint256 = self.batch_meta[index]
    return Batch(
        run_key=self.batch_run[index], validator=convert(convert(meta & (2 ** 160 - 1), uint160), address),
        root=self.batch_root[index], count=(meta >> 160) & 65535, first_contribution=self.batch_first[index],
        epoch=convert(meta >> 176, uint64))


@view
@external
def get_batch(index: uint256) -> Batch:
    return self._batch(index)


@view
@external
def get_batches(start: uint256, count: uint256) -> DynArray[Batch, PAGE]:
    out: DynArray[Batch, PAGE] = []
    for i: uint256 in range(PAGE):
        if i >= count or start + i >= self.batch_count:
            break
        out.append(self._batch(start + i))
    return out


@view
@external
def get_total(run: String[64], worker: address) -> (uint256, uint256, uint256):
    """(credits, tokens, flops) credited to `worker` in `run`."""
    total: uint256 = self.totals[keccak256(run)][worker]
    return total >> 224, (total >> 128) & (2 ** 96 - 1), total & MASK_128


@pure
@internal
def _credit_slot(run_key: bytes32, worker: address, step: uint64) -> (bytes32, uint256):
    """ledger/batches.py credit_slot: (storage key, bit) of assignment (run, worker, step)."""
    version: uint256 = convert(step, uint256) >> 32
    counter: uint256 = convert(step, uint256) & MASK_32
    group: uint256 = version
    bucket: uint256 = 1 + (counter >> 8)
    bit: uint256 = counter & 255
    if counter < LOW_COUNTERS:
        group = version >> 3
        bucket = 0
        bit = (version & 7) * LOW_COUNTERS + counter
    return keccak256(abi_encode(run_key, worker, group, bucket)), bit


@view
@external
def is_credited(run: String[64], worker: address, step: uint64) -> bool:
    key: bytes32 = empty(bytes32)
    bit: uint256 = 0
    key, bit = self._credit_slot(keccak256(run), worker, step)
    return (self.credited[key] >> bit) & 1 == 1


@view
@external
def verify_credit(batch_index: uint256, worker: address, step: uint64, tokens: uint64, flops: uint64,
                  rollout_digest: bytes32, leaf_index: uint256, path: DynArray[bytes32, MAX_PROOF_DEPTH]
                  ) -> bool:
    """Whether the credit is leaf `leaf_index` of batch `batch_index` (ledger/batches.py root_from_path)."""
    if batch_index >= self.batch_count:
        return False
    size: uint256 = (self.batch_meta[batch_index] >> 160) & 65535
    if leaf_index >= size:
        return False
    node: bytes32 = keccak256(abi_encode(worker, step, tokens, flops, rollout_digest))
    index: uint256 = leaf_index
    used: uint256 = 0
    for _: uint256 in range(MAX_PROOF_DEPTH):
        if size <= 1:
            break
        if index % 2 == 1 or index + 1 < size:
            if used >= len(path):
                return False
            if index % 2 == 1:
                node = keccak256(concat(path[used], node))
            else:
                node = keccak256(concat(node, path[used]))
            used += 1
        index = index // 2
        size = (size + 1) // 2
    return used == len(path) and node == self.batch_root[batch_index]


@view
@external
def get_slashes(start: uint256, count: uint256) -> DynArray[SlashRecord, PAGE]:
    out: DynArray[SlashRecord, PAGE] = []
    for i: uint256 in range(PAGE):
        if i >= count or start + i >= self.slash_count:
            break
        out.append(self.slash_records[start + i])
    return out


# --- nodes and stake ------------------------------------------------------------------------------

@external
def register(role: uint8, accelerator: String[32], count: uint32, memory_gb: uint32,
             benchmark_gflops: uint64, public_key: Bytes[64]):
    """Register msg.sender; `public_key` (64 bytes, uncompressed without 0x04) must be its own key, and
    the stored peer id is derived from it (state.process_register)."""
    assert convert(role, uint256) >= ROLE_TRAINER and convert(role, uint256) <= ROLE_VALIDATOR, "malformed"
    assert count >= 1 and count <= 65536 and memory_gb >= 1 and len(accelerator) >= 1, "malformed"
    st: uint256 = self.status_word[msg.sender]
    if self._role(st) != 0:
        assert st & ST_EJECTED == 0, "ejected"
        raise "already_registered"
    assert len(public_key) == 64, "peer_id_mismatch"
    assert convert(slice(keccak256(public_key), 12, 20), address) == msg.sender, "peer_id_mismatch"
    parity: uint256 = convert(slice(public_key, 32, 32), uint256) & 1
    peer_id: Bytes[39] = concat(
        PEER_ID_PREFIX, convert(convert(2 + parity, uint8), bytes1), slice(public_key, 0, 32))
    epoch: uint64 = self._epoch()
    self.status_word[msg.sender] = convert(role, uint256) | (convert(count, uint256) << 16)
    self.node_records[msg.sender] = NodeRecord(
        accelerator=accelerator, memory_gb=memory_gb, benchmark_gflops=benchmark_gflops, peer_id=peer_id,
        registered_epoch=epoch, unbonding=0, release_epoch=0, pending_slashes=0)
    self.node_at[self.node_count] = msg.sender
    self.node_count += 1
    log Registered(node=msg.sender, role=role)


@payable
@external
def deposit():
    st: uint256 = self.status_word[msg.sender]
    assert self._role(st) != 0, "unknown_node"
    assert st & ST_EJECTED == 0, "ejected"
    assert msg.value >= WEI_PER_GWEI and msg.value % WEI_PER_GWEI == 0, "invalid_amount"
    amount: uint256 = msg.value // WEI_PER_GWEI
    self.status_word[msg.sender] = self._with_bonded(st, self._bonded(st) + amount)
    self.total_deposited_gwei += amount
    log Deposited(node=msg.sender, amount_gwei=amount)


@external
def unbond(amount_gwei: uint256):
    st: uint256 = self.status_word[msg.sender]
    assert self._role(st) != 0, "unknown_node"
    assert amount_gwei >= 1, "invalid_amount"
    bonded: uint256 = self._bonded(st)
    assert amount_gwei <= bonded, "insufficient_stake"
    release: uint64 = self._epoch() + UNBONDING_DELAY
    self.status_word[msg.sender] = self._with_bonded(st, bonded - amount_gwei)
    self.node_records[msg.sender].unbonding += amount_gwei
    self.node_records[msg.sender].release_epoch = release
    log Unbonded(node=msg.sender, amount_gwei=amount_gwei, release_epoch=release)


@nonreentrant
@external
def withdraw():
    assert self._role(self.status_word[msg.sender]) != 0, "unknown_node"
    amount: uint256 = self.node_records[msg.sender].unbonding
    assert amount > 0, "nothing_to_withdraw"
    assert self._epoch() >= self.node_records[msg.sender].release_epoch, "still_unbonding"
    assert self.node_records[msg.sender].pending_slashes == 0, "slash_pending"
    self.node_records[msg.sender].unbonding = 0
    self.node_records[msg.sender].release_epoch = 0
    self.total_withdrawn_gwei += amount
    log Withdrawn(node=msg.sender, amount_gwei=amount)
    raw_call(msg.sender, b"", value=amount * WEI_PER_GWEI)


# --- runs -----------------------------------------------------------------------------------------

@external
def register_run(run: String[64], validators: DynArray[address, MAX_VALIDATORS],
                 challenge_window_epochs: uint32, max_tokens_per_credit: uint64,
                 max_flops_per_token: uint64, max_submissions_per_version: uint32):
    """msg.sender, a registered unejected trainer, becomes the run's owner (state.process_register_run)."""
    self._check_run_id(run)
    assert max_tokens_per_credit >= 1 and convert(max_tokens_per_credit, uint256) <= RUN_LIMIT_MAX, \
        "malformed"
    assert convert(max_flops_per_token, uint256) <= FLOPS_PER_TOKEN_MAX, "malformed"
    assert challenge_window_epochs <= MAX_CHALLENGE_WINDOW_EPOCHS, "malformed"
    assert max_submissions_per_version >= 1 and max_submissions_per_version <= MAX_SUBMISSIONS_PER_VERSION_LIMIT, \
        "malformed"
    st: uint256 = self.status_word[msg.sender]
    assert self._role(st) != 0, "unknown_node"
    assert self._role(st) == ROLE_TRAINER, "wrong_role"
    assert st & ST_EJECTED == 0, "ejected"
    key: bytes32 = keccak256(run)
    previous: address = self.runs[key].owner
    if previous == empty(address):
        self.run_at[self.run_count] = key
        self.run_count += 1
    else:  # state.is_lapsed: nothing recorded, no stake of its owner's behind it; it keeps its place
        pst: uint256 = self.status_word[previous]
        assert not self.run_recorded[key] and self.node_records[previous].unbonding == 0 \
            and self._bonded(pst) < self._required(pst) * self.runs_held[previous], "run_exists"
        self.runs_held[previous] -= 1
        for v: address in self.runs[key].validators:
            self.is_run_validator[key][v] = False
    assert self._bonded(st) >= self._required(st) * (self.runs_held[msg.sender] + 1), "insufficient_stake"
    self._check_validator_set(validators)
    epoch: uint64 = self._epoch()
    self.runs_held[msg.sender] += 1
    self.runs[key] = Run(
        run=run, owner=msg.sender, validators=validators, challenge_window_epochs=challenge_window_epochs,
        max_tokens_per_credit=max_tokens_per_credit, max_flops_per_token=max_flops_per_token,
        registered_epoch=epoch, max_submissions_per_version=max_submissions_per_version)
    for v: address in validators:
        self.is_run_validator[key][v] = True
    log RunRegistered(run_key=key, owner=msg.sender, run=run)
    log RunValidatorsSet(run_key=key, validators=validators, epoch=epoch)


@external
def set_run_validators(run: String[64], validators: DynArray[address, MAX_VALIDATORS]):
    key: bytes32 = keccak256(run)
    owner: address = self.runs[key].owner
    assert owner != empty(address), "unknown_run"
    assert msg.sender == owner, "not_run_owner"
    assert self.status_word[owner] & ST_EJECTED == 0, "ejected"
    self._check_validator_set(validators)
    for v: address in self.runs[key].validators:
        self.is_run_validator[key][v] = False
    for v: address in validators:
        self.is_run_validator[key][v] = True
    self.runs[key].validators = validators
    log RunValidatorsSet(run_key=key, validators=validators, epoch=self._epoch())


# --- credits --------------------------------------------------------------------------------------

@pure
@internal
def _refuse_credit(failure: uint256):
    """Revert with the code of the first failing credit's check (FAIL_*)."""
    if failure == FAIL_UNKNOWN_NODE:
        raise "unknown_node"
    if failure == FAIL_WRONG_ROLE:
        raise "wrong_role"
    if failure == FAIL_EJECTED:
        raise "ejected"
    if failure == FAIL_INSUFFICIENT_STAKE:
        raise "insufficient_stake"
    if failure == FAIL_EXCEEDS_RUN_BOUNDS:
        raise "exceeds_run_bounds"
    raise "duplicate_assignment"


@external
def commit_credits(run: String[64], credits: DynArray[CreditIn, MAX_CREDITS]):
    """A run validator's batch: state.check_commit, then state.check_credit per credit, in order.

    One pass: an out-of-order credit reverts `malformed` at once (it outranks every credit's own
    check); the first credit that fails its own check is remembered and reverts after the pass.
    Only an externally owned account may commit, directly: every batch's credits are then in its
    transaction's calldata, where clients and audits read them back (they are not stored)."""
    assert msg.sender == tx.origin and msg.sender.codesize == 0, "malformed"
    key: bytes32 = keccak256(run)
    assert self.runs[key].owner != empty(address), "unknown_run"
    self._check_run_validator(key, msg.sender)
    n: uint256 = len(credits)
    assert n > 0, "malformed"

    max_tokens: uint64 = self.runs[key].max_tokens_per_credit
    max_flops_per_token: uint256 = convert(self.runs[key].max_flops_per_token, uint256)
    max_counter: uint256 = convert(self.runs[key].max_submissions_per_version, uint256)  # exclusive
    # state.max_credit_version: the run's age in epochs, plus one, times MAX_VERSIONS_PER_EPOCH
    max_version: uint256 = (convert(self._epoch() - self.runs[key].registered_epoch, uint256) + 1) \
        * MAX_VERSIONS_PER_EPOCH
    leaves: DynArray[bytes32, MAX_CREDITS] = []
    previous: uint256 = 0  # (worker << 64 | step) + 1 of the previous credit; 0: none yet
    failure: uint256 = 0  # FAIL_* of the first credit that failed its own check
    worker: address = empty(address)
    worker_failure: uint256 = 0
    total: uint256 = 0  # the current worker's increment, written once per run of equal workers
    slot: bytes32 = empty(bytes32)
    slot_group: uint256 = max_value(uint256)  # (group << 32 | bucket) of `slot`; none loaded yet
    bits: uint256 = 0
    for c: CreditIn in credits:
        order: uint256 = unsafe_add((convert(c.worker, uint256) << 64) | convert(c.step, uint256), 1)
        if order <= previous or c.tokens == 0:
            raise "malformed"
        previous = order
        if c.worker != worker:
            if worker != empty(address):
                self.totals[key][worker] += total
                self.credited[slot] = bits
            worker = c.worker
            st: uint256 = self.status_word[worker]
            worker_failure = 0
            if self._role(st) == 0:
                worker_failure = FAIL_UNKNOWN_NODE
            elif self._role(st) != ROLE_WORKER:
                worker_failure = FAIL_WRONG_ROLE
            elif st & ST_EJECTED != 0:
                worker_failure = FAIL_EJECTED
            elif self._bonded(st) < self._required(st):
                worker_failure = FAIL_INSUFFICIENT_STAKE
            total = 0
            slot_group = max_value(uint256)
        step: uint256 = convert(c.step, uint256)
        version: uint256 = step >> 32
        counter: uint256 = step & MASK_32
        # _credit_slot, inline; the bucket (below 2^25) and the group (below 2^32) never overlap
        group: uint256 = (version << 32) | unsafe_add(1, counter >> 8)
        bit: uint256 = counter & 255
        if counter < LOW_COUNTERS:
            group = (version >> 3) << 32
            bit = unsafe_add((version & 7) * LOW_COUNTERS, counter)
        if group != slot_group:
            if slot_group != max_value(uint256):
                self.credited[slot] = bits
            slot = keccak256(abi_encode(key, worker, group >> 32, group & MASK_32))
            slot_group = group
            bits = self.credited[slot]
        if failure == 0:
            if worker_failure != 0:
                failure = worker_failure
            elif c.tokens > max_tokens:
                failure = FAIL_EXCEEDS_RUN_BOUNDS
            elif convert(c.flops, uint256) > unsafe_mul(convert(c.tokens, uint256), max_flops_per_token):
                failure = FAIL_EXCEEDS_RUN_BOUNDS
            elif counter >= max_counter or version > max_version:
                failure = FAIL_EXCEEDS_RUN_BOUNDS
            elif (bits >> bit) & 1 != 0:
                failure = FAIL_DUPLICATE_ASSIGNMENT
        bits = bits | (1 << bit)
        total += TOTAL_CREDIT | (convert(c.tokens, uint256) << 128) | convert(c.flops, uint256)
        leaves.append(keccak256(abi_encode(c.worker, c.step, c.tokens, c.flops, c.rollout_digest)))
    if failure != 0:
        self._refuse_credit(failure)
    self.totals[key][worker] += total
    self.credited[slot] = bits

    # ledger/batches.py credits_root, in place: pairwise keccak(l || r), an odd last node moves up
    size: uint256 = n
    for _: uint256 in range(MERKLE_LEVELS):
        if size <= 1:
            break
        half: uint256 = unsafe_div(size + 1, 2)
        for j: uint256 in range(MAX_CREDITS // 2):
            if j >= half:
                break
            k: uint256 = unsafe_add(j, j)
            if unsafe_add(k, 1) < size:
                leaves[j] = keccak256(concat(leaves[k], leaves[unsafe_add(k, 1)]))
            else:
                leaves[j] = leaves[k]
        size = half
    root: bytes32 = leaves[0]
    index: uint256 = self.batch_count
    first: uint256 = self.contribution_count
    epoch: uint64 = self._epoch()
    self.batch_run[index] = key
    self.run_recorded[key] = True
    self.batch_root[index] = root
    self.batch_meta[index] = convert(msg.sender, uint256) | (n << 160) | (convert(epoch, uint256) << 176)
    self.batch_first[index] = first
    self.batch_count = index + 1
    self.contribution_count = first + n
    log CreditsCommitted(index=index, run_key=key, validator=msg.sender, root=root, count=n, first=first)


# --- slashes --------------------------------------------------------------------------------------

@view
@internal
def _submission_digest(run: String[64], worker: address, seq: uint64, ts: uint64,
                       body_hash: bytes32) -> bytes32:
    """protocol/envelope.py signing_digest_of_body_hash for a rollout submission."""
    return keccak256(concat(
        SUBMISSION_DOMAIN, convert(convert(len(run), uint32), bytes4), convert(run, Bytes[64]),
        convert(worker, bytes20), convert(seq, bytes8), convert(ts, bytes8), body_hash))


@external
def slash(run: String[64], worker: address, amount_gwei: uint256, failing_chunks: DynArray[uint32, MAX_CHUNKS],
          reason_code: uint16, seq: uint64, ts: uint64, body_hash: bytes32, sig: Bytes[65]):
    """File a pending slash (state.check_slash): nothing is taken until finalize_slash."""
    key: bytes32 = keccak256(run)
    window: uint32 = self.runs[key].challenge_window_epochs
    assert self.runs[key].owner != empty(address), "unknown_run"
    self._check_run_validator(key, msg.sender)
    assert self._role(self.status_word[worker]) != 0, "unknown_node"
    assert amount_gwei >= 1 and amount_gwei <= SLASH_AMOUNT, "invalid_amount"
    assert (reason_code >= 602 and reason_code <= 606) or reason_code == MALFORMED_ROLLOUT or \
        reason_code == FABRICATED_ENV_TURN, "invalid_evidence"
    for i: uint256 in range(1, MAX_CHUNKS):
        if i >= len(failing_chunks):
            break
        assert failing_chunks[i] > failing_chunks[i - 1], "invalid_evidence"
    assert reason_code != BAD_PROOF or len(failing_chunks) > 0, "invalid_evidence"
    digest: bytes32 = self._submission_digest(run, worker, seq, ts, body_hash)
    assert not self.slashed[digest], "duplicate_slash"

    assert len(sig) == 65, "invalid_evidence"
    r: uint256 = convert(slice(sig, 0, 32), uint256)
    s: uint256 = convert(slice(sig, 32, 32), uint256)
    v: uint256 = convert(slice(sig, 64, 1), uint256)
    assert v == 27 or v == 28, "invalid_evidence"
    assert r > 0 and r < SECP256K1_N and s > 0 and s <= SECP256K1_HALF_N, "invalid_evidence"
    assert ecrecover(digest, v, r, s) == worker, "invalid_evidence"

    epoch: uint64 = self._epoch()
    index: uint256 = self.slash_count
    self.slash_records[index] = SlashRecord(
        run_key=key, worker=worker, validator=msg.sender, requested=amount_gwei, taken=0,
        submission_digest=digest, failing_chunks=failing_chunks, reason_code=reason_code, epoch=epoch,
        final_epoch=epoch + convert(window, uint64), status=SLASH_PENDING, votes=0, penalty=0,
        ejected=False)
    self.slashed[digest] = True
    self.run_recorded[key] = True
    self.slash_count = index + 1
    self.node_records[worker].pending_slashes += 1
    self.node_records[msg.sender].pending_slashes += 1
    log Slashed(index=index, run_key=key, worker=worker, validator=msg.sender, amount_gwei=amount_gwei,
                submission_digest=digest, seq=seq, ts=ts, body_hash=body_hash, sig=sig)


@view
@internal
def _pending(index: uint256):
    assert index < self.slash_count, "slash_not_pending"
    assert self.slash_records[index].status == SLASH_PENDING, "slash_not_pending"


@internal
def _close(index: uint256, worker: address, validator: address):
    self.node_records[worker].pending_slashes -= 1
    self.node_records[validator].pending_slashes -= 1


@external
def void_slash(index: uint256):
    """The run owner voids at once, at no one's cost; another run validator votes, and a majority of the
    run's validators other than the slasher voids, at the slasher's cost: what it asked (state.process_void)."""
    self._pending(index)
    epoch: uint64 = self._epoch()
    assert epoch < self.slash_records[index].final_epoch, "challenge_window_closed"
    key: bytes32 = self.slash_records[index].run_key
    slasher: address = self.slash_records[index].validator
    votes: uint32 = self.slash_records[index].votes
    voids: bool = msg.sender == self.runs[key].owner
    if voids:
        assert self.status_word[msg.sender] & ST_EJECTED == 0, "ejected"
    else:
        self._check_run_validator(key, msg.sender)
        assert msg.sender != slasher, "not_run_validator"
        assert not self.voted[index][msg.sender], "already_voted"
        others: uint256 = 0
        for v: address in self.runs[key].validators:
            if v != slasher:
                others += 1
        votes += 1
        voids = convert(votes, uint256) >= others // 2 + 1
        self.slash_records[index].votes = votes
    if not voids:
        self.voted[index][msg.sender] = True
        log SlashVoted(index=index, voter=msg.sender, votes=votes)
        return
    penalty: uint256 = 0
    ejected: bool = False
    if msg.sender != self.runs[key].owner:  # only a quorum's void costs the slasher; the owner risks nothing
        penalty, ejected = self._take_stake(slasher, self.slash_records[index].requested, epoch)
    self._close(index, self.slash_records[index].worker, slasher)
    self.slash_records[index].status = SLASH_VOIDED
    self.slash_records[index].penalty = penalty
    self.slash_records[index].ejected = ejected
    log SlashVoided(index=index, by=msg.sender, penalty_gwei=penalty, ejected=ejected)


@external
def finalize_slash(index: uint256):
    """Anyone, once the challenge window has passed: the worker's stake is taken (burned)."""
    self._pending(index)
    epoch: uint64 = self._epoch()
    assert epoch >= self.slash_records[index].final_epoch, "challenge_window_open"
    worker: address = self.slash_records[index].worker
    taken: uint256 = 0
    ejected: bool = False
    taken, ejected = self._take_stake(worker, self.slash_records[index].requested, epoch)
    self._close(index, worker, self.slash_records[index].validator)
    self.slash_records[index].status = SLASH_FINAL
    self.slash_records[index].taken = taken
    self.slash_records[index].ejected = ejected
    log SlashFinalized(index=index, taken_gwei=taken, ejected=ejected)
