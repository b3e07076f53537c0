"""The RL devnet on an emulated WAN (issue #19): every node in its own network namespace, one home worker
behind NAT that nobody can dial, and a cheater; and what a node announces as its reachable address.

The devnet test is slow (multi-process, root only: skipped with the reason where namespaces cannot be
made); `-m slow` runs it, under the `global` profile (150-300 ms RTT, 0.5% loss): about 3 minutes on
2 cores.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import multiaddr  # type: ignore[import-untyped]
import pytest
from hypothesis import given
from hypothesis import strategies as st

from swarmnode.node.config import ConfigError, load_config
from swarmnode.node.devnet.plan import DevnetPlan
from swarmnode.node.p2p.host import announced_addrs, parse_announce
from swarmnode.node.wan import WanUnavailable, check_available
from swarmnode.node.wan.netns import namespaces

ROOT = Path(__file__).resolve().parents[2]
WAN_PROFILE = "global"
STEPS = 6
RUN_TIMEOUT_S = 780


def _require_netns() -> None:
    try:
        check_available()
    except WanUnavailable as err:
        pytest.skip(str(err))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_rl_devnet_trains_over_a_wan_with_a_home_worker_and_a_cheater(tmp_path: Path) -> None:
    _require_netns()
    before = set(namespaces())
    summary_path = tmp_path / "summary.json"
    run = subprocess.run(
        [
            sys.executable, "-m", "swarmnode.node.cli.main", "devnet", "--no-live", "--steps", str(STEPS),
            "--relays", "1", "--workers", "2", "--home-workers", "1", "--cheaters", "1",
            "--wan", WAN_PROFILE, "--out", str(tmp_path / "run"), "--summary", str(summary_path),
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert not set(namespaces()) - before, "the devnet left namespaces behind"

    summary = json.loads(summary_path.read_text())
    assert summary["wan"]["profile"] == WAN_PROFILE
    assert summary["final_reward"] > summary["base_reward"], (summary["base_reward"], summary["final_reward"])
    assert summary["every_cheater_slashed"] is True and summary["honest_slashed"] == []

    links = summary["wan"]["links"]
    assert links["worker-1"]["nat"] is True and not any(v["nat"] for k, v in links.items() if k != "worker-1")
    home = summary["nodes"]["worker-1"]
    assert home["honest"] is True
    assert home["rollouts_accepted"] > 0, home  # the NATed worker's work counts
    assert home["contributions"] > 0, home  # and is credited on the ledger

    layout = json.loads((tmp_path / "run" / "devnet.json").read_text())
    statuses = {
        name: json.loads((tmp_path / "run" / name / "data" / "status.json").read_text())
        for name in layout["nodes"]
    }
    for name, node in layout["nodes"].items():
        assert not node["host"].startswith("127."), (name, node["host"])
        announced = statuses[name]["listen_addrs"]
        if name == "worker-1":
            assert announced == [], announced  # behind NAT: nothing to dial
        else:
            assert announced and all(f"/ip4/{node['host']}/" in a for a in announced), (name, announced)
    home_config = (tmp_path / "run" / "worker-1" / "node.toml").read_text()
    assert "dialable = false" in home_config
    # the emulator drops (and counts) every packet that opens a connection to a NATed node: nobody dialed it
    assert json.loads((tmp_path / "run" / "wan-stats.json").read_text())["dropped_nat"] == 0


def _addr(host: str, port: int) -> multiaddr.Multiaddr:
    return multiaddr.Multiaddr(f"/ip4/{host}/tcp/{port}")


hosts = st.one_of(
    st.sampled_from(["127.0.0.1", "127.5.6.7", "0.0.0.0", "10.64.0.2", "203.0.113.9"]),
    st.ip_addresses(v=4).map(str),
)
candidate_lists = st.lists(st.builds(_addr, hosts, st.integers(1, 65535)), max_size=6)


@given(candidate_lists)
def test_announced_addresses_are_reachable_ones(candidates: list[multiaddr.Multiaddr]) -> None:
    announced = announced_addrs(candidates, dialable=True)
    assert set(map(str, announced)) <= set(map(str, candidates))
    reachable = [a for a in candidates if not a.value_for_protocol("ip4").startswith(("127.", "0.0.0.0"))]
    if reachable:  # a node with a reachable address never announces loopback or 0.0.0.0 beside it
        assert [str(a) for a in announced] == [str(a) for a in reachable]
    else:  # loopback only (a swarm on 127.0.0.1): loopback it is; 0.0.0.0 never
        assert all(a.value_for_protocol("ip4").startswith("127.") for a in announced)
    assert announced_addrs(candidates, dialable=False) == []  # behind NAT: nothing, whatever we listen on
    configured = [_addr("198.51.100.4", 4001)]
    assert announced_addrs(candidates, announce=configured, dialable=True) == configured


@pytest.mark.parametrize(
    "text", ["/ip4/127.0.0.1/tcp/4001", "/ip4/0.0.0.0/tcp/4001", "/ip4/10.0.0.1/udp/4001", "not an addr", ""]
)
def test_an_announce_address_nobody_can_dial_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"cannot be dialed|not a TCP multiaddr"):
        parse_announce([text])


def _config(tmp_path: Path, node: str) -> Path:
    path = tmp_path / "node.toml"
    path.write_text(f'[node]\nidentity = "k"\nrun = "r"\nrole = "worker"\ndata_dir = "d"\n{node}\n')
    return path


def test_config_reachability_settings(tmp_path: Path) -> None:
    home = load_config(_config(tmp_path, "dialable = false\nhttp_port = 8080"))
    assert home.dialable is False and home.http_endpoint == ""  # Hello names no endpoint behind NAT
    public = load_config(_config(tmp_path, 'announce = ["/ip4/203.0.113.7/tcp/4001"]'))
    assert public.announce == ("/ip4/203.0.113.7/tcp/4001",) and public.dialable is True
    for bad, message in (
        ('announce = ["/ip4/203.0.113.7/tcp/4001"]\ndialable = false', "must be empty when dialable"),
        ('announce = ["/ip4/127.0.0.1/tcp/4001"]', "cannot be dialed"),
        ('announce = "/ip4/203.0.113.7/tcp/4001"', "must be a list"),
        ('dialable = "no"', "must be true or false"),
    ):
        with pytest.raises(ConfigError, match=message):
            load_config(_config(tmp_path, bad))


def test_home_workers_are_the_first_workers_and_only_workers() -> None:
    plan = DevnetPlan(relays=1, workers=3, cheaters=("forged-reward",), wan="global", home_workers=2)
    profiles = plan.wan_profiles()
    assert list(profiles) == [name for name, _ in plan.roles()]
    assert {n for n, p in profiles.items() if p == "home"} == {"worker-1", "worker-2"}
    assert {p for n, p in profiles.items() if n not in ("worker-1", "worker-2")} == {"global"}
