"""The sandbox: every program the node executes on behalf of a run (a graded completion with its task's
tests, later an environment's code) runs here, never in the node's process, user, filesystem or network.

Decisions (spec/bounds.md, The code sandbox, states the guarantees and limits):
- Mechanism: bubblewrap (`bwrap`, Debian's package) for the namespaces and mounts, a seccomp filter built
  with libseccomp, and cgroups for the aggregate memory and process bounds. bubblewrap is small,
  maintained, and needs no daemon; its flags say exactly what the sandbox sees.
- The sandbox sees a read-only /usr and a read-only copy of the node's Python install, its own /proc (its
  own PID namespace), a minimal /dev and one writable scratch directory (a size-bounded tmpfs). No network
  namespace peer, no host file, no environment variable of the node.
- A node running as root runs the program as an unprivileged user (`SANDBOX_UID`, default 65534) inside
  cgroups that bound memory and processes; a node running as another user runs it in a user namespace
  under rlimits (spec/bounds.md gives the aggregate bound that follows).
- Where the mechanism is missing the node refuses to run the program (`SandboxUnavailable`, naming what to
  install); it never falls back to running it unsandboxed.
"""

from swarmnode.node.sandbox.host import SandboxUnavailable, host_sandbox
from swarmnode.node.sandbox.limits import Outcome, RunResult, SandboxLimits
from swarmnode.node.sandbox.run import run_python

__all__ = [
    "Outcome",
    "RunResult",
    "SandboxLimits",
    "SandboxUnavailable",
    "host_sandbox",
    "run_python",
]
