"""`python -m sarl.bench suite=smoke [load=N]`: the tiny policy's CPU work idle and beside N busy processes.

Three phases of the embedded default (`python -m sarl.train +exp=smoke`), timed in a fresh process each repeat, so
that torch's threads and OpenMP's wait policy are set as a run sets them (`sarl.runtime.torch_threads`), after the
busy processes have started:

- **build**: the tiny policy from conf/model/tiny_qwen3.yaml's spec, with `warm_start_steps` warm-start steps
  instead of a run's 600 (tokenizer, model, warm start, save; a fresh cache each time);
- **sampling**: `sample_prompts` held-out prompts x `samples_per_prompt` samples at the held-out report's
  temperature and top-p, exactly `sample_tokens` new tokens each (so every repeat does the same work, whatever the
  policy the repeat built);
- **training step**: one update of the smoke row's shape: `train_sequences` sequences of `train_tokens` tokens in
  micro-batches of `micro_batch`: the reference's log-probabilities, the policy's forward and backward with a
  clipped policy-gradient loss and a KL term, gradient clipping and an AdamW step (TRL's GRPO update; its sampling
  is the phase above).

Idle and loaded runs alternate (idle, loaded, idle, ...); each phase's median and the ratio loaded/idle are
reported (a fair share beside N busy processes on N cores is 2x). `settings` lists the variants measured, each as
`TORCH_THREADS/WAIT` (`parse_setting`), e.g. `[2/unset, 2/PASSIVE, 1/unset, auto/train]`: the smoke rows' former
setting (2 threads, libgomp's default wait), a passive wait alone, one thread alone, and what a run does now. Then
the README's first commands run as subprocesses (`sarl.bench.commands`).

    python -m sarl.bench.smoke PHASE.json   # one repeat's phases (what the suite starts), result into its `out`
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table

from sarl.bench.commands import run_commands
from sarl.bench.common import busy_load, median
from sarl.runtime.errors import UserError
from sarl.runtime.files import resolve_path
from sarl.runtime.torch_threads import WAIT_KEYS, apply, check_setting, wait_policy_env
from sarl.smoke.policy import build_policy

REPO = Path(__file__).resolve().parents[2]
PHASES = ("build", "sampling", "training step")


def policy_spec(warm_start_steps: int) -> dict:
    """conf/model/tiny_qwen3.yaml's `build`, with `warm_start_steps` steps (its cache directory is the bench's)."""
    build = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "model" / "tiny_qwen3.yaml").build)
    spec = {k: v for k, v in build.items() if k not in ("cache_dir", "seed")}  # no ${paths...} left to resolve
    spec["warm_start"]["steps"] = int(warm_start_steps)
    spec["traces"] = str(resolve_path(spec["traces"]))
    return spec


def parse_setting(text: str) -> tuple[Any, str]:
    """`THREADS/WAIT` -> (torch_threads, WAIT). WAIT: TRAIN (the wait `sarl.train` sets: `wait_policy_env`), UNSET
    (libgomp's default), PASSIVE or ACTIVE (OMP_WAIT_POLICY), SPINn (GOMP_SPINCOUNT=n)."""
    threads, _, wait = str(text).partition("/")
    wait = (wait or "TRAIN").upper()
    known = ("TRAIN", "UNSET", "PASSIVE", "ACTIVE")
    if wait not in known and not (wait.startswith("SPIN") and wait[4:].isdigit()):
        raise UserError(
            f"smoke.settings: {text!r}: write THREADS/WAIT, WAIT one of train, unset, PASSIVE, ACTIVE, spinN"
        )
    return check_setting(threads if threads != "null" else None, "smoke.settings"), wait


def child_env(wait: str) -> dict[str, str]:
    """This process's environment with the OpenMP wait variables `wait` names (and no others)."""
    env = {k: v for k, v in os.environ.items() if k not in (*WAIT_KEYS, "KMP_BLOCKTIME")}
    if wait == "TRAIN":
        wait_policy_env(env)
    elif wait.startswith("SPIN"):
        env["GOMP_SPINCOUNT"] = wait[4:]
    elif wait != "UNSET":
        env["OMP_WAIT_POLICY"] = wait
    return {**env, "PYTHONUNBUFFERED": "1"}


def run_phases(section: DictConfig, threads: Any, wait: str, work: Path, logs: Path, tag: str) -> dict:
    """One repeat's phases in a fresh process (`python -m sarl.bench.smoke PHASE.json`); its output in `logs`."""
    work.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    spec = {
        "torch_threads": threads,
        "build": policy_spec(int(section.warm_start_steps)),
        "cache_dir": str(work / f"policies-{tag}"),
        "heldout": "pkg://sarl.smoke/data/heldout.trl.jsonl",
        "out": str(work / f"phases-{tag}.json"),
        **{k: int(section[k]) for k in ("sample_prompts", "samples_per_prompt", "sample_tokens")},
        **{k: int(section[k]) for k in ("train_sequences", "train_tokens", "micro_batch")},
    }
    path = work / f"spec-{tag}.json"
    path.write_text(json.dumps(spec))
    log = logs / f"phases-{tag}.log"
    with log.open("w") as out:
        cmd = [sys.executable, "-m", "sarl.bench.smoke", str(path)]
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env(wait)).returncode
    if rc != 0:
        raise UserError(f"smoke: the phases' process exited {rc}; see {log}")
    return json.loads(Path(spec["out"]).read_text())


def run_smoke(
    section: DictConfig, console: Console, load: int = 0, load_max_s: float = 3600, out_dir: Path | None = None
) -> dict:
    settings = [parse_setting(s) for s in section.settings]
    conditions = [0, load] if load else [0]
    with tempfile.TemporaryDirectory(prefix="sarl-bench-smoke-") as tmp:
        work = Path(out_dir) if out_dir is not None else Path(tmp)
        runs: dict[str, dict[int, list[dict]]] = {f"{t}/{w}": {c: [] for c in conditions} for t, w in settings}
        for r in range(int(section.repeats)):
            for threads, wait in settings:
                name = f"{threads}/{wait}"
                for n in conditions:
                    with busy_load(n, load_max_s, console):
                        tag = f"{name.replace('/', '-')}-load{n}-r{r}"
                        result = run_phases(section, threads, wait, Path(tmp) / "phases", work, tag)
                    runs[name][n].append(result)
                    times = ", ".join(f"{p} {result['seconds'][p]:.2f} s" for p in PHASES)
                    console.print(f"{name}, {'idle' if not n else f'load={n}'}, repeat {r + 1}: {times}")
                    console.print(f"  {result['threads']}")
        rows = phase_medians(runs, load)
        console.print(phases_table(rows, load))
        commands = run_commands(section.commands, console, work, load, load_max_s)
    return {"load": load, "settings": [f"{t}/{w}" for t, w in settings], "rows": rows, "runs": runs, **commands}


def phase_medians(runs: dict[str, dict[int, list[dict]]], load: int) -> list[dict]:
    rows = []
    for name, by_load in runs.items():
        for phase in PHASES:
            idle = median([r["seconds"][phase] for r in by_load[0]])
            row = {"setting": name, "phase": phase, "idle_s": idle, "threads_idle": by_load[0][0]["torch_threads"]}
            if load:
                loaded = median([r["seconds"][phase] for r in by_load[load]])
                row.update(loaded_s=loaded, ratio=loaded / idle, threads_loaded=by_load[load][0]["torch_threads"])
            rows.append(row)
    return rows


def phases_table(rows: list[dict], load: int) -> Table:
    title = "the tiny policy's CPU work, idle (medians)"
    if load:
        title = f"the tiny policy's CPU work, idle and beside {load} busy processes (medians)"
    table = Table(title=title)
    loaded = ("threads loaded", "loaded s", "loaded/idle") if load else ()
    for col in ("setting", "phase", "threads idle", "idle s", *loaded):
        table.add_column(col, justify="right")
    for r in rows:
        cells = [r["setting"], r["phase"], str(r["threads_idle"]), f"{r['idle_s']:.2f}"]
        if load:
            cells += [str(r["threads_loaded"]), f"{r['loaded_s']:.2f}", f"{r['ratio']:.2f}x"]
        table.add_row(*cells)
    return table


# ---- the phases' process ------------------------------------------------------------------------------------------


def phases(spec: dict) -> dict:
    """The three phases in this process (see the module's docstring): their seconds and the threads chosen."""
    choice = apply(spec["torch_threads"], say=lambda line: None)  # before torch computes anything
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sarl.reports.heldout import read_heldout  # deferred: imports the grader; the phases' process only

    seconds = {}
    t0 = time.perf_counter()
    path = build_policy(spec["build"], spec["cache_dir"], seed=0)
    seconds["build"] = time.perf_counter() - t0

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    rows = read_heldout(resolve_path(spec["heldout"]), spec["sample_prompts"])
    texts = [tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in rows]
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.no_grad():
        model.generate(
            **enc,
            do_sample=True,
            temperature=0.6,
            top_p=0.95,
            top_k=0,
            max_new_tokens=spec["sample_tokens"],
            min_new_tokens=spec["sample_tokens"],
            num_return_sequences=spec["samples_per_prompt"],
            pad_token_id=tokenizer.pad_token_id,
        )
    seconds["sampling"] = time.perf_counter() - t0

    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    t0 = time.perf_counter()
    training_step(model, reference, spec["train_sequences"], spec["train_tokens"], spec["micro_batch"])
    seconds["training step"] = time.perf_counter() - t0
    return {
        "seconds": seconds,
        "torch_threads": torch.get_num_threads(),
        "threads": choice.describe(),
        "wait": {k: os.environ[k] for k in WAIT_KEYS if k in os.environ},
    }


def training_step(model: Any, reference: Any, sequences: int, tokens: int, micro_batch: int, beta: float = 0.2) -> None:
    """One GRPO-shaped update on random tokens: per micro-batch the reference's log-probabilities (no gradient), the
    policy's clipped ratio loss with advantages and a k3 KL term, backward; then gradient clipping and AdamW."""
    import torch  # deferred: the phases' process only

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (sequences, tokens), generator=gen)
    advantages = torch.randn(sequences, generator=gen)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5)
    model.train()
    for start in range(0, sequences, micro_batch):
        x, a = ids[start : start + micro_batch], advantages[start : start + micro_batch]
        with torch.no_grad():
            ref = torch.log_softmax(reference(input_ids=x).logits[:, :-1], -1).gather(-1, x[:, 1:, None])[..., 0]
        logp = torch.log_softmax(model(input_ids=x).logits[:, :-1], -1).gather(-1, x[:, 1:, None])[..., 0]
        ratio = torch.exp(logp - logp.detach())
        pg = -torch.min(ratio * a[:, None], torch.clamp(ratio, 0.8, 1.28) * a[:, None])
        kl = torch.exp(ref - logp) - (ref - logp) - 1
        loss = (pg + beta * kl).mean() * x.shape[0] / sequences
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        sys.stderr.write("usage: python -m sarl.bench.smoke PHASE.json (started by python -m sarl.bench suite=smoke)\n")
        return 2
    spec = json.loads(Path(args[0]).read_text())
    result = phases(spec)
    Path(spec["out"]).write_text(json.dumps(result))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
