"""In-process embedders: the bundled MiniLM through sentence-transformers, and policy hidden states."""

import numpy as np
import pytest
import torch

from sarl.structure.embed.hidden import HiddenStateEmbedder
from sarl.structure.embed.local import SentenceTransformerEmbedder, bundled_minilm_path

TEXTS = [
    "Let x be the number of apples.",
    "Then 3x + 2 = 11, so x = 3.",
    "Check: 3*3 + 2 = 11.",
    "Let x be the number of apples.",
]


@pytest.fixture(scope="module")
def minilm():
    return SentenceTransformerEmbedder()


def test_bundled_minilm_embeds_offline(minilm):
    res = minilm.embed(TEXTS)
    assert res.vectors.shape == (4, 384) and not res.failed
    np.testing.assert_allclose(np.linalg.norm(res.vectors, axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(res.vectors[0], res.vectors[3])
    sim = res.vectors @ res.vectors.T
    assert sim[1, 2] > sim[0, 2] - 0.5  # real semantics: not random vectors
    assert 0.0 < sim[0, 1] < 0.99


def test_empty_and_odd_texts(minilm):
    res = minilm.embed(["", "\ufffd", "x" * 50_000])
    assert res.vectors.shape == (3, 384)
    assert np.isfinite(res.vectors[~np.isin(np.arange(3), list(res.failed))]).all()
    assert minilm.embed([]).vectors.shape == (0, 384)


def test_hidden_state_mean_pool_equals_sentence_transformers_pooling(minilm):
    """MiniLM's sentence embedding is the mean of its last layer over tokens: Implementation A
    on the same model must give the same unit vectors."""
    hidden = HiddenStateEmbedder(bundled_minilm_path(), layer=-1)
    a = hidden.embed(TEXTS).vectors
    b = minilm.embed(TEXTS).vectors
    np.testing.assert_allclose((a * b).sum(1), 1.0, atol=1e-4)


def test_hidden_states_of_a_tiny_qwen3_policy(tiny_qwen3_dir, byte_tokenizer):
    from transformers import AutoConfig, Qwen3ForCausalLM

    torch.manual_seed(0)
    policy = Qwen3ForCausalLM(AutoConfig.from_pretrained(tiny_qwen3_dir))
    tok = byte_tokenizer
    policy.train()
    emb = HiddenStateEmbedder(policy, tok, layer=1, batch_size=2)
    res = emb.embed(TEXTS[:3])
    assert res.vectors.shape == (3, 128) and not res.failed
    assert policy.training  # mode restored
    # padding must not change a text's embedding: embed one text alone vs. in a padded batch
    alone = emb.embed([TEXTS[2]]).vectors[0]
    np.testing.assert_allclose(alone, res.vectors[2], atol=1e-5)


def test_hidden_state_embedder_needs_a_tokenizer_with_a_model_object():
    with pytest.raises(ValueError, match="tokenizer"):
        HiddenStateEmbedder(torch.nn.Linear(2, 2))
