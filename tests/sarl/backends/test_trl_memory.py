"""DPO over the GPUs of a node on TRL (`dpo_open`, decisions §7.5): the memory plan on Qwen3-4B's real config.json
(docs/gpu.md "DPO on TRL"), the dry run (bf16, gradient checkpointing, FSDP, the torchrun command), the checks that
refuse a plan that does not fit, the single-process rows unchanged, and the multi-process launch on CPU, sharded
by FSDP2 over gloo."""

import json
import logging
from pathlib import Path

import pytest
import yaml
from testkit import smoke_small

from sarl import preflight
from sarl.backends.trl import distributed
from sarl.backends.trl import memory as trl_memory
from sarl.backends.trl import preflight as trl_preflight
from sarl.backends.trl.metrics import read_metrics
from sarl.backends.trl.run import dry_run_config, unsupported
from sarl.launch.compose import compose_train_config
from sarl.runtime.checks import PreflightError, raise_failed
from sarl.runtime.memory import GIB
from sarl.train import main

pytest.importorskip("trl")

QWEN3_4B = Path(__file__).resolve().parents[2] / "fixtures" / "models" / "qwen3_4b"
N_4B = 4_022_468_096
H100 = 79.6  # GiB
TOKENS = 2 * 4 * (1024 + 4096)  # dpo_open: 4 pairs x (chosen + rejected) of at most 5,120 tokens


def sizes():
    return trl_memory.Sizes.of(json.loads((QWEN3_4B / "config.json").read_text()))


def dpo_open(*extra):
    cfg, _ = compose_train_config(["+exp=dpo_open", f"model.path={QWEN3_4B}", "logger=none", *extra])
    return cfg


# -- the plan ------------------------------------------------------------------------------


def test_qwen3_4b_sizes_from_its_config():
    s = sizes()
    assert s.params == N_4B and s.layers == 36 and s.hidden == 2560
    # one decoder layer: q 2560x4096, k and v 2560x1024, o 4096x2560, gate/up/down 3 x 2560x9728, 4 norms
    assert s.layer_params == 2560 * 4096 * 2 + 2560 * 1024 * 2 + 3 * 2560 * 9728 + 2 * 128 + 2 * 2560 == 100_930_816
    assert s.head == 151_936 * 2560
    # per token: 2 RMSNorms in and out (4h) + q, k, normed q and k, v, attention output (3q + 3kv) + SwiGLU (4i)
    assert s.per_token_layer == 4 * 2560 + 3 * 4096 + 3 * 1024 + 4 * 9728 == 64_512


def test_dpo_open_plan_is_gpu_md_s_table():
    """docs/gpu.md "DPO on TRL": 8 x H100, 4 pairs per micro-batch, bf16, gradient checkpointing."""
    plan = trl_memory.dpo_memory_plan(sizes(), trl_memory.setting(dpo_open()), H100)
    items = {i.name: i.gib for p in plan.phases for i in p.items}
    worked = {
        "policy parameters": 4 * N_4B / 8,  # float32 master shard
        "policy gradients": 4 * N_4B / 8,
        "AdamW moments": 8 * N_4B / 8,
        "reference parameters": 2 * N_4B / 8,  # bf16 shard
        "stored activations": 37 * TOKENS * 2560 * 2,  # 36 layer inputs + the LM head's input, bf16
        "gathered LM head": 151_936 * 2560 * 2,
        "gathered layers": 2 * 100_930_816 * 2,
        "reference gathered": 2 * N_4B,  # one FSDP unit: gathered whole
        "reference layer": TOKENS * 64_512 * 2,
        "layer backward": 2 * TOKENS * 64_512 * 2,
        "LM head gradient": 151_936 * 2560 * 4,  # float32
        "CUDA context": 0.5 * GIB,
        # one NCCL communicator on 8 GPUs: 32 channels x (ring 1 + tree 2) x (Simple 4 MiB + LL128 + LL) + NVLS
        "NCCL buffers": 32 * 3 * (4 * 2**20 + 4_915_200 + 524_288) + 32 * 2**20 * 8,
    }
    assert items == pytest.approx({k: v / GIB for k, v in worked.items()})
    assert items["NCCL buffers"] == pytest.approx(1.11, abs=0.005)
    assert [(p.name, round(p.gib, 1)) for p in plan.phases] == [
        ("policy forward", 18.4),
        ("reference forward", 30.4),
        ("policy backward", 29.7),
    ]
    assert plan.ok and plan.peak.name == "reference forward" and round(plan.fraction, 2) == 0.38


@pytest.mark.parametrize(
    "gpus, micro, gib, ok",
    [(1, 1, 79.0, False), (1, 4, 93.5, False), (2, 4, 55.4, True), (4, 4, 38.7, True), (8, 8, 46.7, True)],
)
def test_how_many_gpus_it_needs(gpus, micro, gib, ok):
    """docs/gpu.md: one GPU never fits (float32 state 60 GiB + bf16 reference + autocast's bf16 copy); two do."""
    s = trl_memory.Setting(world=gpus, fsdp=True, micro_pairs=micro, max_length=5120, bf16=True, checkpointing=True)
    plan = trl_memory.dpo_memory_plan(sizes(), s, H100)
    assert (round(plan.peak.gib, 1), plan.ok) == (gib, ok)
    one = trl_memory.dpo_memory_plan(sizes(), trl_memory.Setting(1, True, 1, 5120, True, True), H100)
    assert one.phase("policy forward").items[-2].name == "autocast weight cache"


def test_the_fixes_name_the_single_changes_that_fit():
    s = sizes()
    fp32_one_gpu = trl_memory.setting(dpo_open("train.n_gpus_per_node=1", "backend.bf16=false"))
    assert trl_memory.fixes(s, fp32_one_gpu, H100) == ["train.n_gpus_per_node=3"]
    single = trl_memory.setting(dpo_open("backend.distributed=null"))
    assert trl_memory.fixes(s, single, H100) == ["backend.distributed=fsdp train.n_gpus_per_node=2"]
    eight_big = trl_memory.setting(dpo_open("train.micro_batch_size_per_gpu=32"))
    assert trl_memory.fixes(s, eight_big, H100) == ["train.micro_batch_size_per_gpu=13"]
    # the row as it was: float32, no checkpointing, 32 pairs, one process: no single change is enough
    was = trl_memory.Setting(1, False, 32, 5120, False, False)
    assert round(trl_memory.dpo_memory_plan(s, was, H100).peak.gib) == 2994 and trl_memory.fixes(s, was, H100) == []


# -- the dry run ---------------------------------------------------------------------------


def test_dpo_opens_fsdp_settings_take_effect_in_accelerates_plugin(monkeypatch, tmp_path):
    """What the Trainer hands accelerate under the installed transformers (the GPU node's 5.9.0, requirements/
    cpu.lock): the plugin built from `args.fsdp_plugin_args` as trainer.py builds it wraps each decoder layer, is
    FSDP2 with full resharding and saves whole models. Under 5.9.0, `fsdp: true` with the same fsdp_config gave no
    wrapping (each rank held the whole model) and sharded checkpoints (final/ without weights)."""
    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch.distributed.fsdp import StateDictType
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    from sarl.backends.trl.run import bf16_as_on_the_gpu_node, trainer_args

    cfg = dpo_open()
    monkeypatch.delenv("FSDP_STATE_DICT_TYPE", raising=False)
    for key, value in distributed.fsdp_environment(cfg).items():
        monkeypatch.setenv(key, value)
    with bf16_as_on_the_gpu_node(cfg):
        args = trainer_args(cfg, tmp_path)
    plugin = FullyShardedDataParallelPlugin(**args.fsdp_plugin_args)
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is True
    assert plugin.auto_wrap_policy is transformer_auto_wrap_policy
    assert plugin.state_dict_type == StateDictType.FULL_STATE_DICT
    # the same arguments without the environment: the plugin falls back to FSDP2's sharded checkpoints
    monkeypatch.delenv("FSDP_STATE_DICT_TYPE")
    assert FullyShardedDataParallelPlugin(**args.fsdp_plugin_args).state_dict_type != StateDictType.FULL_STATE_DICT


def test_dpo_open_dry_run_shows_bf16_checkpointing_fsdp_and_the_torchrun_command(capsys, tmp_path):
    run = tmp_path / "run"
    assert main(["+exp=dpo_open", "train.dry_run=true", f"run_dir={run}"]) == 0
    out, err = capsys.readouterr()
    printed = yaml.safe_load(out)
    args = printed["args"]
    assert printed["trainer"] == "DPOTrainer" and printed["model"] == "Qwen/Qwen3-4B"
    assert args["bf16"] is True and args["gradient_checkpointing"] is True and args["use_cpu"] is False
    assert args["fsdp"] == ["full_shard", "auto_wrap"]
    fsdp = args["fsdp_config"]
    assert fsdp["version"] == 2 and fsdp["reshard_after_forward"] is True
    assert fsdp["auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP" and fsdp["state_dict_type"] == "FULL_STATE_DICT"
    # 256 pairs per optimiser step (SARL Table 7's mini batch) = 4 pairs x 8 GPUs x 8 accumulation steps
    assert args["per_device_train_batch_size"] == 4 and args["gradient_accumulation_steps"] == 8
    assert args["precompute_ref_log_probs"] is False and args["max_length"] == 5120  # decisions §7.5
    launch = printed["launch"]
    assert launch["processes"] == 8
    assert launch["torchrun"] == [
        "--standalone",
        "--nnodes=1",
        "--nproc_per_node=8",
        "-m",
        "sarl.backends.trl.worker",
        str(run),
    ]
    first, note, second = err.strip().splitlines()[-3:]
    assert "-m sarl.train +exp=dpo_open" in first and first.count("run_dir=") == 1
    assert note == f"# dry run: nothing written; a real run writes {run / 'config.yaml'} and runs:"
    assert "torch.distributed.run" in second and "--nproc_per_node=8" in second
    assert not run.exists()  # a dry run writes nothing


def test_single_process_rows_are_unchanged(tmp_path):
    for row in ("smoke", "smoke_compare", "smoke_pipeline"):
        cfg, _ = compose_train_config([f"+exp={row}"])
        assert distributed.processes(cfg) == 1 and distributed.fsdp_args(cfg) == {}
        assert not trl_memory.planned(cfg)  # a policy built on this machine trains on the CPU
        raise_failed(trl_preflight.trl_cheap_checks(cfg))  # nothing to refuse
    cfg, _ = compose_train_config(["+exp=smoke"])
    printed = dry_run_config(cfg, tmp_path)
    assert "launch" not in printed
    assert printed["args"]["fsdp"] in (None, []) and printed["args"]["bf16"] is False  # no FSDP (5.9 prints [])
    assert printed["args"]["gradient_checkpointing"] is False
    one = dpo_open("backend.distributed=null", "backend.bf16=false", "backend.gradient_checkpointing=false")
    assert distributed.processes(one) == 1 and "launch" not in dry_run_config(one, tmp_path)


# -- the checks ----------------------------------------------------------------------------


def test_the_preflight_accepts_dpo_open_and_refuses_one_float32_gpu():
    (ok,) = trl_memory.check_trl_memory_plan(dpo_open(), H100, "backend.gpu_memory_gib")
    assert ok.ok and "8 GPU(s), 4 pairs per micro-batch: 30.4 of 79.6 GiB (38%)" in ok.detail
    (bad,) = trl_memory.check_trl_memory_plan(
        dpo_open("train.n_gpus_per_node=1", "backend.bf16=false"), H100, "backend.gpu_memory_gib"
    )
    assert not bad.ok and "111.0 of 79.6 GiB (139%)" in bad.detail and bad.fix == "set train.n_gpus_per_node=3"
    checks = {c.name: c for c in trl_preflight.trl_preflight(dpo_open("train.n_gpus_per_node=1", "backend.bf16=false"))}
    assert not checks["memory plan"].ok and checks["TRL config"].ok and checks["models"].ok
    missing = dpo_open("model.path=/nowhere")
    assert not trl_memory.check_trl_memory_plan(missing, H100, "x")[0].ok
    assert trl_memory.check_trl_memory_plan(missing, H100, "x", skip_missing=True) == []


def test_the_preflight_command_checks_a_trl_row(capsys):
    """`python -m sarl.preflight +exp=dpo_open`: the table of the TRL checks, exit 1 when one fails (as for verl)."""
    argv = ["+exp=dpo_open", f"model.path={QWEN3_4B}", "logger=none", "train.n_gpus_per_node=1", "backend.bf16=false"]
    assert preflight.main(argv) == 1
    out = capsys.readouterr().out
    assert "memory plan" in out and "train.n_gpus_per_node=3" in out and "TRL config" in out


def test_sarl_train_refuses_a_plan_that_does_not_fit_in_one_line(tmp_path, caplog):
    argv = ["+exp=dpo_open", f"model.path={QWEN3_4B}", "logger=none", f"run_dir={tmp_path / 'run'}"]
    with caplog.at_level(logging.ERROR, logger="sarl.train"):
        assert main([*argv, "train.n_gpus_per_node=1", "backend.bf16=false"]) == 2
    (line,) = [r.getMessage() for r in caplog.records if r.name == "sarl.train"]
    assert line.startswith("memory plan: 1 GPU(s)") and line.endswith("-> set train.n_gpus_per_node=3")
    assert not (tmp_path / "run").exists()  # refused before anything is written
    with pytest.raises(PreflightError, match="memory plan"):
        raise_failed(trl_preflight.trl_cheap_checks(dpo_open("train.micro_batch_size_per_gpu=32")))


def test_the_processes_need_their_gpus(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    (gpus,) = distributed.check_devices(dpo_open())
    assert "train.n_gpus_per_node=8 processes" in gpus.detail and gpus.fix.endswith("train.n_gpus_per_node=2")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    (cpu,) = distributed.check_devices(dpo_open("backend.distributed=null"))
    assert "backend.bf16=true" in cpu.detail and "backend.bf16=false" in cpu.fix
    assert distributed.check_devices(dpo_open("backend.use_cpu=true")) == []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # FSDP2 on the CPU: its mesh would take the GPU
    (hidden,) = distributed.check_devices(dpo_open("backend.use_cpu=true"))
    assert "FSDP2 would shard onto GPU 0" in hidden.detail and "CUDA_VISIBLE_DEVICES=" in hidden.fix
    assert distributed.check_devices(dpo_open("backend.use_cpu=true", "backend.distributed=null")) == []


def test_fsdp_on_the_cpu_is_on_only_for_a_cpu_run_of_several_processes():
    """A GPU run's accelerate state is accelerate's own; a CPU run of several processes gets FSDP as on a GPU."""
    from accelerate.state import AcceleratorState

    own = AcceleratorState.__init__
    for cfg in (dpo_open(), dpo_open("backend.use_cpu=true", "backend.distributed=null")):
        with distributed.fsdp_on_the_cpu(cfg):
            assert AcceleratorState.__init__ is own
    with distributed.fsdp_on_the_cpu(dpo_open("backend.use_cpu=true")):
        assert AcceleratorState.__init__ is not own
    assert AcceleratorState.__init__ is own


def test_a_rank_that_fsdp_did_not_shard_stops_the_run(tmp_path):
    """The rank's record of a model as DDP leaves it (every parameter whole) or with unwrapped layers names what did
    not take effect, and a Trainer whose accelerator has no FSDP stops before training: never DDP instead."""
    import types

    import torch
    from accelerate.utils import DistributedType

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    whole = distributed.sharding(model, ["Linear"])
    assert whole["local_numel"] == whole["numel"] == 30 and whole["layers"] == 2 and whole["layers_sharded"] == 0
    record = {"distributed_type": "MULTI_CPU", "auto_wrap_policy": None, "policy": whole}
    assert distributed.sharding_problem(record) == "accelerate's state is MULTI_CPU, not FSDP"
    record["distributed_type"] = "FSDP"
    assert distributed.sharding_problem(record) == "the policy's parameters are not sharded (30 of 30 here)"
    sharded = {**whole, "dtensor_params": 4, "local_numel": 15}
    record.update(policy=sharded, auto_wrap_policy="transformer_auto_wrap_policy")
    assert distributed.sharding_problem(record) == "0 of the 2 decoder layers are FSDP units of their own"
    assert distributed.sharding_problem({**record, "policy": {**sharded, "layers_sharded": 2}}) is None
    ddp = types.SimpleNamespace(
        is_fsdp_enabled=False,
        accelerator=types.SimpleNamespace(state=types.SimpleNamespace(distributed_type=DistributedType.MULTI_CPU)),
    )
    with pytest.raises(distributed.ShardingNotInEffect, match="state is MULTI_CPU, not FSDP"):
        distributed.watch_sharding(ddp, dpo_open("backend.use_cpu=true"), tmp_path)
    distributed.watch_sharding(ddp, dpo_open("backend.distributed=null"), tmp_path)  # one process: nothing to shard


def test_what_several_processes_refuse():
    assert unsupported(dpo_open()) is None
    assert "algorithm=dpo" in unsupported(dpo_open("algorithm=grpo", "reward=ground_truth"))
    assert "train.micro_batch_size_per_gpu x train.n_gpus_per_node = 3 x 8" in unsupported(
        dpo_open("train.micro_batch_size_per_gpu=3")
    )
    assert "null (one process) or fsdp" in unsupported(dpo_open("backend.distributed=deepspeed"))
    assert main(["+exp=dpo_open", "train.dry_run=true", "train.micro_batch_size_per_gpu=3"]) == 2


# -- several processes on the CPU ----------------------------------------------------------


@pytest.mark.slow
def test_dpo_over_two_processes_on_cpu_shards_with_fsdp2_and_writes_the_run_once(
    policy_cache, tmp_path, capfd, monkeypatch
):
    """dpo_open's launch path on 2 CPU processes with FSDP really on: torchrun in its own process group, each rank on
    the config the run wrote, accelerate's FSDP2 over gloo (`distributed.fsdp_on_the_cpu`: accelerate leaves FSDP
    off on the CPU by itself), the Trainer's FULL_STATE_DICT save. What each rank recorded once its models were
    prepared: an FSDP state, FSDP2, the transformer wrap policy with each decoder layer an FSDP unit of its own,
    bf16 parameters gathered from float32 shards, whole-model state dicts, and half of the policy's and of the
    reference's parameter elements held by each rank. Rank 0 writes metrics, `final/` and the summary; `final/`
    holds the whole model (the tied LM head once), checked tensor by tensor against the trained one, gathered once for
    the save and the check (sarl.runtime.weights)."""
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from sarl.runtime.weights import weights_problem

    run = tmp_path / "run"
    argv = [
        "+exp=smoke",
        "algorithm=dpo",
        "logger=none",
        "heldout=null",
        f"paths.root={tmp_path}",
        f"model.build.cache_dir={policy_cache}",
        *smoke_small(),
        "train.micro_batch_size_per_gpu=1",  # 2 pairs a step = 1 x 2 processes
        "backend.max_steps=2",
        "backend.distributed=fsdp",
        "train.n_gpus_per_node=2",
        "backend.use_cpu=true",
        "backend.bf16=true",
        "backend.gradient_checkpointing=true",
        f"run_dir={run}",
    ]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)  # on a GPU host too: the ranks see no GPU
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert main(argv) == 0
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2]  # one writer
    assert json.loads((run / "summary.json").read_text())["steps"] == 2
    written = yaml.safe_load((run / "config.yaml").read_text())
    assert written["model"]["path"]  # the policy was built once, before the ranks started
    records = [json.loads((run / "sharding" / f"rank-{r}.json").read_text()) for r in (0, 1)]
    layers = json.loads((Path(written["model"]["path"]) / "config.json").read_text())["num_hidden_layers"]
    for rank, record in enumerate(records):
        assert record["rank"] == rank and record["world_size"] == 2 and record["backend"] == "gloo"
        assert record["distributed_type"] == "FSDP" and record["fsdp_version"] == 2
        assert record["auto_wrap_policy"] == "transformer_auto_wrap_policy" and record["reshard_after_forward"]
        assert record["state_dict_type"] == "FULL_STATE_DICT" and record["param_dtype"] == "torch.bfloat16"
        policy, reference = record["policy"], record["reference"]
        assert policy["layers"] == policy["layers_sharded"] == layers  # each decoder layer its own FSDP unit
        assert policy["fsdp_units"]["Qwen3DecoderLayer"] == layers and policy["fsdp_units"]["Qwen3ForCausalLM"] == 1
        assert policy["dtensor_params"] == policy["params"] and policy["device"] == "cpu"
        assert reference["fsdp_units"] == {"Qwen3ForCausalLM": 1}  # TRL shards the reference as one unit
        for model in (policy, reference):
            assert model["local_numel"] == pytest.approx(model["numel"] / 2, rel=0.01)  # about half on each rank
    assert sum(r["policy"]["local_numel"] for r in records) == records[0]["policy"]["numel"]
    # final/: the whole model, which the run checked tensor by tensor against the trained one gathered from the
    # shards (sarl.runtime.weights), trained away from the starting policy
    assert f"{run / 'final'}: every saved tensor equals its trained one" in capfd.readouterr().err
    assert weights_problem(run / "final") is None and (run / "final" / "tokenizer.json").exists()
    saved = AutoModelForCausalLM.from_pretrained(run / "final")
    start = AutoModelForCausalLM.from_pretrained(written["model"]["path"])
    assert sum(p.numel() for p in saved.parameters()) == records[0]["policy"]["numel"]
    with safe_open(str(run / "final" / "model.safetensors"), framework="pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F32"}  # the float32 master weights, not bf16
        keys = set(f.keys())
    # the tied LM head saved once, as one process saves it (the gathered state held it as a second copy)
    assert "model.embed_tokens.weight" in keys and "lm_head.weight" not in keys
    assert saved.lm_head.weight.data_ptr() == saved.model.embed_tokens.weight.data_ptr()
    assert any(not torch.equal(a, b) for a, b in zip(saved.parameters(), start.parameters()))
