"""The live policy embedder (embedding=policy_hidden, SARL draft App. A.1 "Implementation A"): each step's vector is
the mean of the bound policy's hidden states at the layer over the step's tokens, with the weights the policy has
at the call (sarl/structure/embed/hidden.py, sarl/backends/trl/live.py)."""

import numpy as np
import pytest
import torch

from sarl.backends.trl.live import PROBE_TEXT, LivePolicyEmbedding, frozen_copy
from sarl.structure.embed.hidden import POLICY, TARGET, HiddenStateEmbedder, asks_for_live_policy

STEPS = ["plan the sum", "calc x and y is a b c d e f", "check", "plan the sum"]


@pytest.fixture
def policy(tiny_qwen3_dir):
    from transformers import AutoConfig, Qwen3ForCausalLM

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(AutoConfig.from_pretrained(tiny_qwen3_dir))
    model.train()  # as the trainer holds it
    return model


@pytest.fixture
def tok(byte_tokenizer):
    byte_tokenizer.padding_side = "left"  # as TRL sets it for generation (the embedder pads on the right)
    return byte_tokenizer


def manual(model, tok, text, layer):
    """e_t = (1/L_t) sum_j h^l_{t,j} over the step's own tokens, one step alone, unit-normalised."""
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    model.eval()
    with torch.no_grad():
        h = model(input_ids=ids, output_hidden_states=True).hidden_states[layer][0]
    model.train()
    v = h.mean(0).double().numpy()
    return v / np.linalg.norm(v)


@pytest.mark.parametrize("layer", [1, -1])
def test_live_vectors_are_the_mean_pool_of_the_policy_hidden_states_at_the_layer(policy, tok, layer):
    emb = HiddenStateEmbedder(POLICY, layer=layer, batch_size=3)
    assert emb.live and emb.dim is None
    emb.bind(policy, tok)
    res = emb.embed(STEPS)
    assert res.vectors.shape == (4, 128) and not res.failed
    for i, step in enumerate(STEPS):  # batched with padding (3 + 1) against each step alone
        np.testing.assert_allclose(res.vectors[i], manual(policy, tok, step, layer), atol=2e-6)
    assert emb.forwards == 1 and emb.texts_embedded == 3  # the duplicate embedded once, one batch of 3
    assert policy.training  # the trainer's mode restored


def test_layer_zero_is_the_mean_of_the_step_token_embeddings(policy, tok):
    """Worked value: hidden_states[0] is the embedding lookup, so e_t is the mean of the rows of the step's ids."""
    emb = HiddenStateEmbedder(POLICY, layer=0)
    emb.bind(policy, tok)
    ids = tok("check", add_special_tokens=False)["input_ids"]
    rows = policy.get_input_embeddings().weight.detach()[ids].double().numpy()
    want = rows.mean(0) / np.linalg.norm(rows.mean(0))
    np.testing.assert_allclose(emb.embed(["check"]).vectors[0], want, atol=1e-6)


def test_live_embeddings_change_as_the_weights_change_and_a_frozen_copy_does_not(policy, tok):
    node = {"_target_": TARGET, "model": POLICY, "layer": -1, "batch_size": 4}
    assert asks_for_live_policy(node) and not asks_for_live_policy({**node, "model": "/ckpt"})
    live = LivePolicyEmbedding(node, policy, tok)
    frozen = frozen_copy(node, policy, tok)
    before = live.embedder.embed(STEPS).vectors
    np.testing.assert_array_equal(frozen.embed(STEPS).vectors, before)
    assert live.metrics() == {"embedding/policy_texts": 3.0, "embedding/drift": 0.0}

    # one optimiser step of the language-modelling loss, as a training step moves the policy
    opt = torch.optim.SGD(policy.parameters(), lr=0.5)
    ids = torch.tensor([tok("plan calc check answer the sum", add_special_tokens=False)["input_ids"]])
    policy(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad()

    after = live.embedder.embed(STEPS).vectors
    assert np.abs(after - before).max() > 1e-3  # the live embedder sees the new weights
    np.testing.assert_array_equal(frozen.embed(STEPS).vectors, before)  # the frozen copy does not
    assert all(p.grad is None or not p.grad.any() for p in policy.parameters())  # no-grad forwards
    metrics = live.metrics()
    assert metrics["embedding/policy_texts"] == 3.0 and metrics["embedding/drift"] > 1e-4
    probe_now = live.embedder.embed([PROBE_TEXT]).vectors[0]
    assert metrics["embedding/drift"] == pytest.approx(1 - float(probe_now @ live._first_probe), abs=1e-6)


def test_a_frozen_embedder_cannot_be_rebound(policy, tok):
    frozen = HiddenStateEmbedder(policy, tok)
    with pytest.raises(ValueError, match="frozen"):
        frozen.bind(policy, tok)
