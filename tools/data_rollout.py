"""Roll a running cluster over to another data version with no downtime: `./run.sh data-rollout VERSION`.

The version must already lie beside the current one on every machine (``<data root>/VERSION``, built by
``python -m builders.data build`` or ``update``, or copied there whole). Configured by the nodes' own
environment (NODE_<n>_IP, TOTAL_NODES, INDEX_NODES, CLUSTER_TOKEN), run from any machine that reaches
them. In order, each step on every node before the next:

1. every index node loads its shard of VERSION beside the current one (the switch waits for every shard
   on every node that serves it);
2. every worker (node 0 too) loads VERSION's documents, checking that its embedder built it;
3. every worker switches: requests that start from now on read VERSION; those in flight finish on
   the version they started with (their searches name it, so the index nodes answer from it);
4. every worker releases the old versions once their requests in flight have ended; node 0's reply
   caches are cleared;
5. every index node switches (for searches that name no version) and releases the old versions.

Every step is idempotent, so a rollout that stopped anywhere (this tool or a node killed) completes when
run again. Exit 0 when every node serves VERSION alone, 1 naming the node that failed, 2 on bad settings.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence

import requests

from pipeline.config import ConfigError, Settings
from pipeline.data_version import check_version_name
from services.server.token import TOKEN_HEADER

log = logging.getLogger("data-rollout")
# A node that does not answer (restarting) is asked again until this long has passed.
NODE_WAIT_S = 300.0
RETRY_PAUSE_S = 0.5


class RolloutFailed(RuntimeError):
    pass


class Rollout:
    def __init__(self, settings: Settings, version: str, *, release_timeout_s: float = 60.0,
                 node_wait_s: float = NODE_WAIT_S):
        self.settings = settings
        self.version = check_version_name(version)
        self.release_timeout_s = release_timeout_s
        self.node_wait_s = node_wait_s
        self.session = requests.Session()
        token = settings.cluster.cluster_token
        if token:
            self.session.headers[TOKEN_HEADER] = token

    @property
    def index_nodes(self) -> tuple[int, ...]:
        return self.settings.cluster.index_nodes

    @property
    def workers(self) -> tuple[int, ...]:
        return self.settings.cluster.workers

    def run(self) -> None:
        self.step(self.index_nodes, "load")
        self.step(self.workers, "load")
        self.step(self.workers, "switch")
        self.release_old(self.workers)
        self._call(0, "POST", "/cache/clear", None)
        self.step(self.index_nodes, "switch")
        self.release_old(self.index_nodes)
        log.info("every node serves data version %s alone", self.version)

    def step(self, nodes: Sequence[int], action: str) -> None:
        """POST /data/<action> ("load" or "switch") of the version to each node in turn."""
        for node in nodes:
            self._call(node, "POST", f"/data/{action}", {"version": self.version})
        log.info("%s %s on nodes %s", action, self.version, ", ".join(map(str, nodes)))

    def release_old(self, nodes: Sequence[int]) -> None:
        """Every version but this one released on each node, once its requests in flight end."""
        for node in nodes:
            status = self._call(node, "GET", "/data", None)
            for entry in status.get("loaded", []):
                old = entry["version"]
                if old != self.version:
                    self._call(node, "POST", "/data/release", {"version": old, "timeout_s": self.release_timeout_s})
                    log.info("node %d released data version %s", node, old)

    def _call(self, node: int, method: str, path: str, body: dict | None) -> dict:
        """One call, asked again while the node is down, starting or busy (503), until node_wait_s."""
        url = f"{self.settings.node_address(node).url}{path}"
        deadline = time.monotonic() + self.node_wait_s
        while True:
            try:
                response = self.session.request(method, url, json=body, timeout=(3.0, self.release_timeout_s + 30))
            except requests.RequestException as exc:
                problem = f"unreachable ({exc.__class__.__name__})"
            else:
                if response.status_code == 200:
                    return response.json()
                problem = f"{response.status_code}: {_error(response)}"
                if response.status_code != 503:
                    raise RolloutFailed(f"node {node} {method} {path} {body or ''} answered {problem}")
            if time.monotonic() > deadline:
                raise RolloutFailed(f"node {node} {method} {path}: {problem} for {self.node_wait_s:g}s")
            log.info("node %d %s %s: %s; asking again", node, method, path, problem)
            time.sleep(RETRY_PAUSE_S)

    def close(self) -> None:
        self.session.close()


def _error(response: requests.Response) -> str:
    try:
        return str(response.json().get("error", response.text[:200]))
    except ValueError:
        return response.text[:200]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./run.sh data-rollout", description=__doc__.split("\n\n")[0])
    parser.add_argument("version", help="the data version to serve: a directory beside the current one")
    parser.add_argument("--release-timeout-s", type=float, default=60.0,
                        help="how long a node waits for the old version's requests in flight, per call")
    parser.add_argument("--node-wait-s", type=float, default=NODE_WAIT_S,
                        help="how long a node that does not answer (restarting) is asked again")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s data-rollout %(levelname)s: %(message)s")
    try:
        settings = Settings.from_env()
        rollout = Rollout(settings, args.version, release_timeout_s=args.release_timeout_s,
                          node_wait_s=args.node_wait_s)
    except (ConfigError, ValueError) as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    try:
        rollout.run()
    except RolloutFailed as exc:
        log.error("%s; every step is idempotent: run the same command again once fixed", exc)
        return 1
    finally:
        rollout.close()
    print(f"SERVING {args.version}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
