#!/usr/bin/env python3
"""Rewrite imports and module names to the installed namespace: `node.x` -> `swarmnode.node.x` (issue #17).

    python scripts/rename_namespace.py [ROOT]

The four source folders (node/, protocol/, crypto/, ledger/) stay where they are; at install they become
`swarmnode.node`, `swarmnode.protocol`, ... (pyproject's package-dir mapping). This rewrites, in every
Python, Markdown, shell and TOML file of the tree: `from node.x import`, `import crypto.x as y`,
`-m node.x`, and quoted module names that name a real module (`"node.cli_run"`) — never file names such
as "node.toml" or "ledger.db". Back-quoted names in prose (`node.rl.sampling`) are left as they read: the
module by its folder. Idempotent.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

TOPS = ("node", "protocol", "crypto", "ledger")
TOP = "|".join(TOPS)
SKIP_DIRS = {".git", ".venv", "node_modules", "__pycache__", ".mypy_cache", ".ruff_cache", "build"}
SUFFIXES = {".py", ".md", ".sh", ".toml", ".cfg", ".ini", ".txt"}

FROM_IMPORT = re.compile(rf"^(\s*)from ({TOP})(\.|\s+import\b)", re.M)
PLAIN_IMPORT = re.compile(rf"^(\s*)import ({TOP})(\.[\w.]+)?(\s+as\s+\w+)$", re.M)
DASH_M = re.compile(rf"(-m\s+)({TOP})\.")
QUOTED = re.compile(rf"([\"'])({TOP})((?:\.[a-z_][a-z0-9_]*)+)")


def is_module(root: Path, top: str, dotted: str) -> bool:
    """Whether `top` + `dotted` (".a.b", perhaps ending in an attribute) starts with a real module."""
    parts = dotted.strip(".").split(".")
    if not parts or not parts[0]:
        return False
    first = root / top / parts[0]
    return first.with_suffix(".py").is_file() or (first / "__init__.py").is_file()


def rewrite(text: str, root: Path) -> str:
    text = FROM_IMPORT.sub(r"\1from swarmnode.\2\3", text)
    text = PLAIN_IMPORT.sub(r"\1import swarmnode.\2\3\4", text)
    text = DASH_M.sub(r"\1swarmnode.\2.", text)

    def quoted(match: re.Match[str]) -> str:
        quote, top, dotted = match.groups()
        if not is_module(root, top, dotted):
            return match.group(0)
        return f"{quote}swarmnode.{top}{dotted}"

    return QUOTED.sub(quoted, text)


def files(root: Path):
    for path in sorted(root.rglob("*")):
        if any(part in SKIP_DIRS for part in path.relative_to(root).parts):
            continue
        if path.is_file() and path.suffix in SUFFIXES and path.name != "rename_namespace.py":
            yield path


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent)
    changed = 0
    for path in files(root):
        old = path.read_text()
        new = rewrite(old, root)
        if new != old:
            path.write_text(new)
            changed += 1
    print(f"rewrote {changed} files")


if __name__ == "__main__":
    main()
