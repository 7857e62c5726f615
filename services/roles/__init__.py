"""One module per node role (services.roles.base.Role), picked once from NODE_NUMBER and INDEX_NODES.

A role's module is imported only when it is picked: the index node never imports torch, and a
settings error is reported before any model code is imported.
"""
from __future__ import annotations

import importlib

from pipeline.config.sections import ClusterSettings
from services.roles.base import Role

ROLE_CLASSES = {"gateway": "services.roles.gateway.role:GatewayRole", "worker": "services.roles.worker.role:WorkerRole",
                "index": "services.roles.index.role:IndexRole"}


def role_class(cluster: ClusterSettings, node: int) -> type[Role]:
    """Node 0: gateway + worker; the INDEX_NODES: index server; every other node: worker."""
    module, name = ROLE_CLASSES[cluster.role_of(node)].split(":")
    return getattr(importlib.import_module(module), name)
