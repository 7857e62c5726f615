"""builders.index_kinds' training: faiss's own coarse quantizer, trained once per shared run, OPQ bounded."""
from __future__ import annotations

import faiss
import numpy as np
import pytest

from builders.index_kinds import (
    OPQ_NITER,
    OPQ_NITER_PQ_0,
    OPQ_TRAIN_POINTS,
    REFINE_FACTOR,
    ivf_params,
    parse_index_spec,
    shared_training,
    train_ivfflat,
    trained_index,
    write_in_memory,
)

DIM = 16
N = 2_600  # PQ warns under 9,984 training points; it trains all the same, and fast
NLIST = 40


def _sample() -> np.ndarray:
    return np.random.default_rng(0).random((N, DIM), dtype=np.float32)


def _faiss_trained(spec: str, x: np.ndarray) -> faiss.Index:
    """``spec`` as faiss's index_factory makes and trains it (the kinds' settings applied first)."""
    kind = parse_index_spec(spec, DIM)
    index = faiss.index_factory(DIM, spec + (",RFlat" if kind.refined else ""))
    ivf = faiss.try_extract_index_ivf(index)
    if kind.refined:
        faiss.downcast_index(ivf).do_polysemous_training = False
        faiss.downcast_index(index).k_factor = REFINE_FACTOR
    if kind.family == "OPQ-IVF-PQ":
        opq = faiss.downcast_VectorTransform(faiss.downcast_index(faiss.downcast_index(index).base_index).chain.at(0))
        opq.niter, opq.niter_pq_0, opq.max_train_points = OPQ_NITER, OPQ_NITER_PQ_0, OPQ_TRAIN_POINTS
    index.train(x)
    ivf.nprobe = 8
    return index


@pytest.mark.parametrize("spec", [f"IVF{NLIST},SQ8", f"IVF{NLIST},PQ4", f"OPQ4,IVF{NLIST},PQ4"])
def test_a_kind_trains_to_the_index_faiss_trains(spec):
    x = _sample()
    mine = trained_index(parse_index_spec(spec, DIM), x, ivf_params(N, NLIST, 8, None, N))
    assert faiss.serialize_index(mine).tobytes() == faiss.serialize_index(_faiss_trained(spec, x)).tobytes()


def test_ivfflat_trains_faiss_own_quantizer():
    x = _sample()
    reference = faiss.IndexIVFFlat(faiss.IndexFlatL2(DIM), DIM, NLIST)
    reference.train(x)
    mine = train_ivfflat(x, ivf_params(N, NLIST, 8, None, N))
    assert np.array_equal(mine.quantizer.reconstruct_n(0, NLIST), reference.quantizer.reconstruct_n(0, NLIST))


def test_kinds_over_one_sample_share_one_quantizer_and_write_the_files_they_would_alone(tmp_path):
    x = _sample()
    params = ivf_params(N, NLIST, 8, None, N)
    sq8 = parse_index_spec("IVF,SQ8", DIM)
    write_in_memory([tmp_path / "alone.bin"], trained_index(sq8, x, params), lambda: iter([x]), N)
    with shared_training() as shared:
        train_ivfflat(x, params)
        assert shared.reused_s == 0 and len(shared.quantizers) == 1
        write_in_memory([tmp_path / "shared.bin"], trained_index(sq8, x, params), lambda: iter([x]), N)
        assert shared.reused_s > 0 and len(shared.quantizers) == 1  # the SQ8 build reused it
        with shared_training() as inner:
            assert inner is shared
        trained_index(sq8, x[: N // 2], params)  # another sample: its own k-means
        assert len(shared.quantizers) == 2
    assert (tmp_path / "shared.bin").read_bytes() == (tmp_path / "alone.bin").read_bytes()
    with shared_training() as fresh:  # closed: the next run starts empty
        assert fresh is not shared and not fresh.quantizers
