"""Start one node's role from the environment: `NODE_NUMBER=N python -m services.node`. The HTTP
server starts first and answers /health 503 "starting" while the role loads in the background.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import sys
import threading
import warnings
from datetime import datetime, timezone

from pipeline.config import ConfigError, Settings
from pipeline.config.typos import misspelt_variables
from pipeline.device import thread_budget
from services.roles import role_class
from services.server import tracing
from services.server.http_server import build_http_server, unsent_replies
from services.server.lifecycle import Lifecycle, exit_on_sigterm_until_serving
from services.server.routes import build_app

log = logging.getLogger("services.node")
TEXT_FORMAT = "%(asctime)s node{node} %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, node, level, logger, message and the line's `extra` fields."""

    def __init__(self, node: int):
        super().__init__()
        self.node = node

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
                 "node": self.node, "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        entry.update(getattr(record, "fields", {}))
        if record.exc_info:  # a traceback inside the object: every line stays one JSON value
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def _log_uncaught(args: threading.ExceptHookArgs) -> None:
    # Through logging, not a raw traceback on stderr: with LOG_FORMAT=json every line stays JSON.
    if not issubclass(args.exc_type, SystemExit) and args.exc_value is not None:
        log.error("uncaught exception in thread %s", args.thread.name if args.thread else "?",
                  exc_info=args.exc_value)


def _quiet_libraries(uses_torch: bool) -> None:
    """Progress bars and advisory notes are noise in a node's log (and break JSON lines)."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    for module in ("transformers", "torch", "huggingface_hub"):
        warnings.filterwarnings("ignore", category=FutureWarning, module=module)
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=module)
    if uses_torch:  # the index node never imports transformers
        import transformers
        transformers.logging.disable_progress_bar()
        # transformers prints through its own stderr handler; ours formats (and levels) it instead
        transformers.logging.disable_default_handler()
        transformers.logging.enable_propagation()
        from huggingface_hub.utils import logging as hub_logging
        hub_logging.get_logger().handlers.clear()
        # Warnings about the generation arguments we pass on purpose, twice per load.
        logging.getLogger("transformers.generation").setLevel(logging.ERROR)


def configure_logging(settings: Settings, node: int, uses_torch: bool) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter(node) if settings.observability.log_format == "json"
                         else logging.Formatter(TEXT_FORMAT.format(node=node)))
    logging.basicConfig(level=settings.observability.log_level.upper(), handlers=[handler], force=True)
    logging.captureWarnings(True)  # the warnings left go through our handler, formatted like the rest
    logging.getLogger("waitress.queue").setLevel(logging.ERROR)  # "task queue depth" chatter under load
    threading.excepthook = _log_uncaught
    _quiet_libraries(uses_torch)


def _configure_threads(settings: Settings, uses_torch: bool) -> None:
    if uses_torch:  # importing torch where no model runs would only cost memory and start time
        import torch
        torch.set_num_threads(thread_budget(settings.models.torch_threads))


def log_settings(settings: Settings) -> None:
    """One line with what differs from the defaults (secrets hidden), and a warning per misspelt variable."""
    changed = settings.non_defaults()
    log.info("settings not at their default: %s", " ".join(f"{k}={v}" for k, v in changed.items()) or "none")
    for warning in misspelt_variables():
        log.warning("%s", warning)


def main() -> int:
    exit_on_sigterm_until_serving()  # replaced by the drain's handlers once the server is built
    try:
        settings = Settings.from_env()
        node = settings.require_node_number()
        Role = role_class(settings.cluster, node)
        Role.check_settings(settings)
        tracing.require(settings.observability)  # TRACING=otlp|jsonl without OpenTelemetry: one line, exit 2
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)  # every problem on a line of its own
        return 2
    configure_logging(settings, node, Role.uses_torch)
    log_settings(settings)
    _configure_threads(settings, Role.uses_torch)
    # Before the role loads (its worker asks whether tracing is on); TRACING=off installs nothing.
    tracing.start(settings.observability, node, Role.name)
    lifecycle = Lifecycle(f"node {node}", settings.limits.shutdown_grace_s,
                          failed_linger_s=settings.limits.failed_linger_s)
    role = Role(settings, node, lifecycle)
    app = build_app(role, lifecycle)
    # Our own address (or BIND_HOST, e.g. in a container): never 0.0.0.0 unless asked for.
    address = settings.cluster.bind_address(node)
    threads = role.http_threads()
    try:
        server = build_http_server(app, address.host, address.port, settings.http_server(threads, role.max_body_bytes))
    except OSError as exc:
        variable = f"BIND_HOST={settings.cluster.bind_host!r} with NODE_{node}_IP" if settings.cluster.bind_host \
            else f"NODE_{node}_IP"
        print(f"config error: {variable}={str(settings.node_address(node))!r} cannot be bound as {address}: "
              f"{exc.strerror}", file=sys.stderr)
        return 2
    lifecycle.install_signal_handlers(role.stop, role.abort, functools.partial(unsent_replies, server))
    if settings.limits.shutdown_grace_s >= settings.limits.request_timeout_s:
        log.warning("SHUTDOWN_GRACE_S (%g s) is not under REQUEST_TIMEOUT_S (%g s): a stopping worker holds "
                    "its requests until they time out instead of handing them back (503) while the gateway "
                    "could still recompute them on the other worker", settings.limits.shutdown_grace_s,
                    settings.limits.request_timeout_s)
    log.info("node %d (%s) listening on %s with %d HTTP threads", node, role.name, address, threads)
    lifecycle.start_loading(role.load)
    server.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
