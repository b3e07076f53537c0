"""The swarm's work: what each role does with the network once it is up (the `RoleWork` seam).

- `trainer/`    GRPO steps on accepted rollouts pulled from validators; checkpoints out through the origin.
- `relay.py`    follows checkpoints, re-serves their shards, announces what it holds.
- `worker.py`   follows the newest checkpoint, generates assigned groups with proofs, submits them.
- `validator/` re-checks submissions on the claimed checkpoint, gossips verdicts, writes the ledger.
- `follow.py`   checkpoint following shared by relay, worker and validator (gossip + DHT + HTTP).
- `common.py`   what they share: the run's setup from its descriptor, the ledger, the ACCEPTED protocol.

`make_work(role, config, identity)` builds the work for `swarmnode run --role ...`.
"""
