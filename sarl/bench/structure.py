"""Structure stage (per-response clustering + reasoning map + SR) against the loop a user would write.

Baseline, per response: scikit-learn `KMeans(n_clusters=k, n_init="auto", random_state=seed)` or
`HDBSCAN(min_cluster_size, min_samples)` (`sarl.structure.reference.sklearn_hdbscan_labels`), then the networkx
reasoning map and SR (SARL Eqs. 4-6), nothing else. Ours: `structure_rewards_from_embeddings` on the whole batch.
Both sides cluster with the reward's settings (conf/reward/sarl.yaml composed as the section's `reward`: seed,
k_rule, variant). Roofline: the Gram-matrix
products alone, as ours makes them (X X^T per response: the compiled kernel in the embeddings' precision for
KMeans, BLAS in float64 for HDBSCAN), the one large product both clustering methods start from; numpy's
float32 X @ X.T (BLAS) is timed beside it. Both sides run under the same thread limits; each figure is the median of
alternating repeats (ours, baseline, ours, baseline, ...).

Three data families, every one with step counts drawn from the spread of real responses:
- random: unit vectors with no structure;
- planted: a few latent "functions" per response (k as the k rule gives), steps = centre + noise;
- minilm: real sentence embeddings (the MiniLM model shipped for tests) of the steps of the shipped
  traces (sarl/samples) and of sentences of the test fixtures, as windows of that text stream.

Then the Gram product alone by response length (`gram_steps`): the reward's compiled kernel against numpy's
X @ X.T, and ours at training size (`scale_responses`) with the kernels' load time (`load_kernels`).
"""

from __future__ import annotations

import glob
import json
import re
import warnings
from pathlib import Path

import numpy as np
from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from sarl.bench.common import alternate, median, peak_memory_mb, timed
from sarl.runtime.files import REPO_ROOT
from sarl.structure.cluster import DEFAULT_K_RULE, cluster_batch, kmeans_k, method_k_rule
from sarl.structure.embed.local import SentenceTransformerEmbedder
from sarl.structure.gram import BLOCKS, gram
from sarl.structure.graph import reasoning_map, structure_reward
from sarl.structure.reference import sklearn_hdbscan_labels
from sarl.structure.reward import structure_rewards_from_embeddings
from sarl.structure.steps import split_steps


def step_counts(n: int, cfg: DictConfig, rng: np.random.Generator) -> np.ndarray:
    """M per response: log-normal around the median of real responses, clipped to [steps_min, steps_max]."""
    m = np.exp(rng.normal(np.log(cfg.steps_median), cfg.steps_sigma, n))
    return np.clip(np.rint(m), cfg.steps_min, cfg.steps_max).astype(np.int64)


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def random_family(ms: np.ndarray, dim: int, rng: np.random.Generator) -> tuple[list[np.ndarray], None]:
    return [_unit(rng.standard_normal((m, dim), dtype=np.float32)) for m in ms], None


def planted_family(
    ms: np.ndarray, dim: int, noise: float, rng: np.random.Generator
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each response visits k = kmeans_k(M) latent functions in random order (every one at least once);
    returns the embeddings and the planted labels."""
    embs, truth = [], []
    for m in ms:
        k = kmeans_k(int(m))
        labels = np.concatenate([np.arange(k), rng.integers(0, k, m - k)])
        rng.shuffle(labels)
        centres = rng.standard_normal((k, dim), dtype=np.float32)
        x = centres[labels] + noise * rng.standard_normal((m, dim), dtype=np.float32)
        embs.append(_unit(x))
        truth.append(labels)
    return embs, truth


def _strings(obj):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v)


def step_text_stream(max_texts: int | None = None) -> list[str]:
    """Distinct step texts in reading order: the steps of the shipped traces, then the sentences
    (at least 20 characters) of the test fixtures' JSON/JSONL text fields."""
    texts: list[str] = []
    for line in (REPO_ROOT / "sarl" / "samples" / "responses.jsonl").read_text().splitlines():
        if line.strip():
            texts += split_steps(json.loads(line)["response"])
    for pattern in ("tests/fixtures/data/*.json*", "tests/fixtures/eval/*.json*"):
        for f in sorted(glob.glob(str(REPO_ROOT / pattern))):
            raw = Path(f).read_text()
            objs = [json.loads(x) for x in raw.splitlines() if x.strip()] if f.endswith(".jsonl") else [json.loads(raw)]
            for s in _strings(objs):
                texts += [p.strip() for p in re.split(r"\n\s*\n|(?<=[.!?])\s+", s) if len(p.strip()) >= 20]
    stream = list(dict.fromkeys(texts))
    return stream[:max_texts] if max_texts else stream


def minilm_family(ms: np.ndarray, rng: np.random.Generator, max_texts: int | None) -> tuple[list[np.ndarray], None]:
    """Windows of M consecutive texts of the step stream (wrapping around), embedded with MiniLM; M is
    capped at the stream's length so no window repeats a text."""
    stream = step_text_stream(max_texts)
    result = SentenceTransformerEmbedder().embed(stream)
    if result.failed:
        raise RuntimeError(f"MiniLM failed on {len(result.failed)} step texts")
    vecs = _unit(np.asarray(result.vectors, dtype=np.float32))
    n = len(vecs)
    embs = []
    for m in np.minimum(ms, n):
        start = int(rng.integers(0, n))
        embs.append(np.ascontiguousarray(vecs[(start + np.arange(m)) % n]))
    return embs, None


def reward_settings(reward: DictConfig, method: str) -> dict:
    """The reward's clustering settings for `method` (`reward`: conf/reward/sarl.yaml as the section composes it)."""
    return {"seed": int(reward.seed), "k_rule": method_k_rule(method, reward.k_rule)}


def baseline_labels(
    x: np.ndarray, method: str, seed: int, algorithm: str = "auto", k_rule: str = DEFAULT_K_RULE
) -> np.ndarray:
    """What a user would write for one response: scikit-learn with the paper's parameters."""
    from sklearn.cluster import KMeans

    if method == "kmeans":
        return KMeans(n_clusters=kmeans_k(len(x), rule=k_rule), n_init="auto", random_state=seed).fit(x).labels_
    return sklearn_hdbscan_labels(x, algorithm=algorithm)


def baseline_rewards(
    embs: list[np.ndarray], method: str, seed: int, k_rule: str = DEFAULT_K_RULE, variant: str = "sarl"
) -> tuple[list[float], list[np.ndarray]]:
    """The per-response loop: scikit-learn clustering, networkx reasoning map, SR (SARL Eq. 6)."""
    scores, labels = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for x in embs:
            lab = baseline_labels(x, method, seed, k_rule=k_rule)
            scores.append(structure_reward(reasoning_map(lab), variant))
            labels.append(lab)
    return scores, labels


def gram_roofline(embs: list[np.ndarray], method: str) -> None:
    """The Gram-matrix products alone, as ours makes them: X X^T for every response with the compiled kernel in the
    embeddings' precision (KMeans), with BLAS in float64 (HDBSCAN, as scikit-learn computes its distances)."""
    for x in embs:
        if method == "kmeans":
            gram(x)
        else:
            x64 = x.astype(np.float64)
            x64 @ x64.T


def blas_grams(embs: list[np.ndarray]) -> None:
    """numpy's X @ X.T for every response in the embeddings' precision (BLAS's symmetric rank-k update)."""
    for x in embs:
        x @ x.T


def inertia(x: np.ndarray, labels: np.ndarray) -> float:
    """KMeans objective: within-cluster sum of squared distances."""
    x = x.astype(np.float64)
    return float(sum(((x[labels == c] - x[labels == c].mean(0)) ** 2).sum() for c in np.unique(labels)))


def make_family(name: str, cfg: DictConfig, n: int, seed: int):
    rng = np.random.default_rng(seed)
    ms = step_counts(n, cfg, rng)
    if name == "random":
        return random_family(ms, cfg.dim, rng)
    if name == "planted":
        return planted_family(ms, cfg.dim, cfg.noise, rng)
    if name == "minilm":
        return minilm_family(ms, rng, cfg.minilm_max_texts)
    raise ValueError(f"structure family {name!r} is not valid; choose random, planted or minilm")


def bench_family(name: str, cfg: DictConfig, console: Console) -> list[dict]:
    from sklearn.metrics import adjusted_rand_score

    embs, truth = make_family(name, cfg, cfg.n_responses, cfg.seed)
    ms = np.array([len(x) for x in embs])
    dim = embs[0].shape[1]
    n = len(embs)
    console.print(
        f"{name}: {n} responses, M {ms.min()}..{ms.max()} (median {np.median(ms):.0f}, mean {ms.mean():.1f}), "
        f"dim {dim}, {sum(x.nbytes for x in embs) / 2**20:.1f} MB of embeddings"
    )
    rows = []
    variant = cfg.reward.variant
    for method in cfg.methods:
        chosen = reward_settings(cfg.reward, method)

        def ours(method=method, chosen=chosen):
            return structure_rewards_from_embeddings(embs, method=method, variant=variant, **chosen)

        first_s, fast = timed(ours)
        times = alternate(
            {
                "ours": ours,
                "baseline": lambda method=method, chosen=chosen: baseline_rewards(
                    embs, method, **chosen, variant=variant
                ),
                "roofline": lambda method=method: gram_roofline(embs, method),
                "blas_gram": lambda: blas_grams(embs),
            },
            cfg.repeats,
        )
        mem_ours = peak_memory_mb(ours)
        # Labels, untimed.
        ours_labels = cluster_batch(embs, method=method, **chosen)
        slow, base_labels = baseline_rewards(embs, method, **chosen, variant=variant)
        row = {
            "family": name,
            "method": method,
            "responses": n,
            "dim": dim,
            "steps_mean": float(ms.mean()),
            "ours_ms": 1e3 * median(times["ours"]) / n,
            "baseline_ms": 1e3 * median(times["baseline"]) / n,
            "roofline_ms": 1e3 * median(times["roofline"]) / n,
            "blas_gram_ms": 1e3 * median(times["blas_gram"]) / n,
            "first_ms": 1e3 * first_s / n,
            "ours_times_s": times["ours"],
            "baseline_times_s": times["baseline"],
            "roofline_times_s": times["roofline"],
            "blas_gram_times_s": times["blas_gram"],
            "peak_mb": mem_ours,
            "same_sr": float(np.mean(np.isclose(fast, slow))),
        }
        row["speedup"] = row["baseline_ms"] / row["ours_ms"]
        row["over_roofline"] = row["ours_ms"] / row["roofline_ms"]
        row["first_over_later"] = row["first_ms"] / row["ours_ms"]
        if method == "kmeans":
            row["inertia_ratio"] = float(
                np.mean([inertia(x, a) / max(inertia(x, b), 1e-300) for x, a, b in zip(embs, ours_labels, base_labels)])
            )
            if truth is not None:
                row["ari_ours_truth"] = float(np.mean([adjusted_rand_score(t, a) for t, a in zip(truth, ours_labels)]))
                row["ari_sklearn_truth"] = float(
                    np.mean([adjusted_rand_score(t, b) for t, b in zip(truth, base_labels)])
                )
        else:
            brute = [sklearn_hdbscan_labels(x, algorithm="brute") for x in embs]
            row["equal_brute"] = int(sum(np.array_equal(a, b) for a, b in zip(ours_labels, brute)))
        rows.append(row)
        console.print(
            f"  {method}: ours {row['ours_ms']:.3f} ms/response, baseline {row['baseline_ms']:.3f}, "
            f"{row['speedup']:.1f}x; Gram roofline {row['roofline_ms']:.3f} ({row['over_roofline']:.2f}x); "
            f"numpy's float32 X @ X.T {row['blas_gram_ms']:.3f}"
        )
    return rows


def bench_gram(cfg: DictConfig) -> list[dict]:
    """Gram products X X^T of one M x dim float32 response (in cache, `gram_products` per timed call) for each M of
    `gram_steps`: the reward's compiled kernel (`sarl.structure.gram.gram`) against numpy's `x @ x.T` (BLAS's
    symmetric rank-k update), alternating, under the run's thread limits. GFLOP/s count the M (M + 1) / 2 dot
    products of d multiply-adds each that both compute."""
    rng = np.random.default_rng(cfg.seed)
    rows = []
    for m in cfg.gram_steps:
        n = int(cfg.gram_products)
        batch = [rng.standard_normal((int(m), cfg.dim), dtype=np.float32)] * n  # one response, n times

        times = alternate(
            {"kernel": lambda b=batch: gram_roofline(b, "kmeans"), "numpy": lambda b=batch: blas_grams(b)}, cfg.repeats
        )
        flop = m * (m + 1) * cfg.dim  # 2 flops per multiply-add
        k_s, b_s = median(times["kernel"]) / n, median(times["numpy"]) / n
        rows.append(
            {
                "steps": int(m),
                "dim": int(cfg.dim),
                "kernel_us": 1e6 * k_s,
                "numpy_us": 1e6 * b_s,
                "kernel_gflop_s": flop / k_s / 1e9,
                "numpy_gflop_s": flop / b_s / 1e9,
                "speedup": b_s / k_s,
                "blocks": BLOCKS,
            }
        )
    return rows


_LOAD_KERNELS = (
    "import time; from sarl.structure.cluster import load_kernels; "
    "t = time.perf_counter(); load_kernels(); print(time.perf_counter() - t)"
)


def kernel_startup() -> dict:
    """Seconds to load the compiled kernels (`sarl.structure.cluster.load_kernels`) in a fresh process: `cold`
    compiles them into an empty cache (what the first load after installing pays, once), `warm` loads them from that
    cache (what every later process pays when it builds the reward, before its first call). numba itself is imported
    first, untimed."""
    import os
    import subprocess
    import sys
    import tempfile

    out = {}
    with tempfile.TemporaryDirectory(prefix="sarl-numba-") as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache}
        for name in ("cold", "warm"):
            done = subprocess.run(
                [sys.executable, "-c", "import numba; " + _LOAD_KERNELS],
                env=env,
                capture_output=True,
                text=True,
                check=True,
                cwd=str(REPO_ROOT),
            )
            out[f"{name}_import_s"] = float(done.stdout.split()[-1])
    return out


def kernel_scratch_mb(embs: list[np.ndarray]) -> float:
    """Largest scratch the compiled kernels allocate for one response (numba's allocator, not seen by
    tracemalloc): the M x M float64 distance matrix and the k x M sums of KMeans, for the longest response."""
    m = max((len(x) for x in embs), default=0)
    return (m * m + kmeans_k(m) * m) * 8 / 2**20 if m else 0.0


def bench_scale(cfg: DictConfig, console: Console) -> dict:
    """Ours alone on a training-size batch: first call vs later calls and the peak memory."""
    embs, _ = make_family("random", cfg, cfg.scale_responses, cfg.seed + 1)
    n = len(embs)
    emb_mb = sum(x.nbytes for x in embs) / 2**20
    out = {"responses": n, "steps_mean": float(np.mean([len(x) for x in embs])), "embeddings_mb": emb_mb}
    for method in cfg.methods:

        def ours(method=method):
            return structure_rewards_from_embeddings(
                embs, method=method, variant=cfg.reward.variant, **reward_settings(cfg.reward, method)
            )

        first = timed(ours)[0]
        later = [timed(ours)[0] for _ in range(cfg.repeats)]
        out[method] = {
            "first_ms": 1e3 * first / n,
            "later_ms": 1e3 * median(later) / n,
            "first_over_later": first / median(later),
            "peak_mb": peak_memory_mb(ours),
        }
    out["kernel_scratch_mb"] = kernel_scratch_mb(embs)
    out["startup"] = kernel_startup()
    return out


# The report's columns, in order.
COLUMNS = (
    "family",
    "dim",
    "method",
    "ours ms",
    "baseline ms",
    "speed-up",
    "Gram roofline ms",
    "ours / roofline",
    "first / later",
    "peak MB",
    "same SR",
    "labels check",
)


def print_gram(console: Console, grams: list[dict], repeats: int) -> None:
    t = Table(title=f"Gram products of one response ({grams[0]['dim']} dims, float32, in cache), median of {repeats}")
    for col in ("steps", "kernel us", "numpy X @ X.T us", "kernel GFLOP/s", "numpy GFLOP/s", "kernel speed-up"):
        t.add_column(col, justify="right")
    for g in grams:
        t.add_row(
            str(g["steps"]),
            f"{g['kernel_us']:.1f}",
            f"{g['numpy_us']:.1f}",
            f"{g['kernel_gflop_s']:.0f}",
            f"{g['numpy_gflop_s']:.0f}",
            f"{g['speedup']:.2f}x",
        )
    console.print(t)
    console.print(
        f"kernel: sarl.structure.gram.gram, register blocks of {grams[0]['blocks']} entries on this CPU; "
        "numpy: BLAS's symmetric rank-k update. GFLOP/s count the M (M + 1) / 2 dot products both compute."
    )


def run_structure(cfg: DictConfig, console: Console) -> dict:
    rows = []
    for family in cfg.families:
        rows += bench_family(family, cfg, console)
    table = Table(title=f"structure stage per response (median of {cfg.repeats} alternating repeats)")
    for col in COLUMNS:
        table.add_column(col, justify="right")
    for r in rows:
        if r["method"] == "kmeans":
            check = f"inertia {r['inertia_ratio']:.4f}"
            if "ari_ours_truth" in r:
                check += f", ARI {r['ari_ours_truth']:.3f} (sklearn {r['ari_sklearn_truth']:.3f})"
        else:
            check = f"= brute {r['equal_brute']}/{r['responses']}"
        table.add_row(
            r["family"],
            str(r["dim"]),
            r["method"],
            f"{r['ours_ms']:.3f}",
            f"{r['baseline_ms']:.3f}",
            f"{r['speedup']:.1f}x",
            f"{r['roofline_ms']:.3f}",
            f"{r['over_roofline']:.2f}x",
            f"{r['first_over_later']:.2f}",
            f"{r['peak_mb']:.1f}",
            f"{100 * r['same_sr']:.1f}%",
            check,
        )
    console.print(table)
    console.print(
        "peak MB: tracemalloc peak of numpy/Python allocations during one call of ours, above the embeddings "
        "(BLAS scratch not seen); first / later: the first call on the family vs the median of later ones; "
        "inertia: mean over responses of ours / scikit-learn's KMeans objective; ARI: mean adjusted Rand index "
        "against the planted labels."
    )
    grams = bench_gram(cfg) if cfg.gram_steps else []
    if grams:
        print_gram(console, grams, cfg.repeats)
    scale = bench_scale(cfg, console) if cfg.scale_responses else None
    if scale:
        t = Table(
            title=f"ours at scale: {scale['responses']} random responses, {scale['steps_mean']:.1f} steps "
            f"on average, {scale['embeddings_mb']:.0f} MB of embeddings"
        )
        for col in ("method", "first call ms/response", "later ms/response", "first / later", "peak MB above"):
            t.add_column(col, justify="right")
        for method in cfg.methods:
            s = scale[method]
            t.add_row(
                method,
                f"{s['first_ms']:.3f}",
                f"{s['later_ms']:.3f}",
                f"{s['first_over_later']:.2f}",
                f"{s['peak_mb']:.0f}",
            )
        console.print(t)
        st = scale["startup"]
        console.print(
            f"peak MB above: tracemalloc peak of one call; the compiled kernels' scratch (not traced) is at most "
            f"{scale['kernel_scratch_mb']:.1f} MB, for the longest response. Kernels are compiled when first "
            f"loaded (sarl.structure.cluster.load_kernels): {st['cold_import_s']:.2f} s into an empty cache "
            "(once per installation), "
            f"{st['warm_import_s']:.2f} s from the cache (every later process, when it builds the reward)."
        )
    return {"rows": rows, "gram": grams, "scale": scale}
