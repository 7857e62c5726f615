"""One module per node role (services.roles.base.Role), picked once from NODE_NUMBER and INDEX_NODES."""
from __future__ import annotations

from pipeline.config.sections import ClusterSettings
from services.roles.base import Role
from services.roles.gateway.role import GatewayRole
from services.roles.index.role import IndexRole
from services.roles.worker.role import WorkerRole

ROLES: dict[str, type[Role]] = {"gateway": GatewayRole, "worker": WorkerRole, "index": IndexRole}


def role_class(cluster: ClusterSettings, node: int) -> type[Role]:
    """Node 0: gateway + worker; the INDEX_NODES: index server; every other node: worker."""
    return ROLES[cluster.role_of(node)]
