"""Start-up of the `swarmnode` commands that load no model (issue #32: under a second).

    python benchmarks/bench_cli.py [--repeats N] [--kdf pbkdf2|scrypt] [--goal SECONDS]

Each command runs N times (default 5) as a fresh process of this interpreter's `swarmnode` console script
(`python -m swarmnode.node.cli` where there is none), and its median wall time is reported:
`swarmnode version`, `swarmnode --help` and `swarmnode keys show` on a key made in a temporary folder
first. The baseline, measured in the same run the same way: `python -c pass` (the interpreter alone).

The key: by default a keystore v3 file with PBKDF2 of 2 iterations (`save_keystore(kdf_iterations=2)`, as
the tests make theirs), so `keys show` times the command's start-up, not its key derivation; with
`--kdf scrypt` it is made by `swarmnode keys new` (scrypt n=2^18, what an operator's key uses), and
`keys show` then includes about a second of scrypt, by design.

The machine may be shared: medians of wall time. The last line printed is one JSON object; `met` says whether
`version` and `keys show` both took under `--goal` seconds (default 1).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from swarmnode.crypto.identity import NodeIdentity  # noqa: E402
from swarmnode.crypto.keystore import save_keystore  # noqa: E402

PASSWORD = "bench-cli-password"


def swarmnode_argv() -> list[str]:
    """This interpreter's `swarmnode` script, or the module where it is not installed as a script."""
    script = Path(sys.executable).with_name("swarmnode")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "swarmnode.node.cli"]


def median_seconds(argv: list[str], env: dict[str, str], repeats: int) -> float:
    """Median wall time of `argv` as a fresh process; a failing command stops the benchmark."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
        times.append(time.perf_counter() - start)
        if done.returncode != 0:
            sys.exit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="Runs of each command (median reported).")
    parser.add_argument("--kdf", choices=("pbkdf2", "scrypt"), default="pbkdf2",
                        help="The key's KDF: pbkdf2 (2 iterations: start-up only) or scrypt (`keys new`).")
    parser.add_argument("--goal", type=float, default=1.0, help="Seconds version and keys show stay under.")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")

    swarmnode = swarmnode_argv()
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as folder:
        key = Path(folder) / "node.key"
        env = {**os.environ, "SWARMNODE_PASSWORD": PASSWORD, "SWARMNODE_KEY": str(key)}
        if args.kdf == "scrypt":
            new = [*swarmnode, "keys", "new"]
            made = subprocess.run(new, env=env, capture_output=True, text=True, timeout=300)
            if made.returncode != 0:
                sys.exit(f"swarmnode keys new failed: {made.stderr.strip()}")
        else:
            save_keystore(NodeIdentity(os.urandom(32)), key, PASSWORD, kdf_iterations=2)

        python_s = median_seconds([sys.executable, "-c", "pass"], env, args.repeats)
        version_s = median_seconds([*swarmnode, "version"], env, args.repeats)
        help_s = median_seconds([*swarmnode, "--help"], env, args.repeats)
        keys_show_s = median_seconds([*swarmnode, "keys", "show"], env, args.repeats)

    print(f"command: {' '.join(swarmnode)}   repeats: {args.repeats}   key: {args.kdf}")
    for name, seconds in (("python -c pass", python_s), ("swarmnode version", version_s),
                          ("swarmnode --help", help_s), ("swarmnode keys show", keys_show_s)):
        print(f"{name:<22} {seconds:7.3f} s (median)")
    print(json.dumps({
        "version_s": round(version_s, 4),
        "help_s": round(help_s, 4),
        "keys_show_s": round(keys_show_s, 4),
        "python_startup_s": round(python_s, 4),
        "version_vs_python_ratio": round(version_s / python_s, 2),
        "keys_show_vs_python_ratio": round(keys_show_s / python_s, 2),
        "repeats": args.repeats,
        "kdf": args.kdf,
        "goal_s": args.goal,
        "met": version_s < args.goal and keys_show_s < args.goal,
    }))


if __name__ == "__main__":
    main()
