"""Typed verdicts on input from a peer.

`Reject` means the peer is at fault (malformed, forged, provably wrong): it feeds peer scoring and,
for rollouts, slashing evidence. `Ignore` means nobody is provably at fault (a duplicate, a replay by a
third party, stale, not for us): drop it quietly. Codes are grouped by class so a peer can be told
exactly why, and a slash can cite it.
"""

from __future__ import annotations

from enum import IntEnum


class Reason(IntEnum):
    # 2xx: ignored, nobody provably at fault
    DUPLICATE = 201
    REPLAYED_SEQ = 202
    STALE = 203
    WRONG_RUN = 204
    NOT_FOR_US = 205
    CLOCK_SKEW = 206
    JUDGE_FAULT = 207  # the validator failed to judge an item (its fault, or an engine's): quarantined
    BUSY = 208  # the peer's share of a protocol's slots or of a queue is full: try again later
    # 4xx: malformed bytes
    UNDECODABLE = 400
    TRAILING_BYTES = 401
    OVERSIZED = 402
    UNKNOWN_TYPE = 403
    UNKNOWN_FIELD = 404
    MISSING_FIELD = 405
    FIELD_ORDER = 406
    WRONG_FIELD_TYPE = 407
    OUT_OF_RANGE = 408
    UNSUPPORTED_VERSION = 409
    NON_CANONICAL = 410
    TYPE_MISMATCH = 411
    # 5xx: authentication
    BAD_SIGNATURE = 500
    WRONG_SENDER = 501
    UNAUTHORISED = 502  # authentic, but the signer has no authority for this topic or request
    BANNED = 503  # the peer is banned: nothing it sends is read
    # 6xx: well-formed and authentic, but breaks a protocol rule (later layers: stake, proofs, tasks)
    RULE_VIOLATION = 600
    NOT_STAKED = 601
    BAD_ASSIGNMENT = 602
    BAD_REWARD = 603
    BAD_TERMINATION = 604
    BAD_PROOF = 605
    BAD_SAMPLING = 606
    UNKNOWN_CHECKPOINT = 607
    BAD_HASH = 608
    MALFORMED_ROLLOUT = 609  # a field outside what the run allows (vocabulary, lengths, byte sizes, ranges)
    ASSIGNMENT_REUSED = 610  # a second, different submission for one (run, worker, step) assignment
    FABRICATED_ENV_TURN = 611  # an environment turn the environment, replayed, does not say
    # 7xx: ledger operations refused by the state machine (spec/ledger.md)
    UNKNOWN_NODE = 701
    ALREADY_REGISTERED = 702
    NODE_EJECTED = 703
    WRONG_ROLE = 704
    INSUFFICIENT_STAKE = 705
    INVALID_AMOUNT = 706
    STILL_UNBONDING = 707
    NOTHING_TO_WITHDRAW = 708
    DUPLICATE_CONTRIBUTION = 709
    INVALID_EVIDENCE = 710
    DUPLICATE_SLASH = 711
    BAD_LEDGER_SIGNATURE = 712
    REPLAYED_OPERATION = 713
    EPOCH_REGRESSION = 714
    WRONG_LEDGER = 715
    MALFORMED_OPERATION = 716
    UNKNOWN_RUN = 717
    RUN_EXISTS = 718
    NOT_RUN_OWNER = 719
    NOT_RUN_VALIDATOR = 721
    EXCEEDS_RUN_BOUNDS = 722
    PEER_ID_MISMATCH = 723
    SLASH_NOT_PENDING = 724
    CHALLENGE_WINDOW_OPEN = 725
    CHALLENGE_WINDOW_CLOSED = 726
    ALREADY_VOTED = 727
    SLASH_PENDING = 728
    CORRUPT_LOG = 720
    BACKEND_ERROR = 730

    @property
    def error_class(self) -> str:
        return {2: "ignore", 4: "malformed", 5: "authentication", 6: "rule", 7: "ledger"}[self.value // 100]


class ProtocolError(Exception):
    """Base of the two verdict errors; carries a machine-readable reason and a human detail."""

    verdict = "error"

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(f"{self.verdict} {reason.value} {reason.name}: {detail}")
        self.reason = reason
        self.detail = detail


class Reject(ProtocolError):
    """The sender is at fault; count it against the peer."""

    verdict = "reject"


class Ignore(ProtocolError):
    """Drop without blame: duplicate, third-party replay, stale, or not addressed to us."""

    verdict = "ignore"
