"""`python -m sarl.launch.inputs`: the models and prepared data sets a composed row reads, the held-out sets its
evaluation reads, and how each is fetched.
The download itself runs in tests/slurm/test_gpu_session.py against a stand-in Hub; here, what is listed, where a
data set is prepared, and how the command fails."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from eval.config import compose_eval_config
from eval.protocol import check_runnable, resolve_plan
from sarl.data.sources import DataSourceError
from sarl.launch import inputs
from sarl.launch.compose import compose_user_config
from sarl.runtime.errors import UserError
from sarl.runtime.rows import PROTOCOL_DIR, protocol_papers


def test_the_row_s_inputs_are_listed_with_their_fetch_commands(tmp_path, capsys):
    rc = inputs.main(["+exp=grpo_sarl_math", f"paths.data_dir={tmp_path}"])
    out = capsys.readouterr().out
    assert rc == 1  # nothing is here yet
    assert "✗ model Qwen/Qwen3-4B  -> hf download Qwen/Qwen3-4B" in out
    resolved = tmp_path.resolve()
    for name, split in (("aime_1983_2024", "train"), ("aime25", "test")):
        line = f"✗ data  {name} ({resolved}/{name}/{split}.parquet)"
        assert f"{line}  -> python -m sarl.data.prepare dataset={name} paths.data_dir={resolved}" in out


def test_a_data_set_is_prepared_into_the_row_s_data_dir(tmp_path, monkeypatch):
    """The data directory travels on the Need itself, not parsed back out of the command line it prints (a path
    with spaces or `paths.data_dir=` in it would otherwise be cut)."""
    data_dir = tmp_path / "my data" / "paths.data_dir=it's"
    cfg, _ = compose_user_config(["+exp=grpo_sarl_math", f"paths.data_dir={str(data_dir)!r}"])
    needs = [n for n in inputs.row_data(cfg) if n.name == "aime25"]
    assert len(needs) == 1 and needs[0].data_dir == str(data_dir.resolve())
    assert needs[0].fetch.endswith(f"paths.data_dir='{tmp_path.resolve()}/my data/paths.data_dir=it'\"'\"'s'")
    prepared = []
    monkeypatch.setattr(inputs, "prepare", lambda c: prepared.append((c.name, c.paths.data_dir)))
    inputs.download(needs[0])
    assert prepared == [("aime25", str(data_dir.resolve()))]

    def unreachable(c):
        raise DataSourceError("math-ai/aime25: the Hub cannot be reached")

    monkeypatch.setattr(inputs, "prepare", unreachable)
    with pytest.raises(UserError, match="math-ai/aime25: the Hub cannot be reached"):
        inputs.download(needs[0])


@pytest.mark.parametrize(
    "argv, line",
    [
        (["+exp=grpo_sarl_math", "trian.x=1"], "trian.x: no such key; did you mean train?"),
        (
            ["--noeval", "+exp=grpo_sarl_math"],
            "--noeval: not an option; the options are --download, --no-eval (and --help)",
        ),
    ],
)
def test_a_mistake_is_one_line_and_exit_2(argv, line, capsys):
    with pytest.raises(SystemExit) as exit_:
        inputs.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2
    assert err[-1] == f"sarl.launch.inputs: {line}"
    assert not any("Traceback" in line for line in err)


def test_a_user_s_own_files_are_listed_without_a_fetch(tmp_path):
    own = tmp_path / "mine.parquet"
    cfg, _ = compose_user_config(["+exp=grpo_sarl_math", f"data.train_files={own}", f"paths.data_dir={tmp_path / 'd'}"])
    mine = [n for n in inputs.row_data(cfg) if n.path == str(own)]
    assert mine and mine[0].fetch is None and mine[0].data_dir is None and not mine[0].here()
    Path(own).write_bytes(b"")
    assert mine[0].here()


def test_a_pipeline_row_lists_each_stage_s_inputs_and_the_sample_set_a_paper_row_refuses(tmp_path, capsys):
    """lcs_paper: the SFT stage trains on a set a teacher writes (the package's sample traces stand in for it, which
    a paper row refuses), the RL stage on prepared sets, both from the row's model; the RL stage's model is the SFT
    stage's, not one to download."""
    args = ["--no-eval", "+exp=lcs_paper", f"paths.data_dir={tmp_path}"]
    assert inputs.main(args) == 1
    out = capsys.readouterr().out.splitlines()
    assert (
        out[0]
        == "✗ model deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B  -> hf download deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"
    )
    assert out[1] == (
        "✗ data  sft:data.sft_files (pkg://sarl.samples/sft/structured.jsonl)  -> python -m sarl.data.synthesize "
        "recipe=structured, then sft:data.sft_files=PATH"
    )
    assert any(line.startswith("✗ data  deepscaler_structured (") for line in out) and len(out) == 4
    traces = tmp_path / "structured.jsonl"
    traces.write_text("{}\n")
    assert inputs.main([*args, f"sft:data.sft_files={traces}"]) == 1
    assert f"✓ data  sft:data.sft_files ({traces})" in capsys.readouterr().out.splitlines()


def test_download_leaves_a_teacher_run_to_the_user(tmp_path, monkeypatch):
    cfg, choices = compose_user_config(["+exp=lcs_paper", f"paths.data_dir={tmp_path}"])
    needs = inputs.inputs_of(cfg, choices, ["+exp=lcs_paper"], heldout=False)
    (sft,) = [n for n in needs if n.name == "sft:data.sft_files"]
    monkeypatch.setattr(inputs, "prepare", lambda c: pytest.fail("a teacher's set is not prepared"))
    inputs.download(sft)  # nothing runs: the table keeps saying what to run
    assert not sft.here()


def test_the_held_out_sets_of_the_row_s_protocols_are_listed_and_only_those(tmp_path, capsys):
    """grpo_sarl_math is a row of SARL's tables: the sarl protocol's benchmarks are listed after the training inputs
    (aime25, its validation set, once), each with the command that prepares it; `--no-eval` lists none of them; the
    smoke run, of no paper, has none."""
    args = ["+exp=grpo_sarl_math", f"paths.data_dir={tmp_path}"]
    assert inputs.main(args) == 1
    out = capsys.readouterr().out.splitlines()
    resolved = tmp_path.resolve()
    heldout = [line for line in out if "held out:" in line]
    assert [line.split()[2] for line in heldout] == ["amc23", "math500", "minerva_math", "wildbench_v2"]
    assert heldout[0] == (
        f"✗ data  amc23 ({resolved}/amc23/test.parquet), held out: eval.run protocol=sarl  -> "
        f"python -m sarl.data.prepare dataset=amc23 paths.data_dir={resolved}"
    )
    assert sum(" aime25 (" in line for line in out) == 1 and out[-len(heldout) :] == heldout
    assert inputs.main(["--no-eval", *args]) == 1
    assert capsys.readouterr().out.splitlines() == [line for line in out if "held out:" not in line]
    cfg, _ = compose_user_config(["+exp=smoke", f"paths.data_dir={tmp_path}"])
    assert inputs.row_heldout(cfg) == []
    cfg, _ = compose_user_config(["reward=sarl", f"paths.data_dir={tmp_path}"])  # no row: eval.run's default protocol
    assert [n.name for n in inputs.row_heldout(cfg)] == ["aime25", "amc23", "math500", "minerva_math", "wildbench_v2"]


@pytest.mark.parametrize("protocol", sorted(p.stem for p in PROTOCOL_DIR.glob("*.yaml")))
def test_what_is_listed_for_a_protocol_is_what_eval_run_reads(protocol, tmp_path):
    """With exactly the listed files in place (the prepared ones written where sarl.data.prepare writes them),
    eval.run's own check of its data passes; with one missing, it names that one."""
    (paper,) = [p for p, protocols in protocol_papers().items() if protocol in protocols]
    row = OmegaConf.create({"paths": {"data_dir": str(tmp_path)}, "paper": {"tables": [{"table": f"{paper} Table 1"}]}})
    needs = inputs.row_heldout(row)
    assert needs and all(n.use.startswith("eval.run protocol=") for n in needs)
    assert protocol in {n.use.split("=")[1] for n in needs}
    plan = resolve_plan(compose_eval_config(["ckpt=x", f"protocol={protocol}", f"paths.data_dir={tmp_path}"]))
    prepared = [n for n in needs if n.fetch is not None]
    for need in prepared:
        assert need.data_dir == str(tmp_path.resolve())
        assert OmegaConf.load(inputs.CONF_DATA / f"{need.name}.yaml").split == "test"  # what prepare writes
        Path(need.path).parent.mkdir(parents=True, exist_ok=True)
        Path(need.path).write_bytes(b"")
    assert all(n.here() for n in needs)
    check_runnable(plan, tmp_path)  # nothing missing
    if prepared:
        Path(prepared[-1].path).unlink()
        with pytest.raises(UserError, match=f"benchmark '{prepared[-1].name}'"):
            check_runnable(plan, tmp_path)


def test_download_prepares_a_held_out_set_by_its_name(tmp_path, monkeypatch):
    cfg, _ = compose_user_config(["+exp=grpo_sarl_math", f"paths.data_dir={tmp_path}"])
    (amc,) = [n for n in inputs.row_heldout(cfg) if n.name == "amc23"]
    prepared = []
    monkeypatch.setattr(inputs, "prepare", lambda c: prepared.append((c.name, c.paths.data_dir)))
    inputs.download(amc)
    assert prepared == [("amc23", str(tmp_path.resolve()))]
