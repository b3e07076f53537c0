"""One TOML file per node; command-line flags override it.

```toml
[node]
identity = "node.key"              # keystore v3 file, relative to this file
listen = "/ip4/0.0.0.0/tcp/4001"
announce = ["/ip4/203.0.113.7/tcp/4001"]   # optional: the addresses peers reach us at (default: listen)
dialable = true                    # false behind NAT: announce nothing, DHT client, no Hello endpoint
bootstrap = ["/ip4/10.0.0.1/tcp/4001/p2p/16Uiu2..."]
run = "my-run"
role = "worker"                    # trainer | relay | worker | validator | bootstrap
ledger_url = "signed:/srv/swarm/ledger.db"   # signed:PATH (one SQLite file every node opens) | evm:URL
data_dir = "data"                  # relative to this file
http_host = "127.0.0.1"            # data plane (HTTP) endpoint announced in Hello
http_port = 8080
metrics_port = 9100                # Prometheus /metrics on 127.0.0.1; 0 disables
trainer = "0x..."                  # optional: accept only this trainer's run descriptor
log_level = "INFO"
libp2p_log_level = "ERROR"
record_deliveries = false          # append every delivered gossip message to data_dir/deliveries.jsonl

[discovery]   # DiscoverySettings fields, seconds
[gossip]      # degree, degree_low, degree_high, heartbeat_interval, seen_ttl, forward_cap_per_topic,
              # max_pending
[liveness]    # interval, idle_after, max_strikes
[scoring]     # ScoreParams fields
[work]        # WorkSettings: what the role does with the network (training, generating, validating)
```
Unknown keys are errors: a typo must not silently fall back to a default.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from swarmnode.crypto.identity import parse_address
from swarmnode.node.p2p.dht import DiscoverySettings
from swarmnode.node.p2p.gossip import GossipSettings
from swarmnode.node.p2p.host import parse_announce
from swarmnode.node.p2p.records import InvalidRecord, check_run
from swarmnode.node.p2p.scoring import ScoreParams
from swarmnode.protocol.ledger_messages import MAX_CHALLENGE_WINDOW_EPOCHS

ROLE_NAMES = ("trainer", "relay", "worker", "validator", "bootstrap")


ENGINES = ("auto", "transformers", "vllm")


class ConfigError(ValueError):
    """The config file or a flag is invalid; the message says which key."""


@dataclass(frozen=True)
class LivenessSettings:
    interval: float = 10.0
    idle_after: float = 20.0
    max_strikes: int = 3


CHEATS = ("", "perturbed-model", "tampered-prompt", "forged-reward", "code-injection", "fabricated-env-turn",
          "greedy")
# What `devnet --cheat` plants and its report requires slashed; `greedy` breaks no rule a validator checks
# (a role abuse that fair judging bounds: tests/swarm/test_role_abuse_devnet.py), so it is not one of them.
DEVNET_CHEATS = tuple(c for c in CHEATS if c and c != "greedy")
# The built-in multi-turn environments (`node.rl.environments.registry`; a test holds the two equal), named
# here so that the CLI offers them without importing the environments.
ENVIRONMENT_CHOICES = ("calculator", "guess")


@dataclass(frozen=True)
class WorkSettings:
    """The role's work. Defaults run the committed devnet recipe on CPU; `steps = 0` trains forever."""

    steps: int = 0  # trainer: stop after this many GRPO steps (0: never)
    threads: int = 1  # torch intra-op threads of this process (the devnet shares 2 cores among 8 nodes)
    shard_mb: float = 1.0  # trainer: checkpoint shard size
    submissions_per_version: int = 4  # worker: most submissions per checkpoint version before waiting
    # worker, devnet only: perturbed-model | tampered-prompt | forged-reward | code-injection | greedy
    cheat: str = ""
    min_batch_groups: int = 0  # trainer: signal groups per step (0: the run's prompts_per_step)
    # trainer: a step that waited this long on a step's worth of groups, too few with signal, reports the
    # run as without learning signal (node.trainer.liveness; 0: never)
    no_signal_after_s: float = 600.0
    diloco_plan: str = ""  # trainer of a multi-trainer run: the DilocoRun file its lead signed
    diloco_lead: str = ""  # with diloco_plan: 0x address of the run's lead trainer, the plan's signer
    # Retention (spec/validation.md Retention, spec/bounds.md): checkpoint versions kept beyond the async
    # window by the validator's accepted log and the trainer's inbox (the audit horizon), and the most the
    # validator's accepted log may hold (only items every trainer has pulled are cut to keep under it).
    retention_versions: int = 4
    accepted_max_mb: int = 2048
    # The run's model and tasks, which every role checks against the signed RunDescriptor: a Hugging Face
    # model folder and a JSONL/Parquet task file ("" = the devnet's built-in model and generated tasks);
    # in a config file, relative to the file (`WORK_PATHS`).
    model: str = ""
    tasks: str = ""
    engine: str = "auto"  # auto (vLLM when CUDA and the vllm extra are present, else transformers)
    max_new_tokens: int = 6  # trainer, when it creates its run: the longest completion (GRPO max_new_tokens)
    # Trainer, when it creates its run: a built-in environment its episodes play (spec/environments.md);
    # "": single-turn, each task graded by its kind's grader. In a multi-turn run max_new_tokens is per turn.
    environment: str = ""
    # The run on the ledger (spec/ledger.md): the lead trainer registers it with the validators it trusts
    # (0x addresses; only they may credit or slash in it) and the epochs a slash waits, voidable, before
    # it takes stake. Validators commit their accepted credits as one batch every credit_interval_s (a real
    # swarm: about one ledger epoch) and finalize their slashes once the window passed.
    run_validators: tuple[str, ...] = ()
    challenge_window_epochs: int = 24
    # Worker and validator: the longest challenge window of a run this node takes part in (a pending slash
    # freezes its stake that long); the protocol allows at most MAX_CHALLENGE_WINDOW_EPOCHS (720).
    max_challenge_window_epochs: int = 168
    credit_interval_s: float = 5.0
    slash_check_s: float = 5.0
    # Trainer: ranks of its FSDP2 process group on this host (1: one process). Rank 0 is the node; a rank
    # that dies ends the group, which the launcher restarts up to max_restarts times (it resumes from the
    # last saved step).
    nproc: int = 1
    max_restarts: int = 3


@dataclass(frozen=True)
class NodeConfig:
    identity: Path
    run: str
    role: str
    data_dir: Path
    listen: str = "/ip4/0.0.0.0/tcp/4001"
    announce: tuple[str, ...] = ()  # () = the listen address (spec/discovery.md, Reachable addresses)
    dialable: bool = True
    bootstrap: tuple[str, ...] = ()
    ledger_url: str = ""
    http_host: str = "127.0.0.1"
    http_port: int = 8080
    metrics_port: int = 0
    trainer: bytes | None = None
    log_level: str = "INFO"
    libp2p_log_level: str = "ERROR"
    record_deliveries: bool = False
    discovery: DiscoverySettings = field(default_factory=DiscoverySettings)
    gossip: GossipSettings = field(default_factory=GossipSettings)
    liveness: LivenessSettings = field(default_factory=LivenessSettings)
    scoring: ScoreParams = field(default_factory=ScoreParams)
    work: WorkSettings = field(default_factory=WorkSettings)

    @property
    def http_endpoint(self) -> str:
        """The data-plane endpoint Hello announces; none for a node nobody can dial."""
        if not self.dialable or not self.http_port:
            return ""
        return f"http://{self.http_host}:{self.http_port}"

    def discovery_settings(self) -> DiscoverySettings:
        return replace(self.discovery, bootstrap=self.bootstrap, trainer=self.trainer)


_NODE_KEYS = {
    "identity",
    "listen",
    "announce",
    "dialable",
    "bootstrap",
    "run",
    "role",
    "ledger_url",
    "data_dir",
    "http_host",
    "http_port",
    "metrics_port",
    "trainer",
    "log_level",
    "libp2p_log_level",
    "record_deliveries",
}
_GOSSIP_KEYS = {
    "degree",
    "degree_low",
    "degree_high",
    "heartbeat_interval",
    "seen_ttl",
    "forward_cap_per_topic",
    "pending_ttl",
    "max_pending",
}


def _section(cls: type, table: dict[str, Any], name: str, allowed: set[str] | None = None) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    allowed = allowed if allowed is not None else set(fields) - {"bootstrap", "trainer", "policies"}
    unknown = set(table) - allowed
    if unknown:
        raise ConfigError(f"[{name}] has unknown key(s): {', '.join(sorted(unknown))}")
    values = {}
    for key, value in table.items():
        default = getattr(cls(), key)
        if isinstance(default, tuple):
            if not isinstance(value, list):
                raise ConfigError(f"[{name}] {key} must be a list")
            value = tuple(value)
        elif isinstance(default, bool) or isinstance(value, bool):
            if not isinstance(value, bool) or not isinstance(default, bool):
                raise ConfigError(f"[{name}] {key} must be a {type(default).__name__}")
        elif isinstance(default, (int, float)):
            if not isinstance(value, (int, float)) or (
                isinstance(default, int) and not isinstance(value, int)
            ):
                raise ConfigError(f"[{name}] {key} must be a {type(default).__name__}")
        values[key] = value
    return cls(**values)


def parse_config(document: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    """The keyword arguments of NodeConfig from a parsed TOML document (paths resolved from base_dir)."""
    unknown = set(document) - {"node", "discovery", "gossip", "liveness", "scoring", "work"}
    if unknown:
        raise ConfigError(f"unknown section(s): {', '.join(sorted(unknown))}")
    node = dict(document.get("node", {}))
    bad = set(node) - _NODE_KEYS
    if bad:
        raise ConfigError(f"[node] has unknown key(s): {', '.join(sorted(bad))}")
    kwargs: dict[str, Any] = {}
    for key in ("listen", "run", "role", "ledger_url", "http_host", "log_level", "libp2p_log_level"):
        if key in node:
            if not isinstance(node[key], str):
                raise ConfigError(f"[node] {key} must be a string")
            kwargs[key] = node[key]
    for key in ("identity", "data_dir"):
        if key in node:
            kwargs[key] = (base_dir / str(node[key])).resolve()
    for key in ("http_port", "metrics_port"):
        if key in node:
            if not isinstance(node[key], int) or not 0 <= node[key] < 65536:
                raise ConfigError(f"[node] {key} must be a port number")
            kwargs[key] = node[key]
    if "bootstrap" in node:
        if not isinstance(node["bootstrap"], list) or not all(isinstance(a, str) for a in node["bootstrap"]):
            raise ConfigError("[node] bootstrap must be a list of multiaddr strings")
        kwargs["bootstrap"] = tuple(node["bootstrap"])
    if "trainer" in node:
        kwargs["trainer"] = _address(node["trainer"])
    for key in ("record_deliveries", "dialable"):
        if key in node:
            if not isinstance(node[key], bool):
                raise ConfigError(f"[node] {key} must be true or false")
            kwargs[key] = node[key]
    if "announce" in node:
        if not isinstance(node["announce"], list) or not all(isinstance(a, str) for a in node["announce"]):
            raise ConfigError("[node] announce must be a list of multiaddr strings")
        kwargs["announce"] = tuple(node["announce"])
    if "discovery" in document:
        kwargs["discovery"] = _section(DiscoverySettings, document["discovery"], "discovery")
    if "gossip" in document:
        kwargs["gossip"] = _section(GossipSettings, document["gossip"], "gossip", _GOSSIP_KEYS)
    if "liveness" in document:
        kwargs["liveness"] = _section(LivenessSettings, document["liveness"], "liveness")
    if "scoring" in document:
        kwargs["scoring"] = _section(ScoreParams, document["scoring"], "scoring")
    if "work" in document:
        work = _section(WorkSettings, document["work"], "work")
        kwargs["work"] = check_work(replace(work, **{key: str((base_dir / path).resolve())
                                                     for key in WORK_PATHS if (path := getattr(work, key))}))
    return kwargs


WORK_PATHS = ("model", "tasks", "diloco_plan")  # [work] files, relative to the config file like [node]'s


def check_work(work: WorkSettings) -> WorkSettings:
    if work.cheat not in CHEATS:
        named = ", ".join(c for c in CHEATS if c)
        raise ConfigError(f"[work] cheat must be one of {named}, not {work.cheat!r}")
    if work.steps < 0 or work.threads < 1 or work.submissions_per_version < 1 or work.min_batch_groups < 0:
        raise ConfigError(
            "[work] steps and min_batch_groups must be >= 0; threads and submissions_per_version >= 1"
        )
    if work.no_signal_after_s < 0:
        raise ConfigError("[work] no_signal_after_s must be >= 0 (0: never report a run without signal)")
    if not 1 <= work.nproc <= 64 or work.max_restarts < 0:
        raise ConfigError("[work] nproc must be in [1, 64] and max_restarts >= 0")
    if work.retention_versions < 2 or work.accepted_max_mb < 1:
        raise ConfigError(
            "[work] retention_versions must be >= 2 (a resume from the previous save and the version the "
            "origin keeps) and accepted_max_mb >= 1"
        )
    if not 0 < work.shard_mb <= 1024:
        raise ConfigError("[work] shard_mb must be in (0, 1024]")
    if work.max_new_tokens < 1:
        raise ConfigError("[work] max_new_tokens must be >= 1")
    if work.engine not in ENGINES:
        raise ConfigError(f"[work] engine must be one of {', '.join(ENGINES)}, not {work.engine!r}")
    for key in ("model", "tasks"):
        path = getattr(work, key)
        if path and not Path(path).expanduser().exists():
            raise ConfigError(f"[work] {key} = {path!r} does not exist")
    if work.challenge_window_epochs < 0 or not work.credit_interval_s > 0 or not work.slash_check_s > 0:
        raise ConfigError(
            "[work] challenge_window_epochs must be >= 0; credit_interval_s and slash_check_s > 0"
        )
    for key in ("challenge_window_epochs", "max_challenge_window_epochs"):
        if not 0 <= getattr(work, key) <= MAX_CHALLENGE_WINDOW_EPOCHS:
            bound = MAX_CHALLENGE_WINDOW_EPOCHS  # how long a pending slash may freeze stake
            raise ConfigError(f"[work] {key} must be in 0..{bound} epochs (the protocol's bound on "
                              f"how long a pending slash freezes stake), not {getattr(work, key)}")
    for text in work.run_validators:
        if not isinstance(text, str) or len(_hex_bytes(text)) != 20:
            raise ConfigError(f"[work] run_validators must be 0x addresses, not {text!r}")
    if bool(work.diloco_plan) != bool(work.diloco_lead):
        raise ConfigError("[work] diloco_plan and diloco_lead go together (the plan file and its signer)")
    if work.diloco_lead:
        if len(_hex_bytes(work.diloco_lead)) != 20:
            raise ConfigError(f"[work] diloco_lead must be a 20-byte 0x address, not {work.diloco_lead!r}")
    return work


def _hex_bytes(text: str) -> bytes:
    """The bytes of 0x-prefixed hex; b"" for anything else."""
    try:
        return bytes.fromhex(text.removeprefix("0x"))
    except ValueError:
        return b""


def run_validator_addresses(work: WorkSettings) -> tuple[bytes, ...]:
    return tuple(_hex_bytes(text) for text in work.run_validators)


def _address(text: object) -> bytes:
    if not isinstance(text, str):
        raise ConfigError("trainer must be a 0x-prefixed address string")
    try:
        return parse_address(text)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def load_config(path: Path | None, overrides: dict[str, Any] | None = None) -> NodeConfig:
    """Read `path` (if given), apply non-None `overrides` (flag values), and check the result."""
    kwargs: dict[str, Any] = {}
    if path is not None:
        try:
            document = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config {path}: {exc}") from None
        kwargs = parse_config(document, path.resolve().parent)
    for key, value in (overrides or {}).items():
        if value is None or value == ():
            continue
        if key in ("identity", "data_dir"):
            value = Path(value).resolve()
        elif key == "trainer":
            value = _address(value)
        elif key == "bootstrap":
            value = tuple(value)
        elif key == "work":
            value = check_work(dataclasses.replace(kwargs.get("work", WorkSettings()), **value))
        kwargs[key] = value
    missing = [k for k in ("identity", "run", "role", "data_dir") if k not in kwargs]
    if missing:
        raise ConfigError(f"missing required setting(s): {', '.join(missing)} (in [node] or as flags)")
    if kwargs["role"] not in ROLE_NAMES:
        raise ConfigError(f"role must be one of {', '.join(ROLE_NAMES)}, not {kwargs['role']!r}")
    try:
        check_run(kwargs["run"])
    except InvalidRecord as exc:
        raise ConfigError(str(exc)) from None
    check_reachability(kwargs.get("announce", ()), kwargs.get("dialable", True))
    return NodeConfig(**kwargs)


def check_reachability(announce: tuple[str, ...], dialable: bool) -> None:
    """`announce` must be multiaddrs; a node that cannot be dialed announces none."""
    if announce and not dialable:
        raise ConfigError("[node] announce must be empty when dialable = false (nobody can dial us)")
    try:
        parse_announce(announce)
    except ValueError as exc:
        raise ConfigError(f"[node] announce: {exc}") from None


def render_config(config: NodeConfig, base_dir: Path) -> dict[str, Any]:
    """The [node] table of a config (paths relative to base_dir), for writing devnet configs with tomli_w."""

    def rel(path: Path) -> str:
        try:
            return str(path.relative_to(base_dir))
        except ValueError:
            return str(path)

    node: dict[str, Any] = {
        "identity": rel(config.identity),
        "listen": config.listen,
        "announce": list(config.announce),
        "dialable": config.dialable,
        "bootstrap": list(config.bootstrap),
        "run": config.run,
        "role": config.role,
        "ledger_url": config.ledger_url,
        "data_dir": rel(config.data_dir),
        "http_host": config.http_host,
        "http_port": config.http_port,
        "metrics_port": config.metrics_port,
        "log_level": config.log_level,
        "libp2p_log_level": config.libp2p_log_level,
        "record_deliveries": config.record_deliveries,
    }
    if config.trainer is not None:
        node["trainer"] = "0x" + config.trainer.hex()
    return {"node": node, "work": dataclasses.asdict(config.work)}
