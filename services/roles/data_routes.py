"""/data routes: what a rollout (tools/data_rollout.py) asks of every node that holds data.

    GET  /data                                   the current version and those held, with requests in flight
    POST /data/load     {"version": V}           hold V beside the current one (idempotent)
    POST /data/switch   {"version": V}           new requests use V (it must be held)
    POST /data/release  {"version": V, "timeout_s": S}
                                                 stop handing out V, wait up to S for its requests in flight,
                                                 close it: 200 once released, 409 while it is current, 503
                                                 if requests still use it at S (ask again)

Each is internal (the cluster token) and answers 503 until the node is ready.
"""
from __future__ import annotations

from flask import Flask, jsonify

from pipeline.data_version import DataVersionError
from services.roles.loaded import Loaded
from services.roles.versioned_data import VersionedData
from services.server.body import read_json_object
from services.server.errors import ApiError
from services.server.lifecycle import Lifecycle
from services.server.token import internal_endpoint

MAX_RELEASE_WAIT_S = 600.0


def _version(body: dict) -> str:
    version = body.get("version")
    if not isinstance(version, str) or not version:
        raise ApiError(400, "'version' must be a data version's name", field="version")
    return version


def register_data_routes(app: Flask, loaded: Loaded[VersionedData], lifecycle: Lifecycle, token: str) -> None:
    def ready() -> VersionedData:
        lifecycle.require_ready()
        return loaded.require()

    @app.get("/data")
    @internal_endpoint(token)
    def data_status():
        return jsonify(ready().status())

    @app.post("/data/load")
    @internal_endpoint(token)
    def data_load():
        data = ready()
        version = _version(read_json_object())
        try:
            manifest = data.load(version)
        except ValueError as exc:
            raise ApiError(400, str(exc), field="version") from None
        except DataVersionError as exc:  # incomplete, unreadable, or for another embedder: this node's answer
            raise ApiError(409, str(exc), field="version") from None
        return jsonify({**data.status(), "loaded_version": manifest.version})

    @app.post("/data/switch")
    @internal_endpoint(token)
    def data_switch():
        data = ready()
        data.switch(_version(read_json_object()))
        return jsonify(data.status())

    @app.post("/data/release")
    @internal_endpoint(token)
    def data_release():
        data = ready()
        body = read_json_object()
        version = _version(body)
        timeout_s = body.get("timeout_s", 30.0)
        if type(timeout_s) not in (int, float) or not 0 <= timeout_s <= MAX_RELEASE_WAIT_S:
            raise ApiError(400, f"'timeout_s' must be a number of seconds from 0 to {MAX_RELEASE_WAIT_S:g}",
                           field="timeout_s")
        if not data.release(version, float(timeout_s)):
            raise ApiError(503, f"data version {version!r} is still in use by requests in flight; ask again",
                           retry_after_s=1.0)
        return jsonify(data.status())
