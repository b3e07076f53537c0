"""The end-of-run report of `swarmnode devnet`: one summary dict, two tables, one PNG.

`build_summary` is pure: it takes what the devnet collected (`ReportInputs`: the nodes it started, the
last status file of each, the final ledger, the held-out rewards) and returns a JSON-ready dict, the
document that `--summary FILE` writes and the scripts check. The tables and the plot read only that dict,
so a summary saved by one run can be re-rendered later.

Design decisions:
- A node that crashed may have written no status, or a status without some keys. Every field is read
  through `_number` / `_numbers` / `_mapping`, which turn anything missing or malformed into 0, [] or {};
  the report never raises on a bad status. Ratios whose denominator is 0 or unknown are None, never NaN,
  so the summary stays valid JSON.
- Validators are the source of truth for a worker's accepted and rejected rollouts: their `per_worker`
  counts are summed by address. Addresses are compared lowercased (node keys give checksum addresses,
  validators key by lowercase hex).
- Worker CPU per accepted rollout counts honest workers only: a cheater's CPU buys rejections, which would
  inflate the cost of honest work it is compared against.
- The plot draws on a bare `matplotlib.figure.Figure` (saved through the Agg canvas), never through
  pyplot: no process-wide backend or figure registry is touched, and matplotlib is imported only when a
  plot is drawn.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table


@dataclass(frozen=True)
class NodeFacts:
    """One node the devnet started, as the devnet knows it (not as the node reports itself)."""

    name: str
    role: str  # bootstrap | trainer | relay | worker | validator
    address: str  # 0x checksum address of the node's key
    cheat: str = ""  # "" = honest; else the cheat kind (perturbed-model, tampered-prompt, forged-reward)
    stake_before_gwei: int | None = None
    stake_after_gwei: int | None = None


@dataclass(frozen=True)
class ReportInputs:
    run: str
    steps: int
    elapsed_s: float
    ledger_kind: str  # signed | evm
    ledger_url: str
    ledger_verified: bool | None  # None: not checked
    base_reward: float  # held-out eval of the base checkpoint
    final_reward: float  # held-out eval of the final checkpoint, same tasks and seeds
    nodes: list[NodeFacts]
    statuses: dict[str, dict[str, Any]]  # node name -> its last status.json; "work" holds the role's status
    ledger_slashes: list[dict[str, Any]]  # {worker, amount_gwei, reason_code, reason, status}
    ledger_contributions: dict[str, int]  # worker address -> contributions recorded
    ledger_batches: int = 0  # CommitCredits batches that carried them
    wan: Mapping[str, Any] | None = None  # the WAN (`Devnet.wan_facts`: each node's link, `nat` = home)


# --- tolerant readers -------------------------------------------------------------------------------


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _number(value: Any) -> float:
    """A finite number, or 0 for anything missing or malformed."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    return float(value) if math.isfinite(value) else 0.0


def _count(value: Any) -> int:
    return int(_number(value))


def _numbers(value: Any) -> list[float]:
    if not isinstance(value, list | tuple):
        return []
    return [
        float(v) for v in value if not isinstance(v, bool) and isinstance(v, int | float) and math.isfinite(v)
    ]


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator else None


def _finite_or_none(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _work(statuses: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    return _mapping(_mapping(statuses.get(name)).get("work"))


def _key(address: Any) -> str:
    return str(address).lower()


# --- the summary ------------------------------------------------------------------------------------


def _validator_counts(works: list[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Lowercase address -> {accepted, rejected, slashed}, summed over every validator's per_worker."""
    counts: dict[str, dict[str, int]] = {}
    for work in works:
        for address, entry in _mapping(work.get("per_worker")).items():
            total = counts.setdefault(_key(address), {"accepted": 0, "rejected": 0, "slashed": 0})
            for field in total:
                total[field] += _count(_mapping(entry).get(field))
    return counts


def _sum_reasons(works: list[Mapping[str, Any]]) -> dict[str, int]:
    reasons: dict[str, int] = {}
    for work in works:
        for reason, n in _mapping(work.get("by_reason")).items():
            reasons[str(reason)] = reasons.get(str(reason), 0) + _count(n)
    return dict(sorted(reasons.items()))


def _trainer_summary(work: Mapping[str, Any]) -> dict[str, Any]:
    step_s = _numbers(work.get("step_s"))
    training_s = sum(step_s)
    wait_s = _finite_or_none(work.get("wait_s"))
    return {
        "rewards_per_step": _numbers(work.get("rewards")),
        "step_s_mean": _ratio(training_s, len(step_s)),
        "trainer_wait_fraction": None if wait_s is None else _ratio(wait_s, training_s),
        "trainer": {
            field: _count(work.get(field))
            for field in (
                "step",
                "version",
                "submissions_used",
                "groups_used",
                "groups_filtered",
                "stale_dropped",
            )
        }
        | {"wait_s": _number(work.get("wait_s")), "train_s": _number(work.get("train_s"))},
    }


def _diloco_summary(trainers: list[NodeFacts], statuses: Mapping[str, Any]) -> dict[str, Any] | None:
    """With several trainers (DiLoCo): per trainer its rounds, contributors per round and final θ."""
    if len(trainers) < 2:
        return None
    per_trainer = {}
    for node in trainers:
        work = _work(statuses, node.name)
        diloco = _mapping(work.get("diloco"))
        per_trainer[node.name] = {
            "lead": bool(diloco.get("lead")),
            "rounds": _count(diloco.get("round")),
            "contributors_per_round": [_count(n) for n in diloco.get("contributors_per_round") or []],
            "theta": str(diloco.get("theta", "")),
            "submissions_used": _count(work.get("submissions_used")),
        }
    thetas = {t["theta"] for t in per_trainer.values()}
    return {
        "trainers": per_trainer,
        "same_final_theta": len(thetas) == 1 and "" not in thetas,
        "submissions_used": sum(t["submissions_used"] for t in per_trainer.values()),
    }


def _node_summary(
    node: NodeFacts,
    verdicts: Mapping[str, Mapping[str, int]],
    slashes: Mapping[str, list[Mapping[str, Any]]],
    contributions: Mapping[str, int],
) -> dict[str, Any]:
    key = _key(node.address)
    counts = verdicts.get(key, {})
    own = [s for s in slashes.get(key, []) if s.get("status") != "voided"]  # a voided slash was wrong
    return {
        "role": node.role,
        "address": node.address,
        "honest": not node.cheat,
        "cheat": node.cheat,
        "rollouts_accepted": counts.get("accepted", 0),
        "rollouts_rejected": counts.get("rejected", 0),
        "stake_before_gwei": node.stake_before_gwei,
        "stake_after_gwei": node.stake_after_gwei,
        "slashes": len(own),
        "slashes_final": sum(1 for s in own if s.get("status", "final") == "final"),
        "slashed_gwei": sum(_count(s.get("amount_gwei")) for s in own),
        "slash_reasons": sorted({str(s.get("reason", "")) for s in own} - {""}),
        "contributions": contributions.get(key, 0),
    }


def _slashes_by_status(slashes: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for slash in slashes:
        status = str(_mapping(slash).get("status", "final"))
        counts[status] = counts.get(status, 0) + 1
    return counts


def build_summary(inputs: ReportInputs) -> dict[str, Any]:
    """The JSON-ready summary of one devnet run (see the module docstring for the rules)."""
    by_role: dict[str, list[NodeFacts]] = {}
    for node in inputs.nodes:
        by_role.setdefault(node.role, []).append(node)
    trainer_works = [_work(inputs.statuses, n.name) for n in by_role.get("trainer", [])]
    trainer_work = next((w for w in trainer_works if w), {})
    validator_works = [_work(inputs.statuses, n.name) for n in by_role.get("validator", [])]
    honest_worker_works = [_work(inputs.statuses, n.name) for n in by_role.get("worker", []) if not n.cheat]

    slashes: dict[str, list[Mapping[str, Any]]] = {}
    for slash in inputs.ledger_slashes:
        slashes.setdefault(_key(_mapping(slash).get("worker")), []).append(_mapping(slash))
    contributions: dict[str, int] = {}
    for address, n in inputs.ledger_contributions.items():
        contributions[_key(address)] = contributions.get(_key(address), 0) + _count(n)
    verdicts = _validator_counts(validator_works)
    nodes = {n.name: _node_summary(n, verdicts, slashes, contributions) for n in inputs.nodes}

    validator_cpu = sum(_number(w.get("cpu_s")) for w in validator_works)
    validator_accepted = sum(_count(w.get("accepted")) for w in validator_works)
    worker_cpu = sum(_number(w.get("cpu_s")) for w in honest_worker_works)
    worker_accepted = sum(_count(w.get("accepted")) for w in honest_worker_works)
    validator_per_accepted = _ratio(validator_cpu, validator_accepted)
    worker_per_accepted = _ratio(worker_cpu, worker_accepted)
    base, final = _finite_or_none(inputs.base_reward), _finite_or_none(inputs.final_reward)
    cheaters = [name for name, n in nodes.items() if not n["honest"]]
    return {
        "run": inputs.run,
        "steps": inputs.steps,
        "elapsed_s": inputs.elapsed_s,
        "wan": dict(inputs.wan) if inputs.wan else None,
        "base_reward": base,
        "final_reward": final,
        "reward_ratio": None if base is None or final is None else _ratio(final, base),
        **_trainer_summary(trainer_work),
        "diloco": _diloco_summary(by_role.get("trainer", []), inputs.statuses),
        "validator_cpu_s_per_accepted": validator_per_accepted,
        "worker_cpu_s_per_accepted": worker_per_accepted,
        "verification_cost_ratio": (
            None
            if validator_per_accepted is None or worker_per_accepted is None
            else _ratio(validator_per_accepted, worker_per_accepted)
        ),
        "validators": {
            "reporting": sum(1 for w in validator_works if w),
            "expected": len(validator_works),
            "accepted": validator_accepted,
            "rejected": sum(_count(w.get("rejected")) for w in validator_works),
            "by_reason": _sum_reasons(validator_works),
        },
        "ledger": {
            "kind": inputs.ledger_kind,
            "url": inputs.ledger_url,
            "verified": inputs.ledger_verified,
            "batches": inputs.ledger_batches,
            "credits": sum(_count(n) for n in inputs.ledger_contributions.values()),
            "slashes_by_status": _slashes_by_status(inputs.ledger_slashes),
        },
        "cheaters": cheaters,
        "cheaters_unslashed": [name for name in cheaters if nodes[name]["slashes"] == 0],
        "every_cheater_slashed": all(nodes[name]["slashes"] > 0 for name in cheaters),
        "honest_slashed": [name for name, n in nodes.items() if n["honest"] and n["slashes"] > 0],
        "nodes": nodes,
    }


# --- tables -----------------------------------------------------------------------------------------


def _fmt(value: Any, spec: str = ".3f", missing: str = "–") -> str:
    return missing if value is None else format(value, spec)


def _stake(node: Mapping[str, Any]) -> str:
    before, after = node.get("stake_before_gwei"), node.get("stake_after_gwei")
    if before is None and after is None:
        return "–"
    text = f"{_fmt(before, ',')} → {_fmt(after, ',')}"
    return f"[red]{text}[/]" if before is not None and after is not None and after < before else text


def _nodes_table(summary: Mapping[str, Any]) -> Table:
    table = Table(title=f"{summary.get('run', '')}: nodes")
    for column in (
        "node",
        "role",
        "behaviour",
        "accepted",
        "rejected",
        "stake gwei",
        "slashes",
        "contributions",
    ):
        table.add_column(column, justify="left" if column in ("node", "role", "behaviour") else "right")
    for name, node in _mapping(summary.get("nodes")).items():
        cheat = node.get("cheat", "")
        worker = node.get("role") == "worker"
        slashes = node.get("slashes", 0)
        flagged = (cheat and not slashes) or (not cheat and slashes)
        table.add_row(
            name,
            str(node.get("role", "")),
            f"[red]cheater: {cheat}[/]" if cheat else "honest",
            str(node.get("rollouts_accepted", 0)) if worker else "",
            str(node.get("rollouts_rejected", 0)) if worker else "",
            _stake(node),
            f"[bold red]{slashes}[/]" if flagged else str(slashes),
            str(node.get("contributions", 0)),
        )
    return table


def _headline_table(summary: Mapping[str, Any]) -> Table:
    table = Table(title=f"{summary.get('run', '')}: run")
    table.add_column("measure")
    table.add_column("value")
    ratio = summary.get("reward_ratio")
    reward = f"{_fmt(summary.get('base_reward'))} → {_fmt(summary.get('final_reward'))}"
    table.add_row("held-out reward", reward + ("" if ratio is None else f" (×{ratio:.2f})"))
    table.add_row("trainer steps", f"{summary.get('steps', 0)} in {_fmt(summary.get('elapsed_s'), '.1f')} s")
    table.add_row("seconds per step", _fmt(summary.get("step_s_mean"), ".2f"))
    table.add_row("trainer wait fraction", _fmt(summary.get("trainer_wait_fraction"), ".1%"))
    diloco = summary.get("diloco")
    if diloco:
        trainers = _mapping(diloco.get("trainers"))
        lead: Any = next((t for t in trainers.values() if _mapping(t).get("lead")), {})
        per_round = "/".join(str(n) for n in _mapping(lead).get("contributors_per_round", []))
        table.add_row(
            "DiLoCo trainers",
            f"{len(trainers)}, contributors per round {per_round or '-'}, "
            f"same final θ: {'yes' if diloco.get('same_final_theta') else 'NO'}",
        )
    cost = summary.get("verification_cost_ratio")
    table.add_row(
        "CPU s per accepted rollout",
        f"validator {_fmt(summary.get('validator_cpu_s_per_accepted'))}"
        f" vs worker {_fmt(summary.get('worker_cpu_s_per_accepted'))}"
        + ("" if cost is None else f" ({cost:.1%})"),
    )
    validators = _mapping(summary.get("validators"))
    reasons = ", ".join(f"{r} {n}" for r, n in _mapping(validators.get("by_reason")).items()) or "none"
    table.add_row("verdicts by reason (rejected, ignored)", reasons)
    ledger = _mapping(summary.get("ledger"))
    verdicts: dict[Any, str] = {True: "[green]verified[/]", False: "[bold red]NOT verified[/]"}
    verified = verdicts.get(ledger.get("verified"), "unchecked")
    table.add_row("ledger", f"{ledger.get('kind', '')} {verified}  {ledger.get('url', '')}")
    every = summary.get("every_cheater_slashed")
    unslashed = ", ".join(summary.get("cheaters_unslashed", []))
    table.add_row(
        "every cheater slashed", "[green]yes[/]" if every else f"[bold red]no[/] (escaped: {unslashed})"
    )
    honest = ", ".join(summary.get("honest_slashed", []))
    table.add_row("honest nodes slashed", f"[bold red]{honest}[/]" if honest else "none")
    return table


def summary_tables(summary: Mapping[str, Any]) -> list[Table]:
    """The per-node table and the headline table, for a rich Console."""
    return [_nodes_table(summary), _headline_table(summary)]


# --- plot -------------------------------------------------------------------------------------------


def _reward_panel(axes: Any, summary: Mapping[str, Any]) -> None:
    from matplotlib.ticker import MaxNLocator

    rewards = summary.get("rewards_per_step") or []
    if rewards:
        axes.plot(
            range(1, len(rewards) + 1), rewards, marker="o", markersize=3, label="trained groups (mean)"
        )
    else:
        axes.text(0.5, 0.5, "no trainer data", ha="center", va="center", transform=axes.transAxes)
    for key, label, style in (
        ("base_reward", "base, held-out", ":"),
        ("final_reward", "final, held-out", "--"),
    ):
        if summary.get(key) is not None:
            axes.axhline(
                summary[key],
                linestyle=style,
                color="grey" if key == "base_reward" else "green",
                label=f"{label} {summary[key]:.3f}",
            )
    axes.set_title("mean reward per trainer step")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("step")
    axes.set_ylabel("reward")
    if axes.get_legend_handles_labels()[0]:
        axes.legend(loc="best", fontsize="small")


def _worker_label(name: str, node: Mapping[str, Any]) -> str:
    if not node.get("cheat"):
        return name + (" (slashed!)" if node.get("slashes") else "")
    return f"{name}\n{node['cheat']}, " + ("slashed" if node.get("slashes") else "ESCAPED")


def _rollout_panel(axes: Any, summary: Mapping[str, Any]) -> None:
    from matplotlib.ticker import MaxNLocator

    workers = [(name, n) for name, n in _mapping(summary.get("nodes")).items() if n.get("role") == "worker"]
    axes.set_title("rollouts per worker, by validator verdict (hatched: cheater)")
    if not workers:
        axes.text(0.5, 0.5, "no workers", ha="center", va="center", transform=axes.transAxes)
        return
    width = 0.4
    for offset, field, colour, label in (
        (-width / 2, "rollouts_accepted", "tab:green", "accepted"),
        (width / 2, "rollouts_rejected", "tab:red", "rejected"),
    ):
        bars = axes.bar(
            [i + offset for i in range(len(workers))],
            [n.get(field, 0) for _, n in workers],
            width,
            color=colour,
            label=label,
        )
        for bar, (_, node) in zip(bars, workers, strict=True):
            if node.get("cheat"):
                bar.set_hatch("//")
                bar.set_edgecolor("black")
    axes.set_xticks(range(len(workers)))
    axes.set_xticklabels(
        [_worker_label(name, n) for name, n in workers], fontsize="small", rotation=20, ha="right"
    )
    axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_ylabel("rollouts")
    axes.legend(loc="best", fontsize="small")


def plot_summary(summary: Mapping[str, Any], path: Path) -> Path:
    """Writes a two-panel PNG (reward per step; accepted vs rejected per worker) to `path`."""
    from matplotlib.figure import Figure  # lazy: importing this module stays cheap

    figure = Figure(figsize=(12, 4.5), layout="constrained")
    reward_axes, rollout_axes = figure.subplots(1, 2)
    _reward_panel(reward_axes, summary)
    _rollout_panel(rollout_axes, summary)
    figure.suptitle(f"devnet {summary.get('run', '')}")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png", dpi=100)
    return path
