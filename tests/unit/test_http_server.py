"""services/server/http_server.py's count of replies not yet written, against a real waitress server
on 127.0.0.1 in this process (a thread): what a stopping node waits for before it exits."""
from __future__ import annotations

import socket
import threading

import pytest
from flask import Flask

from pipeline.config import HttpServerConfig
from services.server.http_server import build_http_server, unsent_replies
from tests.helpers import wait_until

pytestmark = pytest.mark.timeout(60)

BODY_BYTES = 32 * 1024 * 1024  # more than the kernel's socket buffers hold: the rest waits in waitress


@pytest.fixture
def server():
    app = Flask("big")
    app.add_url_rule("/big", "big", lambda: b"x" * BODY_BYTES)
    config = HttpServerConfig(threads=2, read_timeout_s=10.0, connection_limit=16, channel_timeout_s=30.0,
                              max_body_bytes=1024, cluster_token="")
    server = build_http_server(app, "127.0.0.1", 0, config)
    thread = threading.Thread(target=server.run, name="waitress", daemon=True)
    thread.start()
    yield server
    server.close()
    server.trigger.close()  # the loop ends once its map is empty
    server.task_dispatcher.shutdown()
    thread.join(10)


def test_a_reply_counts_as_unsent_until_the_client_has_taken_all_of_it(server):
    assert unsent_replies(server) == 0
    with socket.create_connection(("127.0.0.1", server.effective_port), timeout=30) as client:
        client.sendall(b"GET /big HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        wait_until(lambda: unsent_replies(server) == 1, 20, "the reply waiting in waitress's buffers")
        received = 0
        while received < BODY_BYTES:  # headers and body: the body alone is BODY_BYTES
            chunk = client.recv(1 << 20)
            assert chunk, "the server closed before the whole reply was read"
            received += len(chunk)
        wait_until(lambda: unsent_replies(server) == 0, 20, "every reply written")
