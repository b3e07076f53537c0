"""Hostile programs against the code sandbox: each is a real escape attempt, and each must fail inside it
with the node (this test process) unharmed.

Real parts throughout: bubblewrap, the seccomp filter, cgroups, the node's own interpreter. Nothing is
skipped where the sandbox is missing: the install script brings it, and a node without it refuses code.
"""

from __future__ import annotations

import os
import socket
import stat
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from swarmnode.node.sandbox import Outcome, RunResult, SandboxLimits, run_python
from swarmnode.node.sandbox.host import host_sandbox

FAST = SandboxLimits(wall_time_s=10.0, cpu_time_s=5, max_processes=16)
SECRET = "correct-horse-battery-staple-7f3a"


def run(source: str, limits: SandboxLimits = FAST) -> RunResult:
    return run_python(source, limits=limits)


def sandbox_processes() -> list[int]:
    """Host pids still inside the cgroup of a sandbox run of this process (there must be none once a run
    returned); other processes' runs (a node or another test run on this machine) are named after their own
    pid, and not ours to judge."""
    ours = f"swarmnode-sandbox/{os.getpid()}-"
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if ours in (entry / "cgroup").read_text():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_runs_as_an_unprivileged_user_with_no_capabilities():
    result = run("print(open('/proc/self/status').read())")
    status = dict(line.split(":", 1) for line in result.stdout.splitlines() if ":" in line)
    assert result.outcome is Outcome.OK
    assert status["Uid"].split()[0] != "0" and status["Gid"].split()[0] != "0"
    assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0
    assert status["NoNewPrivs"].strip() == "1" and status["Seccomp"].strip() == "2"
    if host_sandbox().as_root:  # no user namespace: the id outside is the same unprivileged one
        assert status["Uid"].split()[0] == str(host_sandbox().uid)


def test_cannot_read_the_keystore_or_any_node_file(tmp_path):
    keystore = tmp_path / "data" / "key.json"
    keystore.parent.mkdir()
    keystore.write_text(SECRET)
    keystore.chmod(0o600)
    venv_file = Path(sys.prefix) / "pyvenv.cfg"
    program = f"""
import os
for path in {[str(keystore), str(tmp_path), str(venv_file), "/etc/passwd", "/etc/shadow",
              str(Path.home() / ".bashrc"), "/proc/1/root/etc/passwd", "/work/../etc"]!r}:
    try:
        print(path, "READ", open(path).read() if os.path.isfile(path) else os.listdir(path))
    except OSError as exc:
        print(path, "denied", type(exc).__name__)
"""
    result = run(program)
    assert result.outcome is Outcome.OK, result.stderr
    assert SECRET not in result.stdout and "READ" not in result.stdout, result.stdout


def test_cannot_read_the_node_environment_or_proc(monkeypatch):
    monkeypatch.setenv("SWARMNODE_PASSWORD", SECRET)
    program = f"""
import os
print("env", dict(os.environ))
print("pids", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
for pid in {[os.getpid(), os.getppid(), 1, 2]!r} + [os.getppid()]:
    try:
        print(pid, open(f"/proc/{{pid}}/environ", "rb").read(), open(f"/proc/{{pid}}/cmdline", "rb").read())
    except OSError as exc:
        print(pid, "denied", type(exc).__name__)
"""
    result = run(program)
    assert result.outcome is Outcome.OK, result.stderr
    assert SECRET not in result.stdout and "SWARMNODE" not in result.stdout
    pids = eval(result.stdout.splitlines()[1].removeprefix("pids "))  # its own PID namespace: 1 and 2
    assert pids == [1, 2], result.stdout
    assert "pytest" not in result.stdout


@pytest.mark.parametrize(
    "target",
    [
        "/tmp/escaped",
        str(Path(sys.prefix) / "lib" / "escaped.pth"),
        str(Path(sys.base_prefix) / "lib" / "escaped.pth"),
        str(Path.home() / "escaped"),
        "/usr/escaped",
        "/escaped",
        "/box/main.py",
    ],
)
def test_cannot_write_outside_the_scratch_directory(target):
    before = Path(target).read_bytes() if Path(target).exists() else None
    program = f"""
try:
    with open({target!r}, "w") as f:
        f.write("import os; os.system('id')")
    print("WROTE")
except OSError as exc:
    print("denied", type(exc).__name__)
"""
    result = run(program)
    after = Path(target).read_bytes() if Path(target).exists() else None
    assert after == before  # nothing on the host changed (a write inside the sandbox's own root fails too)
    assert "denied" in result.stdout, result.stdout + result.stderr


def test_no_network_of_any_kind(tmp_path):
    unix_path = tmp_path / "node.sock"
    listeners = []
    path_server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path_server.bind(str(unix_path))
    abstract_server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract_server.bind("\0swarmnode-sandbox-test")
    tcp_server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp_server.bind(("127.0.0.1", 0))
    udp_server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp_server.bind(("127.0.0.1", 0))
    for s in (path_server, abstract_server, tcp_server):
        s.listen(4)
        s.setblocking(False)
        listeners.append(s)
    udp_server.setblocking(False)
    tcp_port, udp_port = tcp_server.getsockname()[1], udp_server.getsockname()[1]
    program = f"""
import socket
attempts = {{
    "tcp": lambda: socket.create_connection(("127.0.0.1", {tcp_port}), timeout=1),
    "udp": lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", {udp_port})),
    "tcp6": lambda: socket.create_connection(("::1", {tcp_port}), timeout=1),
    "unix-path": lambda: socket.socket(socket.AF_UNIX).connect({str(unix_path)!r}),
    "unix-abstract": lambda: socket.socket(socket.AF_UNIX).connect("\\0swarmnode-sandbox-test"),
    "netlink": lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0),
    "socketpair": lambda: socket.socketpair(),
    "dns": lambda: socket.getaddrinfo("example.com", 80),
}}
for name, attempt in attempts.items():
    try:
        attempt()
        print(name, "CONNECTED")
    except OSError as exc:
        print(name, "denied", type(exc).__name__)
"""
    try:
        result = run(program)
        assert result.outcome is Outcome.OK, result.stderr
        assert "CONNECTED" not in result.stdout, result.stdout
        assert result.stdout.count("denied") == 8
        for s in listeners:
            with pytest.raises(BlockingIOError):
                s.accept()
        with pytest.raises(BlockingIOError):
            udp_server.recvfrom(16)
    finally:
        for s in (*listeners, udp_server):
            s.close()


def test_fork_bomb_is_bounded_and_leaves_nothing():
    program = """
import os, time
children = 0
try:
    for _ in range(300):
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        children += 1
except OSError as exc:
    print("fork refused after", children, type(exc).__name__)
print("children", children)
"""
    result = run(program)
    children = int(result.stdout.split("children")[-1])
    assert children < FAST.max_processes, result.stdout
    assert "fork refused" in result.stdout
    assert sandbox_processes() == []  # the sleeping children died with the run


def test_memory_bomb_across_children_is_bounded_by_the_aggregate():
    limits = SandboxLimits(wall_time_s=20.0, memory_bytes=512 * 2**20, aggregate_memory_bytes=768 * 2**20)
    program = """
import os, time
pids = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        block = bytearray(400 * 2**20)  # each under its own address-space limit
        for i in range(0, len(block), 4096):
            block[i] = 1
        time.sleep(2)  # all four alive at once: 1.6 GiB in all
        os._exit(0)
    pids.append(pid)
for pid in pids:
    os.waitpid(pid, 0)
"""
    started = time.monotonic()
    result = run(program, limits)
    if host_sandbox().cgroups is not None:
        assert result.outcome is Outcome.MEMORY, result
    assert result.outcome in (Outcome.MEMORY, Outcome.KILLED, Outcome.TIMEOUT)
    assert time.monotonic() - started < limits.wall_time_s + 5
    assert sandbox_processes() == []


def test_disk_bomb_is_bounded_and_leaves_nothing(tmp_path, monkeypatch):
    limits = SandboxLimits(wall_time_s=20.0, scratch_bytes=8 * 2**20, file_size_bytes=4 * 2**20)
    program = """
import os
written = 0
for child in range(4):
    if os.fork() == 0:
        try:
            with open(f"/work/fill-{child}", "wb") as f:
                for _ in range(64):
                    f.write(b"x" * 2**20); f.flush()
        except OSError:
            pass
        os._exit(0)
    os.wait()
print(sum(os.path.getsize(f"/work/{n}") for n in os.listdir("/work")))
"""
    staging = tmp_path / "staging"  # this run's own: other sandbox runs on the machine stage in /tmp
    staging.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(staging))
    free_before = os.statvfs("/tmp").f_bavail
    result = run(program, limits)
    assert result.outcome is Outcome.OK, result.stderr
    assert int(result.stdout) <= limits.scratch_bytes
    assert not any(staging.iterdir())  # the parent's staging directory is gone
    assert os.statvfs("/tmp").f_bavail >= free_before - 256  # a few blocks of noise at most


def test_setsid_double_fork_dies_with_the_run():
    program = """
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(120)
        os._exit(0)
    os._exit(0)
time.sleep(0.2)
print("parent done")
"""
    result = run(program)
    assert result.outcome is Outcome.OK and "parent done" in result.stdout
    assert sandbox_processes() == []


def test_turning_the_line_budget_off_still_ends_at_the_bounds():
    limits = SandboxLimits(wall_time_s=3.0, cpu_time_s=1, line_budget=1000)
    result = run("import sys\nsys.settrace(None)\nwhile True:\n    pass\n", limits)
    assert result.outcome is Outcome.TIMEOUT
    assert sandbox_processes() == []


def test_killing_the_parent_or_everyone_harms_no_one_outside():
    me = os.getpid()
    program = f"""
import os, signal
for target in (os.getppid(), {me}, {os.getppid()}, 1):
    try:
        os.kill(target, signal.SIGKILL)
        print(target, "sent")
    except OSError as exc:
        print(target, type(exc).__name__)
os.kill(-1, signal.SIGKILL)
"""
    sentinel = threading.Event()
    result = run(program)
    assert os.getpid() == me and not sentinel.is_set()  # still here
    assert f"{me} ProcessLookupError" in result.stdout  # the node's pid names nothing in its namespace
    assert result.outcome in (Outcome.KILLED, Outcome.OK, Outcome.FAILED)


def test_kernel_interfaces_an_escape_needs_are_denied():
    program = """
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
calls = {
    "unshare-user": lambda: libc.unshare(0x10000000),
    "unshare-mount": lambda: libc.unshare(0x00020000),
    "mount": lambda: libc.mount(b"none", b"/work", b"tmpfs", 0, None),
    "ptrace-attach": lambda: libc.ptrace(16, 1, None, None),
    "chroot": lambda: libc.chroot(b"/work"),
    "setuid-root": lambda: libc.setuid(0),
    "keyctl": lambda: libc.syscall(250, 0, 0, 0, 0),
    "bpf": lambda: libc.syscall(321, 0, 0, 0),
    "userfaultfd": lambda: libc.syscall(323, 0),
    "io_uring_setup": lambda: libc.syscall(425, 1, 0),
}
for name, call in calls.items():
    ctypes.set_errno(0)
    rc = call()
    print(name, rc, errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno()))
"""
    result = run(program)
    assert result.outcome is Outcome.OK, result.stderr
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert len(lines) == 10
    for name, outcome in lines.items():
        assert outcome.startswith("-1 "), (name, outcome)


def test_setuid_binaries_give_nothing():
    setuid = [p for p in ("/usr/bin/su", "/usr/bin/passwd", "/usr/bin/mount", "/usr/bin/newgrp")
              if Path(p).exists() and os.stat(p).st_mode & stat.S_ISUID]
    if not setuid:
        pytest.skip("no setuid binary on this machine to try")
    program = f"""
import subprocess
print(subprocess.run([{setuid[0]!r}, "--help"], capture_output=True).returncode)
import os; print("euid", os.geteuid())
"""
    result = run(program)
    assert "euid 0" not in result.stdout


def test_a_grading_cannot_see_another_gradings_scratch():
    holder = threading.Thread(
        target=run,
        args=(f"import time\nopen('/work/secret', 'w').write({SECRET!r})\ntime.sleep(3)\n",),
    )
    holder.start()
    try:
        deadline = time.monotonic() + 10
        while not any(Path(f"/proc/{pid}/root/work/secret").exists() for pid in sandbox_processes()):
            assert time.monotonic() < deadline and holder.is_alive(), "the holder never wrote its secret"
            time.sleep(0.01)
        program = """
import os
hits = []
for root, dirs, files in os.walk("/", onerror=lambda e: None):
    if root.startswith(("/proc", "/usr", "/sys")):
        dirs[:] = []
        continue
    hits += [os.path.join(root, f) for f in files if f == "secret"]
print(hits)
"""
        result = run(program)
    finally:
        holder.join()
    assert result.outcome is Outcome.OK, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_program_holds_no_descriptor_but_its_standard_ones():
    result = run("import os\nprint(sorted(os.listdir('/proc/self/fd')), flush=True)\nos._exit(114)\n")
    assert result.stdout.strip() == "['0', '1', '2', '3']"  # 3: listdir's own directory
    assert result.outcome is Outcome.FAILED and result.returncode == 114  # SETUP_EXIT, chosen by the program
