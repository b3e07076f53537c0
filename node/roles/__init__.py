"""What every role shares; each role itself lives in its own package (node/trainer/, node/worker/,
node/validator/, node/relay/), holding both its network service (`service.py`) and its work.

- `base`       `RoleService`, the network handle a role works through (`RoleNet`), the `RoleWork` seam
- `common`     what the works share: the run's setup from its descriptor, the ledger, the ACCEPTED protocol
- `follow`     checkpoint following shared by relay, worker and validator (gossip + DHT + HTTP)
- `bootstrap`  the well-known entry point (a DHT server and gossip relay, no work)
- `probe`      a role-less node for measurements and tests
"""
