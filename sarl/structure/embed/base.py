"""The embedder interface shared by the HTTP, in-process and policy hidden-state embedders."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from sarl.contract.threads import run_each

log = logging.getLogger(__name__)

# Raw vectors of the list path stacked and normalised together: a float64 buffer of 512 x 1,024 x 8 B = 4 MB, reused.
VALIDATE_CHUNK_ROWS = 512

# Rows a thread normalises at a time when `embed` has several (16 MB of float32 at 1,024 dimensions).
CHUNK_ROWS = 4096
# Model outputs normalised in place by `normalise_rows` (the 2-D fast path of `Embedder.embed`).
_DENSE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


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
    def _embed_unique(self, texts: list[str]) -> tuple[list[np.ndarray | None] | np.ndarray, dict[int, str]]:
        """Raw vectors for distinct texts: (vectors, index -> reason of the texts that failed).

        The vectors are either a list with one vector per text (None where failed) or, cheaper to check, one
        2-D float32/float64 array of shape (len(texts), dim) whose rows of failed texts are ignored. The array
        is handed over: `embed` normalises a writeable float32 one in place (return a copy of anything kept, or a
        read-only view).
        """

    def embed(self, texts: list[str], threads: int | None = 1) -> EmbeddingResult:
        """Unit embeddings of `texts`; duplicates are embedded once. `threads`: the threads that check and normalise
        the model's vectors (the model keeps its own settings); the result does not depend on them."""
        distinct = list(dict.fromkeys(texts))  # in order of first occurrence
        # text -> its row among the distinct texts; None: no duplicates, text i is distinct text i
        unique = {t: j for j, t in enumerate(distinct)} if len(distinct) != len(texts) else None
        raw, reasons = self._embed_unique(distinct) if distinct else ([], {})
        if len(raw) != len(distinct):
            raise RuntimeError(f"{type(self).__name__} returned {len(raw)} vectors for {len(distinct)} texts")
        dense: np.ndarray | None = None  # one 2-D float array from the model: normalised without a copy
        if isinstance(raw, np.ndarray):
            if raw.ndim == 2 and raw.dtype in _DENSE_DTYPES:
                dense = raw
            else:
                raw = list(raw)
        if self.dim is None:
            # no configured dimension: the most common size among finite vectors sets it
            if dense is not None:
                if np.isfinite(dense).all(axis=1).any():
                    self.dim = int(dense.shape[1])
            else:
                sizes = Counter(np.size(v) for v in raw if v is not None and np.isfinite(v).all())
                if sizes:
                    self.dim = int(sizes.most_common(1)[0][0])
        if dense is not None and dense.shape[1] != self.dim:
            raw, dense = list(dense), None  # every row has the wrong size: the list path names them
        dim = self.dim or 0
        new_reasons: dict[int, str] = {}
        if dense is not None:
            dense = np.ascontiguousarray(dense)
            if not dense.flags.writeable:  # the model kept it: ours is a copy
                dense = dense.copy()
            # Rows of the distinct texts: unit vectors, NaN where a text failed. A float32 array from the model is
            # normalised in place: writing a second array of this size (666 MB for a paper step) costs more than
            # the arithmetic, on first touch of its pages.
            checked = dense if dense.dtype == np.float32 else np.empty((len(distinct), dim), dtype=np.float32)
            rows = np.arange(len(distinct), dtype=np.int64)
            if reasons:
                rows[list(reasons)] = -1  # failed by the model: not read
            self._check_rows(dense, rows, checked, new_reasons, threads)
        else:
            checked = np.empty((len(distinct), dim), dtype=np.float32)
            self._normalise_list(raw, reasons, checked, new_reasons)
        for j in sorted(new_reasons):  # in text order, as one row at a time would add them
            reasons[j] = new_reasons[j]
        if reasons:
            checked[list(reasons)] = np.nan
        if unique is None:
            vectors = checked
            failed = {i: reasons[i] for i in sorted(reasons)}
        else:
            vectors = checked[np.fromiter(map(unique.__getitem__, texts), dtype=np.intp, count=len(texts))]
            failed = {}
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

    def _normalise_list(self, raw: list, reasons: dict[int, str], out: np.ndarray, new_reasons: dict[int, str]) -> None:
        """The list path: vectors of size `dim` stacked into float64 a chunk at a time and normalised into
        `out` by `_check_rows`; the other vectors' reasons go to `new_reasons`."""
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
        buffer = np.empty((min(VALIDATE_CHUNK_ROWS, len(rows)), out.shape[1]))
        for s in range(0, len(rows), VALIDATE_CHUNK_ROWS):
            chunk = vecs[s : s + VALIDATE_CHUNK_ROWS]
            x = buffer[: len(chunk)]
            np.stack(chunk, out=x)  # converted to float64 on the way
            self._check_rows(x, np.asarray(rows[s : s + VALIDATE_CHUNK_ROWS], dtype=np.int64), out, new_reasons)

    def _check_rows(
        self, x: np.ndarray, rows: np.ndarray, out: np.ndarray, reasons: dict[int, str], threads: int | None = 1
    ) -> None:
        """Writes the unit vector of each row k of `x` (C-contiguous float32/float64, `dim` columns) into
        `out[rows[k]]`, or adds the reason it is unusable to `reasons` (decisions §1.2 "Embeddings");
        rows[k] < 0 skips row k. One compiled pass (`sarl.structure.kernels.normalise_rows`) with the norm
        of `row_norms`, so a vector's unit vector does not depend on the batch or on the path it took;
        `threads` > 1 splits the rows into chunks normalised side by side (each row's result is the same)."""
        # deferred: numba and the compiled kernels (~0.5 s), not paid by `from sarl import StructureReward`
        from sarl.structure.kernels import ROW_OK, ROW_REASONS, normalise_rows

        if (threads or 1) > 1 and len(x) >= 2 * CHUNK_ROWS:
            verdict = np.empty(len(x), dtype=np.uint8)
            starts = list(range(0, len(x), CHUNK_ROWS))

            def chunk(lo: int) -> None:
                hi = lo + CHUNK_ROWS
                verdict[lo:hi] = normalise_rows(x[lo:hi], rows[lo:hi], float(self.norm_eps), out)

            run_each(starts, chunk, threads)
        else:
            verdict = normalise_rows(x, rows, float(self.norm_eps), out)
        for k in np.flatnonzero((verdict != ROW_OK) & (rows >= 0)):
            reasons[int(rows[k])] = ROW_REASONS[int(verdict[k])]


def row_norms(x: np.ndarray) -> np.ndarray:
    """Euclidean norm of each row of a 2-D array, in float64 and in a fixed order of summation: the definition
    that `Embedder.embed` normalises with (compiled as `sarl.structure.kernels.normalise_rows`, bit-identical).

    A row's entries are converted to float64 and squared; the squares of the first 8 floor(d / 8) entries
    are summed in 8 interleaved lanes (lane l: entries l, l + 8, l + 16, ..., each lane sequentially), the
    lanes combined as ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)), then the last d mod 8 squares
    added one by one; the norm is the square root. Each row depends on its own entries only. It agrees
    with `np.linalg.norm(row)` (whose order of summation is the BLAS library's) to a few ulp, not bit for bit.
    """
    x = np.asarray(x, dtype=np.float64)
    n, d = x.shape
    d8 = d - d % 8
    with np.errstate(over="ignore", invalid="ignore"):  # overflowing rows give inf, NaN entries NaN
        sq = x * x
    # np.add.accumulate adds sequentially along an axis: its last entry is each lane's running sum
    a = np.add.accumulate(sq[:, :d8].reshape(n, d8 // 8, 8), axis=1)[:, -1] if d8 else np.zeros((n, 8))
    s = ((a[:, 0] + a[:, 1]) + (a[:, 2] + a[:, 3])) + ((a[:, 4] + a[:, 5]) + (a[:, 6] + a[:, 7]))
    for i in range(d8, d):
        s = s + sq[:, i]
    return np.sqrt(s)


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
