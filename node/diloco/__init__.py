"""DiLoCo between trainers, in one place (spec/diloco.md is the normative text, `protocol.diloco` its pure
rules): the algorithm, pre-training rounds over the swarm, RL runs with several trainers, trainer groups.

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

Parts:
- `algorithm`  DiLoCo itself (K trainers, H local AdamW steps, one averaged Nesterov outer step), in process
               over `weights` (θ by name), `compression` (payloads) and `pretraining` (reference data)
- `rounds`     one trainer's rounds over the swarm (pre-training): the round's control flow; its network
               phases `collect` (contributions, votes, decided fetches) and `resync` (join, adopt, skip)
               over what they share (`exchange`); `participant` where θ and payloads live (one process or
               a trainer group); `holdings` what it holds and serves (`namespace` one store namespace),
               `contribution_endpoints` its HTTP endpoints, `payload` tensors in and out of contributions
- `rl`         an RL run with several trainers: DiLoCo rounds around GRPO (`make_diloco_trainer`)
- `sharded`    a trainer group of FSDP2 ranks as one DiLoCo participant, shard-wise
               (its collectives; `rank_files` who owns which tensor and the per-rank payload files)
- `role` (the node role), `plan` (build and sign a run), `conformance` (the diloco suite's handlers);
  the process is `swarmnode diloco trainer` (node/cli/diloco.py), its test harness `swarmnode.testing.diloco`
"""
