"""A node's dashboard: the figures an operator watches, from the node's own status document.

`figures(status)` picks them out of the status document (node.runtime.NodeRuntime.status, also written to
`data_dir/status.json`): peers, versions followed, rollouts accepted and rejected, reward per step,
staleness, verdicts by reason and the ledger counts the node keeps. It is the one source of the numbers:
the metrics port serves them as `/figures.json` for `PAGE` to render, and `swarmnode status` prints them
with the same labels and wording (`figure_text`). Nothing here counts anything; it only reads.

`PAGE` is self-contained (inline CSS and script, no external asset: nodes often run offline). It fetches
`/figures.json` every 2 s and shows each figure in an element with `data-figure` (its key), `data-value`
(the value as JSON) and `id="figure-<key>"`, so a browser test reads back exactly what the node served.
Pure: no node import, so both the metrics server and the status command build on it.
"""

from __future__ import annotations

from typing import Any

# Every figure, in the page's order: key -> (section, label). A figure a role does not have is left out.
LABELS: dict[str, tuple[str, str]] = {
    "role": ("node", "role"),
    "run": ("node", "run"),
    "peer_id": ("node", "peer id"),
    "state": ("node", "state"),
    "peers": ("node", "peers connected"),
    "version": ("versions", "version followed"),
    "newest_known": ("versions", "newest version announced"),
    "versions_held": ("versions", "versions held"),
    "mb_served": ("versions", "MB served"),
    "step": ("training", "trainer step"),
    "rewards": ("training", "reward per step"),
    "rollouts_submitted": ("rollouts", "rollouts submitted"),
    "rollouts_received": ("rollouts", "rollouts received"),
    "rollouts_used": ("rollouts", "rollouts trained on"),
    "rollouts_accepted": ("rollouts", "rollouts accepted"),
    "rollouts_rejected": ("rollouts", "rollouts rejected"),
    "rollouts_ignored": ("rollouts", "rollouts ignored"),
    "rollouts_queued": ("rollouts", "rollouts queued"),
    "versions_behind": ("staleness", "versions behind the newest"),
    "stale_dropped": ("staleness", "rollouts dropped as stale"),
    "rollouts_undelivered": ("staleness", "rollouts gone stale undelivered"),
    "verdicts_by_reason": ("verdicts", "verdicts by reason"),
    "credits_committed": ("ledger", "credits committed"),
    "credit_batches": ("ledger", "credit batches"),
    "credits_queued": ("ledger", "credits queued"),
    "slashes_filed": ("ledger", "slashes filed"),
    "slashes_finalized": ("ledger", "slashes finalized"),
    "registered_nodes": ("ledger", "registered nodes"),
    "eligible_validators": ("ledger", "eligible validators"),
}


def started_state(status: dict[str, Any]) -> str:
    """ready (started and connected), started but alone, or still starting."""
    if status.get("ready"):
        return "ready"
    return "started, no peer yet" if status.get("started") else "starting"


def figures(status: dict[str, Any]) -> dict[str, Any]:
    """The dashboard's figures of one status document, in `LABELS` order (JSON-ready values)."""
    role = status.get("role")
    work = status.get("work") or {}
    found: dict[str, Any] = {
        "role": role,
        "run": status.get("run"),
        "peer_id": status.get("peer_id"),
        "state": "stopped" if status.get("stopped") else started_state(status),
        "peers": len(status.get("connected_peers") or []),
    }
    by_role = {
        "trainer": _trainer_figures,
        "worker": _worker_figures,
        "validator": _validator_figures,
        "relay": _relay_figures,
    }
    if role in by_role and isinstance(work, dict):
        found |= by_role[role](work)
    found |= _ledger_view_figures(status.get("authority") or {})
    return {key: found[key] for key in LABELS if key in found}


def _trainer_figures(work: dict[str, Any]) -> dict[str, Any]:
    """A trainer's rollouts are what it pulled from validators; accepted/rejected, the verdicts it saw."""
    verdicts = (work.get("verdicts") or {}).values()
    return {
        "version": work.get("version"),
        "step": work.get("step", 0),
        "rewards": list(work.get("rewards") or []),
        "rollouts_received": work.get("submissions_received", 0),
        "rollouts_used": work.get("submissions_used", 0),
        "rollouts_accepted": sum(counts.get("accepted", 0) for counts in verdicts),
        "rollouts_rejected": sum(counts.get("rejected", 0) for counts in verdicts),
        "stale_dropped": work.get("stale_dropped", 0),
    }


def _worker_figures(work: dict[str, Any]) -> dict[str, Any]:
    """A worker's own rollouts and the verdicts on them; staleness is how far its weights lag."""
    version, newest = work.get("version"), work.get("newest_known")
    behind = newest - version if isinstance(version, int) and isinstance(newest, int) else None
    return {
        "version": version,
        "newest_known": newest,
        "rollouts_submitted": work.get("submitted", 0),
        "rollouts_accepted": work.get("accepted", 0),
        "rollouts_rejected": work.get("rejected", 0),
        "versions_behind": behind,
        "rollouts_undelivered": work.get("undelivered", 0),
        "verdicts_by_reason": dict(work.get("by_reason") or {}),
    }


def _validator_figures(work: dict[str, Any]) -> dict[str, Any]:
    """What a validator judged, why it refused, and what it credited and slashed on the ledger."""
    held = list(work.get("versions_held") or [])
    credits = work.get("credits") or {}
    return {
        "version": max(held) if held else None,
        "versions_held": held,
        "rollouts_accepted": work.get("accepted", 0),
        "rollouts_rejected": work.get("rejected", 0),
        "rollouts_ignored": work.get("ignored", 0),
        "rollouts_queued": work.get("queued", 0),
        "verdicts_by_reason": dict(work.get("by_reason") or {}),
        "credits_committed": credits.get("committed", 0),
        "credit_batches": credits.get("batches", 0),
        "credits_queued": credits.get("queued", 0),
        "slashes_filed": work.get("slashes", 0),
        "slashes_finalized": work.get("slashes_finalized", 0),
    }


def _relay_figures(work: dict[str, Any]) -> dict[str, Any]:
    held = list(work.get("versions_held") or [])
    return {
        "version": max(held) if held else None,
        "versions_held": held,
        "mb_served": round(work.get("bytes_served", 0) / 1e6, 1),
    }


def _ledger_view_figures(authority: dict[str, Any]) -> dict[str, Any]:
    """The ledger's sets as this node last read them; none for a node without a ledger."""
    pairs = (("registered_nodes", "registered"), ("eligible_validators", "validators"))
    return {key: authority[field] for key, field in pairs if authority.get(field) is not None}


def figure_text(key: str, value: Any) -> str:
    """How a figure reads, on the page and in `swarmnode status` alike."""
    if value is None:
        return "-"
    if key == "rewards":
        return rewards_text(value)
    if isinstance(value, dict):
        return ", ".join(f"{name} {count}" for name, count in value.items()) or "none"
    if isinstance(value, list):
        return ", ".join(str(item) for item in value) or "none"
    return str(value)


def rewards_text(rewards: list[float]) -> str:
    """The newest step's mean reward, where the run started from, and how many steps in between."""
    if not rewards:
        return "none yet"
    first = f", first {rewards[0]:.3f}" if len(rewards) > 1 else ""
    return f"{rewards[-1]:.3f} at step {len(rewards)}{first}"


def figures_document(status: dict[str, Any]) -> dict[str, Any]:
    """`/figures.json`: each figure with its section, label, value and text, for the page to lay out."""
    return {
        "updated": status.get("updated"),
        "figures": [
            {
                "key": key,
                "section": LABELS[key][0],
                "label": LABELS[key][1],
                "value": value,
                "text": figure_text(key, value),
            }
            for key, value in figures(status).items()
        ],
    }


REFRESH_MS = 2000

PAGE = (
    """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>swarmnode</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body { font: 14px/1.45 system-ui, sans-serif; margin: 0; background: #f5f6f8; color: #1d2733; }
header { background: #1d2733; color: #fff; padding: 12px 20px; display: flex; gap: 18px;
         align-items: baseline; flex-wrap: wrap; }
header h1 { font-size: 18px; margin: 0; }
#connection { font-size: 12px; padding: 1px 8px; border-radius: 9px; background: #2e7d32; }
#connection.down { background: #b3261e; }
#updated { margin-left: auto; font-size: 12px; opacity: .8; }
main { display: flex; flex-wrap: wrap; gap: 14px; padding: 14px; }
section { background: #fff; border: 1px solid #d8dde3; border-radius: 6px; padding: 8px 14px 10px;
          flex: 1 1 320px; }
section h2 { font-size: 12px; text-transform: uppercase; letter-spacing: .06em; color: #5b6876;
             margin: 0 0 4px; }
table { border-collapse: collapse; width: 100%; }
th { font-weight: normal; text-align: left; color: #5b6876; padding: 3px 14px 3px 0; white-space: nowrap;
     vertical-align: top; width: 1%; }
td { padding: 3px 0; font-variant-numeric: tabular-nums; overflow-wrap: anywhere; }
svg.sparkline { display: block; margin-top: 4px; }
svg.sparkline polyline { fill: none; stroke: #1565c0; stroke-width: 1.5; }
svg.sparkline circle { fill: #1565c0; }
</style></head>
<body>
<header><h1 id="title">swarmnode</h1><span id="connection">loading</span><span id="updated"></span></header>
<main id="sections"></main>
<script>
"use strict";
const REFRESH_MS = __REFRESH_MS__;
const SVG = "http://www.w3.org/2000/svg";

// Reward per step as a line: every value is text or an attribute, never markup (peers name some of them).
function sparkline(values) {
  const width = 300, height = 48, pad = 4;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("class", "sparkline");
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  const low = Math.min(...values), high = Math.max(...values), span = high - low || 1;
  const inner = width - 2 * pad, gaps = Math.max(values.length - 1, 1);
  const x = (i) => pad + (values.length > 1 ? i * inner / gaps : inner / 2);
  const y = (v) => height - pad - (v - low) * (height - 2 * pad) / span;
  const points = values.map((v, i) => x(i).toFixed(1) + "," + y(v).toFixed(1));
  const line = document.createElementNS(SVG, "polyline");
  line.setAttribute("points", points.join(" "));
  svg.appendChild(line);
  const last = document.createElementNS(SVG, "circle");
  last.setAttribute("cx", x(values.length - 1));
  last.setAttribute("cy", y(values[values.length - 1]));
  last.setAttribute("r", 2.5);
  svg.appendChild(last);
  return svg;
}

function render(doc) {
  const sections = new Map();
  const byKey = {};
  for (const figure of doc.figures) {
    byKey[figure.key] = figure;
    if (!sections.has(figure.section)) {
      const section = document.createElement("section");
      section.id = "section-" + figure.section;
      const title = document.createElement("h2");
      title.textContent = figure.section;
      const table = document.createElement("table");
      section.append(title, table);
      sections.set(figure.section, {section, table});
    }
    const row = document.createElement("tr");
    const label = document.createElement("th");
    label.textContent = figure.label;
    const cell = document.createElement("td");
    cell.id = "figure-" + figure.key;
    cell.dataset.figure = figure.key;
    cell.dataset.value = JSON.stringify(figure.value);
    cell.textContent = figure.text;
    if (figure.key === "rewards" && figure.value.length) cell.appendChild(sparkline(figure.value));
    row.append(label, cell);
    sections.get(figure.section).table.appendChild(row);
  }
  document.getElementById("sections").replaceChildren(...[...sections.values()].map((s) => s.section));
  const role = byKey.role ? byKey.role.text : "node", run = byKey.run ? byKey.run.text : "?";
  document.getElementById("title").textContent = role + " of run " + run;
  document.title = role + " of run " + run + " - swarmnode";
  const updated = document.getElementById("updated");
  updated.dataset.value = JSON.stringify(doc.updated);
  updated.textContent = doc.updated ? "status of " + new Date(doc.updated * 1000).toLocaleTimeString() : "";
}

async function refresh() {
  const connection = document.getElementById("connection");
  try {
    const answer = await fetch("/figures.json", {cache: "no-store"});
    if (!answer.ok) throw new Error("HTTP " + answer.status);
    render(await answer.json());
    connection.textContent = "live";
    connection.className = "";
  } catch (error) {
    connection.textContent = "node not answering (" + error.message + ")";
    connection.className = "down";
  }
}

refresh();
setInterval(refresh, REFRESH_MS);
</script>
</body></html>
"""
).replace("__REFRESH_MS__", str(REFRESH_MS))
