"""One module per node role, picked once from NODE_NUMBER.

Each role says what it loads (`load`, run by the startup thread), which routes it
serves (`register_routes`), what its /health adds, and its HTTP thread count;
services.server.routes wraps it in the routes every node shares, services.node serves it.
"""
from __future__ import annotations

from services.roles.base import Role
from services.roles.gateway.role import GatewayRole
from services.roles.index.role import IndexRole
from services.roles.worker.role import WorkerRole

ROLES: dict[int, type[Role]] = {0: GatewayRole, 1: WorkerRole, 2: IndexRole}


def role_class(node: int) -> type[Role]:
    """Node 0: gateway + worker; node 1: worker; node 2: index server."""
    return ROLES[node]
