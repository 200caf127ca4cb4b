"""verl's SFT stage trains on the whole trace (tags, graph, reasoning, answer) under each paper model's own chat
template (tests/fixtures/chat_templates/, decisions §7.1), and refuses before launch, dry run included, a set of
fewer traces than one batch."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf
from testkit import run_module, stage_overrides, train_dry_run

from sarl.launch.compose import compose_train_config
from sarl.runtime.errors import UserError

pytest.importorskip("verl")

REPO = Path(__file__).resolve().parents[3]
TEMPLATES = REPO / "tests" / "fixtures" / "chat_templates"
SFT_FIXTURE = REPO / "tests" / "fixtures" / "sft" / "tiny.jsonl"
# the chat template each paper model ships (tests/fixtures/chat_templates/README.md)
TEMPLATE_OF = {
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": "deepseek-r1-distill-qwen.jinja",
    "Qwen/Qwen3-4B-Base": "qwen3.jinja",
}
# the special tokens of the two families, so that the small tokenizer splits a rendering where the real one does
FAMILY_TOKENS = ["<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>"]


def sft_paper_rows() -> list[str]:
    """The conf/exp/ rows whose pipeline has an SFT stage of a Hub model (the paper rows; the smoke pipeline's
    policy is built here and carries the project's own template)."""
    rows = []
    for path in sorted((REPO / "conf" / "exp").glob("*.yaml")):
        stages = OmegaConf.load(path).get("pipeline") or []
        if any("algorithm=sft" in (s.get("overrides") or []) for s in stages):
            if compose_train_config([f"+exp={path.stem}"])[0].model.path is not None:
                rows.append(path.stem)
    return rows


def model_with_template(folder: Path, chat_template: str) -> str:
    """A model directory (a tiny Qwen3 config, no weights) whose tokenizer, trained on the project's SFT traces,
    carries `chat_template`."""
    from sarl.smoke.policy import build_tokenizer, qwen3_config

    texts = [line for f in sorted((REPO / "sarl" / "samples" / "sft").glob("*.jsonl")) for line in f.open()]
    tok = build_tokenizer(texts, vocab_size=400)
    tok.add_special_tokens({"additional_special_tokens": FAMILY_TOKENS}, replace_extra_special_tokens=False)
    if "bos_token" in chat_template:
        tok.bos_token = "<｜begin▁of▁sentence｜>"
    tok.chat_template = chat_template
    tok.save_pretrained(folder)
    qwen3_config(tok, num_hidden_layers=1).save_pretrained(folder)
    return str(folder)


def sft_stage(row: str, *extra: str):
    """The composed config of a row's SFT stage, as sarl.launch.pipeline composes it."""
    cfg, _ = compose_train_config([f"+exp={row}", *stage_overrides(row, "sft"), *extra])
    return cfg


def trained_text(tokenizer, item) -> str:
    ids, mask = item["input_ids"].tolist(), item["loss_mask"].tolist()
    return tokenizer.decode([t for t, m in zip(ids, mask) if m])


@pytest.mark.parametrize("row", sft_paper_rows())
def test_sft_stage_trains_on_the_whole_trace_under_the_models_own_template(row, tmp_path):
    """verl's MultiTurnSFTDataset, built as verl's SFT trainer builds it (HFModelConfig from the config sft.py writes,
    then the dataset on the run's parquet), puts loss on the reasoning between <think> and </think> and on the
    answer of every trace; the prompts render as under the model's own template."""
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    from sarl.backends.verl.sft import build_verl_sft_config, write_sft_parquet
    from sarl.data.sft import sft_rows
    from sarl.runtime.files import resolve_path

    paper_model = compose_train_config([f"+exp={row}"])[0].model.path
    assert paper_model in TEMPLATE_OF, f"{row}: add {paper_model}'s chat template to tests/fixtures/chat_templates"
    own = (TEMPLATES / TEMPLATE_OF[paper_model]).read_text()
    model_dir = model_with_template(tmp_path / "model", own)
    cfg = sft_stage(row, f"model.path={model_dir}", f"paths.root={tmp_path}")
    v = build_verl_sft_config(cfg, str(tmp_path), row)
    model = omega_conf_to_dataclass(v.model)  # verl's HFModelConfig: the tokenizer with model.custom_chat_template
    tok = model.tokenizer
    data = MultiTurnSFTDataset(
        parquet_files=str(write_sft_parquet(cfg, tmp_path)), tokenizer=tok, config=v.data, processor=model.processor
    )
    traces = sft_rows(resolve_path(str(cfg.data.sft_files)))
    assert len(data) == len(traces) > 0
    for i, trace in enumerate(traces):
        text = trace["completion"][-1]["content"]
        reasoning = text[text.index("<think>") + len("<think>") : text.index("</think>")].strip("\n")
        answer = text.split("</think>")[-1].strip()
        trained = trained_text(tok, data[i])
        assert reasoning in trained, (row, i, trained[:200])
        assert answer in trained and text.split("\n", 1)[1] in trained  # all of it, in order, after '<think>\n'
        assert trace["prompt"][-1]["content"] not in trained  # no loss on the prompt
        prompt = dict(tokenize=False, add_generation_prompt=True)
        assert tok.apply_chat_template(trace["prompt"], **prompt) == tok.apply_chat_template(
            trace["prompt"], chat_template=own, **prompt
        )


def test_a_template_that_keeps_the_trace_is_left_alone_and_an_override_wins(tmp_path, chat_policy_dir):
    from sarl.backends.verl.sft import build_verl_sft_config, sft_chat_template

    base = ["+exp=smoke", "algorithm=sft", "data=sft_grp_math", "backend=verl", f"paths.root={tmp_path}"]
    cfg, _ = compose_train_config([*base, f"model.path={chat_policy_dir}"])
    assert sft_chat_template(cfg) is None  # the tiny policy's template renders content as written
    assert build_verl_sft_config(cfg, str(tmp_path), "t").model.custom_chat_template is None
    r1_dir = model_with_template(tmp_path / "r1", (TEMPLATES / "deepseek-r1-distill-qwen.jinja").read_text())
    cfg, _ = compose_train_config([*base, f"model.path={r1_dir}"])
    assert sft_chat_template(cfg) is not None  # R1-Distill's own template drops the reasoning
    mine = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    cfg.backend.sft_overrides = {"model": {"custom_chat_template": mine}}
    assert sft_chat_template(cfg) is None
    assert build_verl_sft_config(cfg, str(tmp_path), "t").model.custom_chat_template == mine


def test_a_template_that_drops_reasoning_in_an_unknown_layout_is_refused(tmp_path):
    from sarl.backends.verl.sft import sft_chat_template

    drops = "{% for m in messages %}{{ m['role'] + ': ' + m['content'].split('</think>')[-1] + '\\n' }}{% endfor %}"
    model_dir = model_with_template(tmp_path / "model", drops)
    cfg, _ = compose_train_config(
        ["+exp=smoke", "algorithm=sft", "data=sft_grp_math", "backend=verl", f"model.path={model_dir}"]
    )
    with pytest.raises(
        UserError,
        match=r"does not render an assistant turn as written .*backend.sft_overrides.model.custom_chat_template",
    ):
        sft_chat_template(cfg)


def test_a_dry_run_without_the_tokenizer_leaves_the_template_to_the_launch(caplog):
    from sarl.backends.verl.sft import sft_chat_template

    cfg, _ = compose_train_config(["+exp=lcs_paper", "algorithm=sft", "data=sft_structured", "pipeline=null"])
    cfg.model.path = "sarl-tests/not-a-cached-model"
    cfg.train.dry_run = True
    assert sft_chat_template(cfg) is None
    assert "decided when the run starts" in caplog.text


# -- a set smaller than one batch --------------------------------------------------------------


@pytest.mark.parametrize("n_ranks", [1, 2, 4])
def test_verls_loader_gives_floor_of_traces_over_batch_steps(n_ranks):
    """The condition check_enough_traces enforces, on the sampler and loader verl's SFT trainer builds (verl 0.9.1
    trainer/sft_trainer.py:236-252): steps per epoch = floor(N / train_batch_size), zero below one batch."""
    from torch.utils.data.distributed import DistributedSampler
    from torchdata.stateful_dataloader import StatefulDataLoader

    for n in range(1, 13):
        for batch in range(n_ranks, 13, n_ranks):  # a multiple of the ranks (verl_sft_values checks it)
            data = list(range(n))
            sampler = DistributedSampler(data, shuffle=True, num_replicas=n_ranks, rank=0, drop_last=True)
            loader = StatefulDataLoader(data, batch_size=batch // n_ranks, sampler=sampler, drop_last=True)
            assert len(loader) == n // batch, (n, batch, n_ranks)


def test_fewer_traces_than_a_batch_are_refused_naming_file_count_batch_and_fixes_that_work():
    from sarl.backends.verl.sft import check_enough_traces

    base = ["+exp=smoke", "algorithm=sft", "data=sft_grp_math", f"data.sft_files={SFT_FIXTURE}", "backend=verl"]
    cfg, _ = compose_train_config([*base, "train.train_batch_size=6", "train.n_gpus_per_node=1"])
    check_enough_traces(cfg, "smoke")  # 6 traces, one step
    cfg, _ = compose_train_config([*base, "train.train_batch_size=8", "train.n_gpus_per_node=4"])
    with pytest.raises(UserError) as err:
        check_enough_traces(cfg, "smoke")
    message = str(err.value)
    assert f"data.sft_files={SFT_FIXTURE} holds 6 traces, fewer than train.train_batch_size=8" in message
    # the smaller batch named splits evenly over the 4 ranks (verl_sft_values refuses one that does not)
    assert "at least 8 traces with data.sft_files=FILE or set train.train_batch_size=4 (a multiple of the 4 ranks)" in (
        message
    )
    assert "\n" not in message
    # in a pipeline the fixes are the stage's own overrides (a plain override loses to the stage's value); with 8
    # ranks and 6 traces no batch fits, so only a larger set is named
    cfg, _ = compose_train_config([*base, "train.train_batch_size=64", "train.n_gpus_per_node=8"])
    with pytest.raises(UserError) as err:
        check_enough_traces(cfg, "grp_math_paper/sft")
    assert str(err.value).endswith("no step would run; give a set of at least 64 traces with sft:data.sft_files=FILE")


def test_a_real_run_stops_with_exit_2_and_one_line_and_a_dry_run_plans_the_paper_row(tmp_path, chat_policy_dir):
    common = [f"paths.root={tmp_path}", f"run_dir={tmp_path / 'r'}"]
    proc = run_module(
        "sarl.train",
        "+exp=smoke",
        "algorithm=sft",
        "data=sft_grp_math",
        f"data.sft_files={SFT_FIXTURE}",
        "backend=verl",
        f"model.path={chat_policy_dir}",
        "train.train_batch_size=8",
        "train.micro_batch_size_per_gpu=2",
        *common,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"{SFT_FIXTURE} holds 6 traces, fewer than train.train_batch_size=8" in err

    # the GRP row's SFT stage (64 traces per step) on the handful of traces shipped with the package: the dry run
    # plans both stages with the row's own settings and says what a real run needs
    proc = train_dry_run("+exp=grp_math_paper", *common)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    warning = [line for line in proc.stderr.splitlines() if "dry run only:" in line]
    assert len(warning) == 1 and "grp_math.jsonl holds 6 traces, fewer than train.train_batch_size=64" in warning[0]
    assert warning[0].endswith("give a set of at least 64 traces with sft:data.sft_files=FILE")
    assert "stage rl:" in proc.stderr and "train_batch_size: 64" in proc.stdout
