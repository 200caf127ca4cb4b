"""`Embedder.embed`'s batched validation against the one-vector-at-a-time version it replaced."""

from __future__ import annotations

import logging
from collections import Counter

import numpy as np
import pytest

import sarl.structure.embed.base as base
from sarl.structure.embed.base import Embedder, EmbeddingResult, embed_rows, row_norms


def reference_embed(emb: Embedder, texts: list[str]) -> tuple[EmbeddingResult, Counter, str | None]:
    """The former `Embedder.embed`, one raw vector at a time: (result, failure counts, first reason)."""
    unique: dict[str, int] = {}
    for t in texts:
        unique.setdefault(t, len(unique))
    distinct = list(unique)
    raw, reasons = emb._embed_unique(distinct) if distinct else ([], {})
    if emb.dim is None:
        sizes = Counter(np.size(v) for v in raw if v is not None and np.isfinite(v).all())
        if sizes:
            emb.dim = int(sizes.most_common(1)[0][0])
    checked: list[np.ndarray | None] = []
    for j, vec in enumerate(raw):
        if j in reasons or vec is None:
            reasons.setdefault(j, "no embedding returned")
            checked.append(None)
            continue
        v = np.asarray(vec, dtype=np.float64).ravel()
        unit = None
        if v.size != emb.dim:
            reasons[j] = f"wrong embedding dimension: got {v.size}, expected {emb.dim}"
        elif not np.isfinite(v).all():
            reasons[j] = "non-finite embedding: NaN or inf in the vector"
        elif (norm := float(np.linalg.norm(v))) <= emb.norm_eps:
            reasons[j] = "zero embedding: the vector has norm 0"
        else:
            unit = (v / norm).astype(np.float32)
        checked.append(unit)
    vectors = np.full((len(texts), emb.dim or 0), np.nan, dtype=np.float32)
    failed: dict[int, str] = {}
    for i, t in enumerate(texts):
        j = unique[t]
        if j in reasons:
            failed[i] = reasons[j]
        else:
            vectors[i] = checked[j]
    counts = Counter(r.split(":")[0] for r in reasons.values())
    return EmbeddingResult(vectors=vectors, failed=failed), counts, next(iter(reasons.values()), None)


class ScriptedEmbedder(Embedder):
    """Returns the raw vectors (and pre-set failures) given for each text."""

    def __init__(self, table: dict[str, object], failures: dict[str, str], dim: int | None) -> None:
        super().__init__(dim=dim)
        self.table = table
        self.failures = failures

    def _embed_unique(self, texts):
        return [self.table[t] for t in texts], {j: self.failures[t] for j, t in enumerate(texts) if t in self.failures}


def scripted_texts(seed: int, n: int, d: int) -> tuple[list[str], dict[str, object], dict[str, str]]:
    """`n` distinct texts (plus repeats) with raw vectors of every kind, good and bad."""
    rng = np.random.default_rng(seed)
    table: dict[str, object] = {}
    failures: dict[str, str] = {}
    for k in range(n):
        t = f"text {k}"
        kind = rng.choice(
            ["f32", "f64", "list", "2d", "nan", "inf", "zero", "tiny", "short", "long", "none", "err"],
            p=[0.4, 0.2, 0.05, 0.05, 0.05, 0.05, 0.04, 0.02, 0.05, 0.04, 0.03, 0.02],
        )
        v = rng.standard_normal(d) * 10.0 ** rng.uniform(-3, 3)
        if kind == "f32":
            table[t] = v.astype(np.float32)
        elif kind == "f64":
            table[t] = v
        elif kind == "list":
            table[t] = v.tolist()
        elif kind == "2d":
            table[t] = v.astype(np.float32)[None, :]
        elif kind in ("nan", "inf"):
            v[rng.integers(d)] = np.nan if kind == "nan" else -np.inf
            table[t] = v.astype(np.float32)
        elif kind == "zero":
            table[t] = np.zeros(d, dtype=np.float32)
        elif kind == "tiny":
            table[t] = np.full(d, 1e-200)  # squares underflow to a zero norm
        elif kind == "short":
            table[t] = v[: d - 1].astype(np.float32)
        elif kind == "long":
            table[t] = np.append(v, 1.0).astype(np.float32)
        elif kind == "none":
            table[t] = None
        else:
            table[t] = v.astype(np.float32)
            failures[t] = "embedding timeout: no answer in 5 s"
    texts = list(table) + [f"text {k}" for k in rng.integers(0, n, n // 3)]
    rng.shuffle(texts)
    return texts, table, failures


@pytest.mark.parametrize("d", [1, 7, 384, 1024, 1025])
def test_row_norms_are_bit_identical_to_the_norm_of_each_row(d):
    rng = np.random.default_rng(d)
    x = rng.standard_normal((500, d)) * 10.0 ** rng.uniform(-5, 5, (500, 1))
    x[::2] = x[::2].astype(np.float32)  # float32 embeddings seen as float64, as `embed` does
    expected = np.array([np.linalg.norm(row) for row in x])
    assert row_norms(x).tobytes() == expected.tobytes()


@pytest.mark.parametrize("dim", [16, 384, None])
@pytest.mark.parametrize("chunk", [7, 512])
def test_batched_validation_is_bit_identical_to_one_vector_at_a_time(monkeypatch, caplog, dim, chunk):
    monkeypatch.setattr(base, "VALIDATE_CHUNK_ROWS", chunk)
    texts, table, failures = scripted_texts(seed=dim or 0, n=300, d=dim or 24)
    ref, ref_counts, ref_first = reference_embed(ScriptedEmbedder(table, failures, dim), texts)
    emb = ScriptedEmbedder(table, failures, dim)
    with caplog.at_level(logging.WARNING, logger="sarl.structure.embed.base"):
        res = emb.embed(texts)
    assert res.vectors.dtype == np.float32 and res.vectors.shape == ref.vectors.shape
    assert res.vectors.tobytes() == ref.vectors.tobytes()  # bit for bit, NaN rows included
    assert list(res.failed.items()) == list(ref.failed.items())  # same rows, reasons and order
    assert emb.failure_counts == ref_counts
    assert set(ref_counts) >= {
        "non-finite embedding",
        "zero embedding",
        "wrong embedding dimension",
        "no embedding returned",
        "embedding timeout",
    }
    assert f"(first: {ref_first})" in caplog.text
    np.testing.assert_allclose(np.linalg.norm(res.vectors[res.ok], axis=1), 1.0, rtol=1e-6)


def test_duplicates_share_the_row_and_the_reason():
    table = {"a": np.array([3.0, 4.0], dtype=np.float32), "b": np.zeros(2, dtype=np.float32)}
    emb = ScriptedEmbedder(table, {}, dim=2)
    res = emb.embed(["a", "b", "a", "b"])
    np.testing.assert_array_equal(res.vectors[[0, 2]], np.float32([[0.6, 0.8], [0.6, 0.8]]))
    assert res.failed == {1: "zero embedding: the vector has norm 0", 3: "zero embedding: the vector has norm 0"}
    assert emb.failure_counts == {"zero embedding": 1}  # counted once per distinct text


def test_a_norm_that_overflows_fails_instead_of_giving_a_zero_vector():
    # finite float64 entries whose squares overflow: dividing by an infinite norm would give
    # an all-zero "unit" vector that the clustering would use
    table = {"big": np.full(4, 1e200), "ok": np.array([1e150, 0.0, 0.0, 0.0])}
    emb = ScriptedEmbedder(table, {}, dim=4)
    res = emb.embed(["big", "ok"])
    assert res.failed == {0: "non-finite embedding: the vector's norm overflows float64"}
    np.testing.assert_array_equal(res.vectors[1], [1.0, 0.0, 0.0, 0.0])
    assert emb.failure_counts == {"non-finite embedding": 1}


def test_no_valid_vector_and_no_configured_dimension():
    emb = ScriptedEmbedder({"a": None, "b": np.full(3, np.nan)}, {}, dim=None)
    res = emb.embed(["a", "b"])
    assert res.vectors.shape == (2, 0)
    assert res.failed == {0: "no embedding returned", 1: "wrong embedding dimension: got 3, expected None"}


def test_embed_rows_places_vectors_and_reasons_by_row():
    table = {"x": np.array([0.0, 2.0]), "y": np.array([np.nan, 1.0]), "z": np.array([1.0, 0.0])}
    failed: dict[int, str] = {}
    out = embed_rows(ScriptedEmbedder(table, {}, dim=2), {4: "x", 1: "y", 2: "z"}, n_rows=6, failed=failed)
    assert failed == {1: "non-finite embedding: NaN or inf in the vector"}
    np.testing.assert_array_equal(out[4], [0.0, 1.0])
    np.testing.assert_array_equal(out[2], [1.0, 0.0])
    assert np.isnan(out[[0, 1, 3, 5]]).all()
