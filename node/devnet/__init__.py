"""The local devnet: a whole swarm on this machine, as real processes.

- `plan`     what runs: the nodes and roles, each node's [work] table, each node's folder and ports
- `network`  `Devnet`: folders, keys, configs, the ledger and WAN set-up, starting and stopping processes
- `live`     the live status table and the loop that runs a devnet while showing it
- `rl`       the RL run on a devnet: its descriptor, ledger, cheaters, and what it measured
- `report`   the end-of-run report (what each node did, what the ledger says)

The `swarmnode devnet` command itself is `node.cli.devnet`: the devnet never imports the CLI.
"""
