"""algorithm=sft: TRL's SFTTrainer on CPU (loss on completion tokens only, checkpoints, metrics.jsonl) and verl's
SFT trainer config (validated against verl's schema and dataset here; run on GPU)."""

import json
import math
from pathlib import Path

import pytest
import yaml

from sarl.launch.compose import compose_train_config
from sarl.runtime.errors import UserError
from sarl.train import main

pytest.importorskip("trl")

REPO = Path(__file__).resolve().parents[3]
FIXTURE = REPO / "tests" / "fixtures" / "sft" / "tiny.jsonl"


def sft_overrides(root, policy, *extra):
    return [
        "+exp=smoke",
        "algorithm=sft",
        "data=sft_grp_math",
        f"data.sft_files={FIXTURE}",
        "logger=none",
        f"paths.root={root}",
        f"model.path={policy}",
        "train.train_batch_size=2",
        "train.micro_batch_size_per_gpu=2",
        *extra,
    ]


def test_sft_rows_read_prompt_completion_and_messages_and_name_bad_lines(tmp_path):
    from sarl.data.sft import sft_rows

    rows = sft_rows(FIXTURE)
    assert len(rows) == 6
    messages_row = rows[3]  # {"messages": [user, assistant]}: split before the last message
    assert [m["role"] for m in messages_row["prompt"]] == ["user"]
    assert messages_row["completion"][0]["content"].endswith("\\boxed{33}.")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(FIXTURE.read_text().splitlines()[0] + '\n{"prompt": "text", "completion": []}\n')
    with pytest.raises(UserError, match=r"bad.jsonl:2: 'prompt' must be a non-empty list"):
        sft_rows(bad)
    bad.write_text('{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}\n')
    with pytest.raises(UserError, match="must be an assistant turn"):
        sft_rows(bad)


def test_sft_pairs_only_with_sft_data():
    from sarl.train import check_supported

    cfg, choices = compose_train_config(["+exp=smoke", "algorithm=sft"])  # data=smoke: prompts, no traces
    with pytest.raises(UserError, match="SFT data group"):
        check_supported(cfg, choices)
    cfg, choices = compose_train_config(["+exp=smoke", "data=sft_smoke"])  # GRPO on traces
    with pytest.raises(UserError, match="pick matching groups"):
        check_supported(cfg, choices)


def test_trl_sft_loss_is_the_mean_cross_entropy_over_completion_tokens_only(tmp_path, chat_policy_dir):
    """The trainer's loss on one collated batch equals a manual token-mean cross-entropy over the completion
    tokens (prompt tokens excluded), and differs from the loss over the whole sequence."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTTrainer

    from sarl.backends.trl.sft import sft_args, sft_dataset
    from sarl.data.sft import sft_rows

    cfg, _ = compose_train_config(sft_overrides(tmp_path, chat_policy_dir))
    tok = AutoTokenizer.from_pretrained(chat_policy_dir)
    model = AutoModelForCausalLM.from_pretrained(chat_policy_dir, dtype=torch.float32)
    trainer = SFTTrainer(
        model=model, args=sft_args(cfg, tmp_path), train_dataset=sft_dataset(cfg, tok), processing_class=tok
    )
    examples = [trainer.train_dataset[i] for i in range(3)]
    batch = trainer.data_collator(examples)
    model.eval()
    with torch.no_grad():
        got = trainer.compute_loss(model, dict(batch)).item()

    total, n_tokens, total_all, n_all = 0.0, 0, 0.0, 0
    for row in sft_rows(FIXTURE)[:3]:
        p = tok.apply_chat_template(row["prompt"], tokenize=True, add_generation_prompt=True)
        full = tok.apply_chat_template(row["prompt"] + row["completion"], tokenize=True)
        p, full = (x["input_ids"] if hasattr(x, "keys") else x for x in (p, full))
        assert full[: len(p)] == p  # the completion starts right after the prompt
        with torch.no_grad():
            logits = model(torch.tensor([full])).logits[0]
        logp = torch.log_softmax(logits[:-1].float(), dim=-1)
        nll = -logp[torch.arange(len(full) - 1), torch.tensor(full[1:])]  # nll[i] predicts token i + 1
        total += nll[len(p) - 1 :].sum().item()  # targets full[len(p):]: the completion tokens
        n_tokens += len(full) - len(p)
        total_all += nll.sum().item()
        n_all += len(full) - 1
    assert got == pytest.approx(total / n_tokens, rel=1e-4)
    assert not math.isclose(got, total_all / n_all, rel_tol=1e-3)


def test_trl_sft_run_writes_checkpoints_final_model_and_metrics(tmp_path, chat_policy_dir):
    run_dir = tmp_path / "run"
    rc = main(
        sft_overrides(tmp_path, chat_policy_dir, "backend.max_steps=3", "train.save_freq=2", f"run_dir={run_dir}")
    )
    assert rc == 0
    assert (run_dir / "checkpoints" / "checkpoint-2" / "trainer_state.json").exists()
    assert (run_dir / "final" / "model.safetensors").exists() and (run_dir / "final" / "tokenizer.json").exists()
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if "loss" in r]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3] and all(math.isfinite(x) for x in losses)
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 3
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["algorithm"]["name"] == "sft"


def test_trl_sft_arguments_map_the_train_keys(tmp_path):
    from sarl.backends.trl.sft import sft_args

    cfg, _ = compose_train_config(
        [
            "+exp=smoke",
            "algorithm=sft",
            "data=sft_smoke",
            "train.train_batch_size=16",
            "train.micro_batch_size_per_gpu=4",
            "train.weight_decay=1e-4",
            "algorithm.packing=true",
            "train.lr_schedule=cosine",
            "train.min_lr_ratio=0.1",
        ]
    )
    args = sft_args(cfg, tmp_path)
    assert args.per_device_train_batch_size == 4 and args.gradient_accumulation_steps == 4
    assert args.completion_only_loss is True and args.packing is True
    assert args.max_length == 128 + 192  # train.max_prompt_length + data.max_response_length
    assert args.weight_decay == 1e-4 and args.lr_scheduler_type == "cosine_with_min_lr"
    assert args.save_strategy == "steps"
    cfg, _ = compose_train_config(
        ["+exp=smoke", "algorithm=sft", "data=sft_smoke", "train.save_freq=-1", "train.micro_batch_size_per_gpu=4"]
    )
    assert sft_args(cfg, tmp_path).save_strategy == "no"  # the final model only
    cfg, _ = compose_train_config(
        [
            "+exp=smoke",
            "algorithm=sft",
            "data=sft_smoke",
            "train.train_batch_size=6",
            "train.micro_batch_size_per_gpu=4",
        ]
    )
    with pytest.raises(UserError, match="multiple of"):
        sft_args(cfg, tmp_path)


def test_overlong_trace_stops_the_run_naming_it_or_is_cut(tmp_path, chat_policy_dir):
    from transformers import AutoTokenizer

    from sarl.backends.trl.sft import sft_dataset

    tok = AutoTokenizer.from_pretrained(chat_policy_dir)
    cfg, _ = compose_train_config(sft_overrides(tmp_path, chat_policy_dir, "algorithm.max_length=20"))
    with pytest.raises(UserError, match=r"6 traces .* exceed algorithm.max_length=20"):
        sft_dataset(cfg, tok)
    cfg, _ = compose_train_config(
        sft_overrides(tmp_path, chat_policy_dir, "algorithm.max_length=20", "algorithm.truncation=right")
    )
    assert len(sft_dataset(cfg, tok)) == 6


# -- verl --------------------------------------------------------------------------------------


def test_verl_sft_config_passes_verls_schema_and_its_dataset_masks_the_prompt(tmp_path, chat_policy_dir):
    pytest.importorskip("verl")
    from transformers import AutoTokenizer
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    from sarl.backends.verl.sft import build_verl_sft_config, validate_verl_sft_config, write_sft_parquet

    cfg, _ = compose_train_config(
        sft_overrides(
            tmp_path,
            chat_policy_dir,
            "backend=verl",
            "train.n_gpus_per_node=2",
            "train.weight_decay=1e-4",
            "train.actor_lr=1e-5",
            "train.lr_schedule=cosine",
            "train.total_epochs=2",
        )
    )
    v = build_verl_sft_config(cfg, str(tmp_path), "sft_test")
    validate_verl_sft_config(v)
    assert v.optim.lr == 1e-5 and v.optim.weight_decay == 1e-4 and v.optim.lr_scheduler_type == "cosine"
    assert v.trainer.total_epochs == 2 and v.data.train_batch_size == 2 and v.data.micro_batch_size_per_gpu == 2
    assert v.data.max_length == 128 + 8192 and v.data.pad_mode == "no_padding"
    assert list(v.trainer.logger) == ["console", "file"]  # logger=none; file: metrics.jsonl
    assert "hf_model" in v.checkpoint.save_contents and v.trainer.default_local_dir == f"{tmp_path}/checkpoints"
    parquet = write_sft_parquet(cfg, tmp_path)
    assert str(parquet) == v.data.train_files
    tok = AutoTokenizer.from_pretrained(chat_policy_dir)
    data = MultiTurnSFTDataset(parquet_files=str(parquet), tokenizer=tok, config=v.data)
    assert len(data) == 6
    item = data[0]
    ids, mask = item["input_ids"].tolist(), item["loss_mask"].tolist()
    row = json.loads(FIXTURE.read_text().splitlines()[0])
    p = tok.apply_chat_template(row["prompt"], tokenize=True, add_generation_prompt=True)
    p = p["input_ids"] if hasattr(p, "keys") else p
    assert ids[: len(p)] == p and not any(mask[: len(p)])  # no loss on the prompt
    assert sum(mask) > 0 and all(mask[len(p) : len(p) + sum(mask)])  # loss on the response tokens


def test_verl_sft_dry_run_prints_the_config_and_a_torchrun_command(tmp_path, chat_policy_dir, capsys):
    pytest.importorskip("verl")
    rc = main(
        sft_overrides(
            tmp_path,
            chat_policy_dir,
            "backend=verl",
            "train.n_gpus_per_node=2",
            "train.dry_run=true",
            f"run_dir={tmp_path / 'r'}",
        )
    )
    assert rc == 0
    out, err = capsys.readouterr()
    printed = yaml.safe_load(out)
    assert printed["model"]["path"] == chat_policy_dir
    command = err.strip().splitlines()[-1]
    assert "torch.distributed.run --standalone --nnodes=1 --nproc_per_node=2 -m verl.trainer.sft_trainer" in command
    assert f"--config-path {tmp_path / 'r'} --config-name verl_sft_trainer" in command
    assert main(sft_overrides(tmp_path, chat_policy_dir, "backend=verl", "train.nnodes=2", "train.dry_run=true")) == 2
    assert (
        main(
            sft_overrides(
                tmp_path,
                chat_policy_dir,
                "backend=verl",
                "train.n_gpus_per_node=4",
                "train.train_batch_size=6",
                "train.dry_run=true",
            )
        )
        == 2
    )
