"""A run's checkpoints as Hugging Face models: what `eval.run` loads and what every finished run leaves in `final/`.

verl's RL trainer saves FSDP shards (`checkpoints/global_step_N/actor/model_world_size_W_rank_R.pt`, with the
config and tokenizer under `actor/huggingface/` but no weights: save_contents `model, optimizer, extra`). A model
is made of them by verl's own model merger (`verl.model_merger`, FSDP back end: each parameter's shards joined
along their DTensor placement, cast to bfloat16, saved with `save_pretrained` and the tokenizer), once at the end
of training into the run's `final/`, and on demand for any other checkpoint into that checkpoint's
`actor/huggingface/` (verl's own place for a Hugging Face copy), which later evaluations then find
(decisions §10.1: why the merger and not verl's `hf_model` save content).

`export_problem` checks a merged model against the shards it came from, read independently of the merger: every
saved tensor equals its trained one (cast to the saved dtype), every trained tensor is saved or tied to one that
is, and nothing else is saved.

`run_checkpoints(run_dir)` lists the checkpoints a run saved, of either back end, in step order: TRL's
`checkpoints/checkpoint-N/` (Hugging Face directories already) and verl's `checkpoints/global_step_N/`;
`resolve_checkpoint(path)` turns whatever a user names (a run directory, a pipeline's run directory, a verl
`global_step_N` or its `actor/`, a Hugging Face directory) into the Hugging Face directory to load.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from sarl.runtime.errors import UserError
from sarl.runtime.weights import is_hf_model, saved_tensors, weight_files, weights_problem

log = logging.getLogger("sarl.checkpoints")

FINAL_SUBDIR = "final"  # every finished run's Hugging Face model
CHECKPOINT_SUBDIR = "checkpoints"  # both back ends save their checkpoints under it
VERL_STEP = re.compile(r"^global_step_(\d+)$")
TRL_STEP = re.compile(r"^checkpoint-(\d+)$")
HF_CONFIG = "config.json"


@dataclass(frozen=True)
class Checkpoint:
    """One saved checkpoint of a run: its step, its directory and what kind it is (`hf`: loads as it is; `verl`:
    FSDP shards under `actor/`, merged before loading)."""

    step: int
    path: Path
    kind: str

    @property
    def label(self) -> str:
        return f"step_{self.step}"


def run_checkpoints(run_dir: Path) -> list[Checkpoint]:
    """The checkpoints a run saved, in step order (TRL `checkpoints/checkpoint-N`, verl `checkpoints/global_step_N`
    with an actor or a Hugging Face copy); [] if none."""
    folder = Path(run_dir) / CHECKPOINT_SUBDIR
    found: list[Checkpoint] = []
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        if not path.is_dir():
            continue
        if m := TRL_STEP.match(path.name):
            if weight_files(path):
                found.append(Checkpoint(int(m.group(1)), path, "hf"))
        elif m := VERL_STEP.match(path.name):
            if weight_files(path / "huggingface"):  # verl SFT (save_contents hf_model)
                found.append(Checkpoint(int(m.group(1)), path / "huggingface", "hf"))
            elif (path / "actor").is_dir():
                found.append(Checkpoint(int(m.group(1)), path / "actor", "verl"))
    return sorted(found, key=lambda c: c.step)


def is_verl_actor(path: Path) -> bool:
    return any(Path(path).glob("model_world_size_*_rank_*.pt"))


def _tied_names(config_dir: Path) -> set[str]:
    """The tensors a Hugging Face model with this config leaves out because they are tied (the LM head to the
    input embedding when `tie_word_embeddings`)."""
    try:
        config = json.loads((config_dir / HF_CONFIG).read_text())
    except (OSError, ValueError):
        return set()
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    return {"lm_head.weight"} if text.get("tie_word_embeddings", config.get("tie_word_embeddings")) else set()


def _shard_state(actor: Path) -> tuple[list[dict], int]:
    """Every rank's model shard of a verl actor checkpoint, memory-mapped (nothing is read until a tensor is)."""
    import torch

    shards = sorted(actor.glob("model_world_size_*_rank_*.pt"))
    if not shards:
        raise UserError(f"{actor} has no model shards (model_world_size_*_rank_*.pt): not a verl actor checkpoint")
    world = int(shards[0].name.split("_")[3])
    paths = [actor / f"model_world_size_{world}_rank_{r}.pt" for r in range(world)]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise UserError(f"{actor}: {len(missing)} of {world} ranks' model shards are missing, e.g. {missing[0]}")
    mesh_log = logging.getLogger("torch.distributed.device_mesh")  # warns of unpickled meshes; harmless on CPU
    level = mesh_log.level
    mesh_log.setLevel(logging.ERROR)
    try:
        return [torch.load(p, map_location="cpu", weights_only=False, mmap=True) for p in paths], world
    finally:
        mesh_log.setLevel(level)


def _trained_tensor(shards: list[dict], name: str):
    """The whole tensor `name` from every rank's shard: a DTensor's local pieces joined along the dimension its
    placement shards (a replicated one taken once), a plain tensor from rank 0 (FSDP keeps those whole)."""
    import torch

    pieces = [s[name] for s in shards]
    first = pieces[0]
    if type(first).__name__ != "DTensor":
        return first
    placement = first.placements[-1]  # the FSDP dimension (a leading DDP dimension replicates)
    local = [p._local_tensor for p in pieces]
    if placement.is_shard():
        return torch.cat(local, dim=placement.dim)
    return local[0]


def export_problem(actor: Path, target: Path) -> str | None:
    """None when `target` holds exactly the model of the verl actor checkpoint `actor` (module docstring); else
    one line saying what differs."""
    import torch

    target = Path(target)
    files = weight_files(target)
    if not files or any(not p.is_file() for p in files):
        return weights_problem(target)  # no weights, or an index naming missing files: said without reading any
    shards, _ = _shard_state(Path(actor))
    trained = set(shards[0])
    saved: set[str] = set()
    try:  # one read of the saved tensors: each is loaded once, to compare (a file that does not load is said)
        for path in files:
            for name, tensor in saved_tensors(path):
                saved.add(name)
                if name not in trained:
                    return f"{target}: {name} is saved but is not a tensor of the trained model in {actor}"
                want = _trained_tensor(shards, name).to(dtype=tensor.dtype)
                if tensor.shape != want.shape or not torch.equal(tensor, want):
                    return f"{target}: {name} differs from the trained tensor in {actor}"
    except Exception as err:  # a truncated or corrupt file, whatever the loader raises
        return f"{target}: the weights do not load ({type(err).__name__}: {str(err)[:160]})"
    if not saved:
        return f"{target}: the weight files hold no tensors"
    lost = sorted(trained - saved - _tied_names(Path(target)))
    if lost:
        return f"{target}: {len(lost)} of {len(trained)} trained tensors are not saved, e.g. {lost[0]}"
    return None


def merge_verl_actor(actor: Path, target: Path) -> Path:
    """verl's FSDP actor checkpoint `actor` merged into a Hugging Face directory `target` by verl's model merger,
    then checked against the shards (`export_problem`); written to a temporary sibling and renamed, so `target`
    is either whole or absent. Raises UserError with one line when the checkpoint cannot be merged."""
    actor, target = Path(actor), Path(target)
    config_dir = actor / "huggingface"
    if not (config_dir / HF_CONFIG).is_file():
        raise UserError(f"{actor}: no huggingface/config.json beside the shards; not a verl actor checkpoint")
    from verl.model_merger.base_model_merger import ModelMergerConfig  # deferred: imports verl (~9 s)
    from verl.model_merger.fsdp_model_merger import FSDPModelMerger

    tmp = target.with_name(f".{target.name}.merging")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    config = ModelMergerConfig(
        operation="merge",
        backend="fsdp",
        local_dir=str(actor),
        target_dir=str(tmp),
        hf_model_config_path=str(config_dir),
    )
    try:
        with _quiet():  # the merger prints its progress and torch warns about unpickled device meshes
            FSDPModelMerger(config).merge_and_save()
    except Exception as err:  # whatever verl's merger raises on a damaged checkpoint
        shutil.rmtree(tmp, ignore_errors=True)
        raise UserError(f"{actor}: verl's model merger failed ({type(err).__name__}: {str(err)[:200]})") from err
    problem = export_problem(actor, tmp)
    if problem:
        shutil.rmtree(tmp, ignore_errors=True)
        raise UserError(f"the merged model does not hold the trained weights: {problem}")
    readable_as_umask(tmp)
    _replace_dir(tmp, target)
    return target


def readable_as_umask(directory: Path) -> None:
    """Give the files of a saved model the permissions the user's umask gives new files: transformers 5.9 writes
    `model.safetensors` through a private temporary file (mode 0600), so on a cluster's shared project folder the
    rest of the group could not read a model the config files beside it let them see."""
    umask = os.umask(0)
    os.umask(umask)
    for path in Path(directory).iterdir():
        if path.is_file():
            path.chmod(0o666 & ~umask)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The merger's prints and progress bars (stdout, stderr) and torch's device-mesh warnings kept off the
    console; they are shown if the merge fails."""
    out = io.StringIO()
    mesh_log = logging.getLogger("torch.distributed.device_mesh")
    level = mesh_log.level
    mesh_log.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            yield
    except Exception:
        sys.stderr.write(out.getvalue()[-4000:])
        raise
    finally:
        mesh_log.setLevel(level)


def _replace_dir(source: Path, target: Path) -> None:
    """Move `source` to `target`, replacing what is there; for a config-only `huggingface/` folder the files it
    had that the merge did not write (a chat template, say) are kept."""
    if target.is_dir():
        for item in target.iterdir():
            if not (source / item.name).exists() and item.is_file():
                shutil.copy2(item, source / item.name)
        shutil.rmtree(target)
    source.replace(target)


def link_tree(source: Path, target: Path) -> Path:
    """A copy of the Hugging Face directory `source` at `target` made of hard links where the file system allows
    (no second copy of the weights on disk), else of copies; written beside `target` and renamed into place."""
    source, target = Path(source), Path(target)
    tmp = target.with_name(f".{target.name}.linking")
    shutil.rmtree(tmp, ignore_errors=True)

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, tmp, copy_function=link)
    shutil.rmtree(target, ignore_errors=True)
    tmp.replace(target)
    return target


def hf_model_of(checkpoint: Checkpoint) -> Path:
    """The Hugging Face directory of a checkpoint, merging a verl actor checkpoint into its `actor/huggingface/`
    on first use (said in one line; later calls find it)."""
    if checkpoint.kind == "hf":
        return checkpoint.path
    target = checkpoint.path / "huggingface"
    if is_hf_model(target):  # merged earlier (merge_verl_actor renames a checked merge into place) or verl's hf_model
        return target
    log.info("%s: verl FSDP shards; merging them into %s (verl's model merger, bfloat16)", checkpoint.path, target)
    return merge_verl_actor(checkpoint.path, target)


def _verl_checkpoint_of(path: Path) -> Checkpoint | None:
    """A verl checkpoint named by any of its folders: `global_step_N/`, its `actor/`, or `actor/huggingface/`."""
    for folder in (path, path.parent, path.parent.parent):
        m = VERL_STEP.match(folder.name)
        if m is None:
            continue
        if (folder / "huggingface").is_dir() and weight_files(folder / "huggingface"):
            return Checkpoint(int(m.group(1)), folder / "huggingface", "hf")  # verl SFT
        if (folder / "actor").is_dir():
            return Checkpoint(int(m.group(1)), folder / "actor", "verl")
    return None


def pipeline_final(run_dir: Path) -> Path | None:
    """The model of a pipeline run directory (`pipeline.json`): its last stage's `final/` when every earlier stage
    leads to it (SFT, then RL from it); UserError naming the stages when they are separate runs (smoke_compare)."""
    record = Path(run_dir) / "pipeline.json"
    if not record.is_file():
        return None
    data = json.loads(record.read_text())
    stages = list(data.get("stages") or {})
    last = data.get("final_stage")
    if last is None:
        names = ", ".join(str(Path(run_dir) / s) for s in stages)
        raise UserError(
            f"{run_dir} is a pipeline of {len(stages)} separate runs ({', '.join(stages)}); evaluate one of them: "
            f"ckpt={names.split(', ')[0] if names else '<stage dir>'} (the stages: {names})"
        )
    return Path(run_dir) / str(last) / FINAL_SUBDIR


def is_run_or_checkpoint(path: str | Path) -> bool:
    """Whether `path` is a directory `resolve_checkpoint` turns into a model: a training run (meta.json, final/), a
    pipeline (pipeline.json) or a verl checkpoint (`global_step_N`, its `actor/` or `actor/huggingface/`)."""
    p = Path(path).expanduser()
    if not p.is_dir():
        return False
    if any((p / name).exists() for name in ("meta.json", "pipeline.json", FINAL_SUBDIR)):
        return True
    return any(VERL_STEP.match(folder.name) for folder in (p, p.parent, p.parent.parent))


def resolve_checkpoint(path: str | Path) -> tuple[Path, str | None]:
    """(the Hugging Face directory to load, a line saying how it was found or None when `path` is one already).
    Accepts a Hugging Face directory, a run directory (its `final/`), a pipeline's run directory (its last stage's
    `final/`), or a verl checkpoint (`checkpoints/global_step_N`, its `actor/` or `actor/huggingface/`), merged on
    first use. A path that is not a directory is returned as it is (a Hub id), for the loader to judge; a directory
    that is none of these is a UserError."""
    p = Path(path).expanduser()
    if not p.is_dir() or is_hf_model(p):
        return p, None
    final = p / FINAL_SUBDIR
    if (p / "meta.json").is_file() or (p / "pipeline.json").is_file() or final.is_dir():
        model = pipeline_final(p) or final
        if not is_hf_model(model):
            ckpts = run_checkpoints(p)
            hint = ""
            if ckpts:
                last = ckpts[-1].path.parent if ckpts[-1].kind == "verl" else ckpts[-1].path
                hint = f"; it saved {len(ckpts)} checkpoint(s), the last: ckpt={last}"
            raise UserError(f"{p} is a run directory without a model in {model} (did the run finish?){hint}")
        return model, f"{p} is a run directory: evaluating its final model {model}"
    verl = _verl_checkpoint_of(p)
    if verl is not None:
        if verl.kind == "hf":
            return verl.path, f"{p} is a verl SFT checkpoint: evaluating its Hugging Face copy {verl.path}"
        earlier = is_hf_model(verl.path / "huggingface")
        merged = "merged earlier into" if earlier else "merged by verl's model merger into"
        return hf_model_of(verl), f"{p} is a verl checkpoint (FSDP shards): {merged} {verl.path / 'huggingface'}"
    if (p / HF_CONFIG).is_file():
        raise UserError(f"{p} has a config.json but no model weights (model.safetensors or pytorch_model.bin)")
    raise UserError(
        f"ckpt={p} has no config.json: not a Hugging Face checkpoint directory, a training run directory (meta.json) "
        "or a verl checkpoint (checkpoints/global_step_N)"
    )


EXPORT_RECORD = "export.json"  # in the run directory: where final/ came from


def last_checkpoint(run_dir: Path) -> Checkpoint | None:
    """The run's last checkpoint: verl's `latest_checkpointed_iteration.txt` step where it names one, else the
    highest step saved."""
    ckpts = run_checkpoints(run_dir)
    try:
        latest = int((Path(run_dir) / CHECKPOINT_SUBDIR / "latest_checkpointed_iteration.txt").read_text().strip())
    except (OSError, ValueError):
        return ckpts[-1] if ckpts else None
    return next((c for c in ckpts if c.step == latest), None)


def export_final(run_dir: Path) -> str | None:
    """Make the run's `final/` from its last checkpoint (verl's FSDP shards merged and checked against them, or a
    Hugging Face checkpoint linked) and record it in `export.json`; returns None, or one line saying why the run
    has no usable final model."""
    run_dir = Path(run_dir)
    last = last_checkpoint(run_dir)
    if last is None:
        return f"no checkpoint under {run_dir / CHECKPOINT_SUBDIR} to make {run_dir / FINAL_SUBDIR} from"
    final = run_dir / FINAL_SUBDIR
    started = time.perf_counter()
    try:
        if last.kind == "verl":
            merge_verl_actor(last.path, final)
        else:
            problem = weights_problem(last.path)
            if problem:
                return problem
            link_tree(last.path, final)
    except UserError as err:
        return str(err)
    seconds = time.perf_counter() - started
    size = sum(p.stat().st_size for p in weight_files(final))
    record = {
        "final": FINAL_SUBDIR,
        "from": os.path.relpath(last.path, run_dir),
        "step": last.step,
        "how": "verl model merger (bfloat16), checked against the shards" if last.kind == "verl" else "linked",
        "seconds": round(seconds, 2),
        "weight_bytes": size,
    }
    (run_dir / EXPORT_RECORD).write_text(json.dumps(record, indent=2))
    log.info(
        "final model: %s (step %d, %s; %.1f MB of weights, %.1f s)",
        final,
        last.step,
        record["how"],
        size / 1e6,
        seconds,
    )
    return None


def exported_step(run_dir: Path) -> int | None:
    """The step whose checkpoint `final/` was made from (export.json), or None."""
    try:
        return int(json.loads((Path(run_dir) / EXPORT_RECORD).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def evaluate_hint(run_dir: Path, tiny_policy: bool) -> str:
    """The command that evaluates a finished run, as the run's last line says it: the smoke protocol for the tiny
    policy a CPU run trains (offline, shipped prompts), else the paper's protocol (docs/reproduce.md names it)."""
    if tiny_policy:
        return f"evaluate it: python -m eval.run ckpt={run_dir} protocol=smoke"
    return (
        f"evaluate it: python -m eval.run ckpt={run_dir} protocol=P [select=paper] (P: the table's, docs/reproduce.md)"
    )
