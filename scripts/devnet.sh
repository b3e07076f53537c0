#!/usr/bin/env bash
# Install, then run the main job on this machine: the whole swarm training the devnet model.
#
# `swarmnode devnet --steps 30 --cheaters 1` starts, as separate processes on 127.0.0.1, a bootstrap node,
# the trainer, 2 relays, 3 honest workers, 1 cheating worker and 1 validator, with a signed-log ledger in
# which every role node is registered and staked. They find each other through the DHT; checkpoints fan
# out through the relays; workers submit TOPLOC-proved rollouts; the validator re-checks them, credits or
# slashes; the trainer runs 30 asynchronous GRPO steps. It ends with a summary table, a PNG plot and the
# final ledger in the devnet folder. Extra args pass through (e.g. --ledger evm, --summary out.json).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh
. .venv/bin/activate
if [ "$#" -eq 0 ]; then
  set -- --steps 30 --cheaters 1
fi
swarmnode devnet "$@"
