import pytest


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory, byte_tokenizer):
    """(checkpoint directory, model, tokenizer): a tiny 2-layer Qwen3 with seeded random weights and eager
    attention, saved with its tokenizer so that it also loads from the path."""
    from testkit import tiny_qwen3 as build

    path = tmp_path_factory.mktemp("tiny_qwen3_weights")
    architecture = {"hidden_size": 64, "intermediate_size": 128, "head_dim": 32, "attn_implementation": "eager"}
    model = build(byte_tokenizer, path, weights=True, seed=0, **architecture).eval()
    return str(path), model, byte_tokenizer
