"""Step-to-step attention of the MaxFlow reward (Structured Reasoning Eq. 3): `step_attention` for one
layer's weights, `StepAttention` for the eager forward pass of a policy over prompt + response, averaged over
chosen layers.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def step_attention(attn: Any, spans: Sequence[tuple[int, int]]) -> np.ndarray:
    """Structured Reasoning Eq. (3) for one layer: A_ij = 1/(H |T_i|) sum_h sum_{a in T_i} max_{b in T_j} Att_h[a, b].

    `attn` is one layer's attention (H x T x T, rows = queries; a torch tensor or an array), `spans` the
    token range [start, end) of each node. A node with no tokens gets a zero row and column.
    """
    import torch

    att = torch.as_tensor(attn)
    if att.ndim != 3 or att.shape[1] != att.shape[2]:
        raise ValueError(f"attention must be H x T x T, got shape {tuple(att.shape)}")
    if att.dtype != torch.float64:
        att = att.float()  # bf16/fp16 weights: the max is exact in fp32, the sums below run in fp64
    heads, t_len = att.shape[0], att.shape[1]
    n = len(spans)
    starts = torch.tensor([s for s, _ in spans], dtype=torch.long)
    ends = torch.tensor([e for _, e in spans], dtype=torch.long)
    if n and (starts.min() < 0 or ends.max() > t_len or (ends < starts).any()):
        raise ValueError(f"spans {list(spans)} do not fit a sequence of {t_len} tokens")
    # colmax[j, a] = sum_h max_{b in T_j} Att_h[a, b]
    colmax = torch.zeros((n, t_len), dtype=torch.float64, device=att.device)
    for j, (s, e) in enumerate(spans):
        if e > s:
            colmax[j] = att[:, :, s:e].amax(-1).double().sum(0)
    csum = torch.nn.functional.pad(colmax.cumsum(1), (1, 0)).cpu()  # n x (T + 1)
    sums = csum[:, ends] - csum[:, starts]  # sums[j, i] = sum_{a in T_i} colmax[j, a]
    sizes = (ends - starts).double()
    out = torch.where(sizes > 0, sums / (heads * sizes.clamp(min=1)), torch.zeros_like(sums))
    return out.T.numpy()  # A[i, j]


class SequenceTooLong(ValueError):
    """The prompt and response together have more tokens than `StepAttention.max_tokens` (`tokens`: how many)."""

    def __init__(self, tokens: int, max_tokens: int) -> None:
        super().__init__(f"sequence of {tokens} tokens exceeds max_tokens={max_tokens}")
        self.tokens = tokens


def default_device() -> str:
    """Where the attention model goes when `device` is not given: GPU 0 of the process's visible GPUs where
    CUDA is available, else the CPU. In verl's reward worker, or its trainer for a group reward (Ray actors
    with no GPU of their own, whose CUDA_VISIBLE_DEVICES Ray leaves as the node's), that is the node's first
    GPU, the one the memory plan charges."""
    import torch

    return "cuda:0" if torch.cuda.is_available() else "cpu"


def planned_gpu(device: str | None) -> int | None:
    """The index, among the node's visible GPUs, of the GPU a `device` setting puts the model on when CUDA is
    available (None: the CPU)."""
    name = device or "cuda:0"
    if name == "cuda":
        return 0
    if name.startswith("cuda:") and name[5:].isdigit():
        return int(name[5:])
    if name == "cpu":
        return None
    raise ValueError(f"device {device!r} is not valid; use null, cpu, cuda or cuda:N")


def eager_pass_bytes(config: dict[str, Any], tokens: int, dtype_bytes: int) -> int:
    """GPU memory of one `StepAttention` pass over `tokens` tokens beyond the weights (an estimate). The pass
    asks for no attention outputs (`output_attentions=False`), so transformers' output capture keeps no layer's
    weights (utils/output_capturing.py: it records them only when asked, by the call or the config) and each layer's
    H x T x T weights are freed before the next layer: one layer at a time, whichever layers are hooked. That
    layer, at its peak, holds three copies: the masked scores (model dtype), their float32 softmax and its cast
    back (transformers' `eager_attention_forward`: `softmax(..., dtype=torch.float32).to(query.dtype)` while the
    scores are still referenced); the hook's float32 copy (`step_attention`) comes after the first two are freed
    (6 bytes an element, below the 8 of the softmax). Plus the causal mask (T x T), and per token the residual
    stream, the normed input, the attention output and the next residual (4 h) and the MLP's peak (3 i: the
    activated gate, the up projection and their product, under no_grad)."""
    attention = config["num_attention_heads"] * tokens**2 * (2 * dtype_bytes + 4)
    mask = tokens**2 * dtype_bytes
    activations = tokens * (4 * config["hidden_size"] + 3 * config["intermediate_size"]) * dtype_bytes
    return attention + mask + activations


def _decoder_layers(model: Any) -> Any:
    """The decoder layers of a transformers model (CausalLM or base model)."""
    for owner in (model, getattr(model, "model", None)):
        layers = getattr(owner, "layers", None)
        if layers is not None and len(layers) and hasattr(layers[0], "self_attn"):
            return layers
    raise ValueError(
        f"{type(model).__name__} has no `layers` with `self_attn` modules (or `.model.layers`); "
        "StepAttention reads the attention weights there"
    )


class StepAttention:
    """Step-to-step attention (Structured Reasoning Eq. 3) of prompt + response, averaged over chosen layers.

    `model` is a loaded transformers model or a path/id (loaded with `AutoModel`, eager attention); `layers`
    index the decoder layers (negative: from the end; the paper's 23-27 of 28 are -5..-1); `device` None is
    `default_device()`, GPU 0 where CUDA is available (its memory: `eager_pass_bytes`). One eager forward
    pass per response; a forward hook on each chosen layer's attention reduces its weights (H x T x T) to
    the n x n step matrix at once and frees them, so no layer's weights outlive the layer.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        layers: Sequence[int] = (-5, -4, -3, -2, -1),
        max_tokens: int = 16384,
        use_chat_template: bool = True,
        device: str | None = None,
        dtype: str = "auto",
    ) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        if isinstance(model, str):
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(model)
            torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
            model = AutoModel.from_pretrained(model, attn_implementation="eager", dtype=torch_dtype)
        elif tokenizer is None:
            raise ValueError("StepAttention needs the tokenizer that goes with the given model")
        elif isinstance(tokenizer, str):
            tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        if not getattr(tokenizer, "is_fast", False):
            raise ValueError("StepAttention needs a fast tokenizer (character offsets of every token)")
        if getattr(model.config, "_attn_implementation", "eager") != "eager":
            model.set_attn_implementation("eager")  # only eager attention returns the weights
        self.model = model.to(device or default_device())
        self.tokenizer = tokenizer
        n_layers = len(_decoder_layers(model))
        bad = [i for i in layers if not -n_layers <= i < n_layers]
        if bad or not layers:
            raise ValueError(f"layers {list(layers)} do not all exist in a {n_layers}-layer model")
        self.layers = sorted({i % n_layers for i in layers})
        self.max_tokens = max_tokens
        self.use_chat_template = use_chat_template and bool(getattr(tokenizer, "chat_template", None))
        self._template_parts: tuple[str, str] | None = None
        self._torch = torch

    def prefix(self, prompt: str) -> str:
        """The text before the response: the chat-templated prompt (generation prompt included), the prompt
        as it is when it is already chat-templated (as TRL hands it over), or the prompt and a newline when
        the tokenizer has no chat template."""
        if not self.use_chat_template:
            return prompt + "\n"
        if self._template_parts is None:
            marker = "\x00QUESTION\x00"
            text = self._template([{"role": "user", "content": marker}])
            head, _, tail = text.partition(marker)
            self._template_parts = (head, tail)
        head, tail = self._template_parts
        if prompt.startswith(head) and prompt.endswith(tail) and len(prompt) >= len(head) + len(tail):
            return prompt
        return self._template([{"role": "user", "content": prompt}])

    def _template(self, messages: list[dict]) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def count_tokens(self, text: str) -> int:
        """The tokens of `text` as the pass tokenizes it (a prefix: the prompt's share of `max_tokens`)."""
        return len(self.tokenizer(text, add_special_tokens=not self.use_chat_template, truncation=False)["input_ids"])

    def token_spans(self, text: str, node_starts: Sequence[int]) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids of `text` and each node's token range: node k owns the tokens whose first character
        lies in [node_starts[k], node_starts[k + 1]) (the last node: to the end); node_starts[0] = 0."""
        enc = self.tokenizer(
            text, add_special_tokens=not self.use_chat_template, return_offsets_mapping=True, truncation=False
        )
        first_char = np.array([a for a, _ in enc["offset_mapping"]], dtype=np.int64)
        owner = np.searchsorted(np.asarray(node_starts), first_char, side="right") - 1
        owner = np.maximum(owner, 0)  # special tokens without a character (offset 0) go to the question
        if len(owner) and (np.diff(owner) < 0).any():
            raise ValueError("token offsets are not monotone; cannot split the sequence into nodes")
        spans = []
        for k in range(len(node_starts)):
            idx = np.flatnonzero(owner == k)
            spans.append((int(idx[0]), int(idx[-1]) + 1) if len(idx) else (0, 0))
        return list(enc["input_ids"]), spans

    def __call__(self, text: str, node_starts: Sequence[int]) -> np.ndarray:
        """The n x n step attention of `text` (mean of Eq. 3 over the chosen layers)."""
        torch = self._torch
        ids, spans = self.token_spans(text, node_starts)
        if len(ids) > self.max_tokens:
            raise SequenceTooLong(len(ids), self.max_tokens)
        layers = _decoder_layers(self.model)
        total = np.zeros((len(spans), len(spans)))
        seen: list[int] = []

        def reduce_weights(layer_idx: int):
            def hook(module: Any, args: Any, output: Any) -> Any:
                weights = output[1]
                if weights is None:
                    raise RuntimeError("the attention module returned no weights; eager attention is required")
                total[:] += step_attention(weights[0], spans)  # Eq. (3) for this layer
                seen.append(layer_idx)
                return (output[0], None, *output[2:])

            return hook

        handles = [layers[i].self_attn.register_forward_hook(reduce_weights(i)) for i in self.layers]
        device = next(self.model.parameters()).device
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                # no attention outputs: every layer's weights freed at once (eager_pass_bytes)
                self.model(input_ids=torch.tensor([ids], device=device), use_cache=False, output_attentions=False)
        finally:
            self.model.train(was_training)
            for h in handles:
                h.remove()
        if sorted(seen) != self.layers:
            raise RuntimeError(f"attention hooks fired for layers {seen}, expected {self.layers}")
        return total / len(self.layers)
