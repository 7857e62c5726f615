"""services/server/http_server.py's count of replies not yet written, against a real waitress server
on 127.0.0.1 in this process (a thread): what a stopping node waits for before it exits."""
from __future__ import annotations

import socket
import threading

import pytest
from flask import Flask, Response

from pipeline.config import HttpServerConfig
from services.server.http_server import build_http_server, unsent_replies
from tests.helpers import wait_until

pytestmark = pytest.mark.timeout(60)

# Under waitress's output-buffer high-water mark (16 MiB): the app's part ends while most of the reply
# is still in waitress's buffers.
BODY_BYTES = 8 * 1024 * 1024
# Socket buffers fixed, so the kernel holds at most a few MiB of the reply whatever its autotuning
# allows: the rest waits in waitress's output buffers until the client reads.
SOCKET_BUFFER_BYTES = 1024 * 1024


@pytest.fixture
def closed() -> threading.Event:
    return threading.Event()


@pytest.fixture
def server(closed):
    app = Flask("big")

    def big():
        response = Response(b"x" * BODY_BYTES)
        response.call_on_close(closed.set)  # waitress has taken the whole reply from the app
        return response

    app.add_url_rule("/big", "big", big)
    config = HttpServerConfig(threads=2, read_timeout_s=10.0, connection_limit=16, channel_timeout_s=30.0,
                              max_body_bytes=1024, cluster_token="")
    server = build_http_server(app, "127.0.0.1", 0, config)
    server.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)  # accepted sockets inherit it
    thread = threading.Thread(target=server.run, name="waitress", daemon=True)
    thread.start()
    yield server
    server.close()
    server.trigger.close()  # the loop ends once its map is empty
    server.task_dispatcher.shutdown()
    thread.join(10)


def test_a_reply_counts_as_unsent_until_the_client_has_taken_all_of_it(server, closed):
    assert unsent_replies(server) == 0
    with socket.socket() as client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)  # before connecting: the window
        client.settimeout(30)
        client.connect(server.socket.getsockname())
        client.sendall(b"GET /big HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert closed.wait(20), "the app never finished its reply"
        assert unsent_replies(server) == 1  # served, but most of it still in waitress's buffers
        received = 0
        while received < BODY_BYTES:  # headers and body: the body alone is BODY_BYTES
            chunk = client.recv(1 << 20)
            assert chunk, "the server closed before the whole reply was read"
            received += len(chunk)
        wait_until(lambda: unsent_replies(server) == 0, 20, "every reply written")
