"""The first Python the sandbox runs: it drops to the sandbox user, sets the per-process limits and the
line budget, then executes the program in its own process (no `preexec_fn`: the node is threaded).

It is the same for every program, so everything it does before `exec` is outside the line budget.
"""

BUDGET_EXIT = 113  # the sandbox's exit status when the line budget is spent
SETUP_EXIT = 114  # the launcher could not drop privileges or set a limit (it never wrote "ready")

LAUNCHER = r"""
import os, resource, sys
uid, gid, mem, cpu, fsize, nproc, budget, ready = (int(a) for a in sys.argv[2:10])
try:
    if os.getuid() == 0:  # the node runs as root: become the sandbox user (clears every capability)
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    if os.getuid() == 0 or os.geteuid() == 0:
        raise OSError("still root after dropping privileges")
    for lim, soft, hard in ((resource.RLIMIT_AS, mem, mem), (resource.RLIMIT_CPU, cpu, cpu + 1),
                            (resource.RLIMIT_FSIZE, fsize, fsize), (resource.RLIMIT_NOFILE, 64, 64),
                            (resource.RLIMIT_CORE, 0, 0)):
        resource.setrlimit(lim, (soft, hard))
    if nproc:
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
except OSError as exc:
    sys.stderr.write("sandbox setup failed: %s\n" % exc); sys.stderr.flush(); os._exit(@SETUP_EXIT@)
os.write(ready, b"ready")  # the parent's proof that what follows is the program's, not the sandbox's
os.closerange(3, 1 << 16)  # the program keeps stdin, stdout and stderr only
del uid, gid, mem, cpu, fsize, nproc, ready, resource
path = sys.argv[1]
sys.argv = [path]
with open(path, encoding="utf-8") as f:
    program = compile(f.read(), path, "exec")
namespace = {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__}
if budget:  # count the program's lines only: everything above is the same for every program
    import threading
    lines = 0
    def _count(frame, event, arg):
        global lines
        if event == "line":
            lines += 1
            if lines > budget:
                sys.stderr.write("line budget spent\n"); sys.stderr.flush(); os._exit(@BUDGET_EXIT@)
        return _count
    sys.settrace(_count); threading.settrace(_count)
exec(program, namespace)
""".replace("@BUDGET_EXIT@", str(BUDGET_EXIT)).replace("@SETUP_EXIT@", str(SETUP_EXIT))
