"""The commands run as a user runs them, on the bad inputs of tests/fixtures/bad_inputs/: a mistake gives
exit code 2 and one or two lines naming the file, key or value, never a traceback, and no input changes."""

import hashlib
import json
import os
import shutil
import socket
import sys
from pathlib import Path

import pytest
from testkit import run_module

REPO = Path(__file__).resolve().parents[1]
BAD = REPO / "tests" / "fixtures" / "bad_inputs"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def inputs(tmp_path):
    """A copy of the bad inputs (the commands get the copies; the test checks that none changed)."""
    d = tmp_path / "in"
    shutil.copytree(BAD, d)
    before = {p.name: digest(p) for p in d.iterdir()}
    yield d
    assert {p.name: digest(p) for p in d.iterdir()} == before, "an input file changed"


def score(tmp_path, *overrides, timeout=300):
    return run_module("sarl.score", f"hydra.run.dir={tmp_path}/run", *overrides, timeout=timeout)


def assert_user_error(proc, *words):
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    err = proc.stderr.strip()
    assert "Traceback" not in proc.stderr and len(err.splitlines()) <= 2, err
    for w in words:
        assert w in err, (w, err)


@pytest.mark.parametrize(
    "name,words",
    [
        ("latin1.jsonl", ["latin1.jsonl, line 1", "not UTF-8"]),
        ("nan_id.jsonl", ["nan_id.jsonl, line 1", "not a string or a finite number"]),
        ("duplicate_ids.jsonl", ["line 2", "repeats line 1"]),
        ("no_response.jsonl", ["line 2", '"response"']),
        ("not_json.jsonl", ["line 1", "not valid JSON"]),
    ],
)
def test_score_names_the_bad_line(inputs, tmp_path, name, words):
    proc = score(tmp_path, f"input={inputs / name}", f"output={tmp_path / 'out.jsonl'}")
    assert_user_error(proc, *words)
    assert not (tmp_path / "out.jsonl").exists()


def test_score_refuses_to_overwrite_its_input(inputs, tmp_path):
    src = inputs / "bom.jsonl"
    assert_user_error(score(tmp_path, f"input={src}", f"output={src}"), "is the input file")
    link = tmp_path / "alias.jsonl"
    link.symlink_to(src)
    assert_user_error(score(tmp_path, f"input={link}", f"output={src}"), "is the input file")


def test_score_never_replaces_what_is_not_a_regular_file(inputs, tmp_path):
    target = tmp_path / "kept.jsonl"
    target.write_text("precious\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    assert_user_error(score(tmp_path, f"input={inputs / 'bom.jsonl'}", f"output={link}"), "symbolic link")
    assert link.is_symlink() and target.read_text() == "precious\n"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert_user_error(score(tmp_path, f"input={inputs / 'bom.jsonl'}", f"output={fifo}"), "FIFO")
    assert fifo.is_fifo()
    assert_user_error(score(tmp_path, f"input={inputs / 'bom.jsonl'}", f"output={tmp_path}"), "directory")


def test_score_checks_settings_and_paths_before_any_work(inputs, tmp_path):
    assert_user_error(score(tmp_path, f"input={tmp_path / 'missing.jsonl'}"), "missing.jsonl does not exist")
    assert_user_error(score(tmp_path, f"input={tmp_path}"), "is not a file")
    assert_user_error(score(tmp_path, f"input={inputs / 'bom.jsonl'}", "batch_size=0"), "batch_size=0")
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    proc = score(tmp_path, f"input={inputs / 'bom.jsonl'}", f"output={blocker / 'out.jsonl'}")
    assert_user_error(proc, "output: cannot create")


@pytest.mark.slow
def test_score_reads_a_byte_order_mark_and_keeps_clashing_ids_apart(inputs, tmp_path):
    out = tmp_path / "out.jsonl"
    proc = score(tmp_path, f"input={inputs / 'bom.jsonl'}", f"output={out}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [json.loads(x)["id"] for x in out.read_text().splitlines()] == ["bom"]
    maps = tmp_path / "maps"
    proc = score(tmp_path, f"input={inputs / 'clashing_ids.jsonl'}", f"output={out}", "plot=true", f"plot_dir={maps}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(list(maps.glob("*.png"))) == 2  # `a/b` and `a_b` each get their own map


def test_score_exits_3_when_every_response_failed(inputs, tmp_path):
    """An embedding server that is not there: every response fails; the scores are still written (each
    line valid JSON, undefined values null) and the exit code says so."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    out = tmp_path / "out.jsonl"
    proc = score(
        tmp_path,
        f"input={inputs / 'clashing_ids.jsonl'}",
        f"output={out}",
        "embedding=vllm_server",
        f"embedding.url=http://127.0.0.1:{port}",
        "embedding.max_retries=0",
        "embedding.timeout_s=2",
    )
    assert proc.returncode == 3, proc.stderr[-2000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]  # strict JSON
    assert len(rows) == 2 and all(r["failed"] for r in rows)
    assert "every response failed" in proc.stderr


@pytest.mark.parametrize(
    "overrides,words",
    [
        (["+exp=grpo_sarl_math", "train.rollout_nn=8"], ["train.rollout_nn"]),
        (["+exp=grpo_sarl_mth"], ["grpo_sarl_mth", "grpo_sarl_math"]),  # the options are listed
        (["+exp=grpo_sarl_math", "train.rollout_n=-8"], ["train.rollout_n=-8", "an integer >= 1"]),
        (["+exp=grpo_sarl_math", "train.dry_run=maybe"], ["train.dry_run='maybe'", "true or false"]),
        (["+exp=grpo_sarl_math", "embedding_server.gpu_memory_utilization=5"], ["gpu_memory_utilization=5"]),
        (["+exp=smoke", "train.micro_batch_size_per_gpu=5"], ["micro_batch_size_per_gpu x processes = 5"]),
        (["+exp=smoke", "train.dry_runn=true"], ["train.dry_runn: no such key; did you mean train.dry_run?"]),
        (["+exp=smoke", "+train.dry_runn=true"], ["+train.dry_runn: no such key", "did you mean train.dry_run?"]),
    ],
)
def test_train_names_a_bad_override_in_one_line(overrides, words):
    proc = run_module("sarl.train", *overrides)
    assert_user_error(proc, *words)
    assert "Config search path" not in proc.stderr  # Hydra's own providers say nothing to the user


def test_debug_switch_shows_the_traceback():
    proc = run_module("sarl.train", "+exp=grpo_sarl_math", "train.rollout_n=0", env={"SARL_DEBUG": "1"})
    assert proc.returncode != 0 and "Traceback" in proc.stderr


def prepare(tmp_path, *overrides):
    root = [f"paths.root={tmp_path}", f"hydra.run.dir={tmp_path}/h"]
    return run_module("sarl.data.prepare", *root, *overrides, env={"HF_DATASETS_OFFLINE": "1"})


@pytest.mark.parametrize(
    "name,words",
    [
        ("header_only.csv", ["header_only.csv has no rows", "only a header: ID, Year"]),
        ("latin1.csv", ["latin1.csv line 2 is not UTF-8"]),
        ("broken.parquet", ["broken.parquet is not a readable parquet file"]),
        ("missing.csv", ["missing.csv does not exist"]),
    ],
)
def test_prepare_names_the_bad_source(inputs, tmp_path, name, words):
    proc = prepare(tmp_path, "dataset=aime_1983_2024", f"source.local_file={inputs / name}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    for w in words:
        assert w in last, (w, last)
    assert not (tmp_path / "data").exists()


def test_eval_run_checks_its_settings_before_loading_anything(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    for overrides, words in (
        ([f"ckpt={tmp_path / 'nope'}"], ["nope is not a directory"]),
        ([f"ckpt={tmp_path}"], ["has no config.json"]),
        ([f"ckpt={ckpt}", "sampling.n=0"], ["sampling.n=0", "an integer >= 1"]),
        ([f"ckpt={ckpt}", "sampling.top_p=2"], ["sampling.top_p=2"]),
        ([f"ckpt={ckpt}", "sampling.nn=2"], ["sampling.nn"]),
        (
            [f"ckpt={ckpt}", "sampling.tempreature=1"],
            ["sampling.tempreature: no such key; did you mean sampling.temperature?"],
        ),
        ([f"ckpt={ckpt}", "+sampling.tempreature=1"], ["+sampling.tempreature: no such key", "sampling.temperature?"]),
        ([f"ckpt={ckpt}", f"cache_dir={ckpt / 'config.json' / 'cache'}"], ["cache_dir: cannot create"]),
    ):
        assert_user_error(run_module("eval.run", f"paths.root={tmp_path}", "logger=none", *overrides), *words)


@pytest.fixture
def no_hub(tmp_path):
    """The environment of a machine that cannot reach the Hub: HF_ENDPOINT at a closed loopback port, an empty
    Hugging Face cache of the test's own."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    return {"HF_ENDPOINT": f"http://127.0.0.1:{port}", "HF_HUB_CACHE": str(tmp_path / "hub")}


MISSING_MODEL = [
    "model.path=MISSING: no such directory, and not in the Hugging Face cache (",
    "with the hub unreachable: give a local checkpoint directory or download the model first (hf download MISSING)",
]


@pytest.mark.parametrize(
    "overrides,words",
    [
        (["+exp=smoke", "model.path=MISSING"], MISSING_MODEL),
        (["+exp=smoke_pipeline", "model.path=MISSING"], MISSING_MODEL),  # its first stage's model, checked first
        (["+exp=smoke", "model.tokenizer_path=org/tok"], ["model.tokenizer_path=org/tok: no such directory"]),
        (["+exp=smoke", "model.path=./no/such/checkpoint"], ["model.path=./no/such/checkpoint is not a directory"]),
    ],
)
def test_train_refuses_a_model_it_cannot_load_before_writing_anything(tmp_path, no_hub, overrides, words):
    proc = run_module("sarl.train", *overrides, f"paths.root={tmp_path}", env=no_hub)
    assert_user_error(proc, *words)
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "runs").exists()


def test_eval_run_refuses_a_checkpoint_it_cannot_load_before_making_its_run_directory(tmp_path, no_hub):
    proc = run_module("eval.run", "ckpt=MISSING", "generator=transformers", f"paths.root={tmp_path}", env=no_hub)
    assert_user_error(proc, f"ckpt=MISSING: no such directory, and not in the Hugging Face cache ({tmp_path / 'hub'})")
    assert "with the hub unreachable: give a local checkpoint directory or download the model first" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "runs").exists()


def test_eval_run_names_base_results_that_cannot_be_read(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    for base, words in (
        (tmp_path / "base.json", [f"base_results={tmp_path / 'base.json'} does not exist", "results.json"]),
        (ckpt, [f"base_results={ckpt}: {ckpt / 'results.json'} does not exist"]),
    ):
        proc = run_module("eval.run", f"ckpt={ckpt}", f"base_results={base}", f"paths.root={tmp_path}", "logger=none")
        assert_user_error(proc, *words)
        assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_slurm_launcher_without_slurm_says_so(tmp_path):
    path = {"PATH": str(Path(sys.executable).parent)}  # no sbatch on this PATH
    proc = run_module("sarl.train", "+exp=smoke", "launcher=slurm_h100", f"paths.root={tmp_path}", env=path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "needs SLURM's sbatch" in proc.stderr and "launcher=local" in proc.stderr


def test_eval_run_checks_its_settings_before_handing_a_job_to_slurm(tmp_path, no_hub):
    """launcher=slurm_h100 checks what it can before anything is submitted: a checkpoint is given, the settings are
    valid (no SLURM here: these checks must fail first, with their own message, not the launcher's). The checkpoint
    is a path of the compute nodes, so its existence is left to the job (tests/slurm/test_launcher.py)."""
    path = {**no_hub, "PATH": str(Path(sys.executable).parent)}
    proc = run_module("eval.run", "launcher=slurm_h100", f"paths.root={tmp_path}", env=path)
    assert_user_error(proc, "no checkpoint: python -m eval.run ckpt=/path/to/checkpoint")
    proc = run_module(
        "eval.run", "launcher=slurm_h100", "ckpt=/ckpts/x", "sampling.n=0", f"paths.root={tmp_path}", env=path
    )
    assert_user_error(proc, "sampling.n=0: must be an integer >= 1")
    assert "needs SLURM's sbatch" not in proc.stderr


def test_score_names_the_nearest_key_for_a_misspelt_one(inputs, tmp_path):
    proc = score(tmp_path, f"input={inputs / 'bom.jsonl'}", "batch_sizee=2")
    assert_user_error(proc, "batch_sizee: no such key; did you mean batch_size?")
    assert len(proc.stderr.strip().splitlines()) == 1
