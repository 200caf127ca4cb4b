"""Preflight checks of the models a run loads and of the embedding server it starts (`sarl.preflight`)."""

from __future__ import annotations

import copy
import os

from hydra.utils import instantiate
from omegaconf import DictConfig

from sarl.runtime.checks import Check
from sarl.runtime.models import find_model_config
from sarl.runtime.node_checks import installed_version
from sarl.serving.auto import planned_embedding_server, starts_embedding_server


def embedding_server_utilization(cfg: DictConfig, reward_cfg: dict) -> float | None:
    """The GPU share of the embedding server the run starts, or None where it starts none."""
    return float(cfg.embedding_server.gpu_memory_utilization) if starts_embedding_server(reward_cfg) else None


def check_model_files(cfg: DictConfig, reward_cfg: dict, allow_download: bool = True) -> Check:
    """The policy (and the embedding model of a started server) resolvable: local, cached or from the Hub."""
    names = [("model.path", str(cfg.model.path))]
    if embedding_server_utilization(cfg, reward_cfg) is not None:
        names.append(("embedding_server.model", str(cfg.embedding_server.model)))
    missing = [f"{k}={v}" for k, v in names if find_model_config(v, allow_download) is None]
    if missing:
        offline = os.environ.get("HF_HUB_OFFLINE") == "1"
        return Check(
            "models",
            False,
            f"not found locally{'' if offline else ' nor on the Hub'}: {', '.join(missing)}",
            "hf download NAME on a node with network (HF_HOME shared with the GPU nodes)",
        )
    return Check("models", True, ", ".join(v for _, v in names))


def check_embedding_server(cfg: DictConfig, reward_cfg: dict) -> Check:
    """The embedding server starts with the configured budget and answers one request (url auto), or the
    configured endpoint answers one request."""
    embedder = dict(reward_cfg.get("embedder") or {})
    if embedder.get("_target_") != "sarl.serving.http.HTTPEmbedder":
        return Check("embedding server", True, "not used by this reward")
    if embedder.get("url") == "auto":
        try:
            import torch

            has_gpu = torch.cuda.is_available()
        except ImportError:
            has_gpu = False
        if not has_gpu or installed_version("vllm") is None:
            return Check(
                "embedding server",
                False,
                "not started: needs a CUDA GPU and vLLM",
                "run the preflight on the GPU node after pip install -r requirements/gpu.lock",
            )
    rc = copy.deepcopy(reward_cfg)
    try:
        server = planned_embedding_server(cfg, rc)
        if server is not None:
            server.start()
        try:
            vectors = instantiate(rc["embedder"]).embed(["Check the sum: 17 + 25 = 42."])
        finally:
            if server is not None:
                server.stop()
    except Exception as err:
        return Check(
            "embedding server",
            False,
            f"{type(err).__name__}: {str(err).splitlines()[0][:300]}",
            "read the server log named above; lower embedding_server.max_model_len or raise its budget",
        )
    v = vectors[0]
    return Check("embedding server", True, f"{rc['embedder']['url']} answered: one {len(v)}-dimensional vector")
