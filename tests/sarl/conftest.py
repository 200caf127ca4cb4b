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
    from sarl.backends.trl.policy import qwen3_config

    path = tmp_path_factory.mktemp("tiny_qwen3")
    qwen3_config(byte_tokenizer, max_position_embeddings=2048).save_pretrained(path)
    byte_tokenizer.save_pretrained(path)
    return str(path)
