"""The worker: follows the newest checkpoint, generates its assigned groups with TOPLOC proofs, submits them.

- `service`      the network service (`Worker`): no endpoints of its own, it dials validators
- `work`         `SwarmWorkerWork`: the loop that follows, generates, proves and submits, and its status
- `eligibility`  whether the ledger lets this worker work, and the commands that fix it when not
- `counters`     the next counter of each version, persisted before use (`worker_state.json`)
- `pacing`       what to generate next: the counter plan, the budget, the trainer's pace and our share
- `build`        one submission built in a thread: weights read, groups generated, timed
- `delivery`     SUBMIT to one validator after another until one gives a final answer
- `stats`        the counts behind the status display
- `conduct`      how the worker behaves at the three points a cheat would differ (`HONEST`; the devnet's
                 cheats are in swarmnode.testing.cheats)
"""
