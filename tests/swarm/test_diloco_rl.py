"""Several trainers of one RL run (node.diloco.rl): the share of accepted rollouts each trains on,
the plan's fit to the run, who may be a trainer of it, the lead's manifests a co-trainer follows, the one
HTTP endpoint, and the config keys.

Real parts throughout: secp256k1 identities, signed plans and manifests on disk, the trainer work as the
node builds it, its DiLoCo service and `Holdings`, trio for what waits. The multi-process run with a
killed co-trainer is tests/swarm/test_diloco_devnet.py.
"""

from __future__ import annotations

import functools
import random
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import trio

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.crypto.merkle import merkle_root
from swarmnode.node.config import ConfigError, NodeConfig, WorkSettings, load_config
from swarmnode.node.dataplane.http_server import BytesBody, Request, Response, simple_response
from swarmnode.node.diloco.algorithm import content_digest
from swarmnode.node.diloco.plan import build_plan, checkpoint_digest, sign_plan
from swarmnode.node.diloco.rl import DilocoSwarmTrainerWork
from swarmnode.node.diloco.weights import trainable_state
from swarmnode.node.errors import RunMismatch
from swarmnode.node.p2p.clock import wall_ms
from swarmnode.node.rl.run import devnet_run
from swarmnode.node.trainer.inbox import InboxEntry
from swarmnode.protocol.diloco import check_rl_plan, contribution_namespace, plan_path, rollout_owner
from swarmnode.protocol.envelope import seal
from swarmnode.protocol.errors import ProtocolError, Reason, Reject
from swarmnode.protocol.messages import (
    AcceptedBatch,
    AcceptedRollout,
    CheckpointManifest,
    DilocoRun,
    RolloutSubmission,
    RunDescriptor,
    ShardInfo,
)
from swarmnode.protocol.shards import manifest_path
from tests.tinymodel import tiny_folder

RUN = "testrun"
LEAD = NodeIdentity(b"\x11" * 32)
CO = NodeIdentity(b"\x12" * 32)
OUTSIDER = NodeIdentity(b"\x13" * 32)
WORKER = NodeIdentity(b"\x14" * 32)
CREATED_MS = 1_767_225_600_000


@functools.cache
def _base_descriptor() -> RunDescriptor:
    return devnet_run(LEAD.address, tiny_folder(), CREATED_MS).descriptor


def descriptor(*co_trainers: bytes, **changes: Any) -> RunDescriptor:
    """The devnet run of LEAD with these co-trainers (CO by default)."""
    return replace(_base_descriptor(), run=RUN, co_trainers=co_trainers or (CO.address,), **changes)


def rl_plan(*trainers: NodeIdentity, run: str = RUN, **changes: Any) -> DilocoRun:
    """The plan that fits `descriptor()`: its trainers, its model, the GRPO learning rate as inner_lr."""
    fields: dict[str, Any] = dict(
        model=tiny_folder(),
        model_seed=0,
        initial=b"\x01" * 32,
        rounds=3,
        inner_steps=2,
        inner_lr=_base_descriptor().grpo.learning_rate,
        created_ms=CREATED_MS,
    )
    fields.update(changes)
    return build_plan(run, [t.address for t in trainers or (LEAD, CO)], **fields)


def digests(n: int, seed: int = 7) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(32) for _ in range(n)]


# --- rollout_owner -------------------------------------------------------------------------------


def test_the_owner_of_a_rollout_is_a_function_of_its_digest_and_the_trainers() -> None:
    trainers = (LEAD.address, CO.address, OUTSIDER.address)
    for digest in digests(50):
        owner = rollout_owner(digest, trainers)
        assert owner in trainers
        assert rollout_owner(bytes(digest), list(trainers)) == owner
        assert rollout_owner(digest[:8] + bytes(24), trainers) == owner  # the first 8 bytes decide


def test_every_trainer_gets_a_roughly_equal_share() -> None:
    trainers = (LEAD.address, CO.address, OUTSIDER.address)
    shares = Counter(rollout_owner(d, trainers) for d in digests(3000))
    assert set(shares) == set(trainers)
    assert all(800 <= n <= 1200 for n in shares.values()), shares


def test_a_lone_trainer_owns_every_rollout() -> None:
    assert {rollout_owner(d, (LEAD.address,)) for d in digests(100)} == {LEAD.address}


def test_a_run_without_trainers_has_no_owner() -> None:
    with pytest.raises(ValueError):
        rollout_owner(bytes(32), ())


# --- check_rl_plan -------------------------------------------------------------------------------


def test_a_plan_naming_the_runs_trainers_model_and_learning_rate_fits() -> None:
    check_rl_plan(rl_plan(LEAD, CO), descriptor())  # the plan lists by address, the descriptor lead first
    check_rl_plan(rl_plan(LEAD, CO, OUTSIDER), descriptor(CO.address, OUTSIDER.address))
    check_rl_plan(rl_plan(LEAD), replace(descriptor(), co_trainers=()))


@pytest.mark.parametrize(
    "plan, run, reason",
    [
        (lambda: rl_plan(run="otherrun"), lambda: descriptor(), Reason.WRONG_RUN),
        (lambda: rl_plan(LEAD, OUTSIDER), lambda: descriptor(), Reason.RULE_VIOLATION),
        (lambda: rl_plan(LEAD), lambda: descriptor(), Reason.RULE_VIOLATION),
        (lambda: rl_plan(LEAD, CO, OUTSIDER), lambda: descriptor(), Reason.RULE_VIOLATION),
        (lambda: rl_plan(CO, OUTSIDER), lambda: descriptor(OUTSIDER.address), Reason.RULE_VIOLATION),
        (lambda: rl_plan(), lambda: descriptor(CO.address, CO.address), Reason.RULE_VIOLATION),
        (lambda: rl_plan(), lambda: descriptor(model_config_hash=b"\x09" * 32), Reason.RULE_VIOLATION),
        (
            lambda: rl_plan(inner_lr=2 * _base_descriptor().grpo.learning_rate),
            lambda: descriptor(),
            Reason.RULE_VIOLATION,
        ),
    ],
    ids=[
        "other-run",
        "other-co-trainer",
        "co-trainer-missing",
        "extra-trainer",
        "lead-missing",
        "co-trainer-twice",
        "other-model",
        "other-inner-lr",
    ],
)
def test_a_plan_that_does_not_fit_the_run_is_rejected(plan: Any, run: Any, reason: Reason) -> None:
    with pytest.raises(ProtocolError) as info:
        check_rl_plan(plan(), run())
    assert isinstance(info.value, Reject) and info.value.reason == reason


# --- the trainer work: who may be a trainer of the run -------------------------------------------


def write_plan(path: Path, plan: DilocoRun, signer: NodeIdentity = LEAD) -> Path:
    path.write_bytes(sign_plan(signer, plan))
    return path


def work_config(tmp: Path, plan_file: Path, lead: NodeIdentity = LEAD, run: str = RUN) -> NodeConfig:
    return NodeConfig(
        identity=tmp / "key",
        run=run,
        role="trainer",
        data_dir=tmp / "data",
        http_port=0,
        work=WorkSettings(
            diloco_plan=str(plan_file), diloco_lead=lead.checksum_address, model=str(tiny_folder())
        ),
    )


def make_work(tmp: Path, identity: NodeIdentity, plan: DilocoRun | None = None) -> DilocoSwarmTrainerWork:
    plan_file = write_plan(tmp / "plan.bin", plan or rl_plan())
    return DilocoSwarmTrainerWork(work_config(tmp / identity.address.hex()[:6], plan_file), identity)


def test_the_plans_signer_leads_and_the_others_are_co_trainers(tmp_path: Path) -> None:
    lead = make_work(tmp_path, LEAD)
    co = make_work(tmp_path, CO)
    assert lead.is_lead and not co.is_lead
    assert lead.co_trainers == co.co_trainers == (CO.address,)
    assert lead.trainers == co.trainers == (LEAD.address, CO.address)
    assert lead._announces() and not co._announces()


def test_only_the_lead_describes_the_run_and_its_descriptor_names_the_co_trainers(tmp_path: Path) -> None:
    lead = make_work(tmp_path, LEAD)
    described = lead.run_descriptor(RUN, LEAD.address)
    assert described.trainer == LEAD.address and described.co_trainers == (CO.address,)
    assert lead.trainers == (LEAD.address, CO.address)
    with pytest.raises(RuntimeError, match="only the lead"):
        make_work(tmp_path, CO).run_descriptor(RUN, LEAD.address)


def test_every_trainer_starts_from_the_model_folders_weights_the_plan_names(tmp_path: Path) -> None:
    """θ_0 of an RL run is the folder's base weights: what `_load_trainer` loads digests to the plan's."""
    initial = checkpoint_digest(tiny_folder())
    plan = rl_plan(initial=initial)
    for identity in (LEAD, CO):
        work = make_work(tmp_path, identity, plan)
        assert work.model_dir == tiny_folder()
        trainer = work._load_trainer(descriptor())
        assert content_digest(trainable_state(trainer.engine.model)) == initial == work.plan.initial_digest
    assert plan.model_config_hash == descriptor().model_config_hash  # sha256 of the folder's config.json


def test_the_lead_refuses_a_plan_that_does_not_fit_its_run(tmp_path: Path) -> None:
    lead = make_work(tmp_path, LEAD, rl_plan(inner_lr=0.5))
    with pytest.raises(RunMismatch, match="inner_lr"):
        lead.run_descriptor(RUN, LEAD.address)


def test_a_plan_signed_by_another_than_the_configured_lead_is_refused(tmp_path: Path) -> None:
    plan_file = write_plan(tmp_path / "plan.bin", rl_plan(), signer=CO)
    with pytest.raises(RunMismatch, match="not a DiLoCo plan signed by the lead") as info:
        DilocoSwarmTrainerWork(work_config(tmp_path, plan_file, lead=LEAD), CO)
    cause = info.value.__cause__
    assert isinstance(cause, ProtocolError) and cause.reason == Reason.WRONG_SENDER


def test_a_missing_or_garbage_plan_file_is_refused_with_its_path(tmp_path: Path) -> None:
    missing = tmp_path / "absent.bin"
    with pytest.raises(RunMismatch, match="absent.bin"):
        DilocoSwarmTrainerWork(work_config(tmp_path, missing, lead=LEAD), CO)
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(b"\x00" * 40)
    with pytest.raises(RunMismatch, match="garbage.bin"):
        DilocoSwarmTrainerWork(work_config(tmp_path, garbage, lead=LEAD), CO)


def test_a_node_the_plan_does_not_name_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RunMismatch, match="not a trainer"):
        make_work(tmp_path, OUTSIDER)


def test_a_plan_for_another_run_is_refused(tmp_path: Path) -> None:
    plan_file = write_plan(tmp_path / "plan.bin", rl_plan(run="otherrun"))
    with pytest.raises(RunMismatch, match="otherrun"):
        DilocoSwarmTrainerWork(work_config(tmp_path, plan_file), LEAD)


def test_a_plan_whose_signer_is_not_one_of_its_trainers_is_refused(tmp_path: Path) -> None:
    plan_file = write_plan(tmp_path / "plan.bin", rl_plan(CO, OUTSIDER), signer=LEAD)
    with pytest.raises(RunMismatch, match="cannot lead"):
        DilocoSwarmTrainerWork(work_config(tmp_path, plan_file), CO)


# --- taking our share ----------------------------------------------------------------------------


def entry(index: int, digest: bytes) -> InboxEntry:
    return InboxEntry(
        index=index,
        digest=digest,
        worker=WORKER.address,
        step=index,
        checkpoint_version=0,
        groups=4,
        signal_groups=1,
        submission=b"sub%d" % index,
        verdict=b"verdict%d" % index,
        received_ms=1,
    )


def test_each_trainer_keeps_exactly_its_share_and_counts_the_rest(tmp_path: Path) -> None:
    entries = [entry(i, d) for i, d in enumerate(digests(40), 1)]
    kept = {}
    for identity in (LEAD, CO):
        work = make_work(tmp_path, identity)
        mine = list(work._mine(entries))
        owned = [
            e for e in entries if rollout_owner(e.digest, (LEAD.address, CO.address)) == identity.address
        ]
        assert mine == owned
        assert work.not_mine == len(entries) - len(mine)
        kept[identity.address] = {e.digest for e in mine}
    assert kept[LEAD.address] and kept[CO.address]
    assert not kept[LEAD.address] & kept[CO.address]
    assert kept[LEAD.address] | kept[CO.address] == {e.digest for e in entries}


# --- a co-trainer follows the lead's manifests ---------------------------------------------------

_seq = iter(range(1, 1 << 30))


def sealed_manifest(version: int, signer: NodeIdentity = LEAD, run: str = RUN, tag: int = 0) -> bytes:
    shards = (ShardInfo("shard-00001-of-00001.safetensors", 1000, bytes([version, tag]) * 16),)
    manifest = CheckpointManifest(
        run=run,
        version=version,
        parent_version=max(version - 1, 0),
        model_config_hash=_base_descriptor().model_config_hash,
        total_size=1000,
        shards=shards,
        merkle_root=merkle_root([s.sha256 for s in shards]),
        created_ms=wall_ms(),
    )
    return seal(signer, manifest, run=run, seq=next(_seq), ts=wall_ms())


def root_of(version: int, tag: int = 0) -> bytes:
    return merkle_root([bytes([version, tag]) * 16])


def test_a_co_trainer_takes_the_leads_manifests_and_keeps_the_versions_a_step_may_name(
    tmp_path: Path,
) -> None:
    co = make_work(tmp_path, CO)
    assert co.published_roots() == {}
    changed = co._roots_changed
    assert co._take_lead_manifest(sealed_manifest(0))
    assert changed.is_set() and co.published_roots() == {0: root_of(0)}
    for version in range(1, 6):
        assert co._take_lead_manifest(sealed_manifest(version))
    # async_level 2 (the devnet's, before the descriptor is known): the newest and 3 more stay
    assert co.published_roots() == {v: root_of(v) for v in (2, 3, 4, 5)}
    assert co._take_lead_manifest(sealed_manifest(5, tag=1))  # the first root of a version stays
    assert co.published_roots()[5] == root_of(5)
    assert co.manifests_refused == 0
    assert co.status()["diloco"]["lead_versions"] == [2, 3, 4, 5]


def test_a_co_trainer_compares_its_own_outer_weights_with_the_leads_checkpoints(tmp_path: Path) -> None:
    from swarmnode.node.dataplane.roles import OriginNode
    from swarmnode.protocol.codec import decode
    from swarmnode.protocol.envelope import Envelope

    co = make_work(tmp_path, CO)
    co.origin_node = OriginNode(tmp_path / "own", CO, RUN)
    for version, tag in ((3, 0), (4, 1)):  # v3 as the lead published it, v4 from other weights
        envelope = sealed_manifest(version, signer=CO, tag=tag)
        manifest = decode(CheckpointManifest, decode(Envelope, envelope).body)
        co.origin_node.catalog.add(manifest, envelope, {0})
    for version in (3, 4):
        assert co._take_lead_manifest(sealed_manifest(version))
    status = co.status()["diloco"]
    assert (status["roots_agreed"], status["root_forks"]) == (1, [4])
    co._compare_root(4)  # compared once
    assert co.root_forks == [4]


def test_a_co_trainer_prunes_by_the_runs_async_level_once_it_knows_the_run(tmp_path: Path) -> None:
    co = make_work(tmp_path, CO)
    co.descriptor = descriptor(async_level=0)
    for version in range(4):
        co._take_lead_manifest(sealed_manifest(version))
    assert sorted(co.published_roots()) == [2, 3]


@pytest.mark.parametrize(
    "envelope",
    [
        lambda: sealed_manifest(1, signer=CO),
        lambda: sealed_manifest(1, signer=OUTSIDER),
        lambda: sealed_manifest(1, run="otherrun"),
        lambda: b"\x00not an envelope",
    ],
    ids=["by-itself", "by-an-outsider", "other-run", "garbage"],
)
def test_a_manifest_the_lead_did_not_sign_for_the_run_is_refused_and_counted(
    tmp_path: Path, envelope: Any
) -> None:
    co = make_work(tmp_path, CO)
    changed = co._roots_changed
    assert not co._take_lead_manifest(envelope())
    assert co.manifests_refused == 1 and co.published_roots() == {} and not changed.is_set()


def test_the_lead_names_its_own_catalog_not_lead_roots(tmp_path: Path) -> None:
    lead = make_work(tmp_path, LEAD)
    lead.lead_roots[1] = root_of(1)  # never filled on the lead; its origin's catalog is the truth
    assert lead.published_roots() == {}  # no origin yet


def batch_naming(*versions: int) -> AcceptedBatch:
    items = []
    for i, version in enumerate(versions, 1):
        submission = RolloutSubmission(RUN, version << 32 | i, version, root_of(version), ())
        envelope = seal(WORKER, submission, run=RUN, seq=next(_seq), ts=wall_ms())
        items.append(AcceptedRollout(i, b"verdict", envelope))
    return AcceptedBatch(tuple(items), len(items))


def test_a_pulled_batch_waits_for_the_leads_manifest_of_each_version_it_names(tmp_path: Path) -> None:
    co = make_work(tmp_path, CO)
    co._take_lead_manifest(sealed_manifest(0))

    async def main() -> float:
        await co._before_check(batch_naming(0))  # known already: no wait
        started = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(co._before_check, batch_naming(0, 1))

            async def gossip_arrives() -> None:
                await trio.sleep(0.3)
                co._take_lead_manifest(sealed_manifest(1))

            nursery.start_soon(gossip_arrives)
        return trio.current_time() - started

    waited = trio.run(main)
    assert 0.3 <= waited < 1.5  # woken by the manifest, not by the 2 s pause between asks
    assert sorted(co.published_roots()) == [0, 1]


# --- one HTTP endpoint ---------------------------------------------------------------------------


def request(target: str) -> Request:
    return Request("GET", target, {})


def test_the_endpoint_sends_diloco_paths_and_namespaces_to_diloco_and_the_rest_to_the_checkpoints(
    tmp_path: Path,
) -> None:
    work = make_work(tmp_path, LEAD)
    own_namespace = contribution_namespace(RUN, work.holdings.index)
    other_namespace = contribution_namespace(RUN, 1 - work.holdings.index)  # not held here
    work.holdings.namespace(own_namespace)
    to_checkpoints: list[str] = []

    async def checkpoints(req: Request) -> Response:
        to_checkpoints.append(req.target)
        return simple_response(299, "checkpoint shards")

    handle = work._mount(checkpoints)

    async def main() -> dict[str, Response]:
        targets = [
            plan_path(RUN),
            plan_path("otherrun"),
            manifest_path(own_namespace, 0),
            manifest_path(RUN, 0),
            manifest_path(other_namespace, 0),
        ]
        return {t: await handle(request(t)) for t in targets}

    answers = trio.run(main)
    plan_answer = answers[plan_path(RUN)]
    assert plan_answer.status == 200 and isinstance(plan_answer.body, BytesBody)
    assert plan_answer.body.data == (tmp_path / "plan.bin").read_bytes()
    assert answers[plan_path("otherrun")].status == 404
    assert answers[manifest_path(own_namespace, 0)].status == 404  # the namespace's own shard service
    assert to_checkpoints == [manifest_path(RUN, 0), manifest_path(other_namespace, 0)]
    assert answers[manifest_path(RUN, 0)].status == 299


# --- config --------------------------------------------------------------------------------------


def config_with(tmp_path: Path, **work: object) -> NodeConfig:
    return load_config(
        None, {"identity": tmp_path / "k", "run": RUN, "role": "trainer", "data_dir": tmp_path, "work": work}
    )


def test_the_plan_and_its_lead_are_configured_together(tmp_path: Path) -> None:
    config = config_with(tmp_path, diloco_plan="plan.bin", diloco_lead=LEAD.checksum_address)
    assert config.work.diloco_lead == LEAD.checksum_address
    toml = tmp_path / "node.toml"
    toml.write_text(
        f"[node]\nidentity='k'\nrun='{RUN}'\nrole='trainer'\ndata_dir='d'\n"
        f"[work]\ndiloco_plan='plan.bin'\ndiloco_lead='{LEAD.address.hex()}'\n"
    )
    assert load_config(toml).work.diloco_plan == str(tmp_path / "plan.bin")  # relative to the config file


@pytest.mark.parametrize(
    "work, message",
    [
        ({"diloco_plan": "plan.bin"}, "go together"),
        ({"diloco_lead": "0x" + "11" * 20}, "go together"),
        ({"diloco_plan": "plan.bin", "diloco_lead": "0x1234"}, "20-byte"),
        ({"diloco_plan": "plan.bin", "diloco_lead": "0x" + "zz" * 20}, "20-byte"),
        ({"diloco_plan": "plan.bin", "diloco_lead": "0x" + "11" * 21}, "20-byte"),
    ],
)
def test_a_plan_without_its_lead_or_a_malformed_lead_is_a_config_error(
    tmp_path: Path, work: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        config_with(tmp_path, **work)
    toml = tmp_path / "node.toml"
    lines = "".join(f"{key} = '{value}'\n" for key, value in work.items())
    toml.write_text(f"[node]\nidentity='k'\nrun='{RUN}'\nrole='trainer'\ndata_dir='d'\n[work]\n{lines}")
    with pytest.raises(ConfigError, match=message):
        load_config(toml)
