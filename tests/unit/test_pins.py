"""The two dependencies whose internals the service relies on are bounded, and the bound is checked:
services/server/http_server.py subclasses and patches waitress's channel, parser, error task and
server (its slow-reader and header-gate hardening), and builders/ivf_writer.py writes faiss's
IndexIVFFlat file format by hand. A waitress whose patched code moved, or a faiss whose file format
moved, fails here, naming what to review, before a raised bound ships it."""
from __future__ import annotations

import configparser
import hashlib
import inspect
import re
from importlib import metadata
from pathlib import Path

import faiss
import numpy as np
import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from builders.ivf_writer import write_ivfflat
from pipeline.config import REPO_ROOT
from pipeline.shards import document_shard

BOUNDED = ("waitress", "faiss-cpu")


def requirements() -> dict[str, Requirement]:
    parser = configparser.ConfigParser()
    parser.read(REPO_ROOT / "setup.cfg")
    lines = [line.strip() for line in parser["options"]["install_requires"].splitlines()]
    found = [Requirement(line) for line in lines if line and not line.startswith("#")]
    return {r.name.lower(): r for r in found}


def constrained(name: str) -> Version:
    text = (REPO_ROOT / "constraints.txt").read_text()
    return Version(re.search(rf"^{re.escape(name)}==(\S+)$", text, flags=re.M | re.I).group(1))


@pytest.mark.parametrize("name", BOUNDED)
def test_each_is_bounded_above_and_its_pin_and_installed_version_are_inside(name):
    specifier = requirements()[name].specifier
    assert any(spec.operator in ("<", "<=", "~=", "==") for spec in specifier), f"{name}{specifier}: no upper bound"
    assert constrained(name) in specifier, f"constraints.txt pins {name}=={constrained(name)}, outside {specifier}"
    assert Version(metadata.version(name)) in specifier


# The waitress code http_server.py overrides or whose behaviour it builds on, as waitress 3.0.2 has
# it (sha256 of each one's source, first 16 hex digits). A change here: read the new code against
# _json_error_channel, _close_slow_readers and unsent_replies, run test_http_server.py and
# test_hostile_input.py, then record the new fingerprints and raise setup.cfg's bound.
WAITRESS_SOURCES = {
    "waitress.channel.HTTPChannel.__init__": "a194769af3fd2e35",
    "waitress.channel.HTTPChannel.received": "08d6df73fb69da84",
    "waitress.parser.HTTPRequestParser.received": "b466c02de37d4a01",
    "waitress.parser.HTTPRequestParser.parse_header": "c2c093b901782da6",
    "waitress.task.ErrorTask.execute": "4abe3262db04d291",
    "waitress.server.BaseWSGIServer.maintenance": "4ab5b7f595bc4253",
    "waitress.server.BaseWSGIServer.handle_accept": "69bfcf0fc140592a",
    "waitress.utilities.Error.__init__": "02472df738da0157",
}


def _resolve(dotted: str):
    import importlib
    module, cls, attribute = dotted.rsplit(".", 2)
    return getattr(getattr(importlib.import_module(module), cls), attribute)


@pytest.mark.parametrize("dotted", sorted(WAITRESS_SOURCES))
def test_the_waitress_code_the_hardening_patches_is_as_reviewed(dotted):
    source = inspect.getsource(_resolve(dotted))
    found = hashlib.sha256(source.encode()).hexdigest()[:16]
    assert found == WAITRESS_SOURCES[dotted], (
        f"waitress {metadata.version('waitress')} changed {dotted}: review services/server/http_server.py "
        f"against it, then record {found!r} here")


# send_bytes=1 (what build_http_server passes) is deprecated in 3.0: one more reason for the bound.
@pytest.mark.filterwarnings("ignore:send_bytes will be removed:DeprecationWarning")
def test_a_waitress_server_has_the_attributes_the_hardening_sets_and_reads():
    from flask import Flask
    from waitress.adjustments import Adjustments
    from waitress.channel import HTTPChannel
    from waitress.parser import HTTPRequestParser
    from waitress.server import BaseWSGIServer, create_server
    from waitress.task import ErrorTask

    from services.server.http_server import _listeners
    assert {"error_task_class", "parser_class"} <= set(vars(HTTPChannel))
    assert {"set_close_on_finish", "write"} <= set(dir(ErrorTask))
    # What GatedParser reads once the headers are parsed, and the fields it resets to refuse the body.
    parser = HTTPRequestParser(Adjustments())
    parser.received(b"POST /search HTTP/1.1\r\nHost: a\r\nX-Cluster-Token: t\r\nContent-Length: 5\r\n\r\n")
    assert (parser.path, parser.content_length, parser.headers["X_CLUSTER_TOKEN"]) == ("/search", 5, "t")
    assert parser.error is None and parser.chunked is False and parser.body_rcv is not None
    server = create_server(Flask(__name__), host="127.0.0.1", port=0, clear_untrusted_proxy_headers=True, send_bytes=1)
    try:
        (listener,) = _listeners(server)
        assert isinstance(listener, BaseWSGIServer) and listener.active_channels == {}
        assert listener.channel_class is HTTPChannel and callable(listener.maintenance)
    finally:
        server.close()


# ---------------------------------------------------------------- faiss's file format

def _trained(dim: int, nlist: int, seed: int) -> faiss.IndexIVFFlat:
    rng = np.random.default_rng(seed)
    quantizer = faiss.IndexFlatL2(dim)
    index = faiss.IndexIVFFlat(quantizer, dim, nlist)
    index.train(rng.standard_normal((nlist * 40, dim)).astype("float32"))
    index.nprobe = 3
    index.own_fields = True
    quantizer.this.disown()  # the index owns its quantizer (as builders.data's does)
    return index


# Few vectors in many lists: the "sprs" size table; many in few: the "full" one (faiss's own rule).
@pytest.mark.parametrize("n, nlist, shards", [(6, 64, 1), (500, 8, 1), (500, 8, 3)])
def test_the_ivf_writer_writes_what_faiss_writes(tmp_path: Path, n, nlist, shards):
    dim = 8
    index = _trained(dim, nlist, seed=n)
    vectors = np.random.default_rng(1).standard_normal((n, dim)).astype("float32")
    paths = [tmp_path / f"shard{s}.bin" for s in range(shards)]
    write_ivfflat(paths, index, lambda: iter([vectors[:n // 2], vectors[n // 2:]]), n, progress=False)
    for shard, path in enumerate(paths):
        expected = faiss.clone_index(index)
        if shards == 1:
            expected.add(vectors)
        else:  # a shard's file: its own vectors under their global ids
            ids = np.arange(n, dtype="int64")[document_shard(np.arange(n), shards) == shard]
            expected.add_with_ids(vectors[ids], ids)
        written = path.read_bytes()
        assert written == faiss.serialize_index(expected).tobytes(), (
            f"faiss {faiss.__version__} writes IndexIVFFlat differently from builders/ivf_writer.py")
        assert faiss.read_index(str(path)).ntotal == expected.ntotal
