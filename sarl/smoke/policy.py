"""A tiny Qwen3-architecture policy built on this machine (no model hub): the smoke run's model.

`build_policy(spec, out_dir)`:
1. trains a byte-level BPE tokenizer on the shipped traces, with Qwen3's chat markers
   (`<|im_start|>`, `<|im_end|>`, `<|endoftext|>`) as special tokens, `<think>`/`</think>` as
   ordinary added tokens (they survive decoding, as in Qwen3), and a Qwen3-style chat template;
2. builds `Qwen3ForCausalLM` from the configured sizes (head_dim >= 64, so that vLLM's CPU
   build can serve it);
3. warm-starts it with a short supervised run on the traces (loss on the assistant tokens only),
   so that the policy writes `<think>` steps separated by blank lines: a randomly initialised
   policy writes no steps at all, every response then gets the same structure reward, and the
   group advantage is zero (no learning signal);
4. saves a Hugging Face checkpoint directory (config, weights, tokenizer, `policy.json`).

The result is cached by a hash of the spec, so repeated runs and tests build it once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import shutil
import time
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout
from omegaconf import DictConfig, OmegaConf, read_write

from sarl.runtime import torch_threads
from sarl.runtime.files import resolve_path

log = logging.getLogger(__name__)
PROGRESS_EVERY_S = 8.0  # a line after this long without one (a step more: under 10 s of silence)
PROGRESS_LINES = 10  # warm-start progress lines per build

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
THINK_TOKENS = ["<think>", "</think>"]
# Qwen3's chat layout without tools: <|im_start|>role\ncontent<|im_end|>\n ...
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
STAMP = "policy.json"


# The smallest Qwen3 layout the project builds (conf/model/tiny_qwen3.yaml's, test models override sizes).
TINY_QWEN3 = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": True,
}


def qwen3_config(tokenizer, **architecture: Any):
    """A `Qwen3Config` for `tokenizer` (vocabulary size, eos/pad ids, no bos): TINY_QWEN3 with `architecture`'s
    keys replacing its entries."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=len(tokenizer),
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        architectures=["Qwen3ForCausalLM"],
        **{**TINY_QWEN3, **architecture},
    )


def spec_hash(spec: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]


def read_traces(path: str | Path) -> list[dict]:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    if not rows:
        raise ValueError(f"no traces in {path}")
    for i, row in enumerate(rows):
        if not (isinstance(row.get("prompt"), list) and isinstance(row.get("completion"), list)):
            raise ValueError(f"{path}:{i + 1}: a trace needs chat-message lists 'prompt' and 'completion'")
    return rows


def build_tokenizer(texts: list[str], vocab_size: int, individual_digits: bool = False):
    """A byte-level BPE tokenizer trained on `texts`, with Qwen3's chat markers. With `individual_digits`
    every digit is a token of its own, as in Qwen3's tokenizer: numbers are not merged into whole-number
    tokens, which is what lets a tiny model learn digit-wise arithmetic."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.pre_tokenizer = (
        pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        if individual_digits
        else byte_level
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(  # no progress bars: off a terminal they print blank lines and nothing else
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.add_tokens(THINK_TOKENS)  # not special: decoded text keeps them, as Qwen3's tokenizer does
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


def _encode_sft(tokenizer, trace: dict, max_length: int) -> tuple[list[int], list[int]]:
    """Token ids of prompt + completion, and labels that score only the completion (and its end marker)."""
    prompt = tokenizer.apply_chat_template(trace["prompt"], tokenize=False, add_generation_prompt=True)
    completion = trace["completion"][0]["content"] + "<|im_end|>"
    p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    c_ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
    ids = (p_ids + c_ids)[:max_length]
    labels = ([-100] * len(p_ids) + c_ids)[:max_length]
    return ids, labels


def warm_start(model, tokenizer, traces: list[dict], sft: dict[str, Any], seed: int) -> list[float]:
    """Supervised warm start on the traces (AdamW, linear warm-up then cosine decay). Returns the losses."""
    import torch

    rng = random.Random(seed)
    torch.manual_seed(seed)
    data = [_encode_sft(tokenizer, t, int(sft["max_length"])) for t in traces]
    steps, bs = int(sft["steps"]), int(sft["batch_size"])
    warmup = max(1, int(0.1 * steps))
    opt = torch.optim.AdamW(model.parameters(), lr=float(sft["lr"]), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: (s + 1) / warmup if s < warmup else 0.5 * (1 + math.cos(math.pi * (s - warmup) / (steps - warmup))),
    )
    pad = tokenizer.pad_token_id
    model.train()
    losses = []
    order: list[int] = []
    start, every = time.monotonic(), max(1, steps // PROGRESS_LINES)
    said = start
    for step in range(steps):
        if len(order) < bs:
            order = list(range(len(data)))
            rng.shuffle(order)
        batch = [data[order.pop()] for _ in range(bs)]
        width = max(len(ids) for ids, _ in batch)
        ids = torch.full((bs, width), pad, dtype=torch.long)
        labels = torch.full((bs, width), -100, dtype=torch.long)
        mask = torch.zeros((bs, width), dtype=torch.long)
        for i, (x, y) in enumerate(batch):
            ids[i, : len(x)], labels[i, : len(y)], mask[i, : len(x)] = torch.tensor(x), torch.tensor(y), 1
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        now = time.monotonic()
        due = (step + 1) % every == 0 or now - said >= PROGRESS_EVERY_S  # no silence of more than ~10 s
        if due and step + 1 < steps:  # a build takes minutes on a laptop: say how far it is
            said, elapsed = now, now - start
            log.info(
                "policy: warm start step %d/%d, loss %.3f, %.0f s so far, about %.0f s to go",
                step + 1,
                steps,
                loss.item(),
                elapsed,
                elapsed / (step + 1) * (steps - step - 1),
            )
    model.eval()
    return losses


def build_policy(spec: dict[str, Any], cache_dir: str | Path, seed: int = 0) -> Path:
    """The checkpoint directory of the policy that `spec` (conf/model/tiny_qwen3.yaml `build`) describes,
    built on first use and reused afterwards (keyed by a hash of the spec and seed)."""
    spec = dict(spec)
    traces_path = Path(spec["traces"])
    traces_sha256 = hashlib.sha256(traces_path.read_bytes()).hexdigest()
    # keyed by the traces' content, not their path: every clone and worktree shares one build
    key = spec_hash({**spec, "traces": traces_sha256, "seed": seed})
    out = Path(cache_dir) / f"tiny_qwen3-{key}"
    if (out / STAMP).exists():
        log.info("policy: reusing %s", out)
        return out
    # One build per spec: processes sharing the cache (parallel runs, test workers) wait for the first one.
    out.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(out.with_name(out.name + ".lock")))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log.info("policy: another process is building %s; waiting for it", out)
        lock.acquire()
    try:
        if (out / STAMP).exists():
            log.info("policy: reusing %s (built while this process waited)", out)
            return out
        return _build_policy(spec, out, traces_path, traces_sha256, seed)
    finally:
        lock.release()


def _build_policy(spec: dict[str, Any], out: Path, traces_path: Path, traces_sha256: str, seed: int) -> Path:
    """Builds the policy into `out` (through `out`.tmp, renamed when complete); the caller holds the lock."""
    import torch
    from transformers import Qwen3ForCausalLM

    arch = dict(spec["architecture"])
    if int(arch.get("head_dim", 0)) < 64:
        raise ValueError(
            f"model.build.architecture.head_dim must be >= 64 (vLLM's CPU build), got {arch.get('head_dim')}"
        )
    traces = read_traces(traces_path)
    t0 = time.monotonic()
    log.info(
        "policy: building %s (%d warm-start steps; minutes on a laptop, once per spec)",
        out,
        spec["warm_start"]["steps"],
    )
    texts = [m["content"] for t in traces for m in t["prompt"] + t["completion"]]
    tokenizer = build_tokenizer(texts, int(spec["vocab_size"]), bool(spec.get("individual_digits", False)))
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(qwen3_config(tokenizer, **arch))
    losses = warm_start(model, tokenizer, traces, dict(spec["warm_start"]), seed) if spec["warm_start"]["steps"] else []
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    info = {
        "spec": spec,
        "seed": seed,
        "traces_sha256": traces_sha256,
        "n_parameters": sum(p.numel() for p in model.parameters()),
        "warm_start_loss_first": losses[0] if losses else None,
        "warm_start_loss_last": float(sum(losses[-10:]) / len(losses[-10:])) if losses else None,
        "build_seconds": round(time.monotonic() - t0, 1),
    }
    (tmp / STAMP).write_text(json.dumps(info, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    log.info(
        "policy: built %s (%d parameters, warm-start loss %s -> %s, %.0f s)",
        out,
        info["n_parameters"],
        info["warm_start_loss_first"],
        info["warm_start_loss_last"],
        info["build_seconds"],
    )
    return out


def policy_path(cfg: DictConfig) -> Path | str:
    """The model to train: `model.path` (hub id or directory), else the locally built tiny policy."""
    if cfg.model.get("path"):
        return cfg.model.path
    build = cfg.model.get("build")
    if not build:
        raise ValueError("model.path is null and model.build is not set: nothing to train")

    spec = OmegaConf.to_container(build, resolve=True)
    cache_dir = spec.pop("cache_dir")
    # the build's own seed (model.build.seed): every training seed starts from the same policy; unset, the run's
    build_seed = spec.pop("seed", None)
    traces = resolve_path(spec["traces"])
    spec["traces"] = str(traces)
    return build_policy(spec, cache_dir, seed=int(cfg.seed if build_seed is None else build_seed))


def with_local_policy(cfg: DictConfig) -> None:
    """A model group without a path (`model=tiny_qwen3`) gets the policy built here, once (cached), torch's threads
    chosen first (the build runs in this process): `model.path` is then its directory, which every process and
    rank of the run loads like any other checkpoint."""
    if cfg.model.get("path") or not cfg.model.get("build"):
        return
    torch_threads.apply(cfg.backend.get("torch_threads", "auto"))
    with read_write(cfg.model):
        cfg.model.path = str(policy_path(cfg))
