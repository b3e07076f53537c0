"""EvmLedger: the ledger as a Vyper contract on any EVM chain, driven through web3.py.

Transactions are built with explicit gas (a per-operation limit, see GAS_LIMITS), signed locally with
eth-account using the node key, and sent raw, so any JSON-RPC URL works (anvil, a testnet, mainnet) and
no key ever reaches the RPC node. Stake is the chain's native currency, accounted in gwei.

Every write first runs `eth_call`, which executes the contract's checks without spending gas: a
revert becomes the same typed `LedgerError` the signed log raises, and nothing is sent. The evidence a
contract cannot afford to check (the verdict and the slashed submission, see spec/ledger.md, Trust) is
checked here with the very functions the signed log's state machine uses.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from eth_abi import encode as abi_encode
from eth_account import Account
from eth_typing import ChecksumAddress, HexAddress, HexStr
from web3 import Web3

from crypto.hashing import keccak256, sha256
from crypto.identity import NodeIdentity, format_address
from ledger.artifact import load_artifact
from ledger.errors import (
    AlreadyRegistered,
    BackendError,
    DuplicateContribution,
    DuplicateSlash,
    InsufficientStake,
    InvalidAmount,
    InvalidEvidence,
    LedgerError,
    MalformedOperation,
    NodeEjected,
    NothingToWithdraw,
    ReplayedOperation,
    StillUnbonding,
    UnknownNode,
    WrongRole,
)
from ledger.evidence import check_slash_evidence, check_verdict
from ledger.state import assignment_of, describe_assignment, filter_contributions, filter_slashes
from ledger.types import (
    ROLES,
    WEI_PER_GWEI,
    ContributionRecord,
    NodeInfo,
    Params,
    Receipt,
    SlashRecord,
    Snapshot,
    StakeInfo,
)
from protocol.codec import validate
from protocol.errors import Reject
from protocol.ledger_messages import (
    ComputeSpec,
    RecordContribution,
    RegisterNode,
    Slash,
    StakeDeposit,
    StakeUnbond,
)

ROLE_CODES = {role: i + 1 for i, role in enumerate(ROLES)}  # 0 = unregistered
PAGE = 32
DEPLOY_GAS = 4_000_000
# Explicit gas limits, about 25% above the worst case measured (longest strings, 64 failing chunks, an
# ejection): estimating on every call would cost an extra execution (a binary search on py-evm).
GAS_LIMITS = {
    "register_node": 450_000,
    "stake_deposit": 100_000,
    "stake_unbond": 120_000,
    "stake_withdraw": 150_000,  # the refund to a contract wallet may run its receive hook
    "record_contribution": 400_000,
    "slash": 500_000,
}
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
    "duplicate_contribution": DuplicateContribution,
    "duplicate_assignment": DuplicateContribution,
    "duplicate_slash": DuplicateSlash,
    "invalid_evidence": InvalidEvidence,
    "malformed": MalformedOperation,
}
_REVERT_RE = re.compile(r"\b(" + "|".join(REVERT_CODES) + r")\b")


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


def assignment_key(op: RecordContribution) -> bytes:
    """The contract's `assignments` key of a contribution: keccak256(abi_encode(run, worker, step))."""
    encoded = abi_encode(["string", "address", "uint64"], [op.run, format_address(op.worker), op.step])
    return keccak256(encoded)


def _address(value: str) -> bytes:
    return bytes.fromhex(value[2:])


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
        if code in ("insufficient_stake", "still_unbonding", "nothing_to_withdraw"):
            row = self.contract.functions.get_node(format_address(sender)).call()
            context = (
                f" (its stake: {row[10]} gwei bonded, {row[11]} gwei unbonding until epoch {row[12]}; "
                f"now epoch {self.current_epoch()})"
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
        extra_gas: int = 0,
        about: str = "",
    ) -> bytes:
        """Preflight with `eth_call` (a revert → typed error, nothing sent), then sign with explicit gas."""
        sender = ChecksumAddress(HexAddress(HexStr(identity.checksum_address)))
        try:
            call.call({"from": sender, "value": value_wei})
        except Exception as exc:  # providers raise different types for a revert
            raise self._refusal(exc, what, identity.address, about) from None
        tx = call.build_transaction(
            {
                "from": sender,
                "value": value_wei,
                "gas": self._gas[what] + extra_gas,
                "gasPrice": self.w3.eth.gas_price,
                "nonce": self.w3.eth.get_transaction_count(sender, "pending"),
                "chainId": self._chain_id,
            }
        )
        return bytes(Account.sign_transaction(tx, identity.private_key).raw_transaction)

    def send_raw_transaction(self, raw: bytes, *, what: str = "transaction", sender: bytes = b"") -> Receipt:
        """Send a signed transaction and wait for it; a reused nonce is a `ReplayedOperation`."""
        try:
            tx_hash = self.w3.eth.send_raw_transaction(raw)
            receipt = self.w3.eth.wait_for_transaction_receipt(tx_hash, timeout=self._timeout)
        except Exception as exc:  # RPC and tester errors have no common base
            if _is_replay(exc):
                raise ReplayedOperation(f"{what}: the signed transaction was already used ({exc})") from None
            raise self._refusal(exc, what, sender) from None
        if receipt["status"] != 1:
            raise BackendError(f"{what}: transaction {receipt['transactionHash'].hex()} reverted on chain")
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
        extra_gas: int = 0,
        offchain_check: Callable[[], None] | None = None,
        about: str = "",
    ) -> Receipt:
        raw = self.sign_transaction(
            identity, call, what=what, value_wei=value_wei, extra_gas=extra_gas, about=about
        )
        if offchain_check is not None:
            offchain_check()
        return self.send_raw_transaction(raw, what=what, sender=identity.address)

    # --- the Ledger operations -----------------------------------------------------------------

    def register(
        self, identity: NodeIdentity, role: str, compute: ComputeSpec, peer_id: str | None = None
    ) -> Receipt:
        op = RegisterNode(role, compute, identity.peer_id if peer_id is None else peer_id)
        _validate(op)
        call = self.contract.functions.register(
            ROLE_CODES[op.role],
            op.compute.accelerator,
            op.compute.count,
            op.compute.memory_gb,
            op.compute.benchmark_gflops,
            op.peer_id,
        )
        return self._transact(identity, call, "register_node")

    def deposit(self, identity: NodeIdentity, amount_gwei: int) -> Receipt:
        _validate(StakeDeposit(amount_gwei))
        call = self.contract.functions.deposit()
        return self._transact(identity, call, "stake_deposit", value_wei=amount_gwei * WEI_PER_GWEI)

    def unbond(self, identity: NodeIdentity, amount_gwei: int) -> Receipt:
        _validate(StakeUnbond(amount_gwei))
        return self._transact(identity, self.contract.functions.unbond(amount_gwei), "stake_unbond")

    def withdraw(self, identity: NodeIdentity) -> Receipt:
        return self._transact(identity, self.contract.functions.withdraw(), "stake_withdraw")

    def record_contribution(self, identity: NodeIdentity, op: RecordContribution) -> Receipt:
        _validate(op)
        call = self.contract.functions.record_contribution(
            op.run,
            op.step,
            format_address(op.worker),
            op.tokens,
            op.flops,
            op.rollout_digest,
            sha256(op.verdict),
        )

        def verdict_check() -> None:
            check_verdict(op, identity.address)

        about = f" of assignment ({describe_assignment(assignment_of(op))})"
        return self._transact(
            identity, call, "record_contribution", offchain_check=verdict_check, about=about
        )

    def slash(self, identity: NodeIdentity, op: Slash) -> Receipt:
        _validate(op)
        call = self.contract.functions.slash(
            op.run,
            format_address(op.worker),
            op.amount_gwei,
            op.submission_digest,
            list(op.failing_chunks),
            op.reason_code,
        )
        extra = GAS_PER_FAILING_CHUNK * len(op.failing_chunks)
        return self._transact(
            identity, call, "slash", extra_gas=extra, offchain_check=lambda: check_slash_evidence(op)
        )

    # --- queries -------------------------------------------------------------------------------

    def _node_info(self, row: Any) -> NodeInfo:
        return NodeInfo(
            address=_address(row[0]),
            role=ROLES[row[1] - 1],
            compute=ComputeSpec(accelerator=row[2], count=row[3], memory_gb=row[4], benchmark_gflops=row[5]),
            peer_id=row[6],
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

    def _all_contributions(self) -> list[ContributionRecord]:
        f = self.contract.functions
        return [
            ContributionRecord(
                index=i,
                run=r[0],
                step=r[1],
                worker=_address(r[2]),
                validator=_address(r[3]),
                tokens=r[4],
                flops=r[5],
                rollout_digest=bytes(r[6]),
                verdict_digest=bytes(r[7]),
                epoch=r[8],
            )
            for i, r in enumerate(self._pages(f.contribution_count, f.get_contributions))
        ]

    def contributions(self, node: bytes | None = None, run: str | None = None) -> list[ContributionRecord]:
        return filter_contributions(self._all_contributions(), node, run)

    def _all_slashes(self) -> list[SlashRecord]:
        f = self.contract.functions
        return [
            SlashRecord(
                index=i,
                run=r[0],
                worker=_address(r[1]),
                validator=_address(r[2]),
                requested_gwei=r[3],
                taken_gwei=r[4],
                submission_digest=bytes(r[5]),
                failing_chunks=tuple(r[6]),
                reason_code=r[7],
                epoch=r[8],
                ejected=r[9],
            )
            for i, r in enumerate(self._pages(f.slash_count, f.get_slashes))
        ]

    def slashes(self, node: bytes | None = None) -> list[SlashRecord]:
        return filter_slashes(self._all_slashes(), node)

    def is_eligible(self, address: bytes) -> bool:
        return bool(self.contract.functions.is_eligible(format_address(address)).call())

    def snapshot(self) -> Snapshot:
        rows = self._node_rows()
        return Snapshot(
            epoch=self.current_epoch(),
            nodes=tuple(self._node_info(r) for r in rows),
            stakes=tuple(self._stake_info(r) for r in rows),
            contributions=tuple(self._all_contributions()),
            slashes=tuple(self._all_slashes()),
        )


def _validate(op: object) -> None:
    """The codec's field rules (pattern, ranges), as the signed log applies them when it signs."""
    try:
        validate(op)
    except Reject as exc:
        raise MalformedOperation(exc.detail) from None
