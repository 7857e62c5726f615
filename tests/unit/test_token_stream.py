"""services/stages/token_stream.py: a stream read until its future resolves, and to its deadline."""
from __future__ import annotations

import time

import pytest


def test_a_token_stream_reads_until_its_future_resolves_and_times_out_at_its_deadline():
    from concurrent.futures import Future

    from services.server.errors import RequestTimeout
    from services.stages.token_stream import TokenStream
    stream, future = TokenStream(), Future()
    stream.end_with(future)
    for token in (5, 6, 7):
        stream.put(token)
    future.set_result("done")
    assert list(stream.read(time.monotonic() + 5)) == [5, 6, 7]
    silent = TokenStream()
    silent.end_with(Future())
    started = time.monotonic()
    with pytest.raises(RequestTimeout):
        list(silent.read(started + 0.2))
    assert 0.15 < time.monotonic() - started < 2.0
