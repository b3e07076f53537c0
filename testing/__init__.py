"""Harnesses for tests, benchmarks and demos (like `trio.testing`): never part of an honest node.

- `ledger`        ledger builders and harnesses: a signed log with a hand-moved clock, a contract on
                  an in-process EVM or a real anvil (`AnvilProcess`, which the local devnet uses too)
- `processes`     data-plane roles as real processes (`swarmnode dataplane ...`) and their JSON-line events
- `diloco`        DiLoCo trainers as real processes (`swarmnode diloco trainer`)
- `relay_faults`  a shard server that misbehaves in one chosen way (`swarmnode dataplane bad-relay`)
- `straggler`     a DiLoCo trainer that is slow in one round
- `cheats`        the devnet's dishonest workers, each a `Conduct` of the worker (node.worker.conduct)

No role package of the node imports this one (tests/test_layering.py); the CLI's test-only commands,
the devnet, and the composition root (for a worker whose `[work] cheat` names a cheat) do.
"""
