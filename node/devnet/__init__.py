"""The local devnet: a whole swarm on this machine, as real processes.

- `network`  the nodes' plan, folders, configs and processes (`Devnet`), and `swarmnode devnet`
- `rl`       the RL run on a devnet: its descriptor, ledger, cheaters, and what it measured
- `report`   the end-of-run report (what each node did, what the ledger says)
"""
