#!/usr/bin/env bash
# Install, then run the main job on this machine. Extra args pass through to `swarmnode devnet`.
#
# What runs today (the issues say what is still to come):
#   1. the swarm: bootstrap, trainer, relays, workers and a validator as separate processes on 127.0.0.1,
#      finding each other through the DHT and checking each other's signed messages;
#   2. GRPO training of the devnet model from the committed base checkpoint, with TOPLOC proofs on every
#      rollout — still the single-process baseline: the roles of step 1 do not yet carry the RL work (issue 6).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh
. .venv/bin/activate
echo "==> 1/2 the swarm on loopback (swarmnode devnet)"
swarmnode devnet --until-discovered "$@"
echo "==> 2/2 GRPO on the devnet model (swarmnode train --sync; the swarm-wide run is issue 6)"
swarmnode train --sync --steps 30
