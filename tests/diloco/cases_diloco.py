"""Conformance cases for DiLoCo between trainers: the run, contributions, votes, outer states, the
contributor-set rule, lineage and join choice, HTTP routes; for RL runs with several trainers, the
rollout split and the plan's fit with the run descriptor.

The `diloco` suite of node/conformance.py: scripts/gen_vectors.py writes `SUITES` to
spec/vectors/diloco/*.json; tests/diloco/test_vectors.py fails when the committed files and these cases
disagree, and replays the files. Invalid cases outnumber valid ones: the reasons are the contract.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from safetensors.torch import save

from swarmnode.crypto.hashing import sha256
from swarmnode.crypto.merkle import merkle_root
from swarmnode.node.diloco.compression import Compressor
from swarmnode.node.diloco.conformance import check_payload_case
from swarmnode.protocol.codec import encode
from swarmnode.protocol.diloco import (
    ZERO_DIGEST,
    contribution_namespace,
    contribution_path,
    outer_namespace,
    outer_path,
    plan_digest,
    plan_path,
    vote_path,
)
from swarmnode.protocol.diloco_conformance import (
    check_contribution_case,
    check_decide_case,
    check_join_case,
    check_lineage_case,
    check_outer_case,
    check_owner_case,
    check_rl_plan_case,
    check_route_case,
    check_run_case,
    check_vote_case,
)
from swarmnode.protocol.envelope import MAX_CLOCK_SKEW_MS, seal
from swarmnode.protocol.messages import (
    CheckpointManifest,
    DilocoContribution,
    DilocoEntry,
    DilocoOuterState,
    DilocoRun,
    DilocoVote,
    FileDigest,
    RunDescriptor,
    ShardInfo,
)
from tests.conformance.keys import NOW_MS, RUN, vector_identity
from tests.conformance.samples import grpo_params, validator_policy

Vector = dict[str, Any]
A, B = sorted((vector_identity(1), vector_identity(2)), key=lambda k: k.address)
OUTSIDER, OWNER = vector_identity(3), vector_identity(4)
CONFIG = sha256(b"model-config")
THETA = [sha256(f"theta-{r}".encode()) for r in range(8)]
ROUND = 3


def _h(data: bytes) -> str:
    return "0x" + data.hex()


def _d(label: str) -> bytes:
    return sha256(label.encode())


def _case(
    name: str, kind: str, inp: dict[str, Any], check: Callable[[dict[str, Any]], dict[str, Any]]
) -> Vector:
    return {"name": name, "kind": kind, "input": inp, "expect": check(inp)}


def _plan(**changes: Any) -> DilocoRun:
    fields: dict[str, Any] = dict(
        run=RUN,
        trainers=(A.address, B.address),
        model_config_hash=CONFIG,
        initial_digest=THETA[0],
        rounds=5,
        inner_steps=50,
        inner_lr=1e-3,
        outer_lr=0.7,
        outer_momentum=0.9,
        nesterov=True,
        compression="fp16",
        collect_timeout_ms=30_000,
        vote_timeout_ms=30_000,
        created_ms=NOW_MS - 60_000,
    )
    fields.update(changes)
    return DilocoRun(**fields)


PLAN = _plan()
DIGEST = plan_digest(PLAN)


def _sealed(message: Any, identity: Any, ts: int = NOW_MS, run: str = RUN) -> bytes:
    return seal(identity, message, run=run, seq=21, ts=ts)


def _manifest(
    namespace: str, version: int, signer: Any = None, **changes: Any
) -> tuple[CheckpointManifest, bytes]:
    shards = tuple(
        ShardInfo(f"shard-{i + 1:05d}-of-00002.safetensors", 4000 + i, _d(f"{namespace}-{version}-{i}"))
        for i in range(2)
    )
    fields: dict[str, Any] = dict(
        run=namespace,
        version=version,
        parent_version=max(version - 1, 0),
        model_config_hash=CONFIG,
        total_size=sum(s.size for s in shards),
        shards=shards,
        merkle_root=merkle_root([s.sha256 for s in shards]),
        created_ms=NOW_MS - 1000,
    )
    fields.update(changes)
    manifest = CheckpointManifest(**fields)
    return manifest, _sealed(manifest, signer or A, ts=NOW_MS - 1000, run=namespace)


def _contribution(author: Any = A, **changes: Any) -> DilocoContribution:
    index = PLAN.trainers.index(author.address) if author.address in PLAN.trainers else 0
    manifest, envelope = _manifest(contribution_namespace(RUN, index), ROUND, author)
    fields: dict[str, Any] = dict(
        run=RUN,
        round=ROUND,
        trainer=author.address,
        plan=DIGEST,
        base=THETA[ROUND],
        compression="fp16",
        merkle_root=manifest.merkle_root,
        manifest=envelope,
    )
    fields.update(changes)
    return DilocoContribution(**fields)


def _message_input(envelope: bytes, **extra: Any) -> dict[str, Any]:
    return {
        "run": RUN,
        "owner": _h(OWNER.address),
        "plan": _h(_sealed(PLAN, OWNER, ts=PLAN.created_ms)),
        "now_ms": NOW_MS,
        "envelope": _h(envelope),
        **extra,
    }


# --- the run -------------------------------------------------------------------------------------


def run_cases() -> Iterator[Vector]:
    def case(name: str, envelope: bytes, now_ms: int = NOW_MS, run: str = RUN) -> Vector:
        inp = {"run": run, "owner": _h(OWNER.address), "now_ms": now_ms, "envelope": _h(envelope)}
        return _case(f"run/{name}", "diloco-run", inp, check_run_case)

    yield case("valid", _sealed(PLAN, OWNER))
    yield case("valid-one-trainer", _sealed(_plan(trainers=(B.address,)), OWNER))
    yield case("valid-old-timestamp", _sealed(PLAN, OWNER), now_ms=NOW_MS + 30 * MAX_CLOCK_SKEW_MS)
    yield case("invalid-signed-by-a-trainer", _sealed(PLAN, A))
    yield case("invalid-no-trainers", _sealed(_plan(trainers=()), OWNER))
    yield case("invalid-trainers-unsorted", _sealed(_plan(trainers=(B.address, A.address)), OWNER))
    yield case("invalid-trainer-twice", _sealed(_plan(trainers=(A.address, A.address)), OWNER))
    long_run = "r" * 60
    yield case("invalid-run-id-too-long", _sealed(_plan(run=long_run), OWNER, run=long_run), run=long_run)
    yield case("invalid-body-run-differs", _sealed(_plan(run="other-run"), OWNER))
    yield case("invalid-momentum-1", _sealed(_plan(outer_momentum=1.0), OWNER))
    yield case("invalid-outer-lr-0", _sealed(_plan(outer_lr=0.0), OWNER))
    yield case("ignore-other-run", _sealed(_plan(run="other-run"), OWNER, run="other-run"))
    yield case("ignore-from-the-future", _sealed(PLAN, OWNER, ts=NOW_MS + 2 * MAX_CLOCK_SKEW_MS))
    flipped = bytearray(_sealed(PLAN, OWNER))
    flipped[-10] ^= 1
    yield case("invalid-tampered-signature", bytes(flipped))


# --- contributions -------------------------------------------------------------------------------


def contribution_cases() -> Iterator[Vector]:
    def case(name: str, envelope: bytes, round: int = ROUND, base: bytes | None = THETA[ROUND]) -> Vector:
        inp = _message_input(envelope, round=round, base=None if base is None else _h(base))
        return _case(f"contribution/{name}", "diloco-contribution", inp, check_contribution_case)

    yield case("valid", _sealed(_contribution(), A))
    yield case("valid-second-trainer", _sealed(_contribution(B), B))
    yield case("valid-base-not-checked", _sealed(_contribution(base=THETA[4]), A), base=None)
    yield case("invalid-from-a-non-trainer", _sealed(_contribution(OUTSIDER), OUTSIDER))
    yield case("invalid-names-another-trainer", _sealed(_contribution(trainer=B.address), A))
    yield case("ignore-past-round", _sealed(_contribution(), A), round=ROUND + 1)
    yield case("ignore-future-round", _sealed(_contribution(), A), round=ROUND - 1)
    yield case("ignore-another-base", _sealed(_contribution(base=THETA[4]), A))
    yield case("ignore-another-plan", _sealed(_contribution(plan=_d("other-plan")), A))
    yield case("invalid-body-run-differs", _sealed(_contribution(run="other-run"), A))
    yield case("invalid-compression-differs", _sealed(_contribution(compression="int8"), A))
    yield case("invalid-merkle-root-differs", _sealed(_contribution(merkle_root=_d("another-root")), A))
    _, foreign = _manifest(contribution_namespace(RUN, 0), ROUND, B)
    yield case("invalid-manifest-signed-by-another", _sealed(_contribution(manifest=foreign), A))
    _, wrong_ns = _manifest(outer_namespace(RUN, 0), ROUND, A)
    yield case("invalid-manifest-of-another-namespace", _sealed(_contribution(manifest=wrong_ns), A))
    _, other_version = _manifest(contribution_namespace(RUN, 0), ROUND + 1, A)
    manifest, _ = _manifest(contribution_namespace(RUN, 0), ROUND + 1, A)
    yield case(
        "invalid-manifest-of-another-round",
        _sealed(_contribution(manifest=other_version, merkle_root=manifest.merkle_root), A),
    )
    bad, bad_root = _manifest(contribution_namespace(RUN, 0), ROUND, A, merkle_root=_d("lie"))
    yield case(
        "invalid-manifest-root-not-over-shards",
        _sealed(_contribution(manifest=bad_root, merkle_root=bad.merkle_root), A),
    )
    _, other_config = _manifest(contribution_namespace(RUN, 0), ROUND, A, model_config_hash=_d("other"))
    yield case("invalid-manifest-other-model", _sealed(_contribution(manifest=other_config), A))
    yield case("ignore-from-the-future", _sealed(_contribution(), A, ts=NOW_MS + 2 * MAX_CLOCK_SKEW_MS))
    flipped = bytearray(_sealed(_contribution(), A))
    flipped[-10] ^= 1
    yield case("invalid-tampered-signature", bytes(flipped))


# --- votes ---------------------------------------------------------------------------------------


def _vote(**changes: Any) -> DilocoVote:
    fields: dict[str, Any] = dict(
        run=RUN,
        round=ROUND,
        plan=DIGEST,
        base=THETA[ROUND],
        entries=(DilocoEntry(A.address, _d("ca")), DilocoEntry(B.address, _d("cb"))),
    )
    fields.update(changes)
    return DilocoVote(**fields)


def vote_cases() -> Iterator[Vector]:
    def case(name: str, envelope: bytes, round: int = ROUND, base: bytes | None = THETA[ROUND]) -> Vector:
        inp = _message_input(envelope, round=round, base=None if base is None else _h(base))
        return _case(f"vote/{name}", "diloco-vote", inp, check_vote_case)

    yield case("valid", _sealed(_vote(), A))
    yield case("valid-only-own", _sealed(_vote(entries=(DilocoEntry(B.address, _d("cb")),)), B))
    yield case("invalid-from-a-non-trainer", _sealed(_vote(), OUTSIDER))
    yield case("invalid-without-own-entry", _sealed(_vote(entries=(DilocoEntry(B.address, _d("cb")),)), A))
    unsorted = (DilocoEntry(B.address, _d("cb")), DilocoEntry(A.address, _d("ca")))
    yield case("invalid-entries-unsorted", _sealed(_vote(entries=unsorted), A))
    twice = (DilocoEntry(A.address, _d("ca")), DilocoEntry(A.address, _d("ca2")))
    yield case("invalid-author-twice", _sealed(_vote(entries=twice), A))
    outsider = (DilocoEntry(A.address, _d("ca")), DilocoEntry(OUTSIDER.address, _d("co")))
    yield case(
        "invalid-names-a-non-trainer",
        _sealed(_vote(entries=tuple(sorted(outsider, key=lambda e: e.trainer))), A),
    )
    yield case("ignore-past-round", _sealed(_vote(), A), round=ROUND + 1)
    yield case("ignore-another-base", _sealed(_vote(base=THETA[4]), A))
    yield case("ignore-another-plan", _sealed(_vote(plan=_d("other-plan")), A))


# --- outer states --------------------------------------------------------------------------------


def _outer(signer: Any = A, round: int = 4, **changes: Any) -> DilocoOuterState:
    index = PLAN.trainers.index(signer.address) if signer.address in PLAN.trainers else 0
    manifest, envelope = _manifest(outer_namespace(RUN, index), round, signer)
    fields: dict[str, Any] = dict(
        run=RUN,
        round=round,
        plan=DIGEST,
        theta=THETA[round],
        parent=THETA[round - 1] if round else ZERO_DIGEST,
        contributors=()
        if round == 0
        else (DilocoEntry(A.address, _d("ca")), DilocoEntry(B.address, _d("cb"))),
        merkle_root=manifest.merkle_root,
        manifest=envelope,
    )
    fields.update(changes)
    return DilocoOuterState(**fields)


def outer_cases() -> Iterator[Vector]:
    def case(name: str, envelope: bytes) -> Vector:
        return _case(f"outer/{name}", "diloco-outer", _message_input(envelope), check_outer_case)

    yield case("valid", _sealed(_outer(), A))
    yield case("valid-round-0", _sealed(_outer(B, 0), B))
    yield case("valid-skipped-round", _sealed(_outer(theta=THETA[3], parent=THETA[3], contributors=()), A))
    yield case("valid-last-round", _sealed(_outer(round=5), A))
    yield case("invalid-from-a-non-trainer", _sealed(_outer(OUTSIDER), OUTSIDER))
    yield case("invalid-past-the-last-round", _sealed(_outer(round=6), A))
    yield case("invalid-round-0-other-theta", _sealed(_outer(B, 0, theta=THETA[1]), B))
    yield case("invalid-round-0-with-contributors", _sealed(_outer(B, 0, contributors=_vote().entries), B))
    yield case("invalid-nothing-averaged-theta-moved", _sealed(_outer(contributors=()), A))
    unsorted = (DilocoEntry(B.address, _d("cb")), DilocoEntry(A.address, _d("ca")))
    yield case("invalid-contributors-unsorted", _sealed(_outer(contributors=unsorted), A))
    _, wrong_ns = _manifest(contribution_namespace(RUN, 0), 4, A)
    yield case("invalid-manifest-of-the-contribution-namespace", _sealed(_outer(manifest=wrong_ns), A))
    yield case("invalid-merkle-root-differs", _sealed(_outer(merkle_root=_d("another-root")), A))
    yield case("ignore-another-plan", _sealed(_outer(plan=_d("other-plan")), A))


# --- the contributor set -------------------------------------------------------------------------


def decide_cases() -> Iterator[Vector]:
    t = [_h(k.address) for k in sorted((A, B, OUTSIDER, OWNER), key=lambda k: k.address)]
    c = {x: _h(_d(f"c-{x}")) for x in t}

    def e(*who: str) -> list[list[str]]:
        return [[x, c[x]] for x in sorted(who)]

    def case(name: str, me: str, own: list[list[str]], votes: dict[str, list[list[str]]]) -> Vector:
        inp = {"me": me, "own": own, "votes": votes}
        return _case(f"decide/{name}", "diloco-decide", inp, check_decide_case)

    yield case("all-agree", t[0], e(*t[:3]), {t[1]: e(*t[:3]), t[2]: e(*t[:3])})
    yield case("alone-keeps-its-holdings", t[0], e(t[0], t[1]), {})
    yield case("alone-without-others", t[0], e(t[0]), {})
    yield case("late-author-left-out-by-itself", t[2], e(*t[:3]), {t[0]: e(t[0], t[1]), t[1]: e(t[0], t[1])})
    yield case("late-author-left-out-by-others", t[0], e(t[0], t[1]), {t[1]: e(t[0], t[1])})
    yield case("held-by-one-voter-counts-for-all", t[1], e(t[0], t[1]), {t[0]: e(t[0], t[1], t[3])})
    yield case("crashed-after-contributing", t[0], e(t[0], t[1], t[3]), {t[1]: e(t[0], t[1])})
    yield case("early-trainer-hears-the-late-ones", t[0], e(t[0]), {t[1]: e(*t[:3]), t[2]: e(*t[:3])})
    yield case("late-but-held-by-a-slower-peer", t[0], e(t[0], t[1]), {t[1]: e(t[0], t[1], t[2])})
    equivocated = [[t[1], _h(_d("second-contribution"))]]
    yield case(
        "equivocating-author-dropped", t[0], e(t[0], t[1], t[2]), {t[2]: sorted(e(t[0], t[2]) + equivocated)}
    )
    yield case(
        "own-vote-ignored-in-votes", t[0], e(t[0], t[1]), {t[0]: e(t[0], t[1], t[2]), t[1]: e(t[0], t[1])}
    )


def lineage_cases() -> Iterator[Vector]:
    t = [_h(k.address) for k in (A, B, OUTSIDER, OWNER)]
    mine, other = _h(THETA[3]), _h(THETA[4])
    small, large = sorted((mine, other))

    def case(name: str, mine: str, support: dict[str, list[str]]) -> Vector:
        return _case(
            f"lineage/{name}", "diloco-lineage", {"mine": mine, "support": support}, check_lineage_case
        )

    yield case("only-ours", mine, {mine: [t[0]]})
    yield case("ours-has-more", mine, {mine: t[:3], other: [t[3]]})
    yield case("theirs-has-more", mine, {mine: [t[0]], other: t[1:3]})
    yield case("tie-to-smaller-digest-ours", small, {small: [t[0]], large: [t[1]]})
    yield case("tie-to-smaller-digest-theirs", large, {large: [t[0]], small: [t[1]]})
    yield case("ours-counted-even-if-absent", mine, {other: [t[1]]})


def join_cases() -> Iterator[Vector]:
    t = [_h(k.address) for k in (A, B, OUTSIDER)]

    def offer(sender: str, round: int, theta: bytes) -> dict[str, Any]:
        return {"sender": sender, "round": round, "theta": _h(theta)}

    def case(name: str, offers: list[dict[str, Any]]) -> Vector:
        return _case(f"join/{name}", "diloco-join", {"offers": offers}, check_join_case)

    yield case("none", [])
    yield case("newest-round", [offer(t[0], 3, THETA[3]), offer(t[1], 4, THETA[4])])
    yield case(
        "majority-theta", [offer(t[0], 4, THETA[4]), offer(t[1], 4, THETA[5]), offer(t[2], 4, THETA[5])]
    )
    small, large = sorted((THETA[4], THETA[5]))
    yield case("tie-to-smaller-digest", [offer(t[0], 4, large), offer(t[1], 4, small)])


def route_cases() -> Iterator[Vector]:
    trainer = A.address
    for name, target in [
        ("plan", plan_path(RUN)),
        ("outer", outer_path(RUN)),
        ("outer-poll", outer_path(RUN, 6, 20)),
        ("outer-wait-only", outer_path(RUN, None, 5)),
        ("outer-poll-capped", outer_path(RUN, 6, 900)),
        ("contribution", contribution_path(RUN, 3, trainer)),
        ("contribution-poll", contribution_path(RUN, 3, trainer, 10)),
        ("vote-poll", vote_path(RUN, 3, 10)),
        ("unknown-uppercase-trainer", f"/diloco/1.0.0/{RUN}/3/contribution/{trainer.hex().upper()}"),
        ("unknown-short-trainer", f"/diloco/1.0.0/{RUN}/3/contribution/{trainer.hex()[:38]}"),
        ("unknown-leading-zero", f"/diloco/1.0.0/{RUN}/03/vote"),
        ("unknown-round-2^64", f"/diloco/1.0.0/{RUN}/18446744073709551616/vote"),
        ("unknown-after-on-vote", f"/diloco/1.0.0/{RUN}/3/vote?after=1&wait=1"),
        ("unknown-query-on-plan", plan_path(RUN) + "?wait=1"),
        ("unknown-empty-query", vote_path(RUN, 3) + "?"),
        ("unknown-prefix", f"/diloco/2.0.0/{RUN}/plan"),
    ]:
        yield _case(f"route/{name}", "diloco-route", {"target": target, "max_wait_s": 30}, check_route_case)


# --- RL runs with several trainers ---------------------------------------------------------------

# In descriptor order (lead first), which is not address order: the split follows the order given.
RL_TRAINERS = tuple(vector_identity(n).address for n in (5, 6, 7, 8))


def owner_cases() -> Iterator[Vector]:
    def case(name: str, digest: bytes, trainers: tuple[bytes, ...]) -> Vector:
        inp = {"digest": _h(digest), "trainers": [_h(t) for t in trainers]}
        return _case(f"owner/{name}", "diloco-owner", inp, check_owner_case)

    t = RL_TRAINERS
    for n in range(1, 5):
        for i in range(3):
            yield case(f"submission-{i}-of-{n}-trainers", _d(f"submission-{i}"), t[:n])
    yield case("zero-digest", bytes(32), t[:3])
    high = bytes([0x80]) + bytes(31)  # 2^63: 2 mod 3 (read as signed, -2^63 would give 1 or -2)
    yield case("high-bit-set", high, t[:3])
    ones = bytes([0xFF] * 8) + bytes(24)  # 2^64 - 1: 0 mod 3, 3 mod 4 (read as signed, -1)
    yield case("all-ones-prefix-of-3", ones, t[:3])
    yield case("all-ones-prefix-of-4", ones, t[:4])
    one = bytes(7) + b"\x01" + bytes(24)  # big-endian 1 (little-endian 2^56, 0 mod 4)
    yield case("big-endian", one, t[:4])
    yield case("only-the-first-8-bytes", bytes(8) + bytes([0xFF] * 24), t[:3])
    yield case("order-as-given", _d("submission-1"), t[:2])
    yield case("order-as-given-reversed", _d("submission-1"), t[1::-1])
    yield case("no-trainers", _d("submission-1"), ())


def _descriptor(**changes: Any) -> RunDescriptor:
    fields: dict[str, Any] = dict(
        run=RUN,
        trainer=RL_TRAINERS[0],
        model_config_hash=CONFIG,
        tokenizer_files=(FileDigest("tokenizer.json", _d("tokenizer.json")),),
        base_checkpoint_hash=_d("base"),
        dataset_hash=_d("dataset"),
        task_kind="arithmetic",
        grpo=grpo_params(),
        async_level=2,
        policy=validator_policy(),
        created_ms=NOW_MS - 10_000,
        co_trainers=RL_TRAINERS[1:3],
    )
    fields.update(changes)
    return RunDescriptor(**fields)


def rl_plan_cases() -> Iterator[Vector]:
    lr = grpo_params().learning_rate

    def plan(*trainers: bytes, **changes: Any) -> DilocoRun:
        return _plan(**{"trainers": tuple(sorted(trainers)), "inner_lr": lr, **changes})

    def case(name: str, plan: DilocoRun, descriptor: RunDescriptor) -> Vector:
        inp = {"plan": _h(encode(plan)), "descriptor": _h(encode(descriptor))}
        return _case(f"rl-plan/{name}", "diloco-rl-plan", inp, check_rl_plan_case)

    lead, co1, co2, other = RL_TRAINERS
    three = plan(lead, co1, co2)
    yield case("valid", three, _descriptor())
    yield case("valid-one-co-trainer", plan(lead, co1), _descriptor(co_trainers=(co1,)))
    yield case("valid-lead-alone", plan(lead), _descriptor(co_trainers=()))
    yield case("invalid-other-run", plan(lead, co1, co2, run="other-run"), _descriptor())
    yield case("invalid-trainer-set-mismatch", plan(lead, co1, other), _descriptor())
    yield case("invalid-missing-co-trainer", plan(lead, co1), _descriptor())
    yield case("invalid-extra-trainer", plan(lead, co1, co2, other), _descriptor())
    yield case("invalid-without-the-lead", plan(co1, co2), _descriptor())
    yield case(
        "invalid-descriptor-repeats-a-co-trainer", plan(lead, co1), _descriptor(co_trainers=(co1, co1))
    )
    yield case("invalid-other-model-hash", plan(lead, co1, co2, model_config_hash=_d("other")), _descriptor())
    yield case("invalid-inner-lr-differs", plan(lead, co1, co2, inner_lr=2 * lr), _descriptor())
    yield case(
        "invalid-inner-lr-one-ulp-off", plan(lead, co1, co2, inner_lr=math.nextafter(lr, 1.0)), _descriptor()
    )


def payload_cases() -> Iterator[Vector]:
    """A peer's pseudo-gradient against the run's elementwise bound DELTA_STEP_BOUND x H x inner_lr, in each
    compression. H = 64 and inner_lr = 2^-10 make the bound exactly 0.5 in float32 and float64, so the
    cases at it and one float32 step above it are exact."""
    just_above = float(torch.nextafter(torch.tensor(0.5), torch.tensor(1.0)))

    def case(name: str, compression: str, values: list[float]) -> Vector:
        delta = {"layer.weight": torch.tensor([values], dtype=torch.float32), "layer.bias": torch.zeros(2)}
        payload = Compressor(compression).compress(delta)
        plan = _plan(compression=compression, inner_steps=64, inner_lr=2**-10)
        inp = {"plan": _h(encode(plan)), "payload": _h(save(payload))}
        return _case(f"payload/{name}", "diloco-payload", inp, check_payload_case)

    yield case("valid-none-at-the-bound", "none", [0.5, -0.25, 0.0])
    yield case("valid-fp16-inside", "fp16", [0.25, -0.125, 0.0625])
    yield case("valid-int8-at-the-bound", "int8", [0.5, -0.25, 0.0])
    yield case("invalid-none-one-float32-step-above", "none", [just_above, 0.0, 0.0])
    yield case("invalid-none-one-element-1e6", "none", [0.1, 1e6, 0.0])
    yield case("invalid-none-3e38", "none", [3e38, 0.0, 0.0])
    yield case("invalid-fp16-1e4", "fp16", [0.0, 0.0, -1e4])
    yield case("invalid-int8-scaled-huge", "int8", [1e6, -5e5, 0.0])


SUITES: dict[str, Callable[[], Iterator[Vector]]] = {
    "diloco-run": run_cases,
    "diloco-contribution": contribution_cases,
    "diloco-vote": vote_cases,
    "diloco-outer": outer_cases,
    "diloco-decide": decide_cases,
    "diloco-lineage": lineage_cases,
    "diloco-join": join_cases,
    "diloco-route": route_cases,
    "diloco-owner": owner_cases,
    "diloco-rl-plan": rl_plan_cases,
    "diloco-payload": payload_cases,
}
