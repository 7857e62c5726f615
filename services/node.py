"""Start one node's role from the environment: `NODE_NUMBER=N python -m services.node`.

Node 0: gateway + worker; node 1: worker; node 2: index server (services.roles).
The HTTP server starts first and answers /health 503 "starting" while models or
the index load in the background, so deployers can watch a node come up.
"""
from __future__ import annotations

import logging
import sys

from pipeline.config import ConfigError, Settings
from pipeline.device import thread_budget
from services.app import build_app
from services.http import serve
from services.lifecycle import Lifecycle
from services.roles import role_class

log = logging.getLogger("services.node")


def _configure_threads(settings: Settings, uses_torch: bool) -> None:
    if uses_torch:  # importing torch where no model runs would only cost memory and start time
        import torch
        torch.set_num_threads(thread_budget(settings.torch_threads))
    try:
        import faiss
        faiss.omp_set_num_threads(thread_budget(settings.faiss_threads))
    except ImportError:
        pass


def main() -> int:
    try:
        settings = Settings.from_env()
        node = settings.require_node_number()
        Role = role_class(node)
        Role.check_settings(settings)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(),
                        format=f"%(asctime)s node{node} %(levelname)s %(name)s: %(message)s")
    logging.getLogger("waitress.queue").setLevel(logging.ERROR)  # "task queue depth" chatter under load
    _configure_threads(settings, Role.uses_torch)
    lifecycle = Lifecycle(f"node {node}", settings.shutdown_grace_s)
    role = Role(settings, node, lifecycle)
    app = build_app(role, lifecycle)
    address = settings.node_address(node)  # our own address only: never 0.0.0.0
    threads = role.http_threads()
    try:
        server = serve(app, address.host, address.port, threads, settings=settings, max_body_bytes=role.max_body_bytes)
    except OSError as exc:
        print(f"config error: NODE_{node}_IP={str(address)!r} cannot be bound: {exc.strerror}", file=sys.stderr)
        return 2
    lifecycle.install_signal_handlers(role.stop, role.abandon)
    if settings.shutdown_grace_s >= settings.request_timeout_s:
        log.warning("SHUTDOWN_GRACE_S (%g s) is not under REQUEST_TIMEOUT_S (%g s): a stopping worker holds "
                    "its requests until they time out instead of handing them back (503) while the gateway "
                    "could still recompute them on the other worker", settings.shutdown_grace_s,
                    settings.request_timeout_s)
    log.info("node %d (%s) listening on %s with %d HTTP threads", node, role.name, address, threads)
    lifecycle.start_loading(role.load)
    server.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
