"""DiLoCo between trainers over the swarm (spec/diloco.md is the normative text; the algorithm is
`node.rl.diloco`).

Design decisions:

- The run is a `DilocoRun` signed by its owner and handed to every trainer, who pins the owner's address:
  it names the trainers (so a contribution from anyone else is refused), H, the learning rates, momentum,
  compression and the round timeouts. Everything a trainer signs names the run's digest.
- Discovery is the control plane's: trainers provide and look up the `trainer` role of the run in the DHT
  and learn each other's address and HTTP endpoint from the signed Hello (`role.DilocoTrainer`).
- Bulk data and the small round messages move over the data plane's HTTP server, pulled with long polls:
  contributions and outer states are checkpoints of their own store namespace (`<run>.t<i>`, `<run>.o<i>`,
  version = round), sharded safetensors under a signed manifest, fetched by the multi-source, resumable,
  verifying `Downloader`; a trainer re-serves every contribution it fetched, so the votes' holders can
  stand in for an author that went away. Integrity comes from signatures and sha256, never the transport.
- Agreement: after collecting, each trainer signs the list of contributions it holds (`DilocoVote`) and
  reads the votes of every reachable trainer; `protocol.diloco.decide` turns the votes into the round's set
  (a contribution counts when a voter other than its author holds it), fetches what it lacks from those
  voters, and everyone averages the same set in the same order. When trainers still diverge (a crash
  mid-vote, an asymmetric partition) the next round's `base` digests show it, and the smaller lineage
  resyncs to the larger one's outer state, as a restarted trainer does.
- Trio throughout; torch work (inner steps, compression, averaging, loading) in worker threads.

Parts: `holdings` (what a trainer holds and serves), `service` (HTTP endpoints), `trainer` (the rounds),
`role` (the node role), `plan` (build and sign a run),
`__main__` (`python -m swarmnode.node.diloco plan|trainer`),
`testing` (processes for tests), `conformance` (replays spec/vectors/diloco).
"""
