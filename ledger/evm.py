"""EvmLedger: the ledger as a Vyper contract on any EVM chain, driven through web3.py.

Transactions are built with explicit gas (a per-operation limit, see GAS_LIMITS, scaled by a batch's
credits and a slash's failing chunks), signed locally with eth-account using the node key, and sent raw,
so any JSON-RPC URL works (anvil, a testnet, mainnet) and no key ever reaches the RPC node. Stake is the
chain's native currency, accounted in gwei.

Every write first runs `eth_call`, which executes the contract's checks without spending gas: a revert
becomes the same typed `LedgerError` the signed log raises, and nothing is sent. What the contract cannot
see of a slash's evidence (the submission's run and chunk count, spec/ledger.md, Trust) is checked here
with the very function the signed log's state machine uses.

The contract stores a batch's root, count and totals, not its credits: they are read back from the
committing transaction's calldata (the contract only accepts commits sent directly by a key) and cached,
since a mined batch never changes.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import coincurve
from eth_abi.abi import encode as abi_encode
from eth_account import Account
from eth_typing import ChecksumAddress, HexAddress, HexStr
from eth_utils.abi import function_abi_to_4byte_selector, get_abi_input_types
from web3 import Web3
from web3.exceptions import TransactionNotFound
from web3.types import Wei

from swarmnode.crypto.identity import NodeIdentity, base58btc, format_address
from swarmnode.ledger.artifact import load_artifact
from swarmnode.ledger.batches import (
    MAX_PROOF_DEPTH,
    CreditProof,
    batch_contributions,
    credit_leaf,
    credit_proof,
    credit_slot,
    credits_root,
    run_key,
)
from swarmnode.ledger.errors import (
    AlreadyRegistered,
    AlreadyVoted,
    BackendError,
    ChallengeWindowClosed,
    ChallengeWindowOpen,
    DuplicateContribution,
    DuplicateSlash,
    ExceedsRunBounds,
    InsufficientStake,
    InvalidAmount,
    InvalidEvidence,
    LedgerError,
    MalformedOperation,
    NodeEjected,
    NothingToWithdraw,
    NotRunOwner,
    NotRunValidator,
    PeerIdMismatch,
    ReplayedOperation,
    RunExists,
    SlashNotPending,
    SlashPending,
    StillUnbonding,
    UnknownNode,
    UnknownRun,
    WrongRole,
)
from swarmnode.ledger.evidence import SubmissionCitation, check_slash_evidence, cite_submission
from swarmnode.ledger.state import describe_assignment, filter_contributions, filter_slashes, worker_totals
from swarmnode.ledger.types import (
    ROLES,
    SLASH_FINAL,
    SLASH_PENDING,
    SLASH_VOIDED,
    WEI_PER_GWEI,
    BatchRecord,
    ContributionRecord,
    NodeInfo,
    Params,
    Receipt,
    RunInfo,
    SlashRecord,
    Snapshot,
    StakeInfo,
    WorkerTotal,
)
from swarmnode.protocol.codec import validate
from swarmnode.protocol.errors import Reject
from swarmnode.protocol.ledger_messages import (
    CommitCredits,
    ComputeSpec,
    Credit,
    FinalizeSlash,
    RegisterNode,
    RegisterRun,
    SetRunValidators,
    Slash,
    StakeDeposit,
    StakeUnbond,
    VoidSlash,
)

ROLE_CODES = {role: i + 1 for i, role in enumerate(ROLES)}  # 0 = unregistered
SLASH_STATUSES = {1: SLASH_PENDING, 2: SLASH_FINAL, 3: SLASH_VOIDED}
PAGE = 32
DEPLOY_GAS = 6_000_000
LOG_BLOCKS = 10_000  # eth_getLogs range per request (public RPCs cap it)
# Explicit gas limits, about 25% above the worst case measured (longest strings, an ejection, fresh
# storage everywhere): estimating on every call would cost an extra execution (a binary search on py-evm).
GAS_LIMITS = {
    "register_node": 400_000,
    "stake_deposit": 80_000,
    "stake_unbond": 100_000,
    "stake_withdraw": 120_000,  # the refund to a contract wallet may run its receive hook
    "register_run": 900_000,  # 16 validators, a 64-character run id
    "set_run_validators": 900_000,
    "commit_credits": 260_000,  # a run's first batch: fresh counters; plus the terms below
    "slash": 400_000,  # plus GAS_PER_FAILING_CHUNK each
    "void_slash": 200_000,
    "finalize_slash": 150_000,
}
GAS_PER_CREDIT = 4_500  # calldata, decoding, checks, its leaf and Merkle node
GAS_PER_WORKER = 35_000  # a worker's status read and a fresh totals slot
GAS_PER_SLOT = 28_000  # a fresh 256-assignment bitmap slot
GAS_PER_FAILING_CHUNK = 26_000

REVERT_CODES: dict[str, type[LedgerError]] = {
    "unknown_node": UnknownNode,
    "already_registered": AlreadyRegistered,
    "ejected": NodeEjected,
    "wrong_role": WrongRole,
    "insufficient_stake": InsufficientStake,
    "invalid_amount": InvalidAmount,
    "still_unbonding": StillUnbonding,
    "nothing_to_withdraw": NothingToWithdraw,
    "duplicate_assignment": DuplicateContribution,
    "duplicate_slash": DuplicateSlash,
    "invalid_evidence": InvalidEvidence,
    "malformed": MalformedOperation,
    "unknown_run": UnknownRun,
    "run_exists": RunExists,
    "not_run_owner": NotRunOwner,
    "not_run_validator": NotRunValidator,
    "exceeds_run_bounds": ExceedsRunBounds,
    "peer_id_mismatch": PeerIdMismatch,
    "slash_not_pending": SlashNotPending,
    "challenge_window_open": ChallengeWindowOpen,
    "challenge_window_closed": ChallengeWindowClosed,
    "already_voted": AlreadyVoted,
    "slash_pending": SlashPending,
}
_REVERT_RE = re.compile(r"\b(" + "|".join(REVERT_CODES) + r")\b")
_STAKE_CODES = ("insufficient_stake", "still_unbonding", "nothing_to_withdraw", "slash_pending")


def revert_code(exc: BaseException) -> str | None:
    """The contract's short revert code inside whatever exception the provider raised, if any."""
    for text in (str(exc), repr(getattr(exc, "message", "")), repr(getattr(exc, "data", ""))):
        match = _REVERT_RE.search(text)
        if match:
            return match.group(1)
    return None


def _is_replay(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(s in text for s in ("nonce too low", "already known", "invalid transaction nonce"))


def _address(value: str) -> bytes:
    return bytes.fromhex(value[2:])


def public_key_64(identity: NodeIdentity) -> bytes:
    """The uncompressed public key without its 0x04 prefix: what `register` hashes to the sender."""
    return coincurve.PublicKey.from_secret(identity.private_key).format(compressed=False)[1:]


def commit_gas(op: CommitCredits) -> int:
    """A gas limit for a batch from its shape: credits, distinct workers, distinct bitmap slots."""
    workers = {c.worker for c in op.credits}
    slots = {credit_slot(op.run, c.worker, c.step)[0] for c in op.credits}
    return (
        GAS_LIMITS["commit_credits"]
        + GAS_PER_CREDIT * len(op.credits)
        + GAS_PER_WORKER * len(workers)
        + GAS_PER_SLOT * len(slots)
    )


def deploy_contract(w3: Web3, deployer: NodeIdentity, params: Params, *, timeout_s: float = 120.0) -> str:
    """Deploy SwarmLedger with these parameters; returns its checksummed address."""
    artifact = load_artifact()
    factory = w3.eth.contract(abi=artifact["abi"], bytecode=artifact["bytecode"])
    constructor = factory.constructor(
        params.min_stake_per_unit_gwei,
        params.unbonding_delay_epochs,
        params.slash_gwei,
        params.ejection_threshold,
        params.epoch_seconds,
    )
    sender = ChecksumAddress(HexAddress(HexStr(deployer.checksum_address)))
    tx = constructor.build_transaction(
        {
            "from": sender,
            "gas": DEPLOY_GAS,
            "gasPrice": w3.eth.gas_price,
            "nonce": w3.eth.get_transaction_count(sender, "pending"),
            "chainId": w3.eth.chain_id,
        }
    )
    raw = Account.sign_transaction(tx, deployer.private_key).raw_transaction
    try:
        receipt = w3.eth.wait_for_transaction_receipt(w3.eth.send_raw_transaction(raw), timeout=timeout_s)
    except Exception as exc:  # the provider's error types differ (RPC error, tester exception)
        raise BackendError(f"deploying the ledger contract failed: {exc}") from exc
    if receipt["status"] != 1 or receipt["contractAddress"] is None:
        raise BackendError(f"the deployment transaction {receipt['transactionHash'].hex()} reverted")
    return str(receipt["contractAddress"])


RECEIPT_POLL_FIRST_S = 0.005
RECEIPT_POLL_MAX_S = 1.0


def encode_call(call: Any) -> bytes:
    """A contract function call's calldata: 4-byte selector + eth_abi encoding of its arguments."""
    return function_abi_to_4byte_selector(call.abi) + abi_encode(get_abi_input_types(call.abi), call.args)


class EvmLedger:
    """The EVM `Ledger`: one deployed SwarmLedger contract at `address`, reached through `w3`."""

    def __init__(
        self,
        w3: Web3,
        address: str,
        *,
        receipt_timeout_s: float = 120.0,
        gas_limits: dict[str, int] | None = None,
    ) -> None:
        self.w3 = w3
        self.address = Web3.to_checksum_address(address)
        if not w3.eth.get_code(self.address):
            raise BackendError(f"no contract at {self.address}; deploy one with `swarmnode ledger deploy`")
        self.contract = w3.eth.contract(address=self.address, abi=load_artifact()["abi"])
        self._timeout = receipt_timeout_s
        self._gas = {**GAS_LIMITS, **(gas_limits or {})}
        self._chain_id = w3.eth.chain_id
        f = self.contract.functions
        self._params = Params(
            min_stake_per_unit_gwei=f.MIN_STAKE_PER_UNIT().call(),
            unbonding_delay_epochs=f.UNBONDING_DELAY().call(),
            slash_gwei=f.SLASH_AMOUNT().call(),
            ejection_threshold=f.EJECTION_THRESHOLD().call(),
            epoch_seconds=f.EPOCH_SECONDS().call(),
        )
        self.genesis_time: int = f.GENESIS_TIME().call()
        self.deploy_block: int = f.DEPLOY_BLOCK().call()
        # Immutable once mined: run names by key, each batch's transaction and credits.
        self._run_names: dict[bytes, str] = {}
        self._batch_tx: dict[int, bytes] = {}
        self._batch_credits: dict[int, tuple[Credit, ...]] = {}
        self._scanned_to = self.deploy_block - 1  # last block whose CreditsCommitted logs are in _batch_tx

    @classmethod
    def connect(cls, url: str, address: str, **kwargs: Any) -> EvmLedger:
        w3 = Web3(Web3.HTTPProvider(url, request_kwargs={"timeout": 60}))
        if not w3.is_connected():
            raise BackendError(f"cannot reach a JSON-RPC node at {url}")
        return cls(w3, address, **kwargs)

    @classmethod
    def deploy(cls, w3: Web3, deployer: NodeIdentity, params: Params, **kwargs: Any) -> EvmLedger:
        return cls(w3, deploy_contract(w3, deployer, params), **kwargs)

    @property
    def params(self) -> Params:
        return self._params

    def close(self) -> None:
        """Nothing to release: HTTP requests are independent and the chain keeps the state."""

    def current_epoch(self) -> int:
        return int(self.contract.functions.current_epoch().call())

    # --- transactions --------------------------------------------------------------------------

    def _refusal(self, exc: BaseException, what: str, sender: bytes, about: str = "") -> LedgerError:
        code = revert_code(exc)
        if code is None:
            if any(s in str(exc).lower() for s in ("insufficient funds", "cannot afford")):
                return BackendError(
                    f"{what}: {format_address(sender)} cannot pay for it (insufficient funds)"
                )
            return BackendError(f"{what} failed: {exc}")
        context = ""
        if code in _STAKE_CODES:
            row = self.contract.functions.get_node(format_address(sender)).call()
            context = (
                f" (its stake: {row[10]} gwei bonded, {row[11]} gwei unbonding until epoch {row[12]}, "
                f"party to {row[13]} pending slashes; now epoch {self.current_epoch()})"
            )
        return REVERT_CODES[code](
            f"the contract refused {what}{about} from {format_address(sender)}: {code}{context}"
        )

    def sign_transaction(
        self,
        identity: NodeIdentity,
        call: Any,
        *,
        what: str,
        value_wei: int = 0,
        gas: int | None = None,
        about: str | Callable[[str], str] = "",
    ) -> bytes:
        """Preflight with `eth_call` (a revert → typed error, nothing sent), then sign with explicit gas.
        `about` may be a function of the revert code, to name what was refused (only run on refusal).
        The calldata is encoded once, with eth_abi: web3's own encoder spends ~10x longer on a batch."""
        sender = ChecksumAddress(HexAddress(HexStr(identity.checksum_address)))
        data = encode_call(call)
        try:
            self.w3.eth.call({"from": sender, "to": self.address, "value": Wei(value_wei), "data": data})
        except Exception as exc:  # providers raise different types for a revert
            detail = about(revert_code(exc) or "") if callable(about) else about
            raise self._refusal(exc, what, identity.address, detail) from None
        tx = {
            "to": self.address,
            "value": value_wei,
            "data": data,
            "gas": self._gas[what] if gas is None else gas,
            "gasPrice": self.w3.eth.gas_price,
            "nonce": self.w3.eth.get_transaction_count(sender, "pending"),
            "chainId": self._chain_id,
        }
        return bytes(Account.sign_transaction(tx, identity.private_key).raw_transaction)

    def _wait_for_receipt(self, tx_hash: bytes) -> Any:
        """Poll for the receipt from RECEIPT_POLL_FIRST_S, doubling up to RECEIPT_POLL_MAX_S: a local chain
        mines in milliseconds, a public one in seconds, and neither should be polled at a fixed 10 Hz."""
        deadline = time.monotonic() + self._timeout
        delay = RECEIPT_POLL_FIRST_S
        while True:
            try:
                return self.w3.eth.get_transaction_receipt(HexStr("0x" + tx_hash.hex()))
            except TransactionNotFound:
                pass
            if time.monotonic() >= deadline:
                raise BackendError(f"no receipt for transaction 0x{tx_hash.hex()} after {self._timeout} s")
            time.sleep(delay)
            delay = min(delay * 2, RECEIPT_POLL_MAX_S)

    def _reverted(self, receipt: Any, what: str, sender: bytes) -> LedgerError:
        """A transaction the preflight passed but the chain reverted: the state moved in between (another
        transaction, or a new block's epoch closing a window). Re-run it at its block for the reason, so
        the caller still gets the typed refusal; BackendError only when the chain gives none."""
        tx = self.w3.eth.get_transaction(receipt["transactionHash"])
        call = {"from": tx["from"], "to": tx["to"], "value": tx["value"], "data": tx["input"]}
        try:
            self.w3.eth.call(call, block_identifier=receipt["blockNumber"])  # type: ignore[arg-type]
        except Exception as exc:  # providers raise different types for a revert
            if revert_code(exc) is not None:
                return self._refusal(exc, what, sender)
        return BackendError(
            f"{what}: transaction {receipt['transactionHash'].hex()} reverted on chain "
            f"(gas used {receipt['gasUsed']})"
        )

    def send_raw_transaction(self, raw: bytes, *, what: str = "transaction", sender: bytes = b"") -> Receipt:
        """Send a signed transaction and wait for it; a reused nonce is a `ReplayedOperation`."""
        try:
            tx_hash = bytes(self.w3.eth.send_raw_transaction(raw))
        except Exception as exc:  # RPC and tester errors have no common base
            if _is_replay(exc):
                raise ReplayedOperation(f"{what}: the signed transaction was already used ({exc})") from None
            raise self._refusal(exc, what, sender) from None
        receipt = self._wait_for_receipt(tx_hash)
        if receipt["status"] != 1:
            raise self._reverted(receipt, what, sender)
        block = self.w3.eth.get_block(receipt["blockNumber"])
        epoch = (int(block["timestamp"]) - self.genesis_time) // self._params.epoch_seconds
        return Receipt(int(receipt["blockNumber"]), bytes(receipt["transactionHash"]), epoch)

    def _transact(
        self,
        identity: NodeIdentity,
        call: Any,
        what: str,
        *,
        value_wei: int = 0,
        gas: int | None = None,
        offchain_check: Callable[[], None] | None = None,
        about: str | Callable[[str], str] = "",
    ) -> Receipt:
        raw = self.sign_transaction(identity, call, what=what, value_wei=value_wei, gas=gas, about=about)
        if offchain_check is not None:
            offchain_check()
        return self.send_raw_transaction(raw, what=what, sender=identity.address)

    # --- the Ledger operations -----------------------------------------------------------------

    def register(
        self, identity: NodeIdentity, role: str, compute: ComputeSpec, peer_id: str | None = None
    ) -> Receipt:
        """The contract derives the peer id from the sender's public key; another peer id is refused
        here (after the contract's earlier checks, as the state machine orders them)."""
        op = RegisterNode(role, compute, identity.peer_id if peer_id is None else peer_id)
        _validate(op)
        call = self.contract.functions.register(
            ROLE_CODES[op.role],
            op.compute.accelerator,
            op.compute.count,
            op.compute.memory_gb,
            op.compute.benchmark_gflops,
            public_key_64(identity),
        )

        def own_peer_id() -> None:
            if op.peer_id != identity.peer_id:
                raise PeerIdMismatch(
                    f"peer id {op.peer_id[:64]!r} is not derived from the key of "
                    f"{format_address(identity.address)}; a node registers its own peer id"
                )

        return self._transact(identity, call, "register_node", offchain_check=own_peer_id)

    def deposit(self, identity: NodeIdentity, amount_gwei: int) -> Receipt:
        _validate(StakeDeposit(amount_gwei))
        call = self.contract.functions.deposit()
        return self._transact(identity, call, "stake_deposit", value_wei=amount_gwei * WEI_PER_GWEI)

    def unbond(self, identity: NodeIdentity, amount_gwei: int) -> Receipt:
        _validate(StakeUnbond(amount_gwei))
        return self._transact(identity, self.contract.functions.unbond(amount_gwei), "stake_unbond")

    def withdraw(self, identity: NodeIdentity) -> Receipt:
        return self._transact(identity, self.contract.functions.withdraw(), "stake_withdraw")

    def register_run(self, identity: NodeIdentity, op: RegisterRun) -> Receipt:
        _validate(op)
        call = self.contract.functions.register_run(
            op.run,
            [format_address(v) for v in op.validators],
            op.challenge_window_epochs,
            op.max_tokens_per_credit,
            op.max_flops_per_token,
            op.max_submissions_per_version,
        )
        receipt = self._transact(identity, call, "register_run", about=f" of run {op.run!r}")
        self._run_names[run_key(op.run)] = op.run
        return receipt

    def set_run_validators(self, identity: NodeIdentity, op: SetRunValidators) -> Receipt:
        _validate(op)
        call = self.contract.functions.set_run_validators(op.run, [format_address(v) for v in op.validators])
        return self._transact(identity, call, "set_run_validators", about=f" of run {op.run!r}")

    def commit_credits(self, identity: NodeIdentity, op: CommitCredits) -> Receipt:
        _validate(op)
        credits = [
            (format_address(c.worker), c.step, c.tokens, c.flops, c.rollout_digest) for c in op.credits
        ]
        call = self.contract.functions.commit_credits(op.run, credits)

        def about(code: str) -> str:
            if code == "duplicate_assignment":  # name the first credit already paid, as the log does
                for c in op.credits:
                    if self.is_credited(op.run, c.worker, c.step):
                        return f" of assignment ({describe_assignment((op.run, c.worker, c.step))})"
            return f" of {len(op.credits)} credits in run {op.run!r}"

        return self._transact(identity, call, "commit_credits", gas=commit_gas(op), about=about)

    def slash(self, identity: NodeIdentity, op: Slash) -> Receipt:
        """The contract checks the cited signature; the evidence's run and chunk count are checked here
        before sending (`check_slash_evidence`), after the contract's checks, as the log orders them."""
        _validate(op)
        try:
            citation = cite_submission(op)
        except InvalidEvidence as exc:
            # Not an envelope: nothing to cite. The contract's earlier checks still come first.
            empty = SubmissionCitation(0, 0, bytes(32), bytes(65), bytes(32))
            try:
                self.sign_transaction(identity, self._slash_call(op, empty), what="slash")
            except InvalidEvidence:
                pass  # the empty citation's signature: the evidence's own error says more
            raise exc from None
        gas = self._gas["slash"] + GAS_PER_FAILING_CHUNK * len(op.failing_chunks)
        return self._transact(
            identity,
            self._slash_call(op, citation),
            "slash",
            gas=gas,
            offchain_check=lambda: check_slash_evidence(op),
        )

    def _slash_call(self, op: Slash, citation: SubmissionCitation) -> Any:
        return self.contract.functions.slash(
            op.run,
            format_address(op.worker),
            op.amount_gwei,
            list(op.failing_chunks),
            op.reason_code,
            citation.seq,
            citation.ts,
            citation.body_hash,
            citation.sig,
        )

    def void_slash(self, identity: NodeIdentity, slash_index: int) -> Receipt:
        _validate(VoidSlash(slash_index))
        call = self.contract.functions.void_slash(slash_index)
        return self._transact(identity, call, "void_slash", about=f" of slash {slash_index}")

    def finalize_slash(self, identity: NodeIdentity, slash_index: int) -> Receipt:
        _validate(FinalizeSlash(slash_index))
        call = self.contract.functions.finalize_slash(slash_index)
        return self._transact(identity, call, "finalize_slash", about=f" of slash {slash_index}")

    # --- nodes and stake -----------------------------------------------------------------------

    def _node_info(self, row: Any) -> NodeInfo:
        return NodeInfo(
            address=_address(row[0]),
            role=ROLES[row[1] - 1],
            compute=ComputeSpec(accelerator=row[2], count=row[3], memory_gb=row[4], benchmark_gflops=row[5]),
            peer_id=base58btc(bytes(row[6])),
            registered_epoch=row[7],
            ejected=row[8],
            slash_count=row[9],
        )

    def _stake_info(self, row: Any) -> StakeInfo:
        required = self._params.min_stake_per_unit_gwei * row[3]
        return StakeInfo(
            address=_address(row[0]),
            bonded_gwei=row[10],
            unbonding_gwei=row[11],
            release_epoch=row[12],
            required_gwei=required,
            eligible=not row[8] and row[10] >= required,
        )

    def _pages(self, count_fn: Any, page_fn: Any) -> list[Any]:
        total = count_fn().call()
        rows: list[Any] = []
        while len(rows) < total:
            rows.extend(page_fn(len(rows), PAGE).call())
        return rows

    def _node_rows(self) -> list[Any]:
        f = self.contract.functions
        return self._pages(f.node_count, f.get_nodes)

    def node(self, address: bytes) -> NodeInfo | None:
        row = self.contract.functions.get_node(format_address(address)).call()
        return self._node_info(row) if row[1] else None

    def nodes(self) -> list[NodeInfo]:
        return [self._node_info(r) for r in self._node_rows()]

    def stake(self, address: bytes) -> StakeInfo | None:
        row = self.contract.functions.get_node(format_address(address)).call()
        return self._stake_info(row) if row[1] else None

    def stakes(self) -> list[StakeInfo]:
        return [self._stake_info(r) for r in self._node_rows()]

    def is_eligible(self, address: bytes) -> bool:
        return bool(self.contract.functions.is_eligible(format_address(address)).call())

    def money(self) -> dict[str, int]:
        """The contract's balance and money counters, and the stake its nodes hold, for an audit:
        balance == (deposited - withdrawn) * 1e9 and deposited - withdrawn == held + burned."""
        f = self.contract.functions
        return {
            "balance_wei": int(self.w3.eth.get_balance(self.address)),
            "deposited_gwei": int(f.total_deposited_gwei().call()),
            "withdrawn_gwei": int(f.total_withdrawn_gwei().call()),
            "burned_gwei": int(f.burned_gwei().call()),
            "held_gwei": sum(s.bonded_gwei + s.unbonding_gwei for s in self.stakes()),
        }

    # --- runs ----------------------------------------------------------------------------------

    @staticmethod
    def _run_info(row: Any) -> RunInfo:
        return RunInfo(
            run=row[0],
            owner=_address(row[1]),
            validators=tuple(_address(v) for v in row[2]),
            challenge_window_epochs=row[3],
            max_tokens_per_credit=row[4],
            max_flops_per_token=row[5],
            registered_epoch=row[6],
            max_submissions_per_version=row[7],
        )

    def run(self, run: str) -> RunInfo | None:
        row = self.contract.functions.get_run(run).call()
        return self._run_info(row) if int(row[1], 16) else None

    def runs(self) -> list[RunInfo]:
        f = self.contract.functions
        infos = [self._run_info(r) for r in self._pages(f.run_count, f.get_runs)]
        self._run_names.update((run_key(r.run), r.run) for r in infos)
        return infos

    def _run_name(self, key: bytes) -> str:
        if key not in self._run_names:
            self.runs()
        name = self._run_names.get(key)
        if name is None:
            raise BackendError(f"the contract names run key 0x{key.hex()} that no registered run has")
        return name

    # --- credits -------------------------------------------------------------------------------

    def _batch_record(self, index: int, row: Any) -> BatchRecord:
        return BatchRecord(
            index=index,
            run=self._run_name(bytes(row[0])),
            validator=_address(row[1]),
            root=bytes(row[2]),
            count=row[3],
            first_contribution=row[4],
            epoch=row[5],
        )

    def _all_batches(self) -> list[BatchRecord]:
        f = self.contract.functions
        return [self._batch_record(i, r) for i, r in enumerate(self._pages(f.batch_count, f.get_batches))]

    def batches(self, run: str | None = None) -> list[BatchRecord]:
        return [b for b in self._all_batches() if run is None or b.run == run]

    def _scan_batch_logs(self) -> None:
        """Map every batch committed since the last scan to its transaction (CreditsCommitted logs)."""
        head = int(self.w3.eth.block_number)
        event = self.contract.events.CreditsCommitted()
        while self._scanned_to < head:
            start = self._scanned_to + 1
            end = min(head, start + LOG_BLOCKS - 1)
            for log in event.get_logs(from_block=start, to_block=end):
                self._batch_tx[int(log["args"]["index"])] = bytes(log["transactionHash"])
            self._scanned_to = end

    def batch_credits(self, batch_index: int) -> tuple[Credit, ...]:
        """The credits of a batch, decoded from its transaction's calldata and held to its stored root."""
        cached = self._batch_credits.get(batch_index)
        if cached is not None:
            return cached
        if batch_index not in self._batch_tx:
            self._scan_batch_logs()
        tx_hash = self._batch_tx.get(batch_index)
        if tx_hash is None:
            raise BackendError(f"no CreditsCommitted log names batch {batch_index}")
        tx = self.w3.eth.get_transaction(tx_hash)  # type: ignore[arg-type]
        if tx["to"] is None or Web3.to_checksum_address(tx["to"]) != self.address:
            raise BackendError(f"batch {batch_index}'s transaction 0x{tx_hash.hex()} is not to the ledger")
        try:
            fn, args = self.contract.decode_function_input(tx["input"])
        except Exception as exc:  # eth-abi raises several decoding errors
            raise BackendError(f"batch {batch_index}'s calldata does not decode: {exc}") from None
        if fn.fn_name != "commit_credits":
            raise BackendError(f"batch {batch_index}'s transaction calls {fn.fn_name}, not commit_credits")
        credits = tuple(_credit_of(c) for c in args["credits"])
        row = self.contract.functions.get_batch(batch_index).call()
        if (len(credits), credits_root([credit_leaf(c) for c in credits])) != (row[3], bytes(row[2])):
            raise BackendError(f"batch {batch_index}'s calldata does not give its stored count and root")
        self._batch_credits[batch_index] = credits
        return credits

    def _all_contributions(self, batches: list[BatchRecord] | None = None) -> list[ContributionRecord]:
        return [
            record
            for batch in (self._all_batches() if batches is None else batches)
            for record in batch_contributions(batch, self.batch_credits(batch.index))
        ]

    def contributions(self, node: bytes | None = None, run: str | None = None) -> list[ContributionRecord]:
        return filter_contributions(self._all_contributions(), node, run)

    def _totals(self, records: list[ContributionRecord], run: str | None) -> list[WorkerTotal]:
        """The (run, worker) pairs in first-credit order, each total as the contract summed it."""
        get_total = self.contract.functions.get_total
        out: list[WorkerTotal] = []
        for pair in worker_totals(records, run):
            credits, tokens, flops = get_total(pair.run, format_address(pair.worker)).call()
            out.append(WorkerTotal(pair.run, pair.worker, credits, tokens, flops))
        return out

    def totals(self, run: str | None = None) -> list[WorkerTotal]:
        return self._totals(self._all_contributions(), run)

    def is_credited(self, run: str, worker: bytes, step: int) -> bool:
        return bool(self.contract.functions.is_credited(run, format_address(worker), step).call())

    def prove_credit(self, contribution: int) -> CreditProof:
        """The inclusion proof of one credited contribution in its batch (IndexError if none)."""
        count = int(self.contract.functions.contribution_count().call())
        if not 0 <= contribution < count:
            raise IndexError(f"no contribution {contribution} (the ledger holds {count})")
        batch = next(b for b in reversed(self._all_batches()) if b.first_contribution <= contribution)
        credits = self.batch_credits(batch.index)
        return credit_proof(contribution, batch, credits)

    def check_credit_proof(self, proof: CreditProof) -> bool:
        """The contract's `verify_credit` accepts the path, and the proof names that batch's root, run,
        validator and count."""
        f = self.contract.functions
        if not 0 <= proof.batch < int(f.batch_count().call()):
            return False
        c = proof.credit
        words_ok = all(len(p) == 32 for p in proof.path) and len(c.rollout_digest) == 32
        fields_ok = all(0 <= x < 2**64 for x in (c.step, c.tokens, c.flops)) and len(c.worker) == 20
        if (
            len(proof.path) > MAX_PROOF_DEPTH
            or not 0 <= proof.leaf_index < 2**256
            or not words_ok
            or not fields_ok
        ):
            return False
        on_chain = f.verify_credit(
            proof.batch,
            format_address(c.worker),
            c.step,
            c.tokens,
            c.flops,
            c.rollout_digest,
            proof.leaf_index,
            list(proof.path),
        ).call()
        row = f.get_batch(proof.batch).call()
        named = (bytes(row[2]), run_key(proof.run), _address(row[1]), row[3])
        return bool(on_chain) and named == (proof.root, bytes(row[0]), proof.validator, proof.count)

    # --- slashes -------------------------------------------------------------------------------

    def _slash_record(self, index: int, r: Any) -> SlashRecord:
        return SlashRecord(
            index=index,
            run=self._run_name(bytes(r[0])),
            worker=_address(r[1]),
            validator=_address(r[2]),
            requested_gwei=r[3],
            taken_gwei=r[4],
            submission_digest=bytes(r[5]),
            failing_chunks=tuple(r[6]),
            reason_code=r[7],
            epoch=r[8],
            final_epoch=r[9],
            status=SLASH_STATUSES[r[10]],
            votes=r[11],
            penalty_gwei=r[12],
            ejected=r[13],
        )

    def _all_slashes(self) -> list[SlashRecord]:
        f = self.contract.functions
        return [self._slash_record(i, r) for i, r in enumerate(self._pages(f.slash_count, f.get_slashes))]

    def slashes(self, node: bytes | None = None) -> list[SlashRecord]:
        return filter_slashes(self._all_slashes(), node)

    def slash_citation(self, slash_index: int) -> SubmissionCitation:
        """What the slash cited (the worker's envelope header, body hash and signature), from its event."""
        logs = self.contract.events.Slashed().get_logs(from_block=self.deploy_block)
        for log in logs:
            args = log["args"]
            if int(args["index"]) == slash_index:
                return SubmissionCitation(
                    seq=int(args["seq"]),
                    ts=int(args["ts"]),
                    body_hash=bytes(args["body_hash"]),
                    sig=bytes(args["sig"]),
                    digest=bytes(args["submission_digest"]),
                )
        raise BackendError(f"no Slashed log names slash {slash_index}")

    def snapshot(self) -> Snapshot:
        rows = self._node_rows()
        runs = self.runs()
        batches = self._all_batches()
        contributions = self._all_contributions(batches)
        return Snapshot(
            epoch=self.current_epoch(),
            nodes=tuple(self._node_info(r) for r in rows),
            stakes=tuple(self._stake_info(r) for r in rows),
            runs=tuple(runs),
            batches=tuple(batches),
            contributions=tuple(contributions),
            totals=tuple(self._totals(contributions, None)),
            slashes=tuple(self._all_slashes()),
        )


def _credit_of(value: Any) -> Credit:
    """A decoded CreditIn tuple (web3 gives a dict by field name, or a plain tuple) as a Credit."""
    fields = (
        [value[k] for k in ("worker", "step", "tokens", "flops", "rollout_digest")]
        if isinstance(value, dict)
        else list(value)
    )
    worker, step, tokens, flops, digest = fields
    return Credit(_address(worker), int(step), int(tokens), int(flops), bytes(digest))


def _validate(op: object) -> None:
    """The codec's field rules (pattern, ranges), as the signed log applies them when it signs."""
    try:
        validate(op)
    except Reject as exc:
        raise MalformedOperation(exc.detail) from None
