"""The worker: follows the newest checkpoint, generates its assigned groups with TOPLOC proofs, submits them.

- `service`  the network service (`Worker`): no endpoints of its own, it dials validators
- `work`     `SwarmWorkerWork`: following, generating, proving, submitting, and its status
- `cheats`   devnet-only dishonest workers, one pure function per cheat
"""
