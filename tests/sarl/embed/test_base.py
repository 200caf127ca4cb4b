"""`Embedder.embed`'s batched validation (the list path and the 2-D fast path) against the
one-vector-at-a-time version it replaced, with the norm of `row_norms` (a fixed order of summation)."""

from __future__ import annotations

import logging
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import sarl.structure.embed.base as base
from sarl.structure.embed.base import Embedder, EmbeddingResult, embed_rows, row_norms
from sarl.structure.kernels import (
    ROW_NON_FINITE,
    ROW_NORM_OVERFLOW,
    ROW_OK,
    ROW_SKIPPED,
    ROW_ZERO_NORM,
    normalise_rows,
)


def reference_embed(emb: Embedder, texts: list[str]) -> tuple[EmbeddingResult, Counter, str | None]:
    """The former `Embedder.embed`, one raw vector at a time: (result, failure counts, first reason)."""
    unique: dict[str, int] = {}
    for t in texts:
        unique.setdefault(t, len(unique))
    distinct = list(unique)
    raw, reasons = emb._embed_unique(distinct) if distinct else ([], {})
    raw = list(raw)  # a 2-D array from the model: one row at a time
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
        elif not np.isfinite(norm := float(row_norms(v[None, :])[0])):
            reasons[j] = "non-finite embedding: the vector's norm overflows float64"
        elif norm <= emb.norm_eps:
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


class DenseScriptedEmbedder(ScriptedEmbedder):
    """Returns one 2-D array of the given dtype (as the in-process models do); rows of failed texts hold junk."""

    def __init__(self, table: dict[str, object], failures: dict[str, str], dim: int | None, dtype) -> None:
        super().__init__(table, failures, dim)
        self.dtype = dtype

    def _embed_unique(self, texts):
        rows, reasons = super()._embed_unique(texts)
        return np.array(rows, dtype=self.dtype), reasons


def dense_texts(seed: int, n: int, d: int, dtype) -> tuple[list[str], dict[str, object], dict[str, str]]:
    """`n` distinct texts (plus repeats) with raw rows of size `d` of every kind a model array can hold."""
    rng = np.random.default_rng(seed)
    f32 = np.dtype(dtype) == np.float32
    table: dict[str, object] = {}
    failures: dict[str, str] = {}
    for k in range(n):
        t = f"text {k}"
        kind = rng.choice(
            ["ok", "nan", "inf", "zero", "tiny", "huge", "overflow", "err"],
            p=[0.6, 0.06, 0.06, 0.05, 0.05, 0.06, 0.06, 0.06],
        )
        v = rng.standard_normal(d) * 10.0 ** rng.uniform(-3, 3)
        if kind in ("nan", "inf"):
            v[rng.integers(d)] = np.nan if kind == "nan" else -np.inf
        elif kind == "zero":
            v[:] = 0.0
        elif kind == "tiny":  # squares underflow to a zero norm, or a norm below norm_eps
            v = np.full(d, 1e-30 if f32 else 1e-200) * rng.choice([-1.0, 1.0], d)
        elif kind == "huge":  # float32 squares would overflow; float64 ones do not
            v *= (1e30 if f32 else 1e150) / np.abs(v).max()
        elif kind == "overflow":  # float64 squares overflow: float32 cannot hold such values, so NaN for it
            v = np.full(d, 1e200) if not f32 else np.where(np.arange(d) == 0, np.nan, v)
        elif kind == "err":
            v[:] = rng.choice([np.nan, 0.0, 1.0])  # whatever the model left in a failed row
            failures[t] = "embedding timeout: no answer in 5 s"
        table[t] = v.astype(dtype)
    texts = list(table) + [f"text {k}" for k in rng.integers(0, n, n // 3)]
    rng.shuffle(texts)
    return texts, table, failures


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


def one_at_a_time_norms(x: np.ndarray) -> np.ndarray:
    return np.array([row_norms(row[None, :])[0] for row in x])


@pytest.mark.parametrize("d", [1, 7, 8, 9, 384, 1024, 1025])
def test_row_norms_sum_each_row_on_its_own_and_agree_with_np_linalg_norm(d):
    rng = np.random.default_rng(d)
    x = rng.standard_normal((500, d)) * 10.0 ** rng.uniform(-5, 5, (500, 1))
    x[::2] = x[::2].astype(np.float32)  # float32 embeddings seen as float64, as `embed` does
    norms = row_norms(x)
    assert norms.tobytes() == one_at_a_time_norms(x).tobytes()
    assert row_norms(x[::-1]).tobytes() == norms[::-1].tobytes()  # no row depends on the others
    np.testing.assert_allclose(norms, [np.linalg.norm(row) for row in x], rtol=1e-15, atol=0)


def test_row_norms_sum_in_the_documented_order():
    x = np.arange(1.0, 20.0)[None, :] ** 3  # d = 19: two blocks of 8 lanes, then 3 squares one by one
    sq = x[0] ** 2
    lanes = [sq[lane] + sq[lane + 8] for lane in range(8)]
    s = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]))
    s = ((s + sq[16]) + sq[17]) + sq[18]
    assert row_norms(x)[0] == np.sqrt(s)


def kernel_units(x: np.ndarray, eps: float = 1e-12) -> tuple[np.ndarray, np.ndarray]:
    out = np.full(x.shape, np.nan, dtype=np.float32)
    verdict = normalise_rows(x, np.arange(len(x), dtype=np.int64), eps, out)
    return out, verdict


def misaligned(x: np.ndarray, offset: int) -> np.ndarray:
    """A C-contiguous copy of `x` starting `offset` bytes into a buffer (a different alignment)."""
    buf = np.zeros(x.nbytes + offset, dtype=np.uint8)
    y = np.frombuffer(buf.data, dtype=x.dtype, count=x.size, offset=offset).reshape(x.shape)
    y[...] = x
    return y


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("d", [1, 7, 8, 9, 384, 1024, 1025])
def test_the_kernel_is_bit_identical_to_row_norms_whatever_the_batch_and_alignment(dtype, d):
    rng = np.random.default_rng(d)
    x = (rng.standard_normal((200, d)) * 10.0 ** rng.uniform(-5, 5, (200, 1))).astype(dtype)
    x64 = x.astype(np.float64)
    expected = (x64 / row_norms(x64)[:, None]).astype(np.float32)  # float64 division, then rounded
    out, verdict = kernel_units(x)
    assert (verdict == ROW_OK).all()
    assert out.tobytes() == expected.tobytes()
    for offset in (4, 8) if dtype == np.float32 else (8,):
        assert kernel_units(misaligned(x, offset))[0].tobytes() == expected.tobytes()
    single = np.concatenate([kernel_units(x[k : k + 1].copy())[0] for k in range(len(x))])
    assert single.tobytes() == expected.tobytes()
    np.testing.assert_allclose(np.linalg.norm(out.astype(np.float64), axis=1), 1.0, rtol=1e-6)


def test_the_kernel_writes_rows_where_told_and_skips_negative_ones():
    x = np.array([[3.0, 4.0], [np.nan, 1.0], [0.0, 2.0], [1e200, 1e200], [0.0, 0.0], [9.0, 9.0]])
    out = np.full((7, 2), -1.0, dtype=np.float32)
    verdict = normalise_rows(x, np.array([6, 0, 2, 3, 4, -1], dtype=np.int64), 1e-12, out)
    assert verdict.tolist() == [ROW_OK, ROW_NON_FINITE, ROW_OK, ROW_NORM_OVERFLOW, ROW_ZERO_NORM, ROW_SKIPPED]
    np.testing.assert_array_equal(out[6], np.float32([0.6, 0.8]))
    np.testing.assert_array_equal(out[2], [0.0, 1.0])
    assert (out[[0, 1, 3, 4, 5]] == -1.0).all()  # bad and skipped rows are not written


@settings(max_examples=200, deadline=None)
@given(
    hnp.arrays(
        np.float32,
        st.tuples(st.integers(1, 6), st.integers(1, 40)),
        elements=st.floats(width=32, allow_nan=True, allow_infinity=True),
    )
)
def test_the_kernel_matches_the_reference_on_any_float32_rows(x):
    out, verdict = kernel_units(x)
    x64 = x.astype(np.float64)
    with np.errstate(all="ignore"):
        norms = one_at_a_time_norms(x64)
        units = (x64 / norms[:, None]).astype(np.float32)
    for k in range(len(x)):
        if not np.isfinite(x64[k]).all():
            assert verdict[k] == ROW_NON_FINITE
        elif not norms[k] > 1e-12:
            assert verdict[k] == ROW_ZERO_NORM
        else:
            assert verdict[k] == ROW_OK and out[k].tobytes() == units[k].tobytes()


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


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("dim", [16, 1024, 1025, None])
@pytest.mark.parametrize("threads", [1, 3])
def test_the_2d_path_is_bit_identical_to_one_vector_at_a_time_and_to_the_list_path(
    monkeypatch, caplog, dtype, dim, threads
):
    monkeypatch.setattr(base, "CHUNK_ROWS", 7)  # threads > 1: chunks of 7 rows normalised side by side
    texts, table, failures = dense_texts(seed=dim or 0, n=300, d=dim or 24, dtype=dtype)
    ref, ref_counts, ref_first = reference_embed(DenseScriptedEmbedder(table, failures, dim, dtype), texts)
    emb = DenseScriptedEmbedder(table, failures, dim, dtype)
    emb._normalise_list = None  # the 2-D array never goes through the list path
    with caplog.at_level(logging.WARNING, logger="sarl.structure.embed.base"):
        res = emb.embed(texts, threads=threads)
    listed = ScriptedEmbedder(table, failures, dim).embed(texts)
    assert emb.dim == (dim or 24)
    assert res.vectors.dtype == np.float32 and res.vectors.shape == ref.vectors.shape
    assert res.vectors.tobytes() == ref.vectors.tobytes() == listed.vectors.tobytes()
    assert list(res.failed.items()) == list(ref.failed.items()) == list(listed.failed.items())
    assert emb.failure_counts == ref_counts
    expected_kinds = {"non-finite embedding", "zero embedding", "embedding timeout"}
    assert set(ref_counts) == expected_kinds
    if dtype == np.float64:
        assert "non-finite embedding: the vector's norm overflows float64" in ref.failed.values()
    assert f"(first: {ref_first})" in caplog.text
    np.testing.assert_allclose(np.linalg.norm(res.vectors[res.ok], axis=1), 1.0, rtol=1e-6)


def test_a_2d_array_of_the_wrong_width_or_dtype_takes_the_list_path():
    table = {"a": np.array([3.0, 4.0, 0.0]), "b": np.array([0.0, 0.0, 2.0])}
    res = DenseScriptedEmbedder(table, {}, 2, np.float32).embed(["a", "b"])
    assert res.failed == {
        0: "wrong embedding dimension: got 3, expected 2",
        1: "wrong embedding dimension: got 3, expected 2",
    }
    res = DenseScriptedEmbedder(table, {}, 3, np.float16).embed(["a", "b", "a"])
    np.testing.assert_array_equal(res.vectors, np.float32([[0.6, 0.8, 0.0], [0.0, 0.0, 1.0], [0.6, 0.8, 0.0]]))
    assert not res.failed
    emb = DenseScriptedEmbedder(table, {}, 3, np.float64)
    emb._embed_unique = lambda texts: (np.asfortranarray([table[t] for t in texts]), {})  # not C-contiguous
    assert emb.embed(["b", "a"]).vectors.tobytes() == np.float32([[0, 0, 1], [0.6, 0.8, 0]]).tobytes()


def test_a_float32_model_array_is_normalised_in_place_and_a_read_only_one_is_copied():
    raw = np.float32([[3, 4], [0, 0], [1, 0]])
    emb = DenseScriptedEmbedder({}, {}, 2, np.float32)
    emb._embed_unique = lambda texts: (raw, {})
    res = emb.embed(["a", "b", "c"])
    assert res.vectors is raw  # no second array of the batch's size
    assert res.vectors[[0, 2]].tobytes() == np.float32([[0.6, 0.8], [1, 0]]).tobytes()
    assert np.isnan(res.vectors[1]).all()
    assert res.failed == {1: "zero embedding: the vector has norm 0"}
    frozen = np.float32([[3, 4], [1, 0]])
    frozen.flags.writeable = False
    emb._embed_unique = lambda texts: (frozen, {})
    res = emb.embed(["a", "b"])
    assert res.vectors.tobytes() == np.float32([[0.6, 0.8], [1, 0]]).tobytes() and frozen.tolist() == [[3, 4], [1, 0]]


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
