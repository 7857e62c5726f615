"""pipeline.cuda_streams: a worker's stage threads on a GPU each issue their work on a stream of their own."""
import threading

import pytest
import torch

from pipeline.cuda_streams import own_stream_starter
from services.stages.batching import BatchingService

ON_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here: runs where torch sees one")


def test_off_cuda_a_stage_thread_has_nothing_to_start():
    assert own_stream_starter("cpu") is None
    assert callable(own_stream_starter("cuda")) and callable(own_stream_starter("cuda:0"))


@ON_CUDA
@pytest.mark.parametrize("device", ["cuda"])
def test_each_stage_thread_on_cuda_computes_on_its_own_stream_after_the_default_streams_work(device):
    weight = torch.randn(256, 256, device=device)  # written on the default stream, as a model's load is
    weight.mul_(2.0)
    seen: dict[str, list] = {}
    lock = threading.Lock()

    def batch_fn(name):
        def run(items):
            stream = torch.cuda.current_stream(device)
            out = [float((weight * x).sum()) for x in items]  # reads what the default stream wrote
            with lock:
                seen.setdefault(name, []).append(stream)
            return out
        return run

    services = [BatchingService(name, batch_fn(name), max_size=2, max_wait_ms=0,
                                on_start=own_stream_starter(device)) for name in ("embed", "rerank")]
    try:
        expected = float(weight.sum())
        for svc in services:
            assert [f.result(timeout=30) for f in svc.submit_many([1.0, 2.0, 3.0])] == pytest.approx(
                [expected, 2 * expected, 3 * expected], rel=1e-5)
    finally:
        for svc in services:
            svc.close(timeout=30)
    default = torch.cuda.default_stream(device)
    streams = {name: set(s) for name, s in seen.items()}
    assert all(len(s) == 1 for s in streams.values()), streams  # one stream a thread, every batch
    embed, rerank = (next(iter(streams[name])) for name in ("embed", "rerank"))
    assert embed != default and rerank != default and embed != rerank
    assert torch.cuda.current_stream(device) == default  # this thread's own stream untouched
