"""pipeline/continuous/cuda_graphs.py: decode rows bucketed to few shapes, and a shape whose graph
cannot be recorded run eagerly (here, where recording fails for want of CUDA)."""
from __future__ import annotations


def test_decode_rows_are_bucketed_to_few_shapes_within_max_batch():
    from pipeline.continuous.cuda_graphs import bucket
    assert [bucket(n, 32) for n in (1, 2, 3, 4, 5, 8, 9, 16, 17, 31, 32)] == [1, 2, 4, 4, 8, 8, 16, 16, 24, 32, 32]
    assert [bucket(n, 6) for n in (1, 3, 5, 6)] == [1, 4, 6, 6]  # never past max_batch, never under the rows


def test_a_shape_whose_graph_cannot_be_recorded_is_tried_twice_counted_and_run_eagerly_alone():
    import torch

    from pipeline.continuous.cuda_graphs import DecodeGraphs
    calls = []

    def step(ids, columns, width):
        # Raises while a CUDA graph records it (off CUDA, recording fails before it is called).
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("cannot be captured")
        calls.append(width)
        return ids.float() * width + columns[:, None]

    device = "cuda" if torch.cuda.is_available() else "cpu"
    graphs = DecodeGraphs(step)
    ids, columns = torch.tensor([[2], [3]], device=device), torch.tensor([5, 7], device=device)
    assert torch.equal(graphs.run(ids, columns, 256).cpu(), torch.tensor([[517.0], [775.0]]))
    assert (graphs.recorded, graphs.failed) == (0, 1)
    before = len(calls)
    assert torch.equal(graphs.run(ids, columns, 256).cpu(), torch.tensor([[517.0], [775.0]]))
    assert calls[before:] == [256]  # a failed shape runs eagerly, without trying again
    graphs.record([(1, 256), (2, 512)], device)  # graphs are not off for the process: each shape is tried
    assert (graphs.recorded, graphs.failed) == (0, 3)
    assert torch.equal(graphs.run(ids, columns, 512).cpu(), torch.tensor([[1029.0], [1543.0]]))
