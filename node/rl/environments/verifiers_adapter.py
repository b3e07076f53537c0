"""Bring your own environment: `verifiers` environments (Prime Intellect's library, 0.3.1's classic API)
that a swarm can verify, played and replayed in the sandbox (spec/environments.md, Verifiers environments).

Decisions:
- A run names `verifiers.<module>`: an environment module in the node's environments folder
  (`SWARMNODE_VERIFIERS_ENVS`, default the repository's examples/verifiers) exposing `load_environment`, as
  verifiers' own loader expects. Its version is `<verifiers version>+<the module file's sha256, 16 hex>`,
  so the run commits to the library and to the environment's code byte for byte; a node with other code
  refuses the run, naming both.
- verifiers lives in its own virtual environment (`SWARMNODE_VERIFIERS_VENV`, default build/verifiers-venv,
  made by scripts/install_verifiers.sh): it is 715 MB of dependencies the node does not share. Every call
  into it runs in the sandbox, never in the node, with that venv's packages read-only on its path. One run
  answers many episodes (`respond_many`): importing verifiers costs about 3 s, so a worker asks once per
  round of turns and a validator once per submission.
- A task of kind `verifiers` carries its dataset row whole with the environment's module and arguments
  (`tasks.verifiers_rows`): the run's dataset hash commits to them, and no node downloads a dataset.
- Replay drives the environment's own `rollout` with a client that hands out the claimed model turns and
  stops when they run out: the environment's messages at that point are its next turn (their text joined
  by blank lines); a rollout that completes is scored by its rubric, and that reward ends the episode.
  Each call replays from the start, so nothing carries between episodes inside the sandbox.
- Refused, with why (`VerifiersRefused`): any verifiers class the adapter has not vetted (a judge model, a
  remote sandbox or tool server, structured tool calls, a wall-clock timeout in the reward), group
  rewards, the environment's own wall-clock or token limits (the run's bounds apply), and anything that is
  not the same twice: the vetting plays sample episodes forward and in reverse in one process and again in
  another, and any difference (unseeded randomness, the clock, state kept between episodes) refuses it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import secrets
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarmnode.node.errors import OperatorError
from swarmnode.node.rl.environments import Done, EnvBounds, EnvCall, EnvTurn, WrongTaskKind
from swarmnode.node.rl.tasks.core import GraderFault, Task
from swarmnode.node.rl.tasks.families import canonical
from swarmnode.node.rl.tasks.graders import VERIFIERS_KIND
from swarmnode.node.rl.tasks.verifiers_rows import Row, parse_task
from swarmnode.node.sandbox import Outcome, RunResult, SandboxLimits, run_python
from swarmnode.node.sandbox.bwrap import read_only_path
from swarmnode.node.sandbox.replies import PROGRAM_PREAMBLE, nonced_replies

KIND = VERIFIERS_KIND
PREFIX = "verifiers."
LIBRARY_VERSION = "0.3.1"  # the classic API (MultiTurnEnv, Rubric, load_environment); 0.4 removed it
ROOT = Path(__file__).resolve().parents[3]
DEFAULT_VENV = ROOT / "build" / "verifiers-venv"
DEFAULT_ENVS = ROOT / "examples" / "verifiers"
MODULE_HASH_CHARS = 16
DEFAULT_MAX_TURNS = 8
DEFAULT_MAX_ENV_BYTES = 4096
CACHE_ENTRIES = 4096  # answers kept between batches (each batch keeps all its own until the next one)
VET_ROWS = 4  # rows the vetting plays (each with every prefix of its scripted turns)
VET_TURNS = ("1", "8", "16", "I do not know.")  # scripted model turns: numbers and prose, as models write
REPLY_CHARS = 256  # one reply line beyond its environment text
RUN_LIMITS = SandboxLimits(wall_time_s=120.0, cpu_time_s=120, memory_bytes=8 << 30,
                           aggregate_memory_bytes=3 << 30, max_processes=64, scratch_bytes=64 << 20)
ESCAPED_CHARS = 12  # json.dumps writes a character as at most 12 (an astral one: two \uXXXX escapes)


class VerifiersRefused(OperatorError, ValueError):
    """A verifiers environment a swarm cannot verify, or one this node cannot load; the message says why."""


# ---------------------------------------------------------------------------- where the code is


def venv_path() -> Path:
    return Path(os.environ.get("SWARMNODE_VERIFIERS_VENV") or DEFAULT_VENV)


def envs_path() -> Path:
    return Path(os.environ.get("SWARMNODE_VERIFIERS_ENVS") or DEFAULT_ENVS)


@functools.cache
def _site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if not found:
        raise VerifiersRefused(f"no verifiers virtual environment at {venv}: run "
                               f"scripts/install_verifiers.sh (or set SWARMNODE_VERIFIERS_VENV)")
    return found[0]


@functools.cache
def installed_version(venv: Path) -> str:
    """The verifiers version installed in `venv`; VerifiersRefused unless it is `LIBRARY_VERSION`."""
    site = _site_packages(venv)
    found = sorted(site.glob("verifiers-*.dist-info"))
    version = found[0].name.removeprefix("verifiers-").removesuffix(".dist-info") if found else None
    if version != LIBRARY_VERSION:
        raise VerifiersRefused(f"swarmnode plays verifiers {LIBRARY_VERSION} environments; {venv} has "
                               f"{version or 'no verifiers'}: run scripts/install_verifiers.sh")
    return version


def module_file(module: str, folder: Path) -> Path:
    path = folder / f"{module}.py"
    if not module.isidentifier() or not path.is_file():
        raise VerifiersRefused(f"no verifiers environment module {module!r} in {folder} (set "
                               f"SWARMNODE_VERIFIERS_ENVS to the folder of your environment modules)")
    return path


def module_version(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:MODULE_HASH_CHARS]


# ---------------------------------------------------------------------------- the sandbox program

# Runs under `python -S` in the sandbox, its request on stdin. Replies are lines "<nonce> <json>" on the
# original stdout; anything else the library prints goes to /dev/null.
PROGRAM = PROGRAM_PREAMBLE + r'''
os.environ.update(HOME="/work", HF_HOME="/work/hf", XDG_CACHE_HOME="/work/cache", HF_HUB_OFFLINE="1",
                  HF_DATASETS_OFFLINE="1", HF_DATASETS_DISABLE_PROGRESS_BARS="1", OPENBLAS_NUM_THREADS="1",
                  OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
os.chdir("/work")
sys.path[:0] = request["path"]
# dill (which datasets hashes tables with) pickles by value any module it finds outside the interpreter's
# prefixes and outside a "site-packages" folder: the packages here sit under /ro, so name that a prefix
sys.real_prefix = "/ro"
import asyncio, logging
logging.disable(logging.CRITICAL)
import verifiers as vf
from verifiers.legacy.clients.client import Client
from verifiers.legacy.types import Response, ResponseMessage

ALLOWED = {"Environment", "MultiTurnEnv", "SingleTurnEnv", "Rubric", "RubricGroup", "MultiTurnMonitorRubric"}
JUDGED = "its reward asks a judge model over the network, which no validator can reproduce"
REMOTE = "it runs the model's actions on a remote machine or service, which no validator can replay"
WHY = {
    "JudgeRubric": JUDGED, "HybridMathRubric": JUDGED, "RemoteHybridMathRubric": JUDGED,
    "MathRubric": "its reward gives up on an answer after a wall-clock timeout, so whether an answer counts "
                  "depends on the machine's speed",
    "ToolEnv": "its tool calls travel as structured API fields, and swarmnode's model turns are text (parse "
               "the call from the text, as the built-in calculator does)",
    "StatefulToolEnv": "its tool calls travel as structured API fields, and swarmnode's model turns are text",
}
for name in ("SandboxEnv", "PythonEnv", "CliAgentEnv", "HarborEnv", "MCPEnv", "BrowserEnv", "OpenEnvEnv",
             "OpenCodeEnv", "OpenCodeQAEnv", "OpenCodeRLMEnv", "SWEDebugEnv", "SandboxDebugEnv"):
    WHY[name] = REMOTE

def library_classes(obj):
    return [c.__name__ for c in type(obj).__mro__ if c.__module__.split(".")[0] == "verifiers"]

def all_rubrics(rubric):
    yield rubric
    for sub in getattr(rubric, "rubrics", None) or []:
        yield from all_rubrics(sub)

def refusals(env):
    found = []
    for obj in [env, *all_rubrics(env.rubric)]:
        for name in library_classes(obj):
            if name not in ALLOWED:
                found.append(name + ": " + WHY.get(name, "a verifiers class swarmnode has not vetted for "
                                                         "deterministic replay"))
    if not isinstance(env, vf.MultiTurnEnv):
        found.append(type(env).__name__ + ": not a MultiTurnEnv, whose turns swarmnode replays")
        return found
    if env.requires_group_rollouts:
        found.append("group rewards: a completion's reward depends on the other rollouts of its group")
    if env.timeout_seconds is not None:
        found.append("timeout_seconds: a wall-clock limit cuts episodes by the machine's speed (the run's "
                     "turn and token bounds apply instead)")
    if env.max_total_completion_tokens > 0 or env.max_seq_len:
        found.append("token limits of its own: the run's token bounds apply instead")
    return found

class NeedTurn(Exception):
    def __init__(self, messages):
        self.messages = messages

class Scripted(Client):
    """Hands out the claimed model turns; asked for one more, stops the rollout with what the environment
    said since the last turn."""
    def __init__(self, turns):
        super().__init__(None)
        self.turns, self.used, self.seen = list(turns), 0, 0
    def setup_client(self, config):
        return None
    async def to_native_tool(self, tool):
        return tool
    async def to_native_prompt(self, messages):
        return messages, {}
    async def get_native_response(self, *args, **kwargs):
        raise RuntimeError("scripted")
    async def raise_from_native_response(self, response):
        return None
    async def from_native_response(self, response):
        return response
    async def close(self):
        return None
    async def get_response(self, prompt, model, sampling_args, tools=None, **kwargs):
        if self.used == len(self.turns):
            raise NeedTurn(list(prompt[self.seen:]))
        text = self.turns[self.used]
        self.used += 1
        self.seen = len(prompt) + 1
        return Response(id="swarmnode", created=0, model=model,
                        message=ResponseMessage(content=text, finish_reason="stop", is_truncated=False))

def text(message):
    content = message["content"] if "content" in message else None
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""

async def play(env, row, turns):
    client = Scripted(turns)
    try:
        state = await env.rollout(dict(row), client, "swarmnode", {})
    except NeedTurn as need:
        return {"env": "\n\n".join(text(m) for m in need.messages)[:request["max_chars"]]}
    if client.used < len(turns):
        return {"over": client.used}
    if state.get("error") is not None:
        return {"done": 0.0, "error": type(state["error"]).__name__[:64]}
    await env.rubric.score_rollout(state)
    return {"done": float(state["reward"])}

envs = {}
def environment(module, args):
    key = module + " " + json.dumps(args, sort_keys=True)
    if key not in envs:
        envs[key] = vf.load_environment(module, **args)
    return envs[key]

def plain(value):
    dump = lambda o: o.model_dump() if hasattr(o, "model_dump") else str(o)
    return json.loads(json.dumps(value, default=dump))

async def main():
    mode = request["mode"]
    if mode == "rows":
        env = environment(request["module"], request["args"])
        reply({"refusals": refusals(env)})
        rows = []
        for i, row in enumerate(env.get_dataset(n=request["count"])):
            kept = {"prompt": row["prompt"], "answer": row.get("answer", ""), "info": row.get("info") or {},
                    "example_id": row.get("example_id", i)}
            if isinstance(row.get("task"), dict):  # a plain string task route is no longer supported
                kept["task"] = row["task"]
            rows.append(plain(kept))
        reply({"rows": rows})
        return
    first = request["items"][0]
    reply({"refusals": refusals(environment(first[1], first[2]))})
    order = list(request["items"])
    for _ in range(2 if mode == "vet" else 1):
        for k, module, args, row, turns in order:
            try:
                body = await play(environment(module, args), row, turns)
            except Exception as exc:
                body = {"fault": type(exc).__name__[:64] + ": " + str(exc)[:200]}
            reply({"k": k, **body})
        order.reverse()

class PipeEnd:
    def __init__(self, fd):
        self.fd = fd
        os.set_blocking(fd, False)
    def fileno(self):
        return self.fd
    def setblocking(self, flag):
        os.set_blocking(self.fd, flag)
    def recv(self, size):
        return os.read(self.fd, size)
    def send(self, data):
        return os.write(self.fd, data)
    def close(self):
        os.close(self.fd)

class PipeLoop(asyncio.SelectorEventLoop):
    """asyncio's loop wakes itself through a socket pair, and the sandbox allows no socket: a pipe."""
    def _make_self_pipe(self):
        read, write = os.pipe()
        self._ssock, self._csock = PipeEnd(read), PipeEnd(write)
        self._internal_fds += 1
        self._add_reader(read, self._read_from_self)

try:
    loop = PipeLoop()
    asyncio.set_event_loop(loop)
    loop.run_until_complete(main())
except MemoryError:
    raise
except Exception as exc:
    reply({"problem": type(exc).__name__ + ": " + str(exc)[:300]})
'''


def _sandboxed(request: Mapping[str, Any], output_chars: int, venv: Path,
               folder: Path) -> tuple[RunResult, list[dict[str, Any]]]:
    """Run `PROGRAM` on `request` with the environments folder and verifiers' packages on its path."""
    paths = (str(folder), str(_site_packages(venv)))
    nonce = secrets.token_hex(16)
    body = {**request, "nonce": nonce, "path": [read_only_path(i) for i in range(len(paths))]}
    limits = dataclasses.replace(RUN_LIMITS, max_output_chars=output_chars,
                                 file_size_bytes=max(RUN_LIMITS.file_size_bytes, output_chars))
    result = run_python(PROGRAM, stdin=canonical(body), limits=limits, read_only=paths)
    return result, nonced_replies(result.stdout, nonce)


def _stopped(result: RunResult, replies: Sequence[Mapping[str, Any]]) -> str:
    problem = next((r["problem"] for r in replies if "problem" in r), None)
    if problem is not None:
        return str(problem)
    lines = result.stderr.strip().splitlines()
    return f"the sandbox run ended {result.outcome.value}" + (f": {lines[-1][:200]}" if lines else "")


# ---------------------------------------------------------------------------- the environment




@dataclass
class VerifiersEnvironment:
    """A verifiers environment module as a swarmnode `Environment` (`respond` is pure: it replays)."""

    module: str
    library_version: str
    module_version: str
    venv: Path
    folder: Path
    max_env_bytes: int = DEFAULT_MAX_ENV_BYTES  # the run's: a longer reply is cut just past it (so it ends)
    _answers: OrderedDict[str, EnvTurn | Done] = dataclasses.field(default_factory=OrderedDict, init=False,
                                                                   repr=False)

    @property
    def name(self) -> str:
        return PREFIX + self.module

    @property
    def version(self) -> str:
        return f"{self.library_version}+{self.module_version}"

    @property
    def bounds(self) -> EnvBounds:
        """8 turns of at most 4 KiB each unless the run says otherwise (the protocol allows 16 KiB: a run
        that does reads back up to 12 x that per call from the sandbox)."""
        return EnvBounds(max_turns=DEFAULT_MAX_TURNS, max_env_bytes=DEFAULT_MAX_ENV_BYTES)

    @property
    def kinds(self) -> tuple[str, ...]:
        return (KIND,)

    @property
    def instructions(self) -> str:
        return ""  # the row's prompt messages say it all

    def respond(self, task: Task, seed: int, model_turns: Sequence[str]) -> EnvTurn | Done:
        """What the environment says after `model_turns` (the seed plays no part: a verifiers episode is
        decided by its row and the model's turns)."""
        key = self._key(task, model_turns)
        if key not in self._answers:
            self.respond_many([(task, seed, tuple(model_turns))])
        return self._answers[key]

    def respond_many(self, calls: Sequence[EnvCall]) -> None:
        """Answer `calls` in one sandbox run and keep the answers for `respond`: every answer to `calls`,
        and older ones up to `CACHE_ENTRIES` in all. GraderFault when the run stops on a machine limit: no
        verdict on anything it would have answered."""
        wanted = {self._key(task, turns): (task, turns) for task, _, turns in calls}
        for key in wanted.keys() & self._answers.keys():
            self._answers.move_to_end(key)  # asked again: kept with this batch's answers
        missing = [(key, task, turns) for key, (task, turns) in wanted.items() if key not in self._answers]
        if not missing:
            return
        items = []
        for k, (_, task, turns) in enumerate(missing):
            row = parse_task(task)
            if row.module != self.module:
                raise WrongTaskKind(self.name, f"{KIND} ({row.module})", [f"{KIND} ({self.module})"])
            items.append([k, row.module, dict(row.args), dict(row.row), list(turns)])
        output = len(items) * (ESCAPED_CHARS * self.max_env_bytes + REPLY_CHARS) + 64 * 1024
        request = {"mode": "respond", "items": items, "max_chars": self.max_env_bytes + 1}
        result, replies = _sandboxed(request, output, self.venv, self.folder)
        answers = {r["k"]: r for r in replies if isinstance(r.get("k"), int)}
        if result.outcome is not Outcome.OK or len(answers) != len(items):
            raise GraderFault(f"{self.name}: {_stopped(result, replies)}")
        refused: list[str] = next((r["refusals"] for r in replies if "refusals" in r), [])
        if refused:  # vetted code is never refused: this node's environments folder changed under it
            raise GraderFault(f"{self.name} is refused here: {'; '.join(refused)}")
        for k, (key, _, _) in enumerate(missing):
            self._answers[key] = _answer(self.name, answers[k])
        # a batch larger than the cache (a submission of long episodes) keeps all its answers until the next
        # batch: evicting them before `respond` reads them would cost a sandbox run per call
        while len(self._answers) > max(CACHE_ENTRIES, len(wanted)):
            self._answers.popitem(last=False)

    def _key(self, task: Task, model_turns: Sequence[str]) -> str:
        return hashlib.sha256(canonical([task.target, list(model_turns)]).encode()).hexdigest()


def _answer(name: str, body: Mapping[str, Any]) -> EnvTurn | Done:
    """One reply of the program as the environment's answer."""
    if "env" in body and isinstance(body["env"], str):
        return EnvTurn(body["env"])
    if "done" in body and isinstance(body["done"], float | int) and not isinstance(body["done"], bool):
        return Done(float(body["done"]))
    if "over" in body:
        # the episode ended before the last of the turns asked about: no honest play asks this
        return Done(0.0)
    if "fault" in body:
        # the environment raised on these turns: its code decides that on every node, as a scorer's
        # exception does (reward 0)
        return Done(0.0)
    raise GraderFault(f"{name}: an answer the adapter does not know: {str(body)[:200]}")


def vet(env: VerifiersEnvironment, tasks: Sequence[Task]) -> None:
    """VerifiersRefused unless `env` is one a swarm can verify: no refused class or setting, and the same
    answers forward and in reverse in one sandbox process and again in another."""
    items: list[list[Any]] = []
    for task in tasks[:VET_ROWS]:
        row = parse_task(task)
        for n in range(1, len(VET_TURNS) + 1):
            items.append([len(items), row.module, dict(row.args), dict(row.row), list(VET_TURNS[:n])])
    if not items:
        raise VerifiersRefused(f"{env.name}: no rows to vet it on")
    output = 2 * len(items) * (ESCAPED_CHARS * env.max_env_bytes + REPLY_CHARS) + 64 * 1024
    request = {"mode": "vet", "items": items, "max_chars": env.max_env_bytes + 1}
    runs = [_sandboxed(request, output, env.venv, env.folder) for _ in range(2)]
    for result, replies in runs:
        refused = next((r["refusals"] for r in replies if "refusals" in r), None)
        if refused:
            raise VerifiersRefused(f"{env.name} cannot be verified by a swarm: {'; '.join(refused)}")
        if result.outcome is not Outcome.OK or refused is None:
            raise VerifiersRefused(f"{env.name} did not play in the sandbox: {_stopped(result, replies)}")
    (_, first), (_, second) = runs
    plays = [[r for r in replies if "k" in r] for replies in (first, second)]
    for played in plays:
        faults = [r["fault"] for r in played if "fault" in r]
        if faults:
            raise VerifiersRefused(f"{env.name} faulted replaying an episode: {faults[0]}")
    forward, backward = plays[0][: len(items)], sorted(plays[0][len(items):], key=lambda r: r["k"])
    if forward != backward:
        raise VerifiersRefused(f"{env.name} answered the same turns differently within one process (state "
                               f"kept between episodes, or unseeded randomness): a swarm cannot verify it")
    if plays[0] != plays[1]:
        raise VerifiersRefused(f"{env.name} answered the same turns differently in two processes "
                               f"(unseeded randomness, or the clock): a swarm cannot verify it")


def export_rows(module: str, args: Mapping[str, Any], count: int, *, venv: Path | None = None,
                folder: Path | None = None) -> list[Task]:
    """The first `count` rows of the environment's dataset as tasks (one sandbox run), after vetting the
    environment on them: VerifiersRefused when a swarm cannot verify it."""
    env = load(module, venv=venv, folder=folder)
    try:
        canonical(dict(args))
    except (TypeError, ValueError) as exc:
        raise VerifiersRefused(f"{module}: the arguments must be plain JSON: {exc}") from None
    request = {"mode": "rows", "module": module, "args": dict(args), "count": count}
    result, replies = _sandboxed(request, 64 << 20, env.venv, env.folder)
    refused = next((r["refusals"] for r in replies if "refusals" in r), None)
    if refused:
        raise VerifiersRefused(f"{env.name} cannot be verified by a swarm: {'; '.join(refused)}")
    rows = next((r["rows"] for r in replies if "rows" in r), None)
    if result.outcome is not Outcome.OK or not isinstance(rows, list):
        raise VerifiersRefused(f"{module}: its dataset did not load in the sandbox: "
                               f"{_stopped(result, replies)}")
    tasks = [Row(module, dict(args), row).task() for row in rows]
    vet(env, tasks)
    return tasks


def load(module: str, *, venv: Path | None = None, folder: Path | None = None,
         max_env_bytes: int = DEFAULT_MAX_ENV_BYTES) -> VerifiersEnvironment:
    """The environment `module` of the environments folder, with the verifiers venv checked; its replies are
    cut just past `max_env_bytes` (the run's bound)."""
    venv, folder = venv or venv_path(), folder or envs_path()
    library = installed_version(venv)
    path = module_file(module, folder)
    return VerifiersEnvironment(module, library, module_version(path), venv, folder, max_env_bytes)
