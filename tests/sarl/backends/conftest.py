"""Fixtures shared by the TRL back-end tests."""

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SFT_FIXTURE = REPO / "tests" / "fixtures" / "sft" / "tiny.jsonl"


@pytest.fixture(scope="session")
def chat_policy_dir(tmp_path_factory):
    """A tiny random Qwen3 with a chat-template tokenizer (the smoke policy's layout, no warm start)."""
    from testkit import built_once

    return str(built_once(tmp_path_factory, "chat_policy", build_chat_policy))


def build_chat_policy(path: Path) -> None:
    import torch
    from transformers import Qwen3ForCausalLM

    from sarl.smoke.policy import build_tokenizer, qwen3_config

    texts = [line for line in SFT_FIXTURE.read_text().splitlines()] + [
        (REPO / "sarl/smoke/data/traces.jsonl").read_text()[:20000]
    ]
    tok = build_tokenizer(texts, vocab_size=400)
    torch.manual_seed(0)
    config = qwen3_config(tok, hidden_size=64, intermediate_size=128, head_dim=32, num_hidden_layers=2)
    Qwen3ForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)
