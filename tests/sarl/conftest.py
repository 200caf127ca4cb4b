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
