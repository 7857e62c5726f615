"""The cluster's topology, both deploy targets', written once: the index shard count and the names each
target's nodes are found by. tools/render_settings.py generates compose's services and anchors,
Kubernetes' shard StatefulSets and the settings' wiring from it."""
from __future__ import annotations

from typing import NamedTuple

# The index shards, one count for both targets: a data version (builders.data --shards) serves on
# either, and each target runs one service or StatefulSet per shard of it.
INDEX_SHARDS = 2
FIRST_INDEX_NODE = 2  # node 0 the gateways, node 1 every worker, then one node number per shard
PORT = 8000  # every node's (the image's), in each address below


class Topology(NamedTuple):
    """Who one target's nodes are, by the names they are found by: node 0's, the one every worker
    (node 1) answers to, and each index shard's (a format of its `shard` and `node` numbers)."""
    gateway: str
    worker: str
    index_shard: str
    shards: int = INDEX_SHARDS

    def index_nodes(self) -> list[int]:
        return [FIRST_INDEX_NODE + shard for shard in range(self.shards)]

    def index_names(self) -> list[str]:
        return [self.index_shard.format(shard=shard, node=node) for shard, node in enumerate(self.index_nodes())]

    def wiring(self) -> dict[str, str]:
        """The settings that name the nodes: their count, roles, addresses and discovery names."""
        index = [f"{name}:{PORT}" for name in self.index_names()]
        return {
            "TOTAL_NODES": str(FIRST_INDEX_NODE + self.shards),
            "INDEX_NODES": ",".join(map(str, self.index_nodes())),
            "INDEX_SHARDS": str(self.shards),
            "NODE_0_IP": f"{self.gateway}:{PORT}",
            "NODE_1_IP": f"{self.worker}:{PORT}",
            **{f"NODE_{node}_IP": address for node, address in zip(self.index_nodes(), index)},
            "WORKER_DISCOVERY": f"{self.worker}:{PORT}",
            "INDEX_DISCOVERY": ",".join(index),
        }


# Kubernetes: the gateway Deployment's Service, the workers' headless Service, and a headless Service
# per shard (deploy/k8s/index-shard.yaml.tmpl's objects take its name).
K8S_TOPOLOGY = Topology(gateway="rag-gateway", worker="rag-worker", index_shard="rag-index-shard-{shard}")
# Compose: a service each; a scaled service's containers are all found by its name.
COMPOSE_TOPOLOGY = Topology(gateway="node0", worker="worker", index_shard="node{node}")
