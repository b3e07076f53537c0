"""The devnet's end-of-run report: summary rules, tolerance of crashed nodes, tables and the PNG."""

from __future__ import annotations

import dataclasses
import json

import pytest
from eth_utils import to_checksum_address
from rich.console import Console

from swarmnode.node.devnet.report import NodeFacts, ReportInputs, build_summary, plot_summary, summary_tables

STAKE = 2 * 10**9
SLASH = 5 * 10**8


def address(n: int) -> str:
    return to_checksum_address(f"0x{n:02x}" + "ab" * 19)


NODES = [
    NodeFacts("bootstrap", "bootstrap", address(1)),
    NodeFacts("trainer-1", "trainer", address(2), "", STAKE, STAKE),
    NodeFacts("relay-1", "relay", address(3), "", STAKE, STAKE),
    NodeFacts("worker-1", "worker", address(4), "", STAKE, STAKE),
    NodeFacts("worker-2", "worker", address(5), "", STAKE, STAKE),
    NodeFacts("cheater-1", "worker", address(6), "perturbed-model", STAKE, STAKE - SLASH),
    NodeFacts("cheater-2", "worker", address(7), "tampered-prompt", STAKE, STAKE - 2 * SLASH),
    NodeFacts("cheater-3", "worker", address(8), "forged-reward", STAKE, STAKE - SLASH),
    NodeFacts("validator-1", "validator", address(9), "", STAKE, STAKE),
    NodeFacts("validator-2", "validator", address(10), "", STAKE, None),  # crashed: no status
]


def lower(n: int) -> str:
    return address(n).lower()


def statuses() -> dict[str, dict]:
    def worker(cheat: str, submitted: int, accepted: int, rejected: int, cpu_s: float) -> dict:
        by_reason = {"BAD_PROOF": rejected} if rejected else {}
        return {
            "role": "worker",
            "work": {
                "version": 6,
                "cheat": cheat,
                "submitted": submitted,
                "accepted": accepted,
                "rejected": rejected,
                "by_reason": by_reason,
                "generate_s": cpu_s * 0.9,
                "cpu_s": cpu_s,
                "tokens": 4000,
            },
        }

    return {
        "bootstrap": {"role": "bootstrap", "work": {}},
        "trainer-1": {
            "role": "trainer",
            "work": {
                "step": 4,
                "version": 4,
                "rewards": [0.25, 0.3, 0.5, 0.625],
                "step_s": [10.0, 12.0, 8.0, 10.0],
                "wait_s": 10.0,
                "train_s": 30.0,
                "submissions_used": 14,
                "groups_used": 14,
                "groups_filtered": 2,
                "stale_dropped": 1,
                "per_worker": {address(4): 8, address(5): 6},
            },
        },
        "relay-1": {"role": "relay", "work": {"versions_held": [3, 4]}},
        "worker-1": worker("", 9, 8, 0, 40.0),
        "worker-2": worker("", 7, 6, 0, 40.0),
        "cheater-1": worker("perturbed-model", 5, 0, 5, 30.0),
        "cheater-2": worker("tampered-prompt", 4, 0, 4, 20.0),
        "cheater-3": worker("forged-reward", 3, 0, 3, 10.0),
        "validator-1": {
            "role": "validator",
            "work": {
                "accepted": 14,
                "rejected": 12,
                "by_reason": {"BAD_PROOF": 5, "BAD_HASH": 4, "BAD_REWARD": 3},
                "slashes": 4,
                "contributions": 14,
                "cpu_s": 7.0,
                "tokens": 56000,
                "per_worker": {
                    lower(4): {"accepted": 8, "rejected": 0, "slashed": 0},
                    lower(5): {"accepted": 6, "rejected": 0, "slashed": 0},
                    lower(6): {"accepted": 0, "rejected": 5, "slashed": 1},
                    lower(7): {"accepted": 0, "rejected": 4, "slashed": 2},
                    lower(8): {"accepted": 0, "rejected": 3, "slashed": 1},
                },
            },
        },
    }


def slash(n: int, reason: str = "BAD_PROOF", code: int = 605) -> dict:
    return {"worker": address(n), "amount_gwei": SLASH, "reason_code": code, "reason": reason}


def inputs(**changes) -> ReportInputs:
    base = ReportInputs(
        run="devnet-test",
        steps=4,
        elapsed_s=61.5,
        ledger_kind="signed",
        ledger_url="signed:/tmp/ledger.db",
        ledger_verified=True,
        base_reward=0.25,
        final_reward=0.5,
        nodes=list(NODES),
        statuses=statuses(),
        ledger_slashes=[
            slash(6),
            slash(7, "BAD_HASH", 608),
            slash(7, "BAD_HASH", 608),
            slash(8, "BAD_REWARD", 603),
        ],
        ledger_contributions={address(4): 8, lower(5): 6},
        ledger_batches=3,
    )
    return dataclasses.replace(base, **changes)


def render(summary: dict) -> str:
    console = Console(record=True, width=200)
    for table in summary_tables(summary):
        console.print(table)
    return console.export_text()


# --- build_summary ----------------------------------------------------------------------------------


def test_summary_of_a_run_where_every_cheater_is_caught():
    summary = build_summary(inputs())
    assert summary["run"] == "devnet-test" and summary["steps"] == 4 and summary["elapsed_s"] == 61.5
    assert summary["reward_ratio"] == pytest.approx(2.0)
    assert summary["rewards_per_step"] == [0.25, 0.3, 0.5, 0.625]
    assert summary["step_s_mean"] == pytest.approx(10.0)
    assert summary["trainer_wait_fraction"] == pytest.approx(10.0 / 40.0)
    assert summary["validator_cpu_s_per_accepted"] == pytest.approx(7.0 / 14)
    assert summary["worker_cpu_s_per_accepted"] == pytest.approx(80.0 / 14)  # honest workers only
    assert summary["ledger"] == {
        "kind": "signed",
        "url": "signed:/tmp/ledger.db",
        "verified": True,
        "batches": 3,
        "credits": 14,
        "slashes_by_status": {"final": 4},
    }
    assert summary["every_cheater_slashed"] is True and summary["honest_slashed"] == []
    assert summary["cheaters"] == ["cheater-1", "cheater-2", "cheater-3"]
    assert summary["validators"] == {
        "reporting": 1,
        "expected": 2,
        "accepted": 14,
        "rejected": 12,
        "by_reason": {"BAD_HASH": 4, "BAD_PROOF": 5, "BAD_REWARD": 3},
    }
    json.dumps(summary, allow_nan=False)  # what --summary writes


def test_node_rows_match_addresses_case_insensitively():
    nodes = build_summary(inputs())["nodes"]
    assert list(nodes) == [n.name for n in NODES]
    assert nodes["worker-1"] == {
        "role": "worker",
        "address": address(4),
        "honest": True,
        "cheat": "",
        "rollouts_accepted": 8,
        "rollouts_rejected": 0,
        "stake_before_gwei": STAKE,
        "stake_after_gwei": STAKE,
        "slashes": 0,
        "slashes_final": 0,
        "slashed_gwei": 0,
        "slash_reasons": [],
        "contributions": 8,
    }
    assert nodes["worker-2"]["contributions"] == 6  # ledger keyed lowercase, node checksum
    assert nodes["cheater-2"]["honest"] is False and nodes["cheater-2"]["cheat"] == "tampered-prompt"
    assert nodes["cheater-2"]["rollouts_rejected"] == 4  # validator keyed lowercase
    assert nodes["cheater-2"]["slashes"] == 2 and nodes["cheater-2"]["slashed_gwei"] == 2 * SLASH
    assert nodes["cheater-2"]["slash_reasons"] == ["BAD_HASH"]
    assert nodes["validator-2"]["stake_after_gwei"] is None
    assert nodes["bootstrap"]["rollouts_accepted"] == 0


def test_verdicts_are_summed_over_validators():
    extra = statuses()
    extra["validator-2"] = {
        "work": {
            "accepted": 3,
            "rejected": 1,
            "cpu_s": 2.0,
            "by_reason": {"BAD_PROOF": 1},
            "per_worker": {
                address(4).upper().replace("0X", "0x"): {"accepted": 3},
                lower(6): {"rejected": 1, "slashed": 0},
            },
        }
    }
    summary = build_summary(inputs(statuses=extra))
    assert summary["nodes"]["worker-1"]["rollouts_accepted"] == 11
    assert summary["nodes"]["cheater-1"]["rollouts_rejected"] == 6
    assert summary["validator_cpu_s_per_accepted"] == pytest.approx(9.0 / 17)
    assert summary["validators"]["by_reason"]["BAD_PROOF"] == 6 and summary["validators"]["reporting"] == 2


def test_a_cheater_that_escaped_is_flagged():
    summary = build_summary(inputs(ledger_slashes=[slash(6), slash(7)]))
    assert summary["every_cheater_slashed"] is False
    assert summary["cheaters_unslashed"] == ["cheater-3"]


def test_an_honest_node_that_was_slashed_is_named():
    summary = build_summary(inputs(ledger_slashes=[slash(6), slash(7), slash(8), slash(5)]))
    assert summary["every_cheater_slashed"] is True
    assert summary["honest_slashed"] == ["worker-2"]


def test_a_run_without_cheaters_has_every_cheater_slashed_vacuously():
    honest = [n for n in NODES if not n.cheat]
    summary = build_summary(inputs(nodes=honest, ledger_slashes=[]))
    assert summary["cheaters"] == [] and summary["every_cheater_slashed"] is True


def test_zero_base_reward_gives_no_ratio():
    assert build_summary(inputs(base_reward=0.0))["reward_ratio"] is None
    assert build_summary(inputs(base_reward=float("nan")))["reward_ratio"] is None


@pytest.mark.parametrize(
    "broken",
    [
        {},  # nobody wrote a status
        {name: {} for name in (n.name for n in NODES)},  # statuses without work
        {name: {"work": None} for name in (n.name for n in NODES)},
        {name: "garbage" for name in (n.name for n in NODES)},
        {
            "trainer-1": {"work": {"rewards": "x", "step_s": [1.0, None, "2", float("inf")], "wait_s": "?"}},
            "validator-1": {
                "work": {
                    "per_worker": {lower(4): None, lower(6): {"accepted": "many"}},
                    "by_reason": [],
                    "cpu_s": None,
                    "accepted": True,
                }
            },
            "worker-1": {"work": {"cpu_s": float("nan"), "accepted": -0.0}},
        },
    ],
    ids=["none", "no-work", "null-work", "not-a-dict", "malformed-fields"],
)
def test_crashed_or_malformed_statuses_never_break_the_report(broken, tmp_path):
    summary = build_summary(inputs(statuses=broken))
    json.dumps(summary, allow_nan=False)
    assert summary["trainer_wait_fraction"] is None
    assert summary["validator_cpu_s_per_accepted"] is None
    assert summary["worker_cpu_s_per_accepted"] is None
    assert summary["nodes"]["cheater-1"]["rollouts_rejected"] == 0
    assert summary["nodes"]["cheater-1"]["slashes"] == 1  # the ledger still speaks
    assert "cheater-1" in render(summary)
    assert plot_summary(summary, tmp_path / "run.png").stat().st_size > 1000


def test_step_times_without_wait_give_mean_but_no_wait_fraction():
    partial = statuses()
    del partial["trainer-1"]["work"]["wait_s"]
    summary = build_summary(inputs(statuses=partial))
    assert summary["step_s_mean"] == pytest.approx(10.0) and summary["trainer_wait_fraction"] is None


def test_malformed_ledger_entries_are_tolerated():
    summary = build_summary(inputs(ledger_slashes=[{}, {"worker": None}, "junk"], ledger_contributions={}))
    assert summary["every_cheater_slashed"] is False and summary["honest_slashed"] == []
    assert all(n["contributions"] == 0 for n in summary["nodes"].values())


# --- tables and plot --------------------------------------------------------------------------------


def test_tables_show_the_numbers():
    text = render(build_summary(inputs()))
    for expected in (
        "worker-1",
        "cheater: perturbed-model",
        "honest",
        "2,000,000,000 → 1,500,000,000",
        "0.250 → 0.500 (×2.00)",
        "25.0%",
        "10.00",
        "validator 0.500 vs worker 5.714",
        "BAD_PROOF 5",
        "verified",
        "every cheater slashed",
        "none",
    ):
        assert expected in text, expected


def test_tables_flag_escaped_cheaters_and_slashed_honest_nodes():
    text = render(build_summary(inputs(ledger_slashes=[slash(6), slash(7), slash(5)], ledger_verified=False)))
    assert "escaped: cheater-3" in text
    assert "NOT verified" in text
    honest_row = next(line for line in text.splitlines() if "honest nodes slashed" in line)
    assert "worker-2" in honest_row


def test_tables_render_a_summary_read_back_from_json():
    summary = json.loads(json.dumps(build_summary(inputs(ledger_verified=None))))
    assert "unchecked" in render(summary)


def test_plot_is_a_png(tmp_path):
    path = plot_summary(build_summary(inputs()), tmp_path / "plots" / "run.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000


# --- several trainers (DiLoCo) ----------------------------------------------------------------------


def diloco_inputs(theta_2: str) -> ReportInputs:
    """The fixture run with a second trainer; trainer-1 leads, both report their DiLoCo rounds."""
    nodes = [*NODES, NodeFacts("trainer-2", "trainer", address(11), "", STAKE, STAKE)]
    found = statuses()
    found["trainer-1"]["work"]["diloco"] = {
        "lead": True,
        "round": 3,
        "contributors_per_round": [2, 1, 2],
        "theta": "aa" * 32,
    }
    found["trainer-2"] = {
        "role": "trainer",
        "work": {
            "submissions_used": 5,
            "diloco": {"lead": False, "round": 3, "contributors_per_round": [2, 2], "theta": theta_2},
        },
    }
    return inputs(nodes=nodes, statuses=found)


def test_several_trainers_are_summed_and_their_final_weights_compared():
    summary = build_summary(diloco_inputs("aa" * 32))
    diloco = summary["diloco"]
    assert diloco["same_final_theta"] is True
    assert diloco["trainers"]["trainer-1"]["contributors_per_round"] == [2, 1, 2]
    assert diloco["trainers"]["trainer-2"]["submissions_used"] == 5
    assert "contributors per round 2/1/2, same final θ: yes" in render(summary)


def test_trainers_that_disagree_on_the_final_weights_are_flagged():
    summary = build_summary(diloco_inputs("bb" * 32))
    assert summary["diloco"]["same_final_theta"] is False
    assert "same final θ: NO" in render(summary)


def test_a_single_trainer_run_has_no_diloco_summary():
    assert build_summary(inputs())["diloco"] is None


def test_a_voided_slash_is_not_counted_and_a_pending_one_is_not_final():
    """A slash the run's owner or a quorum voided was wrong: it neither shows a cheater caught nor an
    honest node punished; a pending one is filed but has taken nothing yet."""
    voided = {**slash(5), "status": "voided"}
    pending = {**slash(8, "BAD_REWARD", 603), "status": "pending"}
    summary = build_summary(inputs(ledger_slashes=[slash(6), slash(7), pending, voided]))
    assert summary["honest_slashed"] == [] and summary["every_cheater_slashed"] is True
    cheater = summary["nodes"]["cheater-3"]
    assert cheater["slashes"] == 1 and cheater["slashes_final"] == 0
    assert summary["ledger"]["slashes_by_status"] == {"final": 2, "pending": 1, "voided": 1}
