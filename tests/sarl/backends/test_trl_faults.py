"""backend=trl when rewards fail: failed completions carry no loss, a dead dependency or a run of fully
failed steps stops the run, an interrupted checkpoint is skipped on resume, failure totals survive it."""

import json
import logging
import shutil
import socket

import pytest
import torch
from testkit import smoke_small

from sarl.backends.trl.metrics import read_metrics
from sarl.backends.trl.rewards import TRLReward
from sarl.backends.trl.run import failed_rewards_before, grpo_args, prompt_dataset, resume_checkpoint
from sarl.contract.reward import RewardFunction, RewardOutput, RewardsFailedError
from sarl.launch.compose import compose_train_config
from sarl.smoke.policy import policy_path
from sarl.train import main

pytest.importorskip("trl")

FAST = [*smoke_small(48), "heldout=null"]  # no held-out evaluation (test_trl_backend.py checks it)


def smoke(root, cache, *extra):
    return ["+exp=smoke", "logger=none", f"paths.root={root}", f"model.build.cache_dir={cache}", *FAST, *extra]


class FailRows(RewardFunction):
    """Scores row i as i, except the rows in `fail`, which fail as if the embedding server had died."""

    def __init__(self, fail):
        super().__init__()
        self.fail = set(fail)

    def score(self, batch):
        return [
            RewardOutput(0.0, failed="embedding error: ConnectError: connection refused")
            if i in self.fail
            else RewardOutput(float(i))
            for i in range(len(batch))
        ]


# -- the reward adapter --------------------------------------------------------------------


def test_adapter_returns_none_for_a_failed_reward_and_stops_after_consecutive_fully_failed_steps():
    reward = FailRows(fail=set())
    fn = TRLReward(reward, num_generations=2, max_failed_steps=2)
    prompts = [[{"role": "user", "content": "p"}]] * 2
    done = [[{"role": "assistant", "content": "x"}]] * 2
    reward.fail = {1}
    assert fn(prompts=prompts, completions=done) == [0.0, None]
    reward.fail = {0, 1}
    assert fn(prompts=prompts, completions=done) == [None, None]  # one fully failed step: not yet
    reward.fail = {0}
    assert fn(prompts=prompts, completions=done) == [None, 1.0]  # a usable reward resets the count
    reward.fail = {0, 1}
    fn(prompts=prompts, completions=done)
    with pytest.raises(RewardsFailedError, match="2 consecutive steps.*connection refused"):
        fn(prompts=prompts, completions=done)
    assert fn.failed_total == 1 + 2 + 1 + 2 + 2


# -- the GRPO step -------------------------------------------------------------------------


@pytest.mark.slow
def test_failed_completions_are_left_out_of_advantages_and_loss(policy_cache, tmp_path):
    """2 prompts x 4 rollouts; rows 1, 2 (group 0) and 4, 5, 6 (group 1) fail. Group 0 keeps rows 0 and 3;
    group 1 has one usable row left and is dropped. The step's loss and gradient equal those of the same step
    on rows 0 and 3 alone."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sarl.backends.trl.trainer import SarlGRPOTrainer

    cfg, _ = compose_train_config(smoke(tmp_path, policy_cache))
    path = policy_path(cfg)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    trainer = SarlGRPOTrainer(
        model=model,
        reward_funcs=[TRLReward(FailRows({1, 2, 4, 5, 6}), num_generations=4, name="fail")],
        args=grpo_args(cfg, tmp_path),
        train_dataset=prompt_dataset(cfg, tokenizer),
        processing_class=tokenizer,
    )
    model.train()
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps  # set by train()
    torch.manual_seed(0)
    inputs = trainer._generate_and_score_completions(next(iter(trainer.get_train_dataloader())))
    mask, adv = inputs["completion_mask"], inputs["advantages"]
    assert mask.shape[0] == 8
    left_out, kept = [1, 2, 4, 5, 6, 7], [0, 3]
    assert mask[left_out].sum() == 0 and (mask[kept].sum(dim=1) > 0).all()
    assert (adv[left_out] == 0).all() and (adv[kept] != 0).all()
    assert adv[0] < 0 < adv[3]  # scores 0 and 3: a baseline from the two usable rows only
    assert inputs["num_items_in_batch"] == mask[kept].sum()
    metrics = trainer._metrics["train"]
    assert metrics["reward/left_out"] == [6.0] and metrics["reward/groups_dropped"] == [1.0]
    assert metrics["reward/failed"] == [5.0]

    def loss_and_grad(batch):
        model.zero_grad()
        loss = trainer._compute_loss(model, batch)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    with torch.no_grad():  # move the policy off the sampling/reference one, so ratios and the KL term count
        for p in model.parameters():
            p.add_(1e-2 * torch.randn_like(p))
    full_loss, full_grad = loss_and_grad(inputs)
    only = {k: v[kept] if torch.is_tensor(v) and v.dim() >= 1 and v.size(0) == 8 else v for k, v in inputs.items()}
    kept_loss, kept_grad = loss_and_grad(only)
    assert full_loss != 0
    torch.testing.assert_close(full_loss, kept_loss, rtol=1e-5, atol=1e-7)
    assert len(full_grad) == len(kept_grad)
    for a, b in zip(full_grad, kept_grad):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


# -- stopping ------------------------------------------------------------------------------


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_dead_embedding_server_stops_the_run_before_step_1(policy_cache, tmp_path, caplog):
    url = f"http://127.0.0.1:{closed_port()}"
    args = smoke(
        tmp_path,
        policy_cache,
        "embedding=vllm_server",
        f"embedding.url={url}",
        "embedding.max_retries=0",
        "backend.max_steps=2",
    )
    with caplog.at_level(logging.ERROR, logger="sarl.train.trl"):
        assert main(args) == 1
    (line,) = [r.getMessage() for r in caplog.records if r.name == "sarl.train.trl" and r.levelno == logging.ERROR]
    assert "stopping before step 1" in line and url in line and "embedding.url" in line
    (run,) = (tmp_path / "runs" / "smoke").iterdir()
    assert read_metrics(run / "metrics.jsonl") == [] and not (run / "checkpoints").exists()


@pytest.mark.slow
def test_rewards_that_all_fail_after_step_1_stop_the_run_after_max_failed_steps(
    policy_cache, tmp_path, caplog, monkeypatch
):
    from sarl.structure.embed.local import SentenceTransformerEmbedder

    calls = []
    real = SentenceTransformerEmbedder._embed_unique

    def dies_after_step_1(self, texts):
        calls.append(len(texts))
        if len(calls) > 2:  # the readiness check, then step 1
            raise ConnectionError("embedding server went away")
        return real(self, texts)

    monkeypatch.setattr(SentenceTransformerEmbedder, "_embed_unique", dies_after_step_1)
    with caplog.at_level(logging.ERROR, logger="sarl.train.trl"):
        assert main(smoke(tmp_path, policy_cache, "backend.max_steps=8", "train.max_failed_steps=2")) == 1
    (line,) = [r.getMessage() for r in caplog.records if r.name == "sarl.train.trl" and r.levelno == logging.ERROR]
    assert "2 consecutive steps" in line and "embedding server went away" in line
    (run,) = (tmp_path / "runs" / "smoke").iterdir()
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]  # step 3's rewards were the second fully failed batch
    assert rows[0]["reward/failed"] == 0 and rows[1]["reward/failed"] == 8 and rows[1]["reward/left_out"] == 8
    summary = json.loads((run / "summary.json").read_text())  # a stopped run says why and what failed
    assert summary["steps"] == 2 and summary["failed_rewards"] == 16 and "2 consecutive steps" in summary["stopped"]


# -- resume --------------------------------------------------------------------------------


def test_failed_rewards_before_sums_the_metrics_up_to_the_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": 1, "reward/failed": 2.0}, {"step": 2, "reward/failed": 3.0}, {"step": 3, "reward/failed": 4.0}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert failed_rewards_before(path, 2) == 5
    assert failed_rewards_before(tmp_path / "absent.jsonl", 2) == 0


@pytest.mark.slow
def test_resume_skips_a_truncated_checkpoint_and_keeps_the_failure_total(policy_cache, tmp_path, caplog, monkeypatch):
    from sarl.structure.embed.local import SentenceTransformerEmbedder

    real = SentenceTransformerEmbedder._embed_unique

    def first_step_fails(self, texts):  # one failed response per reward call (not the one-text ready check)
        vectors, failed = real(self, texts)
        if len(texts) > 1:
            failed = {**failed, 0: "embedding error: HTTP 503"}
        return vectors, failed

    monkeypatch.setattr(SentenceTransformerEmbedder, "_embed_unique", first_step_fails)
    run = tmp_path / "run"
    assert main(smoke(tmp_path, policy_cache, "backend.max_steps=2", "train.save_freq=1", f"run_dir={run}")) == 0
    assert json.loads((run / "summary.json").read_text())["failed_rewards"] >= 2
    newest = run / "checkpoints" / "checkpoint-2"
    (newest / "trainer_state.json").unlink()  # killed while the checkpoint was written
    for extra in newest.glob("*.pt"):
        extra.unlink()
    with caplog.at_level(logging.WARNING, logger="sarl.train.trl"):
        assert resume_checkpoint(run) == run / "checkpoints" / "checkpoint-1"
    assert any("checkpoint-2" in r.getMessage() and "trainer_state.json" in r.getMessage() for r in caplog.records)
    assert main(smoke(tmp_path, policy_cache, "backend.max_steps=3", "train.save_freq=1", f"run_dir={run}")) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed_from"] == "checkpoints/checkpoint-1" and summary["steps"] == 3
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert summary["failed_rewards"] == sum(r["reward/failed"] for r in rows) > rows[0]["reward/failed"]


def test_a_checkpoint_without_weights_is_incomplete(tmp_path):
    run = tmp_path
    good, bad = run / "checkpoints" / "checkpoint-5", run / "checkpoints" / "checkpoint-10"
    for d in (good, bad):
        d.mkdir(parents=True)
        (d / "trainer_state.json").write_text(json.dumps({"global_step": int(d.name.split("-")[1])}))
    (good / "model.safetensors").write_bytes(b"x")
    assert resume_checkpoint(run) == good
    shutil.rmtree(good)
    assert resume_checkpoint(run) is None


def test_a_run_that_saves_no_weights_fails_with_one_line(tmp_path, policy_cache, monkeypatch, caplog):
    """As transformers 5.9's FSDP arguments did: `final/` written with the tokenizer and no model. The run checks
    what it saved against the trained tensors (sarl/runtime/weights.py) and exits 1 instead of reporting success."""
    from transformers import Trainer

    monkeypatch.setattr(Trainer, "save_model", lambda self, output_dir=None, _internal_call=False: None)
    run = tmp_path / "run"
    with caplog.at_level(logging.ERROR, logger="sarl.train.trl"):
        assert main(smoke(tmp_path, policy_cache, "backend.max_steps=1", "train.save_freq=-1", f"run_dir={run}")) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("saved no usable model" in e and "has no model weights" in e and "\n" not in e for e in errors)
    assert "final checkpoint" in json.loads((run / "summary.json").read_text())["stopped"]
