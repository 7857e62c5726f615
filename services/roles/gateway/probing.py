"""The gateway's health probing: a background thread that asks each worker whether it is ready.

A worker whose probe answers differently from its place in the rotation is put back into
it or taken out (Router.mark); the first round runs at once, then one every interval.
"""
from __future__ import annotations

import threading

from services.roles.gateway.routing import Router


class HealthProber:
    """Probes every worker of `router` every `interval_s` seconds until closed."""

    def __init__(self, router: Router, interval_s: float):
        self.router = router
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gateway-prober", daemon=True)
        self._thread.start()

    def probe_once(self) -> None:
        for target in list(self.router.targets):
            try:
                ok = bool(target.probe())
            except Exception:  # a probe must never kill the prober
                ok = False
            if ok != target.up:
                self.router.mark(target, ok, "health probe")

    def _loop(self) -> None:
        while True:
            self.probe_once()
            if self._stop.wait(self.interval_s):
                return

    def close(self) -> None:
        self._stop.set()
