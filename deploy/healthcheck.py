"""The image's HEALTHCHECK: exit 0 when this container's node answers GET /ready with 200.

The port is the node's own (NODE_<NODE_NUMBER>_IP, as the node reads it), asked on loopback:
the node listens there whether BIND_HOST is 0.0.0.0 or unset.
"""
from __future__ import annotations

import sys
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.config import ConfigError, Settings  # noqa: E402  (after the path above)


def main() -> int:
    try:
        settings = Settings.from_env()
        port = settings.cluster.bind_address(settings.require_node_number()).port
    except ConfigError as exc:
        print(f"healthcheck: {exc}", file=sys.stderr)
        return 1
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=3) as reply:
            return 0 if reply.status == 200 else 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"healthcheck: not ready on port {port}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
