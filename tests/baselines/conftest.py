import pytest

from eval.grading import Grader


@pytest.fixture(scope="session")
def grader():
    """One math-verify worker for the baseline tests."""
    g = Grader(timeout_s=5.0)
    yield g
    g.close()


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory, byte_tokenizer):
    """(checkpoint directory, model, tokenizer): a tiny 2-layer Qwen3 with seeded random weights and eager
    attention, saved with its tokenizer so that it also loads from the path."""
    import torch
    from transformers import Qwen3ForCausalLM

    from sarl.backends.trl.policy import qwen3_config

    path = tmp_path_factory.mktemp("tiny_qwen3_weights")
    config = qwen3_config(
        byte_tokenizer, hidden_size=64, intermediate_size=128, head_dim=32, attn_implementation="eager"
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).eval()
    model.save_pretrained(path)
    byte_tokenizer.save_pretrained(path)
    return str(path), model, byte_tokenizer
