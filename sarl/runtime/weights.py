"""A run's saved model, checked after saving: no run ends without its weights.

A trainer can write a checkpoint directory without the model in it and say nothing (transformers 5.9's FSDP
arguments wrote `final/` with the tokenizer only). Every back end therefore checks what it saved before it reports
success: `weights_problem` for a Hugging Face directory (TRL's `final/`, verl SFT's `huggingface/`): the weight files
its index names are there and load, and, where the trained tensors are at hand, every saved tensor equals its
trained one and every trained tensor is saved (or tied to one that is); `verl_actor_problem` for verl's FSDP actor
checkpoint (every rank's shard of the world size its `fsdp_config.json` names, each a readable torch archive).
Each returns None, or one line saying what is missing.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any, Mapping

INDEXES = (("model.safetensors.index.json", "model.safetensors"), ("pytorch_model.bin.index.json", "pytorch_model.bin"))
WEIGHT_FILES = tuple(name for pair in INDEXES for name in reversed(pair))  # model.safetensors, its index, ...


def weight_files(directory: Path) -> list[Path]:
    """The weight files of a Hugging Face directory: those its index names, or the single file; [] if none."""
    for index_name, single in INDEXES:
        index = directory / index_name
        if index.is_file():
            names = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
            return [directory / n for n in names]
        if (directory / single).is_file():
            return [directory / single]
    return []


def is_hf_model(path: Path) -> bool:
    """A Hugging Face model directory: its config.json and its weight files."""
    return (Path(path) / "config.json").is_file() and bool(weight_files(Path(path)))


def saved_tensors(path: Path):
    """(name, tensor) of one weight file, one at a time for safetensors."""
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)
    else:
        import torch

        yield from torch.load(str(path), map_location="cpu", weights_only=True).items()


def trained_state(model: Any) -> tuple[Mapping[str, Any] | None, int]:
    """(the model's state dict when it holds whole tensors here (one process, DDP), else None: FSDP's DTensors,
    which only all ranks together could compare; the model's parameter count, shared parameters once)."""
    state = model.state_dict()
    numel = sum(p.numel() for p in model.parameters())
    if any(type(t).__name__ == "DTensor" for t in state.values()):
        return None, numel
    return state, numel


def weights_problem(directory: Path, trained: Mapping[str, Any] | None = None, numel: int | None = None) -> str | None:
    """None when `directory` holds loadable weights (equal to `trained`, when given; `numel` elements in all,
    when given: the check for a sharded model); else what is wrong."""
    import torch

    directory = Path(directory)
    if not directory.is_dir():
        return f"{directory} does not exist"
    files = weight_files(directory)
    if not files:
        present = ", ".join(sorted(p.name for p in directory.iterdir())[:8]) or "nothing"
        return f"{directory} has no model weights (none of {', '.join(WEIGHT_FILES)}; it holds {present})"
    missing = [p.name for p in files if not p.is_file()]
    if missing:
        return f"{directory}: the weight index names {len(missing)} missing file(s), e.g. {missing[0]}"
    saved: list[str] = []
    differ: list[str] = []
    unknown: list[str] = []
    total = 0
    try:
        for path in files:
            for name, tensor in saved_tensors(path):
                saved.append(name)
                total += tensor.numel()
                if trained is None:
                    continue
                if name not in trained:
                    unknown.append(name)
                elif not torch.equal(tensor, trained[name].detach().to(device="cpu", dtype=tensor.dtype)):
                    differ.append(name)
    except Exception as err:  # a truncated or corrupt file, whatever the loader raises
        return f"{directory}: the weights do not load ({type(err).__name__}: {str(err)[:160]})"
    if not saved:
        return f"{directory}: the weight files hold no tensors"
    if numel is not None and total != numel:
        return f"{directory}: the saved tensors hold {total:,} values, the trained model {numel:,}"
    if trained is None:
        return None
    kept = {trained[n].data_ptr() for n in saved if n in trained}
    lost = [n for n, t in trained.items() if n not in saved and t.data_ptr() not in kept]  # tied ones share storage
    problems = (("differ from the trained ones", differ), ("are not saved", lost), ("are not the model's", unknown))
    for what, names in problems:
        if names:
            return f"{directory}: {len(names)} of {len(trained)} tensors {what}, e.g. {names[0]}"
    return None


def verl_actor_problem(actor: Path) -> str | None:
    """None when verl's FSDP actor checkpoint has every rank's model shard, each a readable torch archive."""
    actor = Path(actor)
    config = actor / "fsdp_config.json"
    try:
        world = int(json.loads(config.read_text())["world_size"])
    except (OSError, ValueError, KeyError, TypeError):
        shards = sorted(actor.glob("model_world_size_*_rank_*.pt"))
        if not shards:
            return f"{actor} has no model shards (model_world_size_*_rank_*.pt)"
        world = int(shards[0].name.split("_")[3])
    for rank in range(world):
        shard = actor / f"model_world_size_{world}_rank_{rank}.pt"
        if not shard.is_file() or shard.stat().st_size == 0:
            return f"{actor}: the model shard of rank {rank} of {world} is missing or empty ({shard.name})"
        if not zipfile.is_zipfile(shard):
            return f"{actor}: {shard.name} is not a torch archive"
    return None


def weights_cached(model: str) -> bool:
    """Whether a model's weights are here, not only its config.json: a local directory with weight files, or a
    Hub id whose config.json and safetensors (every shard its index names) are in the local Hugging Face cache."""
    from huggingface_hub import try_to_load_from_cache

    if Path(model).expanduser().is_dir():
        return is_hf_model(Path(model).expanduser())
    if not isinstance(try_to_load_from_cache(model, "config.json"), str):
        return False
    single = try_to_load_from_cache(model, "model.safetensors")
    if isinstance(single, str):
        return True
    index = try_to_load_from_cache(model, "model.safetensors.index.json")
    if not isinstance(index, str):
        return False
    shards = set(json.loads(Path(index).read_text())["weight_map"].values())
    return all(isinstance(try_to_load_from_cache(model, shard), str) for shard in shards)
