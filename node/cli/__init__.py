"""The `swarmnode` command, one module per command group (`swarmnode --help` lists them all).

- `main`    the group itself (`swarmnode = swarmnode.node.cli.main:main`): version, keys, conformance,
            train --sync, calibrate, diloco
- `run`     run (a node with a role), probe, devnet; also the module devnets and torchrun start
- `ledger`  stake, register, ledger (contributions, slashes, runs, batches, proofs, deploy)
- `model`   model init / show
- `tasks`   tasks show / filter
- `plan`    plan-memory: what a trainer group needs per device
- `inputs`  the model and task options shared by devnet, train --sync and calibrate

`python -m swarmnode.node.cli ...` runs the same command.
"""
