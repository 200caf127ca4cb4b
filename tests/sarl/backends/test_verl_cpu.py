"""verl's own trainer, run for real on this CPU machine (`backend=verl_cpu`), once per row family.

Each test runs `python -m sarl.train +exp=ROW backend=verl_cpu` as a user would (a child process in its own
session, stopped with its whole group if it overruns) and checks what the run left in its directory: exit 0, every
step in metrics.jsonl with finite losses, the rollout's weights changed after every step with a gradient (the HF
rollout's sync log), rewards that are not constant. Runs are not bit-reproducible (which sample lands in which
session depends on arrival order), so nothing asserts exact values.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from testkit import assert_chain, evaluate_run, vllm_python_or_skip

from sarl.backends.verl.cpu import SYNC_RANKS_LOG, sync_records
from sarl.reports.figures import read_metrics_history
from sarl.reports.progress import VERL_LOG
from sarl.runtime.checkpoints import export_problem

pytestmark = [pytest.mark.verl_cpu, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
RUN_TIMEOUT_S = 900
TRAINING_KEYS = ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/kl_loss", "response_length/mean")


@dataclass
class Run:
    rc: int
    run_dir: Path
    log: str  # what sarl.train printed (the console)
    verl_log: str = ""  # what this command appended to verl's log files (verl.log of the run and of its stages)

    def history(self) -> list[dict]:
        return read_metrics_history(self.run_dir / "metrics.jsonl")

    def steps(self) -> dict[int, dict]:
        return {int(r["step"]): r for r in self.history()}


SHARED: dict[str, Path] = {}


@pytest.fixture(scope="module", autouse=True)
def shared_policy_cache(policy_cache_dir):
    """The session's policy cache (tests/conftest.py): the tiny policies are built once for every test of the session
    (the first run that needs one builds it, the others wait), not again in the repository's runs/ directory. Not
    `policy_cache`, which waits for the smoke policy: the graph and tagged rows need only theirs. Module-scoped and
    autouse, it is set up before the module's other fixtures (the gt run) as well as its tests."""
    SHARED["policy_cache"] = policy_cache_dir


def run_row(run_dir: Path, row: str, *overrides: str, env: dict[str, str] | None = None) -> Run:
    """`python -m sarl.train +exp=ROW backend=verl_cpu run_dir=... OVERRIDES`; its output in `run_dir.log`. With
    `SARL_VERL_CPU_TIMINGS=FILE` set, the command's wall time, its step times and the peak of the summed
    proportional memory (PSS) of its process tree go to FILE as one JSON line (docs/results.md)."""
    log_path = run_dir.with_suffix(".log")
    cmd = [sys.executable, "-m", "sarl.train", f"+exp={row}", "backend=verl_cpu", f"run_dir={run_dir}", *overrides]
    if "policy_cache" in SHARED:
        cmd.append(f"++model.build.cache_dir={SHARED['policy_cache']}")
    start = time.monotonic()
    before = {p: p.stat().st_size for p in run_dir.rglob(VERL_LOG)} if run_dir.is_dir() else {}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
        peak = PeakMemory(proc.pid) if os.environ.get(TIMINGS_ENV) else None
        try:
            rc = proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            pytest.fail(f"{row} ran past {RUN_TIMEOUT_S} s (a hang); log: {log_path}")
        finally:
            if peak is not None:
                peak.stop()
    appended = []
    for path in sorted(run_dir.rglob(VERL_LOG)):
        with path.open("rb") as f:
            f.seek(before.get(path, 0))
            appended.append(f.read().decode(errors="replace"))
    run = Run(rc, run_dir, log_path.read_text(errors="replace"), "".join(appended))
    if peak is not None:
        record_timing(row, overrides, run, time.monotonic() - start, peak.gib)
    return run


TIMINGS_ENV = "SARL_VERL_CPU_TIMINGS"


class PeakMemory:
    """The peak over time of the summed PSS of a process and its descendants (Ray's daemons and workers), every 2 s."""

    def __init__(self, pid: int) -> None:
        self.pid, self.gib, self._done = pid, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        import psutil

        while not self._done.wait(2.0):
            try:
                root = psutil.Process(self.pid)
                procs = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            total = 0
            for p in procs:
                try:
                    total += p.memory_full_info().pss
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    pass
            self.gib = max(self.gib, total / 1024**3)

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=10)


def record_timing(row: str, overrides: tuple[str, ...], run: Run, wall_s: float, peak_gib: float) -> None:
    try:
        steps = {int(r["step"]): r.get("timing_s/step") for r in run.history() if r.get("timing_s/step") is not None}
    except ValueError:
        steps = {}
    line = {"row": row, "overrides": list(overrides), "rc": run.rc, "wall_s": round(wall_s, 1)}
    line["step_s"] = {k: round(float(v), 2) for k, v in sorted(steps.items())}
    line["peak_pss_gib"] = round(peak_gib, 2)
    with open(os.environ[TIMINGS_ENV], "a") as f:
        f.write(json.dumps(line) + "\n")


def tail(run: Run, n: int = 40) -> str:
    text = run.log + "\n--- verl.log ---\n" + run.verl_log
    lines = [x for x in text.splitlines() if "UserWarning" not in x and "warnings.warn" not in x]
    return "\n".join(lines[-n:])


def assert_trained(run: Run, steps: int = 2, first_step: int = 1, sparse: bool = False) -> dict[int, dict]:
    """Exit 0; steps first_step..steps logged with reward metrics and a weight sync after each; every trained step
    with finite training metrics; the rollout's weights changed after every step with a gradient, and some step
    had one; rewards not constant (some reward's spread above 0, or the mean differing between trained steps).
    A step whose groups were each scored alike has no gradient (zero advantages; the KL term's gradient is 0
    while the actor equals the reference): nothing to sync, so its weights may stay as they were.
    `sparse`: the tiny policy's rewards for the row are sparse (LCS and MaxFlow score a group alike unless one of its
    responses is right, about 1 in 8 for the tagged tiny policy): a step may also skip its update
    (`reward/update_skipped`: every group left out, e.g. cut by the length cap under train.mask_truncated)."""
    assert run.rc == 0, tail(run)
    said = {int(m.group(1)) for m in re.finditer(r"\] step (\d+)(?:/\d+)?  ", run.log)}
    assert set(range(first_step, steps + 1)) <= said, f"the console said steps {sorted(said)}: {tail(run)}"
    assert "per-step metrics" in run.log, tail(run)  # the closing table
    assert "WorkerDict" not in run.log and "WorkerDict" in run.verl_log  # Ray's workers speak in verl.log only
    assert "No supported accelerator detected" not in run.log, tail(run)  # verl's GPU notice, off a CPU run's console
    by_step = run.steps()
    for step in range(first_step, steps + 1):
        assert step in by_step, f"step {step} missing from metrics.jsonl: {sorted(by_step)}"
        assert any(k.startswith("reward/") for k in by_step[step]), f"step {step}: no reward/* metrics"
    trained = [s for s in range(first_step, steps + 1) if by_step[s].get("reward/update_skipped", 0) != 1]
    assert len(trained) == steps - first_step + 1 or (sparse and trained), f"updates skipped: {by_step}"
    for step in trained:
        row = by_step[step]
        for key in TRAINING_KEYS:
            assert key in row, f"step {step}: no {key} ({sorted(row)[:50]})"
            assert math.isfinite(float(row[key])), f"step {step}: {key}={row[key]}"
    syncs = sync_records(run.run_dir)
    after = {int(s["global_steps"]): s["digest"] for s in syncs if s["global_steps"] is not None}
    before = [s["digest"] for s in syncs if s["global_steps"] in (None, 0)]
    assert before, f"no initial weight sync logged: {syncs}"
    changed = []
    for step in range(first_step, steps + 1):
        assert step in after, f"no weight sync after step {step}: {syncs}"
        if after[step] != after.get(step - 1, before[-1]):
            changed.append(step)
    moved = [s for s in trained if float(by_step[s]["actor/grad_norm"]) > 0]
    grads = {s: by_step[s]["actor/grad_norm"] for s in trained}
    assert moved, f"no step had a gradient (every group scored alike in every step): grad norms {grads}"
    assert set(moved) <= set(changed), f"the rollout's weights changed after steps {changed}; gradients: {grads}"
    spread = {k: v for s in trained for k, v in by_step[s].items() if k.startswith("reward/") and k.endswith("/std")}
    means = {float(by_step[s].get("reward/score/mean", 0.0)) for s in trained}
    assert any(float(v) > 0 for v in spread.values()) or len(means) > 1, f"rewards constant: {spread}, {means}"
    return by_step


@pytest.fixture(scope="module")
def gt_run(tmp_path_factory) -> Run:
    """`grpo_gt_math` for 2 steps, its checkpoint saved at the end: its own test, then resumed by the resume test."""
    return run_row(tmp_path_factory.mktemp("gt") / "run", "grpo_gt_math")


def test_grpo_gt_math_validates_before_training(gt_run):
    run = gt_run
    by_step = assert_trained(run)
    assert any(k.startswith("val-core/") for k in by_step[0]), f"no validation before training: {by_step.get(0)}"
    assert float(by_step[1]["reward/failed"]) == 0


def assert_final_is_the_trained_model(run: Run, step: int) -> Path:
    """The run's `final/`, made at the end from the last checkpoint's FSDP shards by verl's model merger (said in one
    line) and holding exactly the trained tensors (read from the shards independently of the merger)."""
    final = run.run_dir / "final"
    record = json.loads((run.run_dir / "export.json").read_text())
    assert record["step"] == step and record["from"] == f"checkpoints/global_step_{step}/actor", record
    assert f"final model: {final} (step {step}, verl model merger" in run.log, tail(run)
    assert f"evaluate it: python -m eval.run ckpt={run.run_dir} protocol=smoke" in run.log, tail(run)  # the next step
    assert (run.run_dir / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # drawn as a TRL run's are
    assert export_problem(run.run_dir / "checkpoints" / f"global_step_{step}" / "actor", final) is None
    return final


def test_grpo_gt_math_run_is_evaluated_and_tabulated(gt_run, tmp_path):
    """The chain a researcher runs after training, from the run directory: `eval.run ckpt=<run dir>` evaluates the
    trained model (final/), the table's cell is its number; a verl checkpoint directory (`global_step_N`, or the
    config-only `actor/huggingface/` verl leaves) is merged on first use, said in one line, and its tensors are
    the trained ones."""
    final = assert_final_is_the_trained_model(gt_run, step=2)
    assert_chain(gt_run.run_dir, "grpo_gt_math", final, tmp_path / "chain")
    actor = gt_run.run_dir / "checkpoints" / "global_step_2" / "actor"
    assert not (actor / "huggingface" / "model.safetensors").exists()  # verl saved the config and tokenizer only
    results, logged = evaluate_run(actor / "huggingface", tmp_path / "step")
    assert results["run"]["ckpt"] == str(actor / "huggingface")
    assert export_problem(actor, actor / "huggingface") is None
    said = [x for x in logged.splitlines() if "is a verl checkpoint (FSDP shards)" in x]
    assert len(said) == 1 and f"merged by verl's model merger into {actor / 'huggingface'}" in said[0], logged


def test_grpo_ttrl_math_votes_on_all_rollouts_and_trains_on_some(tmp_path):
    """The group reward; saving every step, then `eval.run ckpt=<run dir> select=best`: both checkpoints on the
    held-out set (step 1 merged on demand, step 2 from final/), the best picked and evaluated, every score kept."""
    run = run_row(tmp_path / "ttrl", "grpo_ttrl_math", "train.n_trained=2", "train.save_freq=1")
    by_step = assert_trained(run)
    for step in (1, 2):
        assert by_step[step]["reward/voted_sessions"] == 16  # 4 prompts x 4 votes, scored by the group hook
        assert by_step[step]["reward/trained_sessions"] == 8  # 2 of each prompt's 4 trained on
    final = assert_final_is_the_trained_model(run, step=2)
    results, _ = evaluate_run(run.run_dir, tmp_path / "select", "select=best")
    selection = results["selection"]
    step1 = run.run_dir / "checkpoints" / "global_step_1" / "actor"
    assert [(c["step"], c["ckpt"]) for c in selection["checkpoints"]] == [
        (1, str(step1 / "huggingface")),
        (2, str(final)),
    ]
    assert export_problem(step1, step1 / "huggingface") is None  # merged for the selection: the step-1 weights
    held_out = Path(results["run"]["run_dir"]) / "select"
    for c in selection["checkpoints"]:  # each score is its held-out run's avg@k
        sub = json.loads((held_out / f"step_{c['step']}" / "results.json").read_text())
        assert c["held_out_score"] == sub["math"]["benchmarks"]["smoke_heldout"]["avg_at_k"]
    scores = {c["step"]: c["held_out_score"] for c in selection["checkpoints"]}
    best = max(scores, key=lambda s: (scores[s], -s))
    assert selection["rule"] == "best" and selection["held_out"] == ["smoke_heldout"] and selection["step"] == best
    assert (
        results["run"]["ckpt"]
        == selection["ckpt"]
        == dict((c["step"], c["ckpt"]) for c in selection["checkpoints"])[best]
    )


def test_ppo_sarl_math_trains_the_critic_with_gae_on_two_ranks_with_a_tensor_parallel_2_rollout(tmp_path):
    """Two ranks over gloo (decisions §7.7): actor, reference and critic sharded by FSDP2 across both processes, one
    rollout replica of tensor parallelism 2 whose weights both ranks gather after every step. The critic loads in its
    Ray worker with the configured attention (sdpa; verl's own loader would ask for flash_attention_2, absent on CPU)
    and is trained: its loss is logged every step."""
    ranks = ("train.n_gpus_per_node=2", "backend.rollout_tensor_parallel_size=2")
    run = run_row(tmp_path / "ppo", "ppo_sarl_math", *ranks)
    by_step = assert_trained(run)
    for step in (1, 2):
        assert math.isfinite(float(by_step[step]["critic/vf_loss"]))
        assert "critic/values/mean" in by_step[step]
    for role in ("actor", "critic"):
        assert_sharded(run.run_dir / "checkpoints" / "global_step_2" / role, world=2)
    # one replica (tensor parallelism 2): one server, fed by rank 0 with what both ranks gathered, after every step
    assert {s["replica"] for s in sync_records(run.run_dir)} == {0}
    parts = sync_records(run.run_dir, SYNC_RANKS_LOG)
    for step in (0, 1, 2):
        here = {p["rank"]: p for p in parts if p["global_steps"] == step}
        assert sorted(here) == [0, 1], f"step {step}: ranks in the weight sync {sorted(here)}"
        assert here[0]["server"] and not here[1]["server"] and here[0]["tensors"] == here[1]["tensors"] > 0
    # the two ranks' shards joined into one model (each tensor split along its first dimension), then evaluated
    assert_chain(run.run_dir, "ppo_sarl_math", assert_final_is_the_trained_model(run, step=2), tmp_path / "chain")


def assert_sharded(checkpoint: Path, world: int) -> None:
    """verl's FSDP2 checkpoint of `world` ranks: each rank's model shard holds DTensors whose local pieces are about
    1/world of the model (FSDP2 splits every parameter along its first dimension), the pieces of all ranks adding up
    to the whole model."""
    import torch

    assert json.loads((checkpoint / "fsdp_config.json").read_text()) == {"FSDP_version": 2, "world_size": world}
    local, whole = [], set()
    for rank in range(world):
        shard = checkpoint / f"model_world_size_{world}_rank_{rank}.pt"
        state = torch.load(shard, map_location="cpu", weights_only=False)
        kinds = {type(t).__name__ for t in state.values()}
        assert kinds == {"DTensor"}, f"{checkpoint.name} rank {rank}: {kinds}"
        local.append(sum(t.to_local().numel() for t in state.values()))
        whole.add(sum(t.numel() for t in state.values()))
    (total,) = whole
    assert sum(local) == total, (local, total)
    assert all(abs(n - total / world) <= 0.05 * total for n in local), f"{checkpoint.name}: {local} of {total} per rank"


def test_a_reward_that_cannot_be_built_in_the_reward_workers_is_counted_and_stops_the_run(tmp_path):
    """A reward whose constructor raises in verl's reward workers: each response is a failed reward (left out,
    counted in reward/failed, not dropped by verl's reward loop), and train.max_failed_steps such steps stop the run
    (exit 1, one line). verl would otherwise sample such groups again for ever. The same failed outputs come from a
    reward whose scoring raises (sarl.contract.metrics.scored_or_failed; tests/sarl/backends/test_verl_reward.py)."""
    run = run_row(
        tmp_path / "raises",
        "grpo_gt_math",
        "reward._target_=sarl_raising_reward.RaisingInitReward",
        "train.max_failed_steps=1",
        env={"PYTHONPATH": str(REPO / "tests" / "fixtures" / "rewards")},
    )
    assert run.rc == 1, tail(run)
    stops = [x for x in run.log.splitlines() if x.startswith("training stopped:")]
    assert len(stops) == 1, tail(run)
    assert "no usable reward in 1 consecutive steps" in stops[0]
    assert "RaisingInitReward could not be built: FileNotFoundError" in run.verl_log
    assert re.search(r"last: (\d+) of \1 rewards failed\)", stops[0]), stops[0]  # every response counted
    validation = run.steps()[0]  # the validation before training scored them as failed too, counted
    assert validation["val-aux/smoke_arithmetic/failed/mean@1"] == 1.0, validation


def test_resume_continues_from_the_last_checkpoint(gt_run):
    """The gt run's directory run again with one more step: verl finds its last checkpoint (step 2) and trains
    step 3 only; the steps logged before survive (metrics.jsonl is appended to)."""
    assert (gt_run.run_dir / "checkpoints" / "global_step_2").is_dir(), sorted(os.listdir(gt_run.run_dir))
    second = run_row(gt_run.run_dir, "grpo_gt_math", "train.total_training_steps=3")
    assert second.rc == 0, tail(second)
    assert "global_step_2" in second.verl_log and "Training from scratch" not in second.verl_log, tail(second)
    by_step = assert_trained(second, steps=3, first_step=3)
    assert {1, 2} <= set(by_step)  # the first run's steps survive the resume
    assert_final_is_the_trained_model(second, step=3)  # final/ is the resumed run's last step


def test_grpo_sarl_math_on_two_ray_nodes_embeds_through_the_vllm_server_it_starts(tmp_path, monkeypatch, capfd):
    """Two Ray nodes on this machine, started and joined as a two-node SLURM job starts them (slurm.launcher's
    `ModuleJob.run_on_node`: rank 0 starts the head, publishes its address in the job's folder, waits for rank 1 to
    join and runs the driver with RAY_ADDRESS; rank 1 joins with `ray start --address`). `grpo_sarl_math` with
    `train.nnodes=2` puts one actor rank and one rollout replica on each node; sarl.train starts the vLLM CPU embedding
    server (url auto) listening on every interface and hands verl its routable address, which the reward workers
    reach. What took effect is read back: the ranks' Ray nodes (the weight-sync log), the URL verl was given."""
    from sarl.runtime.network import free_port, is_loopback, routable_ip
    from sarl.serving.server import VLLM_CPU_ENV
    from sarl.structure.embed.local import bundled_minilm_path
    from slurm.launcher import COLLECTIVE_INTERFACE_VARS, ModuleJob, SlurmSettings, interface_of

    try:
        ip = routable_ip()
    except OSError as err:
        pytest.skip(f"no network interface but loopback here: {err}")
    python = vllm_python_or_skip()
    ray_tmp = tempfile.mkdtemp(prefix="sarl-ray-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    monkeypatch.setenv("RAY_TMPDIR", ray_tmp)
    for var in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", *COLLECTIVE_INTERFACE_VARS):
        monkeypatch.delenv(var, raising=False)
    # the Ray daemons start without the Hub's offline mode; the driver decides it (the Hub cannot be reached) and
    # must hand it to the ranks on both nodes
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    for key, value in VLLM_CPU_ENV.items():
        monkeypatch.setenv(key, value)
    run_dir = tmp_path / "run"
    argv = [
        "+exp=grpo_sarl_math",
        "backend=verl_cpu",
        f"run_dir={run_dir}",
        f"++model.build.cache_dir={SHARED['policy_cache']}",
        "train.nnodes=2",
        "embedding=vllm_server",
        "embedding.model=minilm",
        "embedding.dim=384",
        f"embedding_server.model={bundled_minilm_path()}",
        f"embedding_server.python={python}",
        "embedding_server.dtype=float32",
        "embedding_server.max_model_len=256",
        "embedding_server.extra_args=[--enforce-eager]",
        "embedding_server.startup_timeout_s=300",
    ]
    # one logical GPU and 8 logical CPUs per node (verl's pools ask for a GPU per rank and 3 CPUs per bundle)
    settings = SlurmSettings(
        nodes=2, gpus_per_node=1, cpus_per_task=8, ray_port=free_port(), signal_delay_s=0, ray_join_timeout_s=300
    )
    head, worker = (ModuleJob("sarl.train", argv, str(REPO), settings, sys.executable) for _ in range(2))
    hosts, folder = [ip, ip], tmp_path / "job"
    folder.mkdir()
    joined: dict[str, object] = {}

    def join() -> None:
        try:
            joined["rc"] = worker.run_on_node(1, hosts, folder)
        except Exception as err:  # noqa: BLE001 - reported by the main thread
            joined["error"] = err

    node = threading.Thread(target=join, daemon=True)
    node.start()
    watchdog = threading.Timer(RUN_TIMEOUT_S, head._stop_child)  # a hang ends as a failed driver, not a stuck CI
    watchdog.start()
    try:
        rc = head.run_on_node(0, hosts, folder)
    finally:
        watchdog.cancel()
        worker._stop_child()  # the worker node blocks until stopped (its process group) or the head is gone
        node.join(timeout=60)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    out, err = capfd.readouterr()
    (tmp_path / "job.log").write_text(out + err)  # both nodes' and the driver's console, for a failure's reader
    assert "error" not in joined, f"the second node failed: {joined['error']!r}"
    verl_log = (run_dir / VERL_LOG).read_text(errors="replace") if (run_dir / VERL_LOG).exists() else ""
    run = Run(rc, run_dir, out + err, verl_log)
    by_step = assert_trained(run)
    for step in (1, 2):
        assert by_step[step]["reward/failed"] == 0, by_step[step]
        assert math.isfinite(float(by_step[step]["reward/C/mean"]))
    url = yaml.safe_load((run_dir / "verl_trainer.yaml").read_text())["reward"]["custom_reward_function"]
    url = url["reward_kwargs"]["reward"]["embedder"]["url"]
    host = url.split("//")[1].rsplit(":", 1)[0]
    assert host == ip and not is_loopback(host), url
    parts = sync_records(run_dir, SYNC_RANKS_LOG)
    nodes = {p["rank"]: p["node"] for p in parts}
    assert sorted(nodes) == [0, 1] and nodes[0] != nodes[1], f"the actor ranks ran on Ray nodes {nodes}"
    # the run's settings reached the ranks on both nodes: the driver's offline mode, the collectives' interface (the
    # one that routes to the head, as Ray's --node-ip-address)
    interface = interface_of(ip)
    assert interface, f"no interface has {ip}"
    for part in parts:
        assert part["env"] == {"HF_HUB_OFFLINE": "1", "GLOO_SOCKET_IFNAME": interface, "NCCL_SOCKET_IFNAME": interface}
    assert {s["replica"] for s in sync_records(run_dir)} == {0, 1}  # a rollout replica per node


@pytest.mark.parametrize(
    "row,trained,band",
    [
        ("evol_rl_paper", 8, "majority"),  # 64 votes / 32 trained, scaled to 4 / 2 per prompt
        ("evol_rl_rlvr_paper", 16, "correct"),  # EVOL-RL App. D.4: the verifier's bands, all 32 (here 4) trained
    ],
)
def test_evol_rl_paper_rows_vote_and_train(tmp_path, row, trained, band):
    """The EVOL-RL reward's two labels on verl: the majority vote (B.2) and App. D.4's ground-truth verifier, whose
    bands (`reward/correct/mean`) replace the vote's; 4 prompts x 4 rollouts scored a step."""
    run = run_row(tmp_path / "evol", row)
    by_step = assert_trained(run)
    assert by_step[1]["reward/voted_sessions"] == 16 and by_step[1]["reward/trained_sessions"] == trained
    other = {"majority": "correct", "correct": "majority"}[band]
    assert f"reward/{band}/mean" in by_step[1] and f"reward/{other}/mean" not in by_step[1], sorted(by_step[1])


def test_pasc_grpo_grp_math_trains_with_scae(tmp_path):
    """PASC-GRPO's advantage estimator (SCAE) registered in the trainer's process and used in both steps, on a tiny
    policy warm-started on graph traces (tiny_qwen3_graph): some of its graphs parse, so GRP's rewards differ; the
    GRP format check runs first and reports."""
    run = run_row(tmp_path / "pasc", "pasc_grpo_grp_math")
    by_step = assert_trained(run)
    assert all(by_step[s]["reward/failed"] == 0 for s in (1, 2))
    assert "format check:" in run.log
    config = (run.run_dir / "verl_trainer.yaml").read_text()
    assert "adv_estimator: scae" in config


def test_dr_grpo_paper_trains_without_the_std_and_with_a_constant_loss_divisor(tmp_path):
    """Dr.GRPO (conf/algorithm/dr_grpo.yaml) through verl's own keys: advantages not divided by the group's std,
    each response's summed token loss divided by one constant (the response budget, cut to the CPU's)."""
    # At the row's T=0.6 the tiny policy writes the same answer six times over: its groups often score alike
    run = run_row(tmp_path / "dr_grpo", "dr_grpo_paper", "train.temperature=1.0")
    assert_trained(run)
    config = (run.run_dir / "verl_trainer.yaml").read_text()
    assert "norm_adv_by_std_in_grpo: false" in config
    assert "loss_agg_mode: seq-mean-token-sum-norm" in config
    budget = re.search(r"max_response_length: (\d+)", config).group(1)
    assert f"loss_scale_factor: {budget}" in config


def test_grpo_lcs_maxflow_math_joint_reward_with_masking_and_tag_resampling(tmp_path):
    """The attention model (MaxFlow) and LCS on a tiny policy that writes step tags (tiny_qwen3_tagged), truncated
    completions masked (a 176-token cap cuts the longest, about 1 in 8), the tag set redrawn per sampled
    prompt."""
    # 8 steps, not SPARSE_STEPS' 6: right answers cluster on a few prompts (the comment below)
    steps = "train.total_training_steps=8"
    run = run_row(tmp_path / "joint", "grpo_lcs_maxflow_math", "data.max_response_length=176", steps, TOP_K)
    by_step = assert_trained(run, steps=8, sparse=True)
    for step in range(1, 9):
        row = by_step[step]
        assert "reward/maxflow/score/mean" in row and "reward/lcs/score/mean" in row, sorted(row)
        assert row["reward/failed"] == 0
        assert row["data/tag_sets_drawn"] == 4 and row["data/tag_sets_changed"] > 0, row  # redrawn in the run
    assert sum(by_step[s]["response/truncated_left_out"] for s in range(1, 9)) > 0
    learned = [s for s in range(1, 9) if by_step[s]["actor/grad_norm"] > 0]  # a group with a right response
    assert any(by_step[s]["reward/lcs/score/mean"] != 0 for s in learned), by_step  # LCS had its reference
    prompts = pd_prompts(run.run_dir)
    assert len(set(prompts)) == len(prompts)  # every row its own tag set
    config = (run.run_dir / "verl_trainer.yaml").read_text()
    assert "resample_tags: true" in config and "mask_truncated: true" in config


# Rows whose tiny policy gets sparse rewards (assert_trained's `sparse`) run 6 steps, not 2 (a step is 4-10 s beside
# the ~100 s of start-up), sampled with Qwen3's thinking-mode top-k of 20 (its model card; the rows set none). The
# tiny tagged policy's right answers cluster on a few prompts, and the smoke prompts come in order, 4 a step: 32
# samples of each of the first 32 at T=0.6 (176 tokens) found 36 right, 22 of them on 10*8, 11*6, 10*4 (steps 2 and
# 6), 10 on three prompts of steps 7 and 8. From those rates a run has no right answer in 6 steps about 1 time in 40,
# in 8 steps about 1 in 150 (the joint LCS + MaxFlow row runs 8)
SPARSE_STEPS = "train.total_training_steps=6"
TOP_K = "+backend.overrides.actor_rollout_ref.rollout.top_k=20"


def test_grpo_code_exec_runs_each_response_in_the_sandbox(tmp_path):
    """The code rows' plumbing: the smoke code prompts with their tests as gold (smoke_code), reward=code_exec in
    verl's reward workers running each response's last code block in the sandbox (sarl/checking/code/). The tiny
    policy has never seen code: its responses get an outcome each (all `code/no_code_block` so far, so no program
    is executed here: the sandbox's own runs are tests/eval/test_sandbox.py's), scored 0 and counted, none a failed
    reward; with every score 0 nothing is learnt, which only a code model changes."""
    run = run_row(tmp_path / "code", "grpo_code_exec")
    assert run.rc == 0, tail(run)
    by_step = run.steps()
    for step in (1, 2):
        row = by_step[step]
        assert row["reward/failed"] == 0, row
        shares = {k: v for k, v in row.items() if k.startswith("reward/code/") and k.endswith("/mean")}
        assert shares and math.isclose(sum(shares.values()), 1.0), shares  # one outcome per response
        assert math.isfinite(float(row["actor/pg_loss"]))
    config = (run.run_dir / "verl_trainer.yaml").read_text()
    assert "baselines.code_exec.CodeExecReward" in config or "code_exec" in config


def pd_prompts(run_dir: Path) -> list[str]:
    import pandas as pd

    frame = pd.read_parquet(run_dir / "verl_cpu_data" / "train.parquet")
    return [p[0]["content"] for p in frame["prompt"]]


def test_lcs_paper_pipeline_sft_then_grpo_from_its_checkpoint(tmp_path):
    """The SFT stage runs verl's SFT trainer (torchrun, gloo) on the shipped tagged traces from the tagged tiny
    policy, the RL stage loads the Hugging Face checkpoint it wrote and trains on LCS."""
    # After the SFT stage the tagged policy answers every smoke prompt right at the row's T=0.6 (every group
    # scored alike, no gradient); at 1.2 its groups differ
    run = run_row(tmp_path / "lcs_paper", "lcs_paper", f"rl:{SPARSE_STEPS}", f"rl:{TOP_K}", "rl:train.temperature=1.2")
    assert run.rc == 0, tail(run)
    sft = read_metrics_history(run.run_dir / "sft" / "metrics.jsonl")
    assert [int(r["step"]) for r in sft if "train/loss" in r] == [1, 2], sft
    assert_trained(Run(run.rc, run.run_dir / "rl", run.log, run.verl_log), steps=6, sparse=True)
    record = json.loads((run.run_dir / "pipeline.json").read_text())
    start = record["stages"]["sft"]
    assert start == str(run.run_dir / "sft" / "final") and f"model.path={start}" in run.log
    sft_hf = sorted((run.run_dir / "sft" / "checkpoints").glob("global_step_*/huggingface"))[-1]
    assert (Path(start) / "model.safetensors").samefile(sft_hf / "model.safetensors")  # linked: no second copy
    # the pipeline trains one model: `eval.run ckpt=<pipeline run dir>` evaluates its last stage's final/
    assert record["final_stage"] == "rl"
    rl = Run(run.rc, run.run_dir / "rl", run.log, run.verl_log)
    assert_chain(run.run_dir, "lcs_paper/rl", assert_final_is_the_trained_model(rl, step=6), tmp_path / "chain")
