import pytest

from eval.grading import Grader


@pytest.fixture(scope="session")
def grader():
    """One math-verify worker for the baseline tests."""
    g = Grader(timeout_s=5.0)
    yield g
    g.close()


@pytest.fixture(scope="session")
def byte_tokenizer():
    """A real byte-level BPE tokenizer trained here on a few lines (no hub), laid out like Qwen3's
    (a copy of the builder in tests/sarl/conftest.py, whose fixtures this directory cannot see)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["plan calc check answer the sum of x and y is\n\n<think> question a b c d e f " * 3]
    tok.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=400, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    hf.add_tokens(["<think>", "</think>"])
    return hf


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory, byte_tokenizer):
    """(checkpoint directory, model, tokenizer): a tiny 2-layer Qwen3 with seeded random weights and eager
    attention, saved with its tokenizer so that it also loads from the path."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    path = tmp_path_factory.mktemp("tiny_qwen3_weights")
    config = Qwen3Config(
        vocab_size=len(byte_tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).eval()
    model.save_pretrained(path)
    byte_tokenizer.save_pretrained(path)
    return str(path), model, byte_tokenizer
