"""The `swarmnode` command, one module per command group (`swarmnode --help` lists them all).

- `main`    the group itself (`swarmnode = swarmnode.node.cli.main:main`): version, keys, conformance,
            train --sync, calibrate, diloco
- `run`     run (a node with a role), probe, devnet; also the module devnets and torchrun start
- `devnet`  devnet: a whole swarm on this machine (options, checks, the run and report glue)
- `stake`   stake deposit / unbond / withdraw / status, register: staking and registering compute
- `ledger`  the ledger group and its queries (nodes, stakes, contributions, batches, totals, slashes,
            prove, verify); `register_commands` adds stake, register and ledger
- `ledger_admin`   ledger deploy, ledger run ..., ledger slash void / finalize
- `ledger_common`  the --ledger / --key / --json plumbing and output the three share
- `model`   model init / show
- `tasks`   tasks show / filter
- `plan`    plan-memory: what a trainer group needs per device
- `wan`     wan linkemu, wan probe: the processes the WAN harness (node.wan) runs inside namespaces
- `inputs`  the model and task options shared by devnet, train --sync and calibrate
- `password` the key password: SWARMNODE_PASSWORD taken out of the environment once per command, or a prompt

`python -m swarmnode.node.cli ...` runs the same command.
"""
