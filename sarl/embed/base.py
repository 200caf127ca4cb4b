"""The embedder interface shared by the HTTP, in-process and policy hidden-state embedders."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

log = logging.getLogger(__name__)


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
        checked: list[np.ndarray | None] = []
        for j, vec in enumerate(raw):
            if j in reasons or vec is None:
                reasons.setdefault(j, "no embedding returned")
                checked.append(None)
                continue
            unit, problem = self._validate(vec)
            if problem:
                reasons[j] = problem
            checked.append(unit)
        dim = self.dim or 0
        vectors = np.full((len(texts), dim), np.nan, dtype=np.float32)
        failed: dict[int, str] = {}
        for i, t in enumerate(texts):
            j = unique[t]
            if j in reasons:
                failed[i] = reasons[j]
            else:
                vectors[i] = checked[j]
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

    def _validate(self, vec: np.ndarray) -> tuple[np.ndarray | None, str | None]:
        """A unit vector, or the reason the raw vector is unusable (decisions §1.2 "Embeddings")."""
        v = np.asarray(vec, dtype=np.float64).ravel()
        if v.size != self.dim:
            return None, f"wrong embedding dimension: got {v.size}, expected {self.dim}"
        if not np.isfinite(v).all():
            return None, "non-finite embedding: NaN or inf in the vector"
        norm = float(np.linalg.norm(v))
        if norm <= self.norm_eps:
            return None, "zero embedding: the vector has norm 0"
        return (v / norm).astype(np.float32), None


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
    for k, i in enumerate(rows):
        if k in result.failed:
            failed[i] = result.failed[k]
        else:
            vectors[i] = result.vectors[k]
    return vectors
