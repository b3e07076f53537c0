"""Move source modules and rewrite every reference to them, in one pass (issue #17's restructuring).

    python scripts/move_modules.py node/cli_run.py=node/cli/run.py node/trainer=node/trainer ...

Each pair is a file or a package folder, old=new. The files move with `git mv` (history follows them),
missing `__init__.py` files are created, and every dotted name (`swarmnode.node.cli_run`, `node.cli_run`
in prose) and path (`node/cli_run.py`, `node/trainer/`) under the tree's text files is rewritten by
its longest moved prefix. One pass per token, so a name is never rewritten twice; not idempotent: run once.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SKIP_PARTS = {".git", ".venv", "build", "node_modules", "__pycache__", "vectors", ".hypothesis"}
TEXT_SUFFIXES = {".py", ".md", ".toml", ".sh", ".cfg", ".txt", ".yml", ".yaml", ".json", ""}
DOTTED = re.compile(r"(?<![\w.])(swarmnode\.)?(node(?:\.\w+)+)")
PATH = re.compile(r"(?<![\w/.])(node(?:/\w+)+)(\.py)?(/?)")


def dotted(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def build_map(pairs: list[str]) -> dict[str, str]:
    moves = {}
    for pair in pairs:
        old, new = pair.split("=")
        moves[dotted(old)] = dotted(new)
    return moves


def rename(name: str, moves: dict[str, str]) -> str:
    """The longest moved prefix of a dotted name, replaced."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        prefix = ".".join(parts[:cut])
        if prefix in moves:
            return ".".join([moves[prefix], *parts[cut:]])
    return name


def rewrite(text: str, moves: dict[str, str], root: Path) -> str:
    text = DOTTED.sub(lambda m: (m.group(1) or "") + rename(m.group(2), moves), text)

    def path_token(m: re.Match[str]) -> str:
        old = m.group(1).replace("/", ".")
        new = rename(old, moves)
        if new == old:
            return m.group(0)
        as_path = new.replace(".", "/")
        suffix = m.group(2) or ""
        if suffix and (root / (as_path)).is_dir():
            suffix = "/"  # a module that became a package
        return as_path + suffix + m.group(3)

    return PATH.sub(path_token, text)


def text_files(root: Path) -> list[Path]:
    listed = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True)
    files = []
    for name in listed.stdout.splitlines():
        path = root / name
        if SKIP_PARTS.intersection(path.parts) or path.suffix not in TEXT_SUFFIXES or not path.is_file():
            continue
        files.append(path)
    return files


def main() -> None:
    root = Path.cwd()
    pairs = sys.argv[1:]
    moves = build_map(pairs)
    for pair in pairs:
        old, new = (root / part for part in pair.split("="))
        new.parent.mkdir(parents=True, exist_ok=True)
        for folder in new.relative_to(root).parents:
            init = root / folder / "__init__.py"
            if folder != Path(".") and folder.parts[0] == "node" and not init.exists():
                init.write_text('"""(docstring to write)"""\n')
                subprocess.run(["git", "add", str(folder / "__init__.py")], cwd=root, check=True)
        subprocess.run(["git", "mv", str(old), str(new)], cwd=root, check=True)
    changed = 0
    for path in text_files(root):
        text = path.read_text()
        new_text = rewrite(text, moves, root)
        if new_text != text:
            path.write_text(new_text)
            changed += 1
    print(f"moved {len(pairs)}, rewrote {changed} files")


if __name__ == "__main__":
    main()
