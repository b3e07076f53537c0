"""The bubblewrap command line of one sandboxed run: a pure function of where things are.

Inside, the program sees:
- `/usr` read-only (the system's libraries; `/bin`, `/lib`, `/lib64` link into it) and the node's Python
  install read-only at its own path (its parent directories exist, nothing else of them);
- the caller's `read_only` host paths (a library's site-packages, for a grader that imports it) read-only
  at `/ro/0`, `/ro/1`, ... in order: fixed places, so no host path can fall under `/work` or `/box`, and
  the program's text does not depend on where the node is installed;
- `/box/launcher.py` and `/box/main.py` read-only (copied from descriptors: no host path is shared);
- `/work`, the only writable place: a fresh tmpfs of `scratch_bytes`, its working directory and HOME;
- its own `/proc` (a new PID namespace: no other process is visible) and a minimal `/dev`;
- new IPC, network (no interface reaches out), UTS and cgroup namespaces; a new session (no terminal);
  an empty environment but the variables below.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

SCRATCH = "/work"
LAUNCHER_PATH = "/box/launcher.py"
READ_ONLY_ROOT = "/ro"
PROGRAM_PATH = "/box/main.py"
# PYTHONHASHSEED: the iteration order of a set of str, hence a program's output, is the same everywhere.
ENVIRONMENT = (
    ("HOME", SCRATCH), ("TMPDIR", SCRATCH), ("PATH", "/usr/bin:/bin"), ("LANG", "C.UTF-8"),
    ("PYTHONHASHSEED", "0"),
)
# -S: no site-packages (the stdlib only); -s: no user site; -P: no script directory on sys.path;
# -X utf8: the same text encoding everywhere. Not -I/-E: the environment above is ours.
INTERPRETER_FLAGS = ("-S", "-s", "-P", "-X", "utf8")


@dataclass(frozen=True)
class BwrapFds:
    """Descriptors the parent passes to bubblewrap."""

    launcher: int  # read: the launcher's source
    program: int  # read: the program's source
    seccomp: int  # read: the BPF filter
    info: int  # write: bubblewrap reports the sandbox's first pid here
    block: int  # read: bubblewrap waits for one byte here before starting the launcher
    ready: int  # write: the launcher says "ready" here once its set-up is done, then closes it


def ancestors(path: str) -> list[str]:
    """`/a/b/c` -> [`/a`, `/a/b`]: the directories to create (0755) before mounting `path`."""
    parts = PurePosixPath(path).parents
    return [str(p) for p in reversed(parts) if str(p) != "/"]


def read_only_path(index: int) -> str:
    """Where the `index`-th of a run's `read_only` host paths appears inside the sandbox."""
    return f"{READ_ONLY_ROOT}/{index}"


def bwrap_argv(
    bwrap: str,
    python: str,
    python_prefix: str,
    fds: BwrapFds,
    *,
    as_root: bool,
    sandbox_uid: int,
    sandbox_gid: int,
    scratch_bytes: int,
    launcher_args: list[str],
    read_only: Sequence[str] = (),
) -> list[str]:
    """The whole command: bubblewrap's options, then the interpreter running the launcher."""
    argv = [bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup"]
    if as_root:  # no user namespace: the launcher itself becomes sandbox_uid (the capabilities it needs)
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:  # an unprivileged node: a user namespace, no further ones inside
        argv += ["--unshare-user", "--disable-userns", "--uid", str(sandbox_uid), "--gid", str(sandbox_gid)]
    argv += ["--die-with-parent", "--new-session", "--clearenv"]
    argv += ["--ro-bind", "/usr", "/usr"]
    for link in ("bin", "lib", "lib64", "sbin"):
        argv += ["--symlink", f"usr/{link}", f"/{link}"]
    if python_prefix != "/usr" and not python_prefix.startswith("/usr/"):
        for parent in ancestors(python_prefix):
            argv += ["--perms", "0755", "--dir", parent]
        argv += ["--ro-bind", python_prefix, python_prefix]
    if read_only:
        argv += ["--perms", "0755", "--dir", READ_ONLY_ROOT]
    for index, path in enumerate(read_only):
        argv += ["--ro-bind", path, read_only_path(index)]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += ["--size", str(scratch_bytes), "--perms", "1777", "--tmpfs", SCRATCH]
    for fd, path in ((fds.launcher, LAUNCHER_PATH), (fds.program, PROGRAM_PATH)):
        argv += ["--perms", "0444", "--ro-bind-data", str(fd), path]
    argv += ["--remount-ro", "/", "--chdir", SCRATCH]
    for name, value in ENVIRONMENT:
        argv += ["--setenv", name, value]
    argv += ["--seccomp", str(fds.seccomp), "--info-fd", str(fds.info), "--block-fd", str(fds.block)]
    return argv + ["--", python, *INTERPRETER_FLAGS, LAUNCHER_PATH, PROGRAM_PATH, *launcher_args]
