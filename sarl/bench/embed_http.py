"""HTTP embedding client (HTTPEmbedder: base64 transport, reused connections) against a local vLLM CPU
server, versus the same model (the MiniLM shipped for tests) called in-process with sentence-transformers.

Both sides embed the same step texts with the same number of compute threads (`threads`): in-process,
`torch.set_num_threads` (and no tokenizer thread pool); the server's model worker, OMP_NUM_THREADS, which
vLLM's CPU worker keeps when VLLM_CPU_OMP_THREADS_BIND is "nobind" (vLLM 0.24 vllm/utils/ompmultiprocessing.py;
with a CPU list such as "0-1" it sets OMP_NUM_THREADS to the list's length itself and pins the threads:
`server_cpu_bind`). The server
also runs an API process and an engine-core process besides the model's threads, so the CPU seconds each
process used during every run are read from /proc and printed with its thread count: "cores busy" is
CPU seconds / wall seconds, and texts per CPU second compares the work done, not only the clock.
In-process and HTTP alternate for each repeat; figures are medians. The vectors must agree to float32
precision (maximum absolute difference and minimum cosine printed).
"""

from __future__ import annotations

import os
import re
import resource
import time
from pathlib import Path

import numpy as np
from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from sarl.bench.common import median
from sarl.bench.structure import step_text_stream
from sarl.runtime.errors import UserError
from sarl.serving.http import HTTPEmbedder
from sarl.serving.server import VLLM_CPU_ARGS, VLLM_CPU_ENV, EmbeddingServer
from sarl.structure.embed.local import SentenceTransformerEmbedder, bundled_minilm_path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def own_cpu_s() -> float:
    """CPU seconds (user + system) of this process, all its threads."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def process_tree(root: int) -> list[int]:
    """`root` and all its descendants, from /proc (empty where /proc is missing)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parents[int(entry.name)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    tree, frontier = [], [root] if root in parents else []
    while frontier:
        pid = frontier.pop()
        tree.append(pid)
        frontier.extend(p for p, pp in parents.items() if pp == pid)
    return sorted(tree)


def cpu_by_process(pids: list[int]) -> dict[int, dict]:
    """Name, thread count and CPU seconds (user + system) so far of each live process in `pids`."""
    out = {}
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        threads = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("Threads:")), 0)
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        out[pid] = {"name": name, "threads": threads, "cpu_s": (int(fields[11]) + int(fields[12])) / CLOCK_TICKS}
    return out


def cpu_list_size(spec: str) -> int:
    """Number of CPUs in a list such as "0", "0-1" or "0,2-3" (vLLM's VLLM_CPU_OMP_THREADS_BIND form)."""
    count = 0
    for part in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
        if m is None or (m[2] is not None and int(m[2]) < int(m[1])):
            raise UserError(
                f"conf/bench.yaml: embed_http.server_cpu_bind={spec!r} is not a CPU list; write e.g. '0', '0-1' "
                "or 'nobind'"
            )
        count += int(m[2]) - int(m[1]) + 1 if m[2] is not None else 1
    return count


def server_env(threads: int, cpu_bind: str) -> dict[str, str]:
    """The thread settings of the vLLM CPU server for `threads` compute threads."""
    if cpu_bind != "nobind":
        n = cpu_list_size(cpu_bind)
        if n != threads:
            raise UserError(
                f"conf/bench.yaml: embed_http.server_cpu_bind={cpu_bind!r} lists {n} CPUs but threads={threads}; "
                f"list {threads} CPUs (e.g. '0-{threads - 1}') or use 'nobind'"
            )
    return {"OMP_NUM_THREADS": str(threads), "VLLM_CPU_OMP_THREADS_BIND": cpu_bind}


def bench_texts(n: int) -> list[str]:
    stream = step_text_stream()
    return [stream[i % len(stream)] + ("" if i < len(stream) else f" ({i // len(stream)})") for i in range(n)]


def run_embed_http(cfg: DictConfig, console: Console) -> dict | None:
    python = Path(cfg.server_python)
    if not python.exists():
        console.print(f"[yellow]embed_http skipped: {python} not found (run scripts/setup_vllm_cpu.sh)")
        return None
    import torch

    threads = torch.get_num_threads()  # set by `threads` (sarl.bench.common.thread_settings)
    env = {**VLLM_CPU_ENV, **server_env(threads, str(cfg.server_cpu_bind))}
    # the server's tokenizer runs without a thread pool (VLLM_CPU_ENV); so does the in-process one
    tokenizers_before = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    texts = bench_texts(cfg.texts)
    local = SentenceTransformerEmbedder(batch_size=cfg.batch_size)
    local.embed(texts[:16])  # warm-up
    try:
        with EmbeddingServer(
            bundled_minilm_path(),
            served_name="minilm",
            python=str(python),
            env=env,
            extra_args=[*VLLM_CPU_ARGS, *cfg.server_args],
            startup_timeout_s=cfg.startup_timeout_s,
        ) as server:
            with HTTPEmbedder(
                url=server.url,
                model="minilm",
                batch_size=cfg.batch_size,
                max_concurrency=cfg.max_concurrency,
                timeout_s=cfg.timeout_s,
                # the server cuts long texts where sentence-transformers does (instead of a 400 per long
                # text and the request splits it causes): the same work and vectors on both sides
                extra_body={"truncate_prompt_tokens": int(local.model.max_seq_length)},
            ) as client:
                client.embed(texts[:16])  # warm-up (connection, first request)
                server_pids = process_tree(server.proc.pid)
                runs = alternate_with_cpu({"in_process": local, "http": client}, texts, server_pids, cfg.repeats)
    finally:
        if tokenizers_before is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = tokenizers_before
    ref = np.asarray(runs["in_process"]["result"].vectors, dtype=np.float32)
    got_result = runs["http"]["result"]
    got = np.asarray(got_result.vectors, dtype=np.float32)
    out: dict = {
        "texts": len(texts),
        "threads": threads,
        "server_env": server_env(threads, str(cfg.server_cpu_bind)),
        "truncate_tokens": int(local.model.max_seq_length),
    }
    for name in ("in_process", "http"):
        r = runs[name]
        wall, cpu = median(r["wall_s"]), median(r["cpu_s"])
        out[f"{name}_s"] = wall
        out[f"{name}_times_s"] = r["wall_s"]
        out[f"{name}_cpu_s"] = cpu
        out[f"{name}_cores_busy"] = cpu / wall
        out[f"{name}_texts_per_cpu_s"] = len(texts) / cpu
    out["server_processes"] = runs["http"]["processes"]
    out["failed"] = len(got_result.failed)
    out["max_abs_diff"] = float(np.nanmax(np.abs(got - ref)))
    out["min_cosine"] = float(np.nanmin((got * ref).sum(1)))
    out["http_over_in_process_throughput"] = out["in_process_s"] / out["http_s"]
    out["http_over_in_process_per_cpu_s"] = out["http_texts_per_cpu_s"] / out["in_process_texts_per_cpu_s"]

    title = (
        f"embedding {len(texts)} step texts with all-MiniLM-L6-v2 on CPU, {threads} compute thread(s) a side "
        f"(server: {', '.join(f'{k}={v}' for k, v in out['server_env'].items())}), texts cut at "
        f"{out['truncate_tokens']} tokens on both sides, median of {cfg.repeats}"
    )
    table = Table(title=title)
    for col in ("path", "median s", "texts/s", "CPU s", "cores busy", "texts per CPU s", "repeats s"):
        table.add_column(col, justify="right")
    for name, label in (("in_process", "in-process (sentence-transformers)"), ("http", "HTTP (vLLM CPU server)")):
        table.add_row(
            label,
            f"{out[f'{name}_s']:.2f}",
            f"{len(texts) / out[f'{name}_s']:.0f}",
            f"{out[f'{name}_cpu_s']:.2f}",
            f"{out[f'{name}_cores_busy']:.2f}",
            f"{out[f'{name}_texts_per_cpu_s']:.0f}",
            " ".join(f"{t:.2f}" for t in runs[name]["wall_s"]),
        )
    console.print(table)
    procs = Table(title="CPU seconds of each process during the HTTP runs (median run)")
    for col in ("process", "pid", "threads", "CPU s", "cores busy"):
        procs.add_column(col, justify="right")
    for row in out["server_processes"]:
        cpu_s = row["cpu_s"]
        procs.add_row(row["name"], str(row["pid"]), str(row["threads"]), f"{cpu_s:.2f}", f"{cpu_s / out['http_s']:.2f}")
    console.print(procs)
    console.print(
        f"HTTP throughput / in-process: {100 * out['http_over_in_process_throughput']:.0f}% (goal >= 90%); "
        f"per CPU second: {100 * out['http_over_in_process_per_cpu_s']:.0f}%; "
        f"max |difference| {out['max_abs_diff']:.2e}, min cosine {out['min_cosine']:.6f}; failed {out['failed']}"
    )
    return out


def alternate_with_cpu(embedders: dict, texts: list[str], server_pids: list[int], repeats: int) -> dict[str, dict]:
    """Each embedder on `texts` once per repeat, in turn; the wall time, the CPU seconds used by this
    process and (for all but the in-process side) by the server's processes, and the last result.

    The /proc reads happen outside the timed part. "processes" holds, per process (this one first),
    the thread count and CPU seconds of the run whose wall time is the median.
    """
    runs: dict[str, dict] = {name: {"wall_s": [], "cpu_s": [], "per_run": []} for name in embedders}
    for _ in range(repeats):
        for name, embedder in embedders.items():
            server_before = cpu_by_process(server_pids)
            own_before = own_cpu_s()
            t0 = time.perf_counter()
            result = embedder.embed(texts)
            wall = time.perf_counter() - t0
            own = own_cpu_s() - own_before
            server_after = cpu_by_process(server_pids)
            procs = [{"name": "this process (client side)", "pid": os.getpid(), "threads": own_threads(), "cpu_s": own}]
            server_cpu = 0.0
            if name != "in_process":
                for pid, after in server_after.items():
                    used = after["cpu_s"] - server_before.get(pid, {"cpu_s": 0.0})["cpu_s"]
                    server_cpu += used
                    procs.append({"name": after["name"], "pid": pid, "threads": after["threads"], "cpu_s": used})
            runs[name]["wall_s"].append(wall)
            runs[name]["cpu_s"].append(own + server_cpu)
            runs[name]["per_run"].append(procs)
            runs[name]["result"] = result
    for r in runs.values():
        order = sorted(range(len(r["wall_s"])), key=r["wall_s"].__getitem__)
        r["processes"] = r.pop("per_run")[order[len(order) // 2]]
    return runs


def own_threads() -> int:
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return 0
    return next((int(line.split()[1]) for line in status.splitlines() if line.startswith("Threads:")), 0)
