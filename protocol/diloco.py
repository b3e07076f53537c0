"""Pure rules of DiLoCo between trainers (spec/diloco.md is the normative twin).

What every trainer of a DiLoCo run must agree on, without I/O: the checks a signed `DilocoRun`,
`DilocoContribution`, `DilocoVote` and `DilocoOuterState` must pass, the store namespaces their shards
live in, the rule that turns the votes into the round's contributor set, which lineage wins when trainers
diverged, which outer state a (re)joining trainer adopts, and the HTTP paths. Time, the run and the
node's own state arrive as arguments.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from swarmnode.crypto.hashing import sha256
from swarmnode.protocol.codec import decode, encode
from swarmnode.protocol.envelope import Envelope, envelope_digest, open_envelope
from swarmnode.protocol.errors import Ignore, Reason, Reject
from swarmnode.protocol.messages import (
    CheckpointManifest,
    DilocoContribution,
    DilocoEntry,
    DilocoOuterState,
    DilocoRun,
    DilocoVote,
    RunDescriptor,
)
from swarmnode.protocol.runs import run_trainers
from swarmnode.protocol.shards import verify_manifest

# --- parameters (spec/diloco.md, Parameters) -----------------------------------------------------

PATH_PREFIX = "/diloco/1.0.0"
MAX_TRAINERS = 256
MAX_RUN_LEN = 59  # the run id plus ".t255" must still be a run id (64 characters)
KEEP_ROUNDS = 3  # rounds whose contributions and votes a trainer keeps serving
ZERO_DIGEST = bytes(32)
# An AdamW step moves a weight by lr * |m_hat / sqrt(v_hat)| plus lr * weight_decay * |w|. m_hat and v_hat
# are averages of the gradients and their squares with weights w_k = (1 - b1) b1^k and u_k = (1 - b2) b2^k,
# so by Cauchy-Schwarz, whatever the gradients, |m_hat / sqrt(v_hat)| <= sqrt(sum w_k^2 / u_k)
# = (1 - b1) / sqrt((1 - b2)(1 - b1^2 / b2)): 1.17 at betas (0.9, 0.95), 7.27 at torch's default (0.9, 0.999).
# So H honest inner steps move no weight by more than 8 H inner_lr, typical ones by far less; a finite 1e6
# (what made every logit equal) is refused.
DELTA_STEP_BOUND = 8


def max_delta_element(inner_steps: int, inner_lr: float) -> float:
    """The largest |x| any element of a contribution's pseudo-gradient may hold (spec/diloco.md, Weights):
    elementwise, so a sharded trainer checks its own tensors with no reduction and all trainers agree."""
    return DELTA_STEP_BOUND * inner_steps * inner_lr


def _rule(detail: str) -> Reject:
    return Reject(Reason.RULE_VIOLATION, detail)


# --- the run -------------------------------------------------------------------------------------


def plan_digest(plan: DilocoRun) -> bytes:
    """sha256 of the canonical `DilocoRun` body: what every contribution, vote and outer state names."""
    return sha256(encode(plan))


def check_plan(plan: DilocoRun) -> None:
    """Raise Reject unless the run is one trainers can follow (the codec already checked field types)."""
    if len(plan.run) > MAX_RUN_LEN:
        raise _rule(f"a DiLoCo run id has at most {MAX_RUN_LEN} characters, {plan.run!r} has {len(plan.run)}")
    if not plan.trainers:
        raise _rule("a DiLoCo run names at least one trainer")
    if any(a >= b for a, b in zip(plan.trainers, plan.trainers[1:], strict=False)):
        raise _rule("trainers must be listed in strictly ascending address order")
    if not (plan.inner_lr > 0 and plan.outer_lr > 0):
        raise _rule("inner_lr and outer_lr must be positive")
    if not 0 <= plan.outer_momentum < 1:
        raise _rule(f"outer_momentum {plan.outer_momentum} outside [0, 1)")


def _open_at_rest(data: bytes, run: str, expect: type, now_ms: int) -> tuple[bytes, object]:
    """Open an envelope that may be re-served long after signing (refuse only a future timestamp)."""
    freshness_ref = min(now_ms, decode(Envelope, data).ts)
    opened = open_envelope(data, run=run, now_ms=freshness_ref, replay=None, expect=expect)
    return opened.sender, opened.message


def verify_plan(data: bytes, *, run: str, owner: bytes, now_ms: int) -> DilocoRun:
    """Open a `DilocoRun` envelope; trusted only when the run's owner (pinned by the operator) signed it."""
    sender, message = _open_at_rest(data, run, DilocoRun, now_ms)
    if sender != owner:
        raise Reject(Reason.WRONG_SENDER, f"run signed by 0x{sender.hex()}, not the owner 0x{owner.hex()}")
    plan: DilocoRun = message  # type: ignore[assignment]
    if plan.run != run:
        raise _rule(f"run body names {plan.run!r}, envelope {run!r}")
    check_plan(plan)
    return plan


def trainer_index(plan: DilocoRun, address: bytes) -> int:
    """The trainer's position in the run; Reject a signer the run does not name."""
    try:
        return plan.trainers.index(address)
    except ValueError:
        raise Reject(Reason.WRONG_SENDER, f"0x{address.hex()} is not a trainer of run {plan.run!r}") from None


# --- RL runs with several trainers ---------------------------------------------------------------


def check_rl_plan(plan: DilocoRun, descriptor: RunDescriptor) -> None:
    """The DiLoCo plan of an RL run must name exactly the descriptor's trainers and its model.

    The inner steps are the run's GRPO steps, so the plan's inner learning rate is the run's.
    """
    trainers = run_trainers(descriptor)
    if plan.run != descriptor.run:
        raise Reject(
            Reason.WRONG_RUN, f"the plan is for run {plan.run!r}, the descriptor for {descriptor.run!r}"
        )
    if sorted(plan.trainers) != sorted(trainers) or len(set(trainers)) != len(trainers):
        raise _rule("the plan's trainers are not the run descriptor's trainer and co-trainers")
    if plan.model_config_hash != descriptor.model_config_hash:
        raise _rule("the plan names another model than the run descriptor")
    if plan.inner_lr != descriptor.grpo.learning_rate:
        raise _rule(
            f"the plan's inner_lr {plan.inner_lr} is not the run's GRPO learning rate "
            f"{descriptor.grpo.learning_rate}"
        )


def rollout_owner(digest: bytes, trainers: Sequence[bytes]) -> bytes:
    """The trainer whose inner steps take the accepted submission with envelope digest `digest`.

    `trainers` in the descriptor's order (lead, then co-trainers): every trainer computes the same split
    from what it pulls, so each accepted rollout is trained on exactly once across the run.
    """
    if not trainers:
        raise ValueError("a run has at least one trainer")
    return trainers[int.from_bytes(digest[:8], "big") % len(trainers)]


def contribution_namespace(run: str, index: int) -> str:
    """The shard-store run id under which trainer `index` publishes its contributions (version = round)."""
    return f"{run}.t{index}"


def outer_namespace(run: str, index: int) -> str:
    """The shard-store run id under which trainer `index` publishes its outer states (version = round)."""
    return f"{run}.o{index}"


# --- messages ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Contribution:
    sender: bytes
    message: DilocoContribution
    manifest: CheckpointManifest
    digest: bytes  # sha256 of the envelope: its name in votes

    def entry(self) -> DilocoEntry:
        return DilocoEntry(self.sender, self.digest)


@dataclass(frozen=True)
class Vote:
    sender: bytes
    message: DilocoVote
    digest: bytes


@dataclass(frozen=True)
class OuterState:
    sender: bytes
    message: DilocoOuterState
    manifest: CheckpointManifest
    digest: bytes


def _check_common(
    sender: bytes, body_run: str, body_plan: bytes, plan: DilocoRun, digest: bytes, what: str
) -> int:
    index = trainer_index(plan, sender)
    if body_run != plan.run:
        raise _rule(f"{what} body names run {body_run!r}, envelope {plan.run!r}")
    if body_plan != digest:
        raise Ignore(Reason.NOT_FOR_US, f"{what} follows another DilocoRun of {plan.run!r}")
    return index


def _check_round(got: int, want: int, what: str) -> None:
    if got < want:
        raise Ignore(Reason.STALE, f"{what} for round {got}, this round is {want}")
    if got > want:
        raise Ignore(Reason.NOT_FOR_US, f"{what} for round {got}, this round is {want}")


def check_base(got: bytes, want: bytes | None, what: str) -> None:
    """A contribution or vote computed from other outer weights belongs to another lineage: ignore it."""
    if want is not None and got != want:
        raise Ignore(Reason.NOT_FOR_US, f"{what} starts from θ {got.hex()[:16]}, ours is {want.hex()[:16]}")


def check_entries(entries: Sequence[DilocoEntry], plan: DilocoRun, what: str) -> None:
    """Entries name trainers of the run, strictly ascending (one entry per author)."""
    for entry in entries:
        if entry.trainer not in plan.trainers:
            raise _rule(f"{what} names 0x{entry.trainer.hex()}, not a trainer of the run")
    if any(a.trainer >= b.trainer for a, b in zip(entries, entries[1:], strict=False)):
        raise _rule(f"{what} entries must be strictly ascending by trainer")


def _check_manifest(
    data: bytes, namespace: str, sender: bytes, version: int, root: bytes, plan: DilocoRun, now_ms: int
) -> CheckpointManifest:
    """The embedded manifest: signed by the message's signer, for its namespace, version and root.

    Its author signed it into the message, so what would merely be ignored on its own (another run, a
    future timestamp) is the author's fault here.
    """
    try:
        manifest = verify_manifest(data, run=namespace, trainer=sender, now_ms=now_ms)
    except Ignore as verdict:
        raise _rule(f"embedded manifest: {verdict}") from None
    if manifest.version != version:
        raise _rule(f"manifest version {manifest.version}, the message says round {version}")
    if manifest.model_config_hash != plan.model_config_hash:
        raise _rule("manifest names another model config than the run")
    if manifest.merkle_root != root:
        raise Reject(Reason.BAD_HASH, "merkle_root differs from the embedded manifest's root")
    return manifest


def verify_contribution(
    data: bytes, *, plan: DilocoRun, digest: bytes, round: int, base: bytes | None = None, now_ms: int
) -> Contribution:
    """Open a contribution for `round` fetched from anyone; trusted when a trainer of the run signed it.

    `base`, when given, is our θ's content digest: a contribution from another lineage is ignored.
    """
    sender, message = _open_at_rest(data, plan.run, DilocoContribution, now_ms)
    body: DilocoContribution = message  # type: ignore[assignment]
    index = _check_common(sender, body.run, body.plan, plan, digest, "contribution")
    if body.trainer != sender:
        raise Reject(Reason.WRONG_SENDER, "contribution names another trainer than its signer")
    _check_round(body.round, round, "contribution")
    check_base(body.base, base, "contribution")
    if body.compression != plan.compression:
        raise _rule(f"contribution compressed {body.compression}, the run uses {plan.compression}")
    namespace = contribution_namespace(plan.run, index)
    manifest = _check_manifest(body.manifest, namespace, sender, body.round, body.merkle_root, plan, now_ms)
    return Contribution(sender, body, manifest, envelope_digest(data))


def verify_vote(
    data: bytes, *, plan: DilocoRun, digest: bytes, round: int, base: bytes | None = None, now_ms: int
) -> Vote:
    """Open a vote for `round`: a trainer's signed list of the contributions it held, its own among them."""
    sender, message = _open_at_rest(data, plan.run, DilocoVote, now_ms)
    body: DilocoVote = message  # type: ignore[assignment]
    _check_common(sender, body.run, body.plan, plan, digest, "vote")
    _check_round(body.round, round, "vote")
    check_base(body.base, base, "vote")
    check_entries(body.entries, plan, "vote")
    if sender not in {e.trainer for e in body.entries}:
        raise _rule("a vote names its voter's own contribution")
    return Vote(sender, body, envelope_digest(data))


def verify_outer_state(data: bytes, *, plan: DilocoRun, digest: bytes, now_ms: int) -> OuterState:
    """Open an outer state (θ and momentum at the start of a round) that a trainer of the run signed."""
    sender, message = _open_at_rest(data, plan.run, DilocoOuterState, now_ms)
    body: DilocoOuterState = message  # type: ignore[assignment]
    index = _check_common(sender, body.run, body.plan, plan, digest, "outer state")
    if body.round > plan.rounds:
        raise _rule(f"outer state for round {body.round}, the run has {plan.rounds}")
    if body.round == 0:
        if body.theta != plan.initial_digest or body.parent != ZERO_DIGEST or body.contributors:
            raise _rule("round 0 starts from the run's initial θ, with no parent and no contributors")
    elif not body.contributors and body.theta != body.parent:
        raise _rule(f"round {body.round - 1} averaged nothing, so θ must equal its parent (a skipped round)")
    check_entries(body.contributors, plan, "outer state")
    namespace = outer_namespace(plan.run, index)
    manifest = _check_manifest(body.manifest, namespace, sender, body.round, body.merkle_root, plan, now_ms)
    return OuterState(sender, body, manifest, envelope_digest(data))


# --- the round's contributor set -----------------------------------------------------------------


def decide(
    me: bytes, own: Sequence[DilocoEntry], votes: Mapping[bytes, Sequence[DilocoEntry]]
) -> tuple[DilocoEntry, ...]:
    """The contributions averaged in a round, from our vote and the votes received (same run, round, θ).

    A function of the set of ballots alone (ours among them), so trainers that saw the same votes decide
    the same. With no other vote, our own holdings. Otherwise a contribution counts when a voter other
    than its author names it: a contribution that only its (late) author holds is left out by everyone,
    and one that any voter holds is fetched from that voter by everyone. An author named with two
    different digests signed two contributions for one round: none of its entries count.
    """
    ballots: dict[bytes, tuple[DilocoEntry, ...]] = {me: tuple(own)}
    ballots.update({voter: tuple(entries) for voter, entries in votes.items() if voter != me})
    if len(ballots) == 1:
        chosen = set(own)
    else:
        chosen = {e for voter, entries in ballots.items() for e in entries if e.trainer != voter}
    digests: dict[bytes, set[bytes]] = {}
    for entries in ballots.values():
        for e in entries:
            digests.setdefault(e.trainer, set()).add(e.digest)
    equivocators = {trainer for trainer, seen in digests.items() if len(seen) > 1}
    return tuple(sorted((e for e in chosen if e.trainer not in equivocators), key=lambda e: e.trainer))


def _inverted(digest: bytes) -> bytes:
    return bytes(255 - b for b in digest)


def winning_base(mine: bytes, support: Mapping[bytes, Collection[bytes]]) -> bytes:
    """The lineage a trainer follows when trainers of one round started from different θ.

    `support` maps each θ digest seen this round (in contributions and votes) to the trainers seen on it,
    ours included. The θ with the most trainers wins, ties to the smaller digest; a trainer whose θ loses
    leaves the round and adopts an outer state of the winners.
    """
    counts = {base: len(set(trainers)) for base, trainers in support.items()}
    counts.setdefault(mine, 1)
    return max(counts, key=lambda base: (counts[base], _inverted(base)))


def choose_outer_state(offers: Sequence[tuple[bytes, int, bytes]]) -> tuple[int, bytes] | None:
    """`(round, θ digest)` a (re)joining trainer adopts from `(sender, round, θ digest)` offers, or None.

    The newest round wins; within it the θ the most trainers offer, ties to the smaller digest.
    """
    if not offers:
        return None
    senders: dict[tuple[int, bytes], set[bytes]] = {}
    for sender, round, theta in offers:
        senders.setdefault((round, theta), set()).add(sender)
    return max(senders, key=lambda key: (key[0], len(senders[key]), _inverted(key[1])))


def is_round_retained(round: int, current: int, keep: int = KEEP_ROUNDS) -> bool:
    """A trainer at round `current` keeps serving the contributions and votes of the last `keep` rounds."""
    return round + keep > current


# --- HTTP paths ----------------------------------------------------------------------------------


def _wait_query(wait_s: int) -> str:
    return f"?wait={wait_s}" if wait_s else ""


def plan_path(run: str) -> str:
    return f"{PATH_PREFIX}/{run}/plan"


def contribution_path(run: str, round: int, trainer: bytes, wait_s: int = 0) -> str:
    """A contribution the serving node holds (its own or fetched); with `wait_s`, held until it does."""
    return f"{PATH_PREFIX}/{run}/{round}/contribution/{trainer.hex()}{_wait_query(wait_s)}"


def vote_path(run: str, round: int, wait_s: int = 0) -> str:
    """The serving node's own vote for `round`; with `wait_s`, held until it has voted."""
    return f"{PATH_PREFIX}/{run}/{round}/vote{_wait_query(wait_s)}"


def outer_path(run: str, after: int | None = None, wait_s: int = 0) -> str:
    """The serving node's newest outer state; with `after`, held (up to `wait_s`) until one is newer."""
    if after is None:
        return f"{PATH_PREFIX}/{run}/outer{_wait_query(wait_s)}"
    return f"{PATH_PREFIX}/{run}/outer?after={after}&wait={wait_s}"


@dataclass(frozen=True)
class Route:
    """A parsed request target. kind: plan | outer | contribution | vote. `after` is -1 when absent."""

    kind: str
    run: str
    round: int = 0
    trainer: bytes = b""
    after: int = -1
    wait_s: int = 0


_RUN = r"[a-z0-9][a-z0-9._-]{0,63}"
_U64 = r"0|[1-9][0-9]{0,19}"
_ROUTE = re.compile(
    rf"{re.escape(PATH_PREFIX)}/(?P<run>{_RUN})/"
    rf"(?:(?P<named>plan|outer)|(?P<round>{_U64})/(?:(?P<vote>vote)|contribution/(?P<trainer>[0-9a-f]{{40}})))"
)
_WAIT = re.compile(r"wait=(?P<wait>[0-9]{1,4})")
_AFTER_WAIT = re.compile(rf"after=(?P<after>{_U64})&wait=(?P<wait>[0-9]{{1,4}})")
_U64_MAX = 2**64 - 1


def parse_route(target: str, max_wait_s: int) -> Route | None:
    """The route a request target names, or None (404). Waits are capped at `max_wait_s`."""
    path, sep, query = target.partition("?")
    match = _ROUTE.fullmatch(path)
    if match is None or (sep and not query):
        return None
    run, named = match["run"], match["named"]
    after, wait_s = -1, 0
    if query:
        if named == "plan":
            return None
        q = _AFTER_WAIT.fullmatch(query) if named == "outer" and query.startswith("after=") else None
        q = q or _WAIT.fullmatch(query)
        if q is None:
            return None
        wait_s = min(int(q["wait"]), max_wait_s)
        if "after" in q.groupdict():
            after = int(q["after"])
            if after > _U64_MAX:
                return None
    if named is not None:
        return Route(named, run, after=after, wait_s=wait_s)
    round = int(match["round"])
    if round > _U64_MAX:
        return None
    if match["vote"] is not None:
        return Route("vote", run, round, wait_s=wait_s)
    return Route("contribution", run, round, bytes.fromhex(match["trainer"]), wait_s=wait_s)
