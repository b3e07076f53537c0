"""The distribution installs one name, `swarmnode`: every source package is listed under it, and the
wheel holds nothing else at its top (issue #17: `import crypto` or `protocol` of another distribution
must never be shadowed by ours)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOPS = ("node", "protocol", "crypto", "ledger", "testing")
DATA_PACKAGES = {"swarmnode.node.rl.assets"}  # folders of package data only (no __init__.py), listed too


def source_packages() -> set[str]:
    found = set()
    for top in TOPS:
        for init in (ROOT / top).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT).parts
            found.add(".".join(("swarmnode", *relative)))
    return found


def test_every_source_package_is_listed_under_swarmnode():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert set(setuptools["packages"]) == source_packages() | DATA_PACKAGES
    assert setuptools["package-dir"] == {f"swarmnode.{top}": top for top in TOPS}


def test_the_wheel_installs_only_swarmnode(tmp_path):
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path),
         str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    assert "Warning" not in built.stdout + built.stderr, built.stderr[-3000:]  # setuptools has no complaint
    (wheel,) = tmp_path.glob("swarmnode-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = archive.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    tops = {name.split("/")[0] for name in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"swarmnode"}
    assert "swarmnode = swarmnode.node.cli.main:main" in entry_points
    assert "swarmnode/node/rl/assets/devnet-model/config.json" in names
    assert "swarmnode/node/rl/assets/calc-model/model.safetensors" in names
    assert "swarmnode/ledger/contracts/SwarmLedger.vy" in names

    # Installed into a fresh environment (dependencies left out: this checks what the wheel itself puts
    # there), it adds one package, its metadata and one console script, and `swarmnode` resolves there.
    env = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True, timeout=120)
    python = env / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    before = {p.name for p in site.iterdir()}
    scripts_before = {p.name for p in (env / "bin").iterdir()}
    installed = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", str(wheel)],
                               capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-3000:]
    added = {p.name for p in site.iterdir()} - before
    version = wheel.name.split("-")[1]
    assert added == {"swarmnode", f"swarmnode-{version}.dist-info"}
    assert {p.name for p in (env / "bin").iterdir()} - scripts_before == {"swarmnode"}
    where = subprocess.run([python, "-c", "import swarmnode; print(*swarmnode.__path__)"],
                           capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert where.returncode == 0, where.stderr[-2000:]
    assert where.stdout.split() == [str(site / "swarmnode")]


def test_no_source_imports_a_bare_top_level_name():
    """Run from the checkout, `import node` would still work (the working directory is on sys.path), but
    installed it fails: every import of our code says `swarmnode.`."""
    import ast

    offenders = []
    for top in (*TOPS, "tests", "benchmarks", "scripts"):
        for path in (ROOT / top).rglob("*.py"):
            for statement in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(statement, ast.Import):
                    names = [alias.name for alias in statement.names]
                elif isinstance(statement, ast.ImportFrom) and statement.level == 0 and statement.module:
                    names = [statement.module]
                else:
                    continue
                offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in TOPS]
    assert offenders == []
