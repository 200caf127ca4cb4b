"""The structure stage works in bounded chunks of similar-length responses, zero-padded: a response's
labels are the same whatever the chunk size and whatever it is padded to."""

import numpy as np
import pytest

from sarl.cluster import _chunks, cluster_batch


def test_chunks_bound_the_padded_steps_and_the_padding():
    lengths = {i: m for i, m in enumerate([2, 3, 3, 4, 10, 11, 12, 40, 400, 401])}
    chunks = _chunks(lengths, chunk_steps=30, max_pad=1.25)
    assert sorted(i for c in chunks for i in c) == sorted(lengths)
    for c in chunks:
        ms = [lengths[i] for i in c]
        assert ms == sorted(ms)
        assert len(c) == 1 or (len(c) * max(ms) <= 30 and max(ms) <= 1.25 * min(ms))
    assert [lengths[i] for i in chunks[-1]] == [401]  # a response longer than a chunk is a chunk of its own


@pytest.mark.parametrize("method", ["kmeans", "hdbscan"])
def test_labels_do_not_depend_on_chunking_or_padding(method):
    rng = np.random.default_rng(5)
    embs = []
    for m in [2, 3, 5, 9, 10, 11, 12, 13, 30, 33, 35, 60]:
        x = rng.normal(size=(m, 24)).astype(np.float32)
        embs.append(x / np.linalg.norm(x, axis=1, keepdims=True))
    embs.append(np.repeat(embs[4][:3], 4, axis=0))  # duplicate steps: k capped by distinct rows
    alone = [cluster_batch([x], method=method)[0] for x in embs]
    for chunk_steps in (1, 40, 100, 10_000):
        got = cluster_batch(embs, method=method, chunk_steps=chunk_steps)
        assert all(np.array_equal(a, b) for a, b in zip(alone, got)), chunk_steps
