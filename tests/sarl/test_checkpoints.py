"""sarl.runtime.checkpoints and eval.select: what `eval.run ckpt=` accepts, verl's shards merged into a model that is
checked against them (a tampered, missing or extra tensor is named), and the papers' checkpoint-selection rules."""

import json
import os

import pytest
from testkit import run_module, tiny_qwen3

from eval.select import held_out_score, pick
from sarl.launch.pipeline import model_chain
from sarl.runtime.checkpoints import (
    export_final,
    export_problem,
    merge_verl_actor,
    resolve_checkpoint,
    run_checkpoints,
)
from sarl.runtime.errors import UserError

torch = pytest.importorskip("torch")


@pytest.fixture
def tokenizer(byte_tokenizer):
    return byte_tokenizer


def verl_actor(folder, tokenizer, *, tie: bool = True, seed: int = 0):
    """A verl FSDP actor checkpoint of one rank as verl writes it: the model shard (every tensor, the tied LM head
    included), fsdp_config.json and `huggingface/` with the config and tokenizer but no weights."""
    model = tiny_qwen3(tokenizer, weights=True, seed=seed, tie_word_embeddings=tie)
    folder.mkdir(parents=True)
    state = dict(model.state_dict())
    if tie:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    torch.save(state, folder / "model_world_size_1_rank_0.pt")
    (folder / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": 1}))
    model.config.architectures = ["Qwen3ForCausalLM"]
    model.config.save_pretrained(folder / "huggingface")
    tokenizer.save_pretrained(folder / "huggingface")
    return state


def verl_run(root, tokenizer, steps=(1, 2)):
    """A verl RL run directory: meta.json and one actor checkpoint per step, the last named by verl's tracker."""
    root.mkdir(parents=True)
    (root / "meta.json").write_text(json.dumps({"experiment": "grpo_gt_math"}))
    for step in steps:
        verl_actor(root / "checkpoints" / f"global_step_{step}" / "actor", tokenizer, seed=step)
    (root / "checkpoints" / "latest_checkpointed_iteration.txt").write_text(str(steps[-1]))
    return root


def test_a_merged_model_holds_exactly_the_trained_tensors(tmp_path, tokenizer):
    from safetensors.torch import load_file, save_file

    actor = tmp_path / "actor"
    trained = verl_actor(actor, tokenizer)
    target = merge_verl_actor(actor, tmp_path / "merged")
    saved = load_file(target / "model.safetensors")
    assert "lm_head.weight" not in saved  # tied: saved once, as the embedding
    for name, tensor in saved.items():
        assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, trained[name].to(torch.bfloat16))
    assert export_problem(actor, target) is None
    assert not (tmp_path / ".merged.merging").exists()  # written beside and renamed into place
    umask = os.umask(0)
    os.umask(umask)
    assert (target / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask  # not transformers' 0600
    # a changed tensor, a lost one and a foreign one are each named
    name = "model.layers.0.mlp.up_proj.weight"
    for change, said in (
        (lambda s: s.__setitem__(name, s[name] + 1), f"{name} differs from the trained tensor"),
        (lambda s: s.pop(name), "1 of 25 trained tensors are not saved, e.g. " + name),
        (lambda s: s.__setitem__("extra.weight", s[name].clone()), "extra.weight is saved but is not a tensor"),
    ):
        state = dict(saved)
        change(state)
        save_file(state, target / "model.safetensors", metadata={"format": "pt"})
        assert said in (export_problem(actor, target) or ""), export_problem(actor, target)


def test_an_untied_head_must_be_saved(tmp_path, tokenizer):
    from safetensors.torch import load_file, save_file

    actor = tmp_path / "actor"
    verl_actor(actor, tokenizer, tie=False)
    target = merge_verl_actor(actor, tmp_path / "merged")
    assert export_problem(actor, target) is None
    state = load_file(target / "model.safetensors")
    state.pop("lm_head.weight")
    save_file(state, target / "model.safetensors", metadata={"format": "pt"})
    assert "lm_head.weight" in export_problem(actor, target)


def test_a_checkpoint_that_cannot_be_merged_is_one_line(tmp_path, tokenizer):
    actor = tmp_path / "actor"
    verl_actor(actor, tokenizer)
    (actor / "model_world_size_1_rank_0.pt").write_bytes(b"not a torch archive")
    with pytest.raises(UserError, match="verl's model merger failed"):
        merge_verl_actor(actor, tmp_path / "merged")
    assert not (tmp_path / "merged").exists() and not (tmp_path / ".merged.merging").exists()
    verl_actor(tmp_path / "ok", tokenizer)
    merged = merge_verl_actor(tmp_path / "ok", tmp_path / "ok_merged")
    (actor / "model_world_size_1_rank_0.pt").unlink()
    with pytest.raises(UserError, match="has no model shards"):  # checked against a checkpoint without its shards
        export_problem(actor, merged)


def test_what_eval_run_accepts_as_ckpt(tmp_path, tokenizer):
    run = verl_run(tmp_path / "run", tokenizer)
    with pytest.raises(UserError, match=r"without a model in .*final \(did the run finish\?\).*global_step_2"):
        resolve_checkpoint(run)
    assert export_final(run) is None
    record = json.loads((run / "export.json").read_text())
    assert record["step"] == 2 and record["from"] == "checkpoints/global_step_2/actor"
    assert resolve_checkpoint(run) == (
        run / "final",
        f"{run} is a run directory: evaluating its final model {run / 'final'}",
    )
    assert resolve_checkpoint(run / "final") == (run / "final", None)  # a Hugging Face directory, as it is
    # a verl checkpoint by any of its folders: merged into actor/huggingface/ on first use, found there after
    step1 = run / "checkpoints" / "global_step_1"
    model, said = resolve_checkpoint(step1 / "actor" / "huggingface")
    assert model == step1 / "actor" / "huggingface" and "merged by verl's model merger into" in said
    assert export_problem(step1 / "actor", model) is None
    assert "merged earlier into" in resolve_checkpoint(step1)[1]
    assert [(c.step, c.kind) for c in run_checkpoints(run)] == [(1, "verl"), (2, "verl")]
    # a folder with a config and no weights, a pipeline of separate runs, one that trains one model
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text("{}")
    with pytest.raises(UserError, match="has a config.json but no model weights"):
        resolve_checkpoint(tmp_path / "cfg")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="has no config.json: not a Hugging Face checkpoint directory, a training run"):
        resolve_checkpoint(tmp_path / "empty")
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    (pipe / "pipeline.json").write_text(json.dumps({"stages": {"SARL": "a", "TTRL": "b"}}))
    with pytest.raises(UserError, match=r"a pipeline of 2 separate runs \(SARL, TTRL\); evaluate one of them"):
        resolve_checkpoint(pipe)
    (pipe / "pipeline.json").write_text(json.dumps({"stages": {"sft": "a", "rl": "b"}, "final_stage": "rl"}))
    (pipe / "rl").mkdir()
    (run / "final").rename(pipe / "rl" / "final")
    assert resolve_checkpoint(pipe)[0] == pipe / "rl" / "final"
    assert resolve_checkpoint("Qwen/Qwen3-4B") == (__import__("pathlib").Path("Qwen/Qwen3-4B"), None)  # the Hub's


def test_eval_runs_settings_check_lets_a_run_directory_through_to_its_resolution(tmp_path, tokenizer):
    """eval.run checks its settings before it resolves the checkpoint; a run directory or a verl checkpoint has no
    config.json of its own and must pass that check (the clean-clone run of cb0c466 failed every chain on it)."""
    from eval.config import compose_eval_config
    from eval.protocol import check_eval_config

    run = verl_run(tmp_path / "run", tokenizer, steps=(2,))
    for ckpt in (run, run / "checkpoints" / "global_step_2"):
        check_eval_config(compose_eval_config([f"ckpt={ckpt}", "protocol=smoke", f"cache_dir={tmp_path / 'c'}"]))
    with pytest.raises(UserError, match="is not a directory"):  # a local path that does not exist: still refused
        check_eval_config(compose_eval_config([f"ckpt={tmp_path / 'nope'}", f"cache_dir={tmp_path / 'c'}"]))


def test_eval_run_says_what_is_wrong_with_a_checkpoint_in_one_line(tmp_path):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")  # verl's actor/huggingface/ outside a checkpoint
    for args, said in (
        ([f"ckpt={tmp_path / 'hf'}", "protocol=smoke"], "has a config.json but no model weights"),
        (
            [f"ckpt={tmp_path}", "protocol=smoke", "select=bestest"],
            "select='bestest'; choose one of: best, last, paper",
        ),
        ([f"ckpt={tmp_path}", "protocol=smoke", "select=best"], "needs a training run directory"),
        ([f"ckpt={tmp_path}", "protocol=structured_temperature", "select=best"], "names no held-out set"),
    ):
        proc = run_module("eval.run", *args, "logger=none", f"paths.root={tmp_path}")
        assert proc.returncode == 2 and said in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_the_selection_rules():
    scores = {100: 30.0, 200: 42.5, 300: 42.5, 400: None, 500: 40.0}
    assert pick("best", scores) == 200  # the best held-out score, the earlier step on a tie
    assert pick("last", scores) == 500
    with pytest.raises(UserError, match="no checkpoint has a held-out score"):
        pick("best", {1: None})
    results = {"math": {"benchmarks": {"aime25": {"avg_at_k": 10.0}, "amc23": {"avg_at_k": 30.0}}}}
    assert held_out_score(results) == 20.0 and held_out_score({"math": None}) is None


def test_a_pipeline_trains_one_model_when_every_stage_leads_to_the_last():
    sft_rl = [{"name": "sft", "init_from": None}, {"name": "rl", "init_from": "sft"}]
    separate = [{"name": "SARL", "init_from": None}, {"name": "TTRL", "init_from": None}]
    assert model_chain(sft_rl) == "rl" and model_chain(separate) is None
