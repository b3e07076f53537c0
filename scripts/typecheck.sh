#!/usr/bin/env bash
# mypy over the installed names (swarmnode.protocol, ...): the source folders keep their places beside
# pyproject.toml, so a throwaway tree of links shows mypy the package layout the wheel installs.
# With no arguments: all four; protocol, crypto and ledger strict (pyproject's [tool.mypy] overrides),
# node with the defaults (annotated functions checked).
set -euo pipefail
cd "$(dirname "$0")/.."
tree=build/typecheck
mkdir -p "$tree/swarmnode"
for part in node protocol crypto ledger testing; do
    ln -sfn "$PWD/$part" "$tree/swarmnode/$part"
done
# trio ships its own annotations, but py-libp2p pulls in trio-typing, whose older `trio-stubs` would win
# (no trio.TaskStatus there): a link to trio itself, found first on MYPYPATH, puts trio's own types back.
trio_dir=$(python -c "import os, trio; print(os.path.dirname(trio.__file__))")
ln -sfn "$trio_dir" "$tree/trio"
packages=("${@:-protocol crypto ledger node testing}")
args=()
for part in ${packages[@]}; do
    args+=(-p "swarmnode.$part")
done
MYPYPATH="$tree" mypy "${args[@]}"
