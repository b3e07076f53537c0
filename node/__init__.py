"""The node: everything with I/O (network, disk, processes, the CLI); the pure rules live in
`swarmnode.protocol`, `swarmnode.crypto` and `swarmnode.ledger`.

- `cli/`        the `swarmnode` command, one module per command group
- `devnet/`     a whole swarm on this machine (orchestration, the RL run, the report)
- `runtime`     the node process: one trio loop, every component a task; `config` its settings;
                `metrics` the Prometheus endpoint; `conformance` the table of vector suites (spec/vectors)
                that `swarmnode conformance` replays and `make vectors` writes
- `roles/`      what every role shares (the service base, checkpoint following); no role package
- `assemble`    the composition root: a role with its work, from the config (the only module
                that imports every role)
- `trainer/`, `worker/`, `validator/`, `relay/`: one package per role, its network service and its work
- `diloco/`     DiLoCo between trainers (the algorithm, pre-training rounds, RL runs, trainer groups)
- `p2p/`        libp2p host, DHT, gossip, request/response, peer scoring
- `dataplane/`  HTTP shard origin, relay and follower for checkpoints
- `rl/`         models, engines, tasks, GRPO, TOPLOC capture, validation
- `sandbox/`    where programs others wrote run (graded code): bubblewrap, seccomp, cgroups
- `wan/`        the WAN emulator (namespaces, shaped links, NAT) for `devnet --wan`
"""
