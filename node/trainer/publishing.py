"""Publishing: the current weights out through the origin as a signed checkpoint version, announced on
gossip (`checkpoints`, re-gossiped every `REPUBLISH_S`, since gossip may drop) and in the DHT.

Each publication prunes the inbox of the rows no step can take any more (`node.trainer.inbox`).
"""

from __future__ import annotations

import logging

import trio

from swarmnode.node.dataplane.checkpoint import MODEL_LAYOUT
from swarmnode.node.dataplane.origin import model_folder_files
from swarmnode.node.rl.model import state_dict_of
from swarmnode.node.trainer.limits import REPUBLISH_S
from swarmnode.node.trainer.sharded import ShardedGrpoTrainer
from swarmnode.node.trainer.state import TrainerState

log = logging.getLogger(__name__)


class Publishing(TrainerState):
    """Publishes checkpoint versions and announces them."""

    def _announces(self) -> bool:  # a hook `node.diloco.rl` overrides
        """Whether this trainer announces its checkpoints (gossip, DHT): it signs the run's manifests."""
        return True

    async def _publish(self, version: int) -> None:
        """Publish the current weights as `version` through the origin, then announce it."""
        trainer, _, descriptor = self._parts()
        assert self.origin_node is not None
        if self._model_files is None:
            self._model_files = await trio.to_thread.run_sync(model_folder_files, self.model_dir)
        origin = self.origin_node.origin
        if isinstance(trainer, ShardedGrpoTrainer):  # every rank writes its files: no full gather
            infos = await trio.to_thread.run_sync(
                trainer.write_model, origin.store, version, origin.shard_size, self._model_files
            )
            await origin.publish_written(
                version=version,
                parent_version=max(version - 1, 0),
                model_config_hash=descriptor.model_config_hash,
                shards=infos,
            )
            self._announce_newest()
            self._prune_inbox(version)
            return
        state = await trio.to_thread.run_sync(state_dict_of, trainer.engine.model)
        await origin.publish(
            state,
            version=version,
            parent_version=max(version - 1, 0),
            model_config_hash=descriptor.model_config_hash,
            layout=MODEL_LAYOUT,
            files=self._model_files,
        )
        self._announce_newest()
        self._prune_inbox(version)

    def _prune_inbox(self, newest: int) -> None:
        """Delete the inbox rows no step can take any more, now that `newest` is published."""
        _, inbox, descriptor = self._parts()
        pruned = inbox.prune(newest, descriptor.async_level)
        if pruned:
            log.info("pruned the inbox", extra={"version": newest, "rows": pruned})

    def _announce_newest(self) -> None:
        """Gossip the newest manifest and provide the retained versions in the DHT (in the background)."""
        if self._background is None or self.origin_node is None or not self._announces():
            return
        self._background.start_soon(self._gossip_newest)
        net = self._net
        assert net is not None
        held = set(self.origin_node.catalog.versions())
        for version in sorted(held - self._provided):
            self._background.start_soon(net.provide_checkpoint, version)
        for version in self._provided - held:
            net.stop_providing_checkpoint(version)
        self._provided = held

    async def _gossip_newest(self) -> None:
        entry = self.origin_node.catalog.latest if self.origin_node is not None else None
        if entry is not None and self._net is not None:
            await self._net.publish("checkpoints", entry.head)

    async def _republish_forever(self) -> None:
        while True:
            await trio.sleep(REPUBLISH_S)
            if self._announces():
                await self._gossip_newest()
