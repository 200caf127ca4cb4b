"""Held-out before/after evaluation of a policy: SARL's claim in miniature.

A run with `heldout.files` set samples `heldout.samples_per_prompt` responses to each held-out prompt
(prompts the run never trains on) once before training and once after, and measures on them:

- `sr_mean`, `sr_se`: the SARL structure score SR = C/2 + 1/(1+L) (SARL Eq. 6), computed by the
  structure reward whatever reward the run trains on, so that runs with different rewards compare
  on one scale (SARL Fig. 2a). The standard error treats prompts as the independent units: the
  standard deviation of the per-prompt means over sqrt(prompts).
- `accuracy`: the share of responses whose answer (`sarl.checking.grading`, the answer after `</think>`)
  equals the prompt's ground truth.
- `n_steps`, `length`: mean number of reasoning steps and of response tokens.
- health signals: `boxed` (share with a `\\boxed{}` answer), `truncated` (share cut at the length
  cap), `repeated_tags` (share with more than one `<think>` or `</think>`).
- `sr_failed`: responses whose SR could not be computed (left out of the SR figures, counted here).

`heldout.delta` holds after - before for each figure and `sr_delta_ci95`: a paired bootstrap interval
for the SR difference, resampling prompts (each prompt's before and after means stay paired).
The "before" figures are written to the run directory once and reused on resume, so a resumed run
compares with the policy it started from, not with a checkpoint.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from sarl.checking.grading.extract import extract_answer
from sarl.checking.grading.grader import is_equivalent
from sarl.contract.reward import RolloutBatch
from sarl.runtime.files import resolve_path

log = logging.getLogger("sarl.reports.heldout")

BEFORE_FILE = "heldout_before.json"
AFTER_FILE = "heldout_after.json"
FIGURES = ("sr_mean", "sr_se", "accuracy", "n_steps", "length", "boxed", "truncated", "repeated_tags")
DELTA_FIGURES = ("sr_mean", "accuracy", "n_steps", "length", "boxed", "truncated", "repeated_tags")


@dataclass
class Sample:
    """One held-out response's measurements (`sr` is None when it could not be computed)."""

    prompt: int
    sr: float | None
    correct: bool
    n_steps: int
    length: int
    boxed: bool
    truncated: bool
    repeated_tags: bool


def read_heldout(path: Path, limit: int | None = None) -> list[dict[str, Any]]:
    """The held-out prompts: TRL jsonl rows with `prompt` (chat messages) and `ground_truth`."""
    rows = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if not line.strip():
            continue
        row = json.loads(line)
        if not isinstance(row.get("prompt"), list) or "ground_truth" not in row:
            raise ValueError(f"{path}:{i + 1}: a held-out row needs 'prompt' (chat messages) and 'ground_truth'")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no held-out prompts")
    return rows[:limit] if limit else rows


def prompt_key(messages: Sequence[dict[str, Any]]) -> str:
    """The text of a prompt's user messages: what decides whether two prompts are the same."""
    return "\n".join(str(m.get("content", "")) for m in messages if m.get("role") == "user").strip()


def check_disjoint(heldout: list[dict[str, Any]], train: list[dict[str, Any]], where: str) -> None:
    """ValueError if a held-out prompt is also a training prompt."""
    seen = {prompt_key(r["prompt"]) for r in train}
    shared = [prompt_key(r["prompt"]) for r in heldout if prompt_key(r["prompt"]) in seen]
    if shared:
        raise ValueError(f"{where}: {len(shared)} held-out prompts are training prompts too, e.g. {shared[0][:80]!r}")


class Progress:
    """Generation's progress as lines, at most one every `every_s` seconds (no silence longer): the prompts done, the
    current batch's new tokens against its cap, the time so far and the estimated time left. It is also the
    `streamer` of `model.generate`, which calls `put` once per generated token position (the prompt first)."""

    def __init__(self, label: str, total: int, max_new_tokens: int, every_s: float = 8.0, say: Any = None) -> None:
        self.label, self.total, self.cap, self.every_s = label, total, max_new_tokens, every_s
        self.say = say or log.info
        self.start = self.last = time.monotonic()
        self.done = self.batch = self.steps = 0

    def begin(self, prompts: int) -> None:
        self.batch, self.steps = prompts, -1  # the first put is the prompt itself

    def put(self, value: Any) -> None:
        self.steps += 1
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last = now
            self.say(self.line(now))

    def end(self) -> None:
        self.done += self.batch

    def line(self, now: float) -> str:
        elapsed = now - self.start
        share = (self.done + self.batch * min(1.0, max(0, self.steps) / max(1, self.cap))) / max(1, self.total)
        eta = f", at most {elapsed / share - elapsed:.0f} s left" if share > 0 else ""
        return (
            f"{self.label}: {self.done}/{self.total} prompts done, {max(0, self.steps)}/{self.cap} new tokens of the "
            f"next {self.batch}; {elapsed:.0f} s{eta}"
        )


def generate(
    model: Any,
    tokenizer: Any,
    prompts: list[list[dict[str, Any]]],
    n: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float = 1.0,
    seed: int = 0,
    batch_prompts: int = 8,
    progress: Progress | None = None,
) -> list[list[tuple[str, int, bool]]]:
    """`n` sampled responses per prompt: (text, number of tokens, cut at `max_new_tokens`). `progress`: says how far
    it is (a line every 10 s at most apart), without changing what is sampled."""
    import torch

    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    was_training = model.training
    model.eval()
    eos = tokenizer.eos_token_id
    out: list[list[tuple[str, int, bool]]] = []
    try:
        for start in range(0, len(prompts), batch_prompts):
            chunk = prompts[start : start + batch_prompts]
            texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in chunk]
            enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            torch.manual_seed(seed + start)  # a prompt chunk's draws do not depend on the chunks before it
            if progress is not None:
                progress.begin(len(chunk))
            with torch.no_grad():
                ids = model.generate(
                    streamer=progress,
                    **enc,
                    do_sample=True,
                    temperature=temperature,
                    top_p=top_p,
                    top_k=0,
                    max_new_tokens=max_new_tokens,
                    num_return_sequences=n,
                    pad_token_id=tokenizer.pad_token_id,
                    eos_token_id=eos,
                )
            new = ids[:, enc["input_ids"].shape[1] :]
            for j, row in enumerate(chunk):
                samples = []
                for k in range(n):
                    seq = new[j * n + k].tolist()
                    ended = eos in seq
                    tokens = seq[: seq.index(eos)] if ended else seq
                    samples.append((tokenizer.decode(tokens, skip_special_tokens=True), len(tokens), not ended))
                out.append(samples)
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    return out


def measure(
    responses: list[list[tuple[str, int, bool]]], ground_truths: list[Any], structure_reward: Any
) -> list[Sample]:
    """Each response's SR (`structure_reward`, a `sarl.structure.reward.StructureReward`), correctness and health."""
    flat = [(i, text, n_tokens, cut) for i, group in enumerate(responses) for text, n_tokens, cut in group]
    outputs = structure_reward(RolloutBatch.from_responses([text for _, text, _, _ in flat]))
    samples = []
    for (i, text, n_tokens, cut), output in zip(flat, outputs):
        answer = extract_answer(text)
        gold = str(ground_truths[i])
        samples.append(
            Sample(
                prompt=i,
                sr=None if output.failed else float(output.diagnostics.get("sr", output.score)),
                correct=answer is not None and is_equivalent(answer, gold),
                n_steps=int(output.diagnostics.get("n_steps", 0)),
                length=int(n_tokens),
                boxed=answer is not None,
                truncated=bool(cut),
                repeated_tags=text.count("<think>") > 1 or text.count("</think>") > 1,
            )
        )
    return samples


def prompt_means(samples: list[Sample], field: str) -> dict[int, float]:
    """Per-prompt mean of a field (None values left out; a prompt with none is absent)."""
    by_prompt: dict[int, list[float]] = {}
    for s in samples:
        value = getattr(s, field)
        if value is not None:
            by_prompt.setdefault(s.prompt, []).append(float(value))
    return {p: float(np.mean(v)) for p, v in by_prompt.items()}


def summarize(samples: list[Sample]) -> dict[str, float]:
    """The figures of the module docstring for one set of samples."""
    sr = prompt_means(samples, "sr")
    sr_values = np.array(list(sr.values()))
    n_sr = len(sr_values)
    out = {
        "sr_mean": float(sr_values.mean()) if n_sr else math.nan,
        # prompts are the independent units: SE of the mean of per-prompt means
        "sr_se": float(sr_values.std(ddof=1) / math.sqrt(n_sr)) if n_sr > 1 else math.nan,
    }
    for name in ("correct", "n_steps", "length", "boxed", "truncated", "repeated_tags"):
        out["accuracy" if name == "correct" else name] = float(np.mean([float(getattr(s, name)) for s in samples]))
    out["sr_failed"] = sum(s.sr is None for s in samples)
    out["samples"] = len(samples)
    out["prompts"] = len({s.prompt for s in samples})
    return out


def paired_bootstrap_ci(
    before: dict[int, float], after: dict[int, float], n_boot: int = 2000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile interval of mean(after - before) over prompts, resampling prompts with replacement."""
    keys = sorted(set(before) & set(after))
    if len(keys) < 2:
        return (math.nan, math.nan)
    diff = np.array([after[k] - before[k] for k in keys])
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(diff), size=(n_boot, len(diff)))].mean(axis=1)
    tail = (1.0 - level) / 2.0
    return (float(np.quantile(means, tail)), float(np.quantile(means, 1.0 - tail)))


def delta(before: list[Sample], after: list[Sample], n_boot: int, seed: int) -> dict[str, Any]:
    b, a = summarize(before), summarize(after)
    out: dict[str, Any] = {k: a[k] - b[k] for k in DELTA_FIGURES}
    out["sr_delta_ci95"] = list(
        paired_bootstrap_ci(prompt_means(before, "sr"), prompt_means(after, "sr"), n_boot=n_boot, seed=seed)
    )
    out["accuracy_delta_ci95"] = list(
        paired_bootstrap_ci(prompt_means(before, "correct"), prompt_means(after, "correct"), n_boot=n_boot, seed=seed)
    )
    return out


class HeldOut:
    """The held-out evaluation of one run (config: the `heldout` node, see conf/exp/smoke.yaml)."""

    def __init__(self, cfg: Any, run_dir: Path, structure_reward: Any, train_rows: list[dict[str, Any]] | None):
        self.cfg = cfg
        self.run_dir = run_dir
        self.reward = structure_reward
        path = resolve_path(str(cfg.files))
        self.rows = read_heldout(path, int(cfg.n_prompts) if cfg.get("n_prompts") else None)
        if train_rows is not None:
            check_disjoint(self.rows, train_rows, str(path))

    def _evaluate(self, model: Any, tokenizer: Any, name: str = "held-out") -> list[Sample]:
        c = self.cfg
        label = f"held-out {'before' if name == BEFORE_FILE else 'after'} training"
        log.info("%s: sampling %d prompts x %d", label, len(self.rows), int(c.samples_per_prompt))
        responses = generate(
            model,
            tokenizer,
            [r["prompt"] for r in self.rows],
            n=int(c.samples_per_prompt),
            max_new_tokens=int(c.max_new_tokens),
            temperature=float(c.temperature),
            top_p=float(c.get("top_p", 1.0)),
            seed=int(c.seed),
            progress=Progress(label, len(self.rows), int(c.max_new_tokens)),
        )
        return measure(responses, [r["ground_truth"] for r in self.rows], self.reward)

    def _load_or_run(self, name: str, model: Any, tokenizer: Any, reuse: bool) -> list[Sample]:
        path = self.run_dir / name
        if reuse and path.is_file():
            log.info("held-out: reusing %s", path)
            return [Sample(**s) for s in json.loads(path.read_text())["samples"]]
        samples = self._evaluate(model, tokenizer, name)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"summary": summarize(samples), "samples": [asdict(s) for s in samples]}))
        tmp.replace(path)
        return samples

    def before(self, model: Any, tokenizer: Any) -> list[Sample]:
        """The starting policy's samples (computed once per run directory)."""
        return self._load_or_run(BEFORE_FILE, model, tokenizer, reuse=True)

    def after(self, model: Any, tokenizer: Any) -> list[Sample]:
        return self._load_or_run(AFTER_FILE, model, tokenizer, reuse=False)

    def report(self, before: list[Sample], after: list[Sample]) -> dict[str, Any]:
        """`summary.json`'s `heldout` block."""
        return {
            "prompts": len(self.rows),
            "samples_per_prompt": int(self.cfg.samples_per_prompt),
            "before": summarize(before),
            "after": summarize(after),
            "delta": delta(before, after, n_boot=int(self.cfg.bootstrap), seed=int(self.cfg.seed)),
        }


def interval_text(delta: float, ci: Sequence[float], places: int) -> str:
    """A difference with its interval as every report prints it: `+0.1057 [+0.0476, +0.1606]`."""
    lo, hi = ci
    return f"{delta:+.{places}f} [{lo:+.{places}f}, {hi:+.{places}f}]"


# The figures whose difference has a paired bootstrap interval: (its key in `delta`, the figure's standard error,
# decimal places every report prints it with).
INTERVAL_FIGURES = {"sr_mean": ("sr_delta_ci95", "sr_se", 4), "accuracy": ("accuracy_delta_ci95", None, 3)}


def before_after_cells(block: dict[str, Any], figure: str, with_se: bool = False) -> list[str]:
    """The before, after and after - before [95% CI] cells of `figure` (one of INTERVAL_FIGURES) of a `heldout`
    block, as every report prints them; `with_se` (SR): before and after with the standard error, `0.4123 ± 0.0100`."""
    ci, se, places = INTERVAL_FIGURES[figure]
    cells = []
    for side in (block["before"], block["after"]):
        cell = f"{side[figure]:.{places}f}"
        cells.append(f"{cell} ± {side[se]:.{places}f}" if with_se else cell)
    return [*cells, interval_text(block["delta"][figure], block["delta"][ci], places)]


def table(block: dict[str, Any]) -> Any:
    """A rich table of the `heldout` block: each figure before, after and the difference."""
    from rich.table import Table

    b, a, d = block["before"], block["after"], block["delta"]
    t = Table(title=f"held-out prompts: {block['prompts']} x {block['samples_per_prompt']} samples")
    for col in ("", "before", "after", "after - before"):
        t.add_column(col, justify="right" if col else "left")
    t.add_row("SR", *before_after_cells(block, "sr_mean", with_se=True))
    t.add_row("accuracy", *before_after_cells(block, "accuracy"))
    for name, fmt in (
        ("n_steps", ".2f"),
        ("length", ".1f"),
        ("boxed", ".3f"),
        ("truncated", ".3f"),
        ("repeated_tags", ".3f"),
    ):
        t.add_row(name, f"{b[name]:{fmt}}", f"{a[name]:{fmt}}", f"{d[name]:+{fmt}}")
    t.caption = "SR ± standard error over prompts; [95% paired bootstrap interval over prompts]"
    return t


def log_heldout(wandb_run: Any, block: dict[str, Any]) -> None:
    """The held-out before/after in the run's W&B: summary keys `heldout/<figure>/{before,after,delta}` (and the
    95% interval's ends for SR and accuracy) and a table with a row per figure, as `table` prints it."""
    import wandb

    summary: dict[str, float] = {}
    rows = []
    for figure in DELTA_FIGURES:
        before, after, change = block["before"][figure], block["after"][figure], block["delta"][figure]
        summary.update({f"heldout/{figure}/before": before, f"heldout/{figure}/after": after})
        summary[f"heldout/{figure}/delta"] = change
        low = high = None
        if figure in INTERVAL_FIGURES:
            low, high = block["delta"][INTERVAL_FIGURES[figure][0]]
            summary.update({f"heldout/{figure}/delta_ci95_low": low, f"heldout/{figure}/delta_ci95_high": high})
        rows.append([figure, before, after, change, low, high])
    wandb_run.summary.update(summary)
    columns = ["figure", "before", "after", "after - before", "ci95 low", "ci95 high"]
    wandb_run.log({"heldout/before_after": wandb.Table(columns=columns, data=rows)})
