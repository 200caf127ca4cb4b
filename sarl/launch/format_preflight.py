"""Format preflight: a reward that reads a response format is useless on a policy that never writes it.

GRP's rewards (GRP Sec. 3.2.1) score the graph-structured format that GRP-SFT teaches (Sec. 3.1.3); a policy
without that stage writes plain text, every response fails `sarl.formats.graph.parse_graph`, R_graph is 0 for every
rollout, and GRPO/PASC-GRPO silently degrade to accuracy-only training. Before any training step the policy
answers `format_check.n_prompts` of the run's prompts (greedy, at most `format_check.max_new_tokens` tokens,
transformers on this machine's GPU if it has one, in a child process that takes its GPU memory with it when it
exits); if fewer than `format_check.min_share` of the responses parse, the run stops with exit 2 naming the
share and the parser's reasons.

    format_check:
      parser: sarl.formats.graph.parse_graph   # response -> object with `.error` (None: parseable); null: no check
      n_prompts: 4
      min_share: 0.5
      max_new_tokens: 2048
"""

from __future__ import annotations

import json
import logging
import multiprocessing
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Callable, Sequence

from omegaconf import DictConfig

from sarl.launch.compose import config_function
from sarl.runtime.errors import UserError
from sarl.runtime.files import resolve_path
from sarl.smoke.policy import policy_path

log = logging.getLogger("sarl.launch.format_preflight")

Generate = Callable[[list[list[dict[str, str]]]], list[str]]


def parseable_share(responses: Sequence[str], parser: Callable[[str], Any]) -> tuple[float, Counter]:
    """The share of `responses` the parser accepts (its result's `.error` is None), and the reasons of the others."""
    reasons: Counter = Counter()
    for text in responses:
        error = getattr(parser(text), "error", "the parser returned no result")
        if error is not None:
            reasons[str(error)] += 1
    return (len(responses) - sum(reasons.values())) / len(responses) if responses else 0.0, reasons


def check_prompts(cfg: DictConfig, n: int) -> list[list[dict[str, str]]]:
    """The first `n` prompts of the run's validation set (`data.val_files`), else of its training set (verl
    parquet or TRL jsonl), as chat messages."""
    candidates = [cfg.data.get("val_files"), cfg.data.get("train_files"), cfg.data.get("trl_train_files")]
    for path in (resolve_path(str(p)) for p in candidates if p):
        if not path.is_file():
            continue
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            rows = pq.read_table(path, columns=[cfg.data.prompt_key]).slice(0, n).to_pylist()
            prompts = [r[cfg.data.prompt_key] for r in rows]
        else:
            lines = [line for line in path.read_text().splitlines() if line.strip()][:n]
            prompts = [json.loads(line)["prompt"] for line in lines]
        return [[{"role": m["role"], "content": m["content"]} for m in p] for p in prompts]
    named = ", ".join(str(p) for p in candidates if p) or "none configured"
    raise UserError(f"format_check: no prompt file of data={cfg.data.name} exists ({named}); prepare the data first")


def transformers_generate(model_path: str, tokenizer_path: str | None, max_new_tokens: int) -> Generate:
    """Greedy responses of the policy with transformers, in a child process of its own: the model and, on a
    GPU, the CUDA context (which no process can free while it lives) go when the child exits, before the run
    that follows needs the GPU."""

    def generate(prompts: list[list[dict[str, str]]]) -> list[str]:
        spawn = multiprocessing.get_context("spawn")  # a fork would inherit this process's CUDA state
        with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as child:
            return child.submit(greedy_responses, model_path, tokenizer_path, max_new_tokens, prompts).result()

    return generate


def greedy_responses(
    model_path: str, tokenizer_path: str | None, max_new_tokens: int, prompts: list[list[dict[str, str]]]
) -> list[str]:
    """The policy's greedy responses to `prompts` (bfloat16 on GPU 0, float32 on the CPU), in this process."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cuda = torch.cuda.is_available()
    tok = AutoTokenizer.from_pretrained(tokenizer_path or model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16 if cuda else torch.float32)
    model.to("cuda:0" if cuda else "cpu").eval()
    out = []
    for messages in prompts:
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        ids = {k: v.to(model.device) for k, v in ids.items()}
        with torch.no_grad():
            seq = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
        out.append(tok.decode(seq[0, ids["input_ids"].shape[1] :], skip_special_tokens=True))
    return out


def check_format(cfg: DictConfig, generate: Generate | None = None) -> float | None:
    """Run the check when `format_check.parser` is set (RL runs only); returns the parseable share, None when
    no check applies. Below `format_check.min_share`: UserError (exit 2)."""
    fc = cfg.get("format_check")
    if not fc or not fc.get("parser") or cfg.algorithm.name in ("sft", "dpo"):
        return None
    n, min_share = int(fc.n_prompts), float(fc.min_share)
    if n < 1 or not 0.0 <= min_share <= 1.0:
        raise UserError(f"format_check: n_prompts={n} must be >= 1 and min_share={min_share} in [0, 1]")
    parser = config_function("format_check.parser", str(fc.parser))
    prompts = check_prompts(cfg, n)
    if generate is None:
        model = str(policy_path(cfg))
        generate = transformers_generate(model, cfg.model.get("tokenizer_path"), int(fc.max_new_tokens))
    responses = generate(prompts)
    share, reasons = parseable_share(responses, parser)
    log.info("format check: %d of %d responses parse with %s", round(share * len(responses)), len(responses), fc.parser)
    if share < min_share:
        why = "; ".join(f"{reason} ({k}x)" for reason, k in reasons.most_common(3))
        raise UserError(
            f"format_check: {share:.0%} of {len(responses)} responses of model {cfg.model.path or 'the built policy'} "
            f"parse with {fc.parser} (format_check.min_share={min_share}; {why}). The reward would score nothing: "
            "start from a model tuned on the format (the paper row's SFT stage), or format_check.parser=null"
        )
    return share
