import pytest
from fakes import KeywordEmbedder


@pytest.fixture
def keyword_embedder():
    return KeywordEmbedder()


@pytest.fixture(scope="session")
def minilm():
    from sarl.structure.embed.local import SentenceTransformerEmbedder

    return SentenceTransformerEmbedder()


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory, byte_tokenizer):
    """A tiny Qwen3-architecture checkpoint directory (config + tokenizer), built locally."""
    from testkit import tiny_qwen3

    path = tmp_path_factory.mktemp("tiny_qwen3")
    tiny_qwen3(byte_tokenizer, path, max_position_embeddings=2048)
    return str(path)
