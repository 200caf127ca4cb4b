"""The first GPU session, rehearsed up to the GPU: `scripts/gpu_session.sh` runs its steps 1-4 as a user runs them
from a login node, against the local SLURM cluster, a stand-in Hugging Face Hub on loopback (the real download code,
exact ids, no network) and `backend=verl_cpu` in place of the GPUs:

1. a venv from the GPU node's lock (requirements/gpu.lock: torch's CUDA build and vLLM, which run here without a GPU
   as verl_cpu uses them), made by the checked Python 3.11;
2. exactly the row's model (`Qwen/Qwen3-4B`: here the tiny smoke policy under that id) and data sets
   (`gneubig/aime-1983-2024` and `math-ai/aime25`: synthetic problems with the real columns and counts);
3. the preflight of the row, as one srun task;
4. the row, two steps, submitted through `launcher=slurm_h100` (its srun step gets the job's CPUs), with a W&B key
   and a W&B host that cannot be reached: the job goes offline with one line, trains and writes its weights.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from standin_hub import StandinHub

from sarl.backends.trl.metrics import read_metrics

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_session.sh"
AIME = "gneubig/aime-1983-2024"  # conf/data/aime_1983_2024.yaml's source
AIME25 = "math-ai/aime25"  # conf/data/aime25.yaml's source
SESSION_TIMEOUT_S = 2400  # a fresh venv from the lock (2.5 min with pip's cache warm from .venv-vllm's), the job


def aime_sets(root: Path) -> dict[tuple[str, str], Path]:
    """The two data sets the row reads, as parquet files in the Hub's layout, with the real sets' columns and row
    counts (933: SARL App. B.1; 30) and problems a tiny policy can answer."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    years = [1983 + i // 25 for i in range(933)]
    train = {
        "ID": [f"{y}-{i % 25 + 1}" for i, y in enumerate(years)],
        "Year": years,
        "Problem Number": [i % 15 + 1 for i in range(933)],
        "Part": ["I" if i % 2 else "II" for i in range(933)],
        "Question": [f"What is {i % 50} plus {i % 7}?" for i in range(933)],
        "Answer": [str(i % 50 + i % 7) for i in range(933)],
    }
    test = {
        "id": [str(i) for i in range(30)],
        "problem": [f"What is {i} plus 2?" for i in range(30)],
        "answer": [str(i + 2) for i in range(30)],
    }
    out = {}
    for repo_id, table, split in ((AIME, train, "train"), (AIME25, test, "test")):
        folder = root / repo_id.replace("/", "--") / "data"
        folder.mkdir(parents=True)
        pq.write_table(pa.table(table), folder / f"{split}-00000-of-00001.parquet")
        out[("dataset", repo_id)] = folder.parent
    return out


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.timeout(SESSION_TIMEOUT_S + 120)
def test_the_first_gpu_session_runs_up_to_the_gpu(slurm_cluster, launch_policy_cache, tmp_path, request):
    request.addfinalizer(lambda: shutil.rmtree(tmp_path / "venv", ignore_errors=True))  # 11 GB: CUDA's libraries
    from sarl.launch.compose import compose_train_config
    from sarl.smoke.policy import policy_path

    smoke, _ = compose_train_config(["+exp=smoke", f"model.build.cache_dir={launch_policy_cache}"])
    repos = {("model", "Qwen/Qwen3-4B"): Path(policy_path(smoke)), **aime_sets(tmp_path / "hub_repos")}
    row_args = [
        "backend=verl_cpu",  # in place of the GPUs; the row's model, data and logger are named, so they stay
        "model=qwen3_4b",
        "data=aime_1983_2024",
        "data.max_response_length=192",
        "logger=wandb",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_OFFLINE", "WANDB_", "RAY_"))}
    env.update(slurm_cluster.env)
    env.update(
        HF_HOME=str(tmp_path / "hf_home"),
        VENV=str(tmp_path / "venv"),
        SARL_PYTHON=sys._base_executable,  # the Python 3.11 that made this venv
        STEPS="1 2 3 4",
        GPUS="0",
        DATA_DIR=str(tmp_path / "data"),
        SESSION_DIR=str(tmp_path / "session"),
        ROW_ARGS=" ".join(row_args),
        SARL_SLURM_CPUS_PER_TASK="2",  # the local cluster's node
        WANDB_API_KEY="k" * 40,  # a key, and W&B's host cannot be reached (a compute node without internet)
        WANDB_BASE_URL=f"http://127.0.0.1:{closed_port()}",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
    )
    with StandinHub(repos) as hub:
        env["HF_ENDPOINT"] = hub.url
        proc = subprocess.run(
            ["bash", str(SCRIPT)], cwd=REPO, env=env, capture_output=True, text=True, timeout=SESSION_TIMEOUT_S
        )
    (session,) = (tmp_path / "session").iterdir()
    logs = {p.name: p.read_text(errors="replace") for p in session.glob("*.log")}
    failed = re.search(r"see (\S+\.log)", proc.stderr)
    failed_log = logs.get(Path(failed.group(1)).name, "") if failed else ""
    why = f"{proc.stdout}\n{proc.stderr[-2000:]}\n{failed_log[-6000:]}\n{slurm_cluster.log_tail()}"
    assert proc.returncode == 0, why
    for number, name in enumerate(("install", "inputs", "preflight", "row"), start=1):
        assert re.search(rf"step {number} \({name}\): done in \d+ s", proc.stdout), proc.stdout

    # 1. the venv: the checked Python 3.11, the GPU lock's versions
    venv = tmp_path / "venv" / "bin" / "python"
    check = "import sys, torch; from importlib.metadata import version as v; "
    check += "print(sys.version_info[:2], torch.__version__, v('vllm'))"
    lock = dict(ln.split("==", 1) for ln in (REPO / "requirements" / "gpu.lock").read_text().splitlines() if "==" in ln)
    out = subprocess.run([str(venv), "-c", check], capture_output=True, text=True, check=True).stdout.split()
    assert out[:2] == ["(3,", "11)"] and out[2].split("+")[0] == lock["torch"] and out[3] == lock["vllm"], out

    # 2. exactly the row's inputs, by their exact ids
    asked = {tuple(r.split(" ", 1)[1].strip("/").split("/")[:4]) for r in hub.requests if "/api/" in r}
    models = {f"{a[2]}/{a[3]}" for a in asked if a[1] == "models"}
    datasets = {f"{a[2]}/{a[3]}" for a in asked if a[1] == "datasets"}
    assert models == {"Qwen/Qwen3-4B"} and datasets == {AIME, AIME25}, hub.requests
    assert "✓ model Qwen/Qwen3-4B" in logs["2_inputs.log"]
    for name in ("aime_1983_2024/train.parquet", "aime25/test.parquet"):
        assert (tmp_path / "data" / name).is_file()

    # 3. the preflight passed as one task of the cluster, against the stack it runs on (the GPU lock)
    assert re.search(r"(\d+) of \1 checks passed", logs["3_preflight.log"]), logs["3_preflight.log"][-3000:]
    assert "stack = requirements/gpu.lock" in logs["3_preflight.log"]

    # 4. the row: submitted, trained two steps, its weights there; the step's CPUs; W&B offline in one line
    row = session / "row"
    steps = [r["step"] for r in read_metrics(row / "metrics.jsonl")]
    assert steps[-2:] == [1, 2] and set(steps) <= {0, 1, 2}, steps  # 0: the row's validation before training
    assert "the weights are there and load" in logs["4_row.log"]
    job_id = re.search(r"submitted sarl.train as SLURM job (\d+)", logs["4_row.log"]).group(1)
    assert json.loads((row / "meta.json").read_text())["slurm_job_id"] == job_id
    job_log = logs["4_row.log"]  # the launcher's wait prints the job's log
    assert "slurm.launcher: this task may use 2 CPUs (the job asked 2 per task)" in job_log
    assert job_log.count("cannot be reached from this node: WANDB_MODE=offline") == 1, job_log[-3000:]
    offline = sorted(p.name for p in row.glob("wandb/offline-run-*"))
    assert len(offline) == 2, offline  # the driver's record of the run, verl's own tracker in its trainer actor
    submission = (session / "slurm" / job_id / f"{job_id}_submission.sh").read_text()
    (srun,) = [ln for ln in submission.splitlines() if ln.startswith("srun ")]
    assert "--cpus-per-task=2" in srun.split()
    assert str(tmp_path / "venv" / "bin" / "python") in submission  # the job runs the session's own stack
