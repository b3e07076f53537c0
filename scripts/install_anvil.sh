#!/usr/bin/env bash
# Install anvil (a local EVM node) from npm into the project-local, git-ignored .tools/ directory and
# print the path of the anvil binary. Idempotent: a second run finds the binary and installs nothing.
#
# Why npm: @foundry-rs/anvil ships the prebuilt anvil binary for the host platform inside a package,
# so no Rust toolchain and no download outside the npm registry is needed.
set -euo pipefail

ANVIL_VERSION="${ANVIL_VERSION:-1.7.1}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="$ROOT/.tools"
PREFIX="$TOOLS/anvil"

find_binary() {
    # The launcher in node_modules/.bin is a JS shim; prefer the native binary it wraps.
    local candidate
    candidate="$(find "$PREFIX/node_modules" -type f -name anvil -perm -u+x 2>/dev/null \
        | grep -v '/\.bin/' | grep -v '\.js$' | head -n 1 || true)"
    if [[ -n "$candidate" ]] && "$candidate" --version >/dev/null 2>&1; then
        echo "$candidate"
        return 0
    fi
    if [[ -x "$PREFIX/node_modules/.bin/anvil" ]] && "$PREFIX/node_modules/.bin/anvil" --version >/dev/null 2>&1; then
        echo "$PREFIX/node_modules/.bin/anvil"
        return 0
    fi
    return 1
}

if binary="$(find_binary)"; then
    echo "$binary"
    exit 0
fi

command -v npm >/dev/null 2>&1 || { echo "npm is required to install anvil (apt-get install npm)" >&2; exit 1; }
mkdir -p "$PREFIX"
# Keep .tools/ out of git even if the project's .gitignore does not list it.
[[ -f "$TOOLS/.gitignore" ]] || printf '*\n' > "$TOOLS/.gitignore"
npm install --prefix "$PREFIX" --no-audit --no-fund --loglevel=error "@foundry-rs/anvil@$ANVIL_VERSION" >&2

if binary="$(find_binary)"; then
    echo "$binary"
else
    echo "anvil was installed under $PREFIX but no runnable binary was found" >&2
    exit 1
fi
