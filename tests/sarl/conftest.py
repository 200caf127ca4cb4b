import pytest
from fakes import KeywordEmbedder


@pytest.fixture
def keyword_embedder():
    return KeywordEmbedder()


@pytest.fixture(scope="session")
def minilm():
    from sarl.embed.local import SentenceTransformerEmbedder

    return SentenceTransformerEmbedder()


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory, byte_tokenizer):
    """A tiny Qwen3-architecture checkpoint directory (config + tokenizer), built locally."""
    from transformers import Qwen3Config

    path = tmp_path_factory.mktemp("tiny_qwen3")
    Qwen3Config(
        vocab_size=len(byte_tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        architectures=["Qwen3ForCausalLM"],
    ).save_pretrained(path)
    byte_tokenizer.save_pretrained(path)
    return str(path)
