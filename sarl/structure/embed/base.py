"""The embedder interface shared by the HTTP, in-process and policy hidden-state embedders."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

log = logging.getLogger(__name__)

# Raw vectors checked and normalised together: a float64 buffer of 512 x 1,024 x 8 B = 4 MB, reused.
VALIDATE_CHUNK_ROWS = 512


@dataclass
class EmbeddingResult:
    """Unit vectors for a list of texts.

    `vectors[i]` is the unit embedding of text i; rows of texts listed in `failed`
    (index -> reason) are NaN and must not be used.
    """

    vectors: np.ndarray
    failed: dict[int, str] = field(default_factory=dict)

    @property
    def ok(self) -> np.ndarray:
        mask = np.ones(len(self.vectors), dtype=bool)
        mask[list(self.failed)] = False
        return mask


class Embedder(ABC):
    """Embeds texts; subclasses implement `_embed_unique` on de-duplicated texts.

    `dim` is the expected embedding dimension; when None it is taken from the first
    valid vector and then enforced.
    """

    def __init__(self, dim: int | None = None, norm_eps: float = 1e-12) -> None:
        self.dim = dim
        self.norm_eps = norm_eps
        self.failure_counts: Counter[str] = Counter()

    @abstractmethod
    def _embed_unique(self, texts: list[str]) -> tuple[list[np.ndarray | None], dict[int, str]]:
        """Raw vectors for distinct texts: (vectors with None where failed, index -> reason)."""

    def embed(self, texts: list[str]) -> EmbeddingResult:
        """Unit embeddings of `texts`; duplicates are embedded once."""
        unique: dict[str, int] = {}
        for t in texts:
            unique.setdefault(t, len(unique))
        distinct = list(unique)
        raw, reasons = self._embed_unique(distinct) if distinct else ([], {})
        if len(raw) != len(distinct):
            raise RuntimeError(f"{type(self).__name__} returned {len(raw)} vectors for {len(distinct)} texts")
        if self.dim is None:
            # no configured dimension: the most common size among finite vectors sets it
            sizes = Counter(np.size(v) for v in raw if v is not None and np.isfinite(v).all())
            if sizes:
                self.dim = int(sizes.most_common(1)[0][0])
        dim = self.dim or 0
        # Rows of the distinct texts: unit vectors written a chunk at a time, NaN where a text failed.
        checked = np.empty((len(distinct), dim), dtype=np.float32)
        new_reasons: dict[int, str] = {}
        rows: list[int] = []
        vecs: list[np.ndarray] = []
        for j, vec in enumerate(raw):
            if j in reasons or vec is None:
                if j not in reasons:
                    new_reasons[j] = "no embedding returned"
                continue
            if type(vec) is np.ndarray and vec.ndim == 1 and vec.dtype.kind == "f":
                v = vec  # the usual case: converted to float64 with its chunk below
            else:
                v = np.asarray(vec, dtype=np.float64).ravel()
            if v.size != self.dim:
                new_reasons[j] = f"wrong embedding dimension: got {v.size}, expected {self.dim}"
                continue
            rows.append(j)
            vecs.append(v)
        buffer = np.empty((min(VALIDATE_CHUNK_ROWS, len(rows)), dim))
        for s in range(0, len(rows), VALIDATE_CHUNK_ROWS):
            self._normalise_rows(
                vecs[s : s + VALIDATE_CHUNK_ROWS], rows[s : s + VALIDATE_CHUNK_ROWS], checked, new_reasons, buffer
            )
        for j in sorted(new_reasons):  # in text order, as one row at a time would add them
            reasons[j] = new_reasons[j]
        if reasons:
            checked[list(reasons)] = np.nan
        if len(distinct) == len(texts):  # no duplicates: text i is distinct text i
            vectors = checked
        else:
            vectors = checked[np.fromiter((unique[t] for t in texts), dtype=np.intp, count=len(texts))]
        failed: dict[int, str] = {}
        if reasons:
            for i, t in enumerate(texts):
                j = unique[t]
                if j in reasons:
                    failed[i] = reasons[j]
        for reason in reasons.values():
            self.failure_counts[reason.split(":")[0]] += 1
        if reasons:
            log.warning(
                "%s: %d of %d distinct texts failed to embed (first: %s)",
                type(self).__name__,
                len(reasons),
                len(distinct),
                next(iter(reasons.values())),
            )
        return EmbeddingResult(vectors=vectors, failed=failed)

    def _normalise_rows(
        self, vecs: list[np.ndarray], rows: list[int], out: np.ndarray, reasons: dict[int, str], buffer: np.ndarray
    ) -> None:
        """Writes the unit vector of each raw vector (all of size `dim`) into `out[rows[k]]`, or
        adds the reason it is unusable to `reasons` (decisions §1.2 "Embeddings").

        Batched, with the same float64 arithmetic as normalising one vector at a time (`row_norms`),
        in `buffer` (at least len(vecs) rows), reused from chunk to chunk.
        """
        x = buffer[: len(vecs)]
        np.stack(vecs, out=x)  # converted to float64 on the way
        with np.errstate(all="ignore"):  # bad rows are reported below and never written
            norm = row_norms(x)  # NaN or inf in a row makes its norm NaN or inf
            x /= norm[:, None]
        ok = np.isfinite(norm) & (norm > self.norm_eps)
        for k in np.flatnonzero(~ok):
            if not np.isfinite(np.asarray(vecs[k], dtype=np.float64)).all():  # as converted
                reasons[rows[k]] = "non-finite embedding: NaN or inf in the vector"
            elif not np.isfinite(norm[k]):  # finite float64 entries whose squares overflow
                reasons[rows[k]] = "non-finite embedding: the vector's norm overflows float64"
            else:
                reasons[rows[k]] = "zero embedding: the vector has norm 0"
        if ok.all() and rows[-1] - rows[0] == len(rows) - 1:  # consecutive rows: one slice
            out[rows[0] : rows[-1] + 1] = x  # float64 -> float32 rounds as `astype` does
        else:
            out[np.asarray(rows, dtype=np.intp)[ok]] = x[ok]


def row_norms(x: np.ndarray) -> np.ndarray:
    """Euclidean norm of each row of a 2-D float64 array, bit-identical to `np.linalg.norm(row)`.

    Each squared norm is a (1 x d) @ (d x 1) product, which numpy hands to the same BLAS dot as
    `np.linalg.norm` of a vector; `np.linalg.norm(x, axis=1)` sums in another order and differs in
    the last bit for about a fifth of rows (and is 20x slower).
    """
    return np.sqrt(np.matmul(x[:, None, :], x[:, :, None])[:, 0, 0])


def embed_rows(embedder: Embedder, texts: dict[int, str], n_rows: int, failed: dict[int, str]) -> np.ndarray | None:
    """Unit embeddings of some rows of a batch (row -> text) as an (n_rows, d) array, NaN elsewhere.

    Rows whose text cannot be embedded are added to `failed` with the reason; an embedder
    crash fails all of them and returns None. Never invents a vector.
    """
    rows = list(texts)
    if not rows:
        return None
    try:
        result = embedder.embed([texts[i] for i in rows])
    except Exception as err:  # an embedder crash fails these rows, not the run
        log.exception("embedder %s failed on %d texts", type(embedder).__name__, len(rows))
        failed.update({i: f"embedding error: {type(err).__name__}: {err}" for i in rows})
        return None
    vectors = np.full((n_rows, result.vectors.shape[1]), np.nan)
    for k, reason in result.failed.items():
        failed[rows[k]] = reason
    good = result.ok
    vectors[np.asarray(rows, dtype=np.intp)[good]] = result.vectors[good]
    return vectors
