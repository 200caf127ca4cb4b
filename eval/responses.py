"""The responses of an evaluation: the configured generator (built when first needed), the cache directory of the
checkpoint's current contents, and every (benchmark, problem, sample) response from the cache or generated.
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Any, Callable, Iterator

from omegaconf import DictConfig

from eval.cache import FileDigests, SampleCache, atomic_write_text, checkpoint_fingerprint, safe_name, stable_hash
from eval.config import build, run_name
from eval.generate import Generation, GenerationRequest, Generator, RunInfo, SamplingConfig, sample_seed
from eval.protocol import Benchmark
from sarl.runtime.heartbeat import heartbeat

log = logging.getLogger("eval.run")  # a part of `python -m eval.run`: its messages keep that name


@contextlib.contextmanager
def generators(cfg: DictConfig, run_dir: Path) -> Iterator[Callable[[SamplingConfig], Generator]]:
    """`get(sampling)`: the configured generator (conf/eval/generator/<choice>.yaml, built by
    `hydra.utils.instantiate` when first needed, so a fully cached run loads no model) with those sampling
    settings; one generator serves every sampling setting of the plan. Closed after the run (an `openai`
    generator with url=auto stops the vLLM server it started)."""
    held: list[Generator] = []

    def get(sampling: SamplingConfig) -> Generator:
        if not held:
            info = RunInfo(name=run_name(cfg), run_dir=run_dir, seed=int(cfg.seed))
            kind = str(cfg.generator.get("_target_", "")).rsplit(".", 1)[-1].removesuffix("_generator")
            what = f"generator: loading {kind or 'the generator'} on {cfg.ckpt}"
            with heartbeat(log.info, what):  # imports and weights: minutes on a busy CPU, said as it goes
                held.append(build(cfg.generator, str(cfg.ckpt), sampling, info))
        held[0].sampling = sampling  # every back end samples with its `sampling` (eval/generate.py)
        return held[0]

    try:
        yield get
    finally:
        for gen in held:
            gen.close()


def checkpoint_cache_root(cache_dir: Path, ckpt: str) -> Path:
    """The cache directory of this checkpoint's contents, `fp-<fingerprint>` (eval.cache): keyed by content, not by
    the run's name or the checkpoint's path, so a renamed run or a copied checkpoint reuses its samples and a
    re-saved one never does (said in one line when the same path held other contents before). A Hub id or a server's
    model name is its own identity (`id-<name>`)."""
    digests = FileDigests(cache_dir / "file_digests.json")
    fingerprint = checkpoint_fingerprint(ckpt, digests)
    if fingerprint is None:
        return cache_dir / f"id-{safe_name(ckpt)}"
    seen = cache_dir / "paths" / f"{stable_hash(str(Path(ckpt).resolve()))}.json"
    try:
        before = json.loads(seen.read_text(encoding="utf-8")).get("fingerprint") if seen.is_file() else None
    except (OSError, ValueError, AttributeError):
        before = None
    if before and before != fingerprint:
        log.warning(
            "checkpoint %s changed since it was last evaluated (fingerprint %s, was %s): generating anew, "
            "its earlier cached samples are not used",
            ckpt,
            fingerprint,
            before,
        )
    if before != fingerprint:
        atomic_write_text(seen, json.dumps({"ckpt": str(Path(ckpt).resolve()), "fingerprint": fingerprint}))
    return cache_dir / f"fp-{fingerprint}"


def _is_generation(record: dict[str, Any]) -> bool:
    return isinstance(record.get("text"), str) and isinstance(record.get("truncated"), bool)


def generate_all(
    cfg: DictConfig, benchmarks: list[Benchmark], cache: SampleCache, generator: Callable[[], Generator]
) -> tuple[dict[tuple[str, str], dict[int, dict]], dict[tuple[str, str, int], str]]:
    """Every (benchmark, problem, sample) response: from the cache, else generated (and cached at once).
    Returns the records per problem and the failures by key."""
    records: dict[tuple[str, str], dict[int, dict]] = {}
    prompt_hash: dict[tuple[str, str], str] = {}
    pending: list[GenerationRequest] = []
    for b in benchmarks:
        for p in b.problems:
            key = (b.name, p.id)
            prompt_hash[key] = p.prompt_hash
            records[key] = cache.get(b.name, p.id, p.prompt_hash, valid=_is_generation)
            for i in range(b.n_samples):
                if i not in records[key]:
                    pending.append(
                        GenerationRequest((b.name, p.id, i), p.messages, sample_seed(cfg.seed, b.name, p.id, i))
                    )
    total = sum(len(b.problems) * b.n_samples for b in benchmarks)
    log.info("generation: %d of %d responses cached, %d to generate", total - len(pending), total, len(pending))
    failures: dict[tuple[str, str, int], str] = {}
    if not pending:
        return records, failures

    def on_result(request: GenerationRequest, generation: Generation | None, error: str | None) -> None:
        bench, pid, i = request.key
        if generation is None:
            failures[request.key] = error or "unknown error"
            log.warning("generation failed for %s/%s sample %d: %s", bench, pid, i, error)
            return
        record = generation.to_record()
        records[(bench, pid)][i] = record
        cache.put(bench, pid, prompt_hash[(bench, pid)], i, record)

    generator().generate(pending, on_result)
    return records, failures
