"""The weight-broadcast data plane: signed sharded checkpoints moved over HTTP by origins, relays, workers.

Design decisions (spec/shards.md is the normative text):

- HTTP/1.1 on trio + h11, not libp2p streams (spec/shards.md). Servers send files with `os.sendfile`;
  clients read bodies with `recv_into` into one reused buffer and hash while writing, so a byte costs one
  kernel copy in, one sha256 pass and one page-cache write, and Python runs a few steps per MiB.
- Trust comes from the trainer-signed `CheckpointManifest` (per-shard sha256, Merkle root), never from
  the peer that served the bytes: any node may serve, a bad byte is caught at its shard and the shard is
  fetched again elsewhere, and nothing unverified is ever served or loaded.
- The control plane is not imported here. It feeds two things in: manifest or `CheckpointHead` envelopes
  (a channel; a head is resolved into its manifest over HTTP, `heads`) and shard availability
  (`SourceBook.observe(ShardHave)`); it may read `Catalog` to announce what we hold.
  `feeds` does the same over HTTP long polls, for standalone use and tests.

API, by role:

- Origin (trainer): `OriginNode(root, identity, run).run()` serves; `node.origin.publish(state_dict,
  version=, parent_version=, model_config_hash=, layout="model", files=model_folder_files(folder))` writes
  the files of a Hugging Face folder (weights shards, index, config and tokenizer), signs the manifest and
  returns `(manifest, envelope)`: gossip the catalog entry's `head` on `swarm/<run>/checkpoints`. A
  complete version's directory on any node (`store.complete_dir(v)`) is then a folder transformers and
  vLLM load directly.
- Relay: `FollowerNode(FollowerNodeConfig(root, run, trainer, identity, peers={...}))`, then `run()`.
  Feed it with `node.manifests.send(envelope)` and `node.book.observe(have)` (or give `peers` and let it
  poll them); it fetches, verifies, serves, prunes; `node.catalog` and its `have` endpoint say what it holds.
- Worker: the same with `newest_only=True` (serving optional); `run(completed)` sends a
  `VerifiedCheckpoint(manifest, envelope, directory)` on `completed` once a version is whole, and
  `checkpoint.load_checkpoint(directory, manifest)` (in a thread) gives the state dict to hot-swap.

Processes for tests and the benchmark:
`swarmnode dataplane origin|relay|worker|bad-relay --help` (node/cli/dataplane.py).
"""
