"""The relay: follows every retained checkpoint, re-serves its verified shards, announces what it holds.

- `service`  the network service (`Relay`)
- `work`     `SwarmRelayWork`: the follower and the shard server
"""
