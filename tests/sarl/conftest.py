import pytest
from fakes import KeywordEmbedder


@pytest.fixture
def keyword_embedder():
    return KeywordEmbedder()


@pytest.fixture(scope="session")
def minilm():
    from sarl.embed.local import SentenceTransformerEmbedder

    return SentenceTransformerEmbedder()
