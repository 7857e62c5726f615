"""Synthetic vectors shaped like real sentence embeddings, drawn from a fitted mixture, streamed.

Uniform random vectors (``--vectors uniform``, the course's own) fill the cube evenly: every point is about
as far from every other, so an IVF index's few probed lists rarely hold a query's true neighbours and
centroid shards are all visited. Real embeddings are clumped and low-dimensional. The model here, in
``mixture_vectors.npz`` (fitted by ``python -m profiling.fit_mixture``), is a Gaussian mixture fitted
to all-MiniLM-L6-v2's normalised embeddings (384-d) of a few thousand Python-documentation paragraphs:

* ``means`` (K, 384): k-means centres of the embeddings, ``weights`` (K,) their shares;
* ``basis`` (384, r): the embeddings' top r principal directions; ``variances`` (K, r): each cluster's
  variance along them; ``residual`` (K,): its variance per dimension in the rest of the space.

A draw picks a cluster by weight, adds its Gaussian spread (its own variances in the shared PCA basis,
isotropic in the complement) and is normalised, as the embedder normalises. K = 32 and r = 128 because,
of the fits tried, their draws' IVF recall curve came closest to the real embeddings' (docs/performance.md,
"Real-looking vectors"); more clusters make the draws clumpier than the embeddings.

Other widths (``dim``): below 384, the draw's first ``dim`` coordinates in a fixed orthonormal basis whose
first r directions are the PCA basis (the most variance kept), normalised again; above 384 (768,
bge-base's width), the draw is placed in ``dim`` dimensions by a fixed seeded orthogonal embedding ``Q`` (dim x 384, orthonormal
columns) and gets independent Gaussian noise in Q's complement of total norm about ``LIFT_NOISE``
before normalising. Why that keeps the neighbour structure: Q is an isometry, so distances between
lifted draws equal the 384-d ones; the complement noise adds, to every squared distance, about
``2 * LIFT_NOISE**2`` (0.02) with a spread of a few thousandths, against neighbour distances of tenths, so
who is near whom barely changes; the rotation spreads the energy over all ``dim`` axes (as real
768-d embeddings have it), so per-axis codecs (SQ8, PQ) see no aligned structure to exploit.

Deterministic and streamed: rows are drawn in blocks of ``BLOCK`` from ``default_rng([seed, block])``,
so row i depends only on (seed, dim, i) — not on the batch size, the count asked for, or where a stream
starts — and memory stays one block plus one batch, whatever N (4.6 M x 768 is 14 GB).

:func:`course_vector_batches` is where a course build (builders.data ``--vectors``) and the benchmarks take
their vectors from: ``uniform`` or ``mixture``.
"""
from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.spec import EMBED_DIM

MODEL_PATH = Path(__file__).with_name("mixture_vectors.npz")
BLOCK = 16_384
LIFT_NOISE = 0.1  # norm of the complement noise added to a lifted draw (the draw's own norm is 1)
_BASIS_SEED = 20_240_768  # the fixed embeddings' seed: the same for every draw seed, so every stream shares them
UNIFORM, MIXTURE = VECTOR_SOURCES = ("uniform", "mixture")


@dataclass(frozen=True, eq=False)  # hashed by identity: the width changes are cached per model
class MixtureModel:
    weights: np.ndarray  # (K,)
    means: np.ndarray  # (K, d)
    basis: np.ndarray  # (d, r), orthonormal columns
    variances: np.ndarray  # (K, r)
    residual: np.ndarray  # (K,)
    fitted_on: str = ""  # what the fit read (model, passages)

    @property
    def dim(self) -> int:
        return int(self.means.shape[1])

    @property
    def clusters(self) -> int:
        return int(self.means.shape[0])

    def save(self, path: Path) -> None:
        np.savez_compressed(path, weights=self.weights.astype(np.float32), means=self.means.astype(np.float32),
                            basis=self.basis.astype(np.float32), variances=self.variances.astype(np.float32),
                            residual=self.residual.astype(np.float32), fitted_on=np.array(self.fitted_on))

    @classmethod
    def load(cls, path: Path = MODEL_PATH) -> MixtureModel:
        with np.load(path) as data:
            weights = data["weights"].astype(np.float64)
            return cls(weights / weights.sum(), data["means"].astype(np.float32), data["basis"].astype(np.float32),
                       data["variances"].astype(np.float32), data["residual"].astype(np.float32),
                       str(data["fitted_on"]))

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n unit vectors of the model's own width (float32)."""
        return np.ascontiguousarray(self.draw_in_frame(rng, n) @ _frame(self)[0].T)

    def draw_in_frame(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n draws, normalised, as coordinates in the model's frame (its PCA basis, then a fixed orthonormal
        completion): the cluster's mean plus its spread, independent along each of the frame's axes."""
        d, r = self.basis.shape
        _, means = _frame(self)
        cluster = rng.choice(self.clusters, n, p=self.weights)
        spread = np.empty((n, d), dtype=np.float32)
        spread[:, :r] = rng.standard_normal((n, r), dtype=np.float32) * np.sqrt(self.variances[cluster])
        spread[:, r:] = rng.standard_normal((n, d - r), dtype=np.float32) * np.sqrt(self.residual[cluster])[:, None]
        return unit_rows(means[cluster] + spread)


def fit(vectors: np.ndarray, clusters: int, rank: int, seed: int = 0, fitted_on: str = "",
        shrink: float = 10.0) -> MixtureModel:
    """A MixtureModel of `vectors` (n, d): k-means clusters (faiss), each cluster's variances in the
    shared top-`rank` PCA basis and in its complement; a cluster's variances are shrunk toward the
    pooled within-cluster ones by `shrink` pseudo-points (a cluster of a few dozen points estimates
    `rank` variances poorly)."""
    import faiss
    x = np.ascontiguousarray(vectors, dtype=np.float32)
    n, d = x.shape
    centred = x - x.mean(axis=0)
    _, _, vt = np.linalg.svd(centred.astype(np.float64), full_matrices=False)
    basis = vt[:rank].T.astype(np.float32)
    kmeans = faiss.Kmeans(d, clusters, niter=50, seed=seed, verbose=False, min_points_per_centroid=1)
    kmeans.train(x)
    labels = kmeans.index.search(x, 1)[1].ravel()
    counts = np.bincount(labels, minlength=clusters).astype(np.float64)
    centroids = np.asarray(kmeans.centroids)
    means = np.stack([x[labels == k].mean(axis=0) if counts[k] else centroids[k] for k in range(clusters)])
    spread = x - means[labels]
    along = spread @ basis
    rest = ((spread - along @ basis.T) ** 2).sum(axis=1) / (d - rank)
    pooled_along, pooled_rest = (along ** 2).mean(axis=0), rest.mean()
    variances = np.stack([(np.sum(along[labels == k] ** 2, axis=0) + shrink * pooled_along) / (counts[k] + shrink)
                          for k in range(clusters)])
    residual = np.array([(rest[labels == k].sum() + shrink * pooled_rest) / (counts[k] + shrink)
                         for k in range(clusters)])
    return MixtureModel((counts / n).astype(np.float64), means.astype(np.float32), basis, variances.astype(np.float32),
                        residual.astype(np.float32), fitted_on)


def unit_rows(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x / np.linalg.norm(x, axis=1, keepdims=True), dtype=np.float32)


@functools.lru_cache(maxsize=4)
def _model(path: Path = MODEL_PATH) -> MixtureModel:
    return MixtureModel.load(path)


def model_sha256(path: Path = MODEL_PATH) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@functools.lru_cache(maxsize=4)
def _frame(model: MixtureModel) -> tuple[np.ndarray, np.ndarray]:
    """F (d, d) orthogonal, its first columns the model's PCA basis, the rest a fixed seeded completion; and
    the cluster means in F's coordinates (the draws are made there: F's columns are independent axes)."""
    rng = np.random.default_rng(_BASIS_SEED)
    d, r = model.basis.shape
    q, upper = np.linalg.qr(np.hstack([model.basis.astype(np.float64), rng.standard_normal((d, d - r))]))
    frame = q * np.sign(np.diag(upper))  # signs fixed, so the first columns are the basis itself
    return frame.astype(np.float32), (model.means.astype(np.float64) @ frame).astype(np.float32)


@functools.lru_cache(maxsize=8)
def _lift(model: MixtureModel, dim: int) -> np.ndarray:
    """(dim, dim) orthogonal G = [Q F | C]: R (dim, dim) fixed seeded orthogonal, Q its first d columns (the
    embedding), C the rest (its complement); frame coordinates and complement noise, side by side, times G.T
    are the lifted draw."""
    rng = np.random.default_rng(_BASIS_SEED + dim)
    q, upper = np.linalg.qr(rng.standard_normal((dim, dim)))
    rotation = q * np.sign(np.diag(upper))
    frame = _frame(model)[0].astype(np.float64)
    return np.hstack([rotation[:, : model.dim] @ frame, rotation[:, model.dim :]]).astype(np.float32)


def draw(model: MixtureModel, rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    """n unit vectors of width `dim` (see the module's docstring): below the model's width the first `dim`
    frame coordinates (the top principal directions first), above it lifted, at its width as drawn."""
    d = model.dim
    u = model.draw_in_frame(rng, n)
    if dim < d:
        return unit_rows(u[:, :dim])
    if dim == d:
        return np.ascontiguousarray(u @ _frame(model)[0].T)
    noise = rng.standard_normal((n, dim - d), dtype=np.float32) * np.float32(LIFT_NOISE / np.sqrt(dim - d))
    return unit_rows(np.hstack([u, noise]) @ _lift(model, dim).T)


def mixture_batches(n: int, dim: int, seed: int = 0, batch_size: int = 65_536, *, start: int = 0,
                    model_path: Path = MODEL_PATH) -> Iterator[np.ndarray]:
    """Rows start..start+n-1 of the seeded mixture stream of width `dim`, in batches of `batch_size`
    (the last shorter); float32 unit vectors."""
    model = _model(model_path)
    pending: list[np.ndarray] = []
    held = 0
    row, end = start, start + n
    while row < end:
        block = row // BLOCK
        rng = np.random.default_rng([seed, block])
        drawn = draw(model, rng, BLOCK, dim)
        piece = drawn[row - block * BLOCK : min(end, (block + 1) * BLOCK) - block * BLOCK]
        row += len(piece)
        pending.append(piece)
        held += len(piece)
        while held >= batch_size or (row == end and held):
            joined = np.concatenate(pending) if len(pending) > 1 else pending[0]
            take = min(batch_size, held)
            yield joined[:take]
            pending, held = ([joined[take:]] if take < held else []), held - take


def course_vector_batches(
    n: int, dim: int = EMBED_DIM, seed: int = 0, batch_size: int = 65_536, source: str = UNIFORM
) -> Iterator[np.ndarray]:
    """Vectors 0..n-1 of the course index, float32, seeded: ``uniform`` in [0, 1) from one stream, or
    ``mixture``: unit vectors shaped like real embeddings (builders.mixture_vectors).

    Either way the values do not depend on ``batch_size``.
    """
    if source == MIXTURE:
        yield from mixture_batches(n, dim, seed, batch_size)
        return
    if source != UNIFORM:
        raise ValueError(f"--vectors {source!r}: one of {', '.join(VECTOR_SOURCES)}")
    rng = np.random.default_rng(seed)
    for start in range(0, n, batch_size):
        yield rng.random((min(batch_size, n - start), dim), dtype=np.float32)
