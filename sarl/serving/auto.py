"""The embedding server a run starts itself: the reward's embedder asks for `url: auto` (conf/embedding/
vllm_server.yaml), and `sarl.train` / `eval.run` start the standalone vLLM server of `embedding_server` for the
length of the run, write its URL into the reward config, and stop it when the run ends.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import Any, Iterator

from omegaconf import DictConfig, OmegaConf

from sarl.runtime.errors import UserError
from sarl.runtime.models import find_model_config
from sarl.runtime.network import is_loopback, routable_ip
from sarl.serving.server import EmbeddingServer

log = logging.getLogger(__name__)


def starts_embedding_server(reward_cfg: dict) -> bool:
    """Whether the reward's embedder is the HTTP client with url "auto": sarl.train then starts the server."""
    embedder = reward_cfg.get("embedder") or {}
    return embedder.get("_target_") == "sarl.serving.http.HTTPEmbedder" and embedder.get("url") == "auto"


def planned_embedding_server(cfg: DictConfig, reward_cfg: dict) -> Any | None:
    """The standalone embedding server when the reward's embedder asks for url "auto" (not started yet), with
    its URL written into `reward_cfg` now, so that the config verl receives carries it. One node: bound and
    reached at 127.0.0.1. Several nodes (`train.nnodes` > 1): verl's reward workers run on every node, so the
    server listens on all interfaces and is reached at this node's routable address. Pinned to the GPU
    `embedding_server.gpu` of the node's visible GPUs (the one the memory plan charges)."""
    if not starts_embedding_server(reward_cfg):
        return None
    embedder = reward_cfg["embedder"]

    s = cfg.embedding_server
    nnodes = int(OmegaConf.select(cfg, "train.nnodes", default=1))
    if s.host != "auto":
        bind, advertise = str(s.host), str(s.host)
    elif nnodes > 1:
        head = os.environ.get("RAY_ADDRESS", "").rpartition(":")[0] or None
        try:
            bind, advertise = "0.0.0.0", routable_ip(head)
        except OSError as err:
            raise UserError(
                f"embedding_server.host=auto on {nnodes} nodes: {err}; set embedding_server.host=<this node's IP>"
            ) from err
    else:
        bind = advertise = "127.0.0.1"
    max_model_len = s.max_model_len

    context = (find_model_config(str(s.model)) or {}).get("max_position_embeddings")
    if max_model_len and context and int(max_model_len) > int(context):  # vLLM refuses a longer one
        log.info("embedding_server.max_model_len=%s exceeds %s's context: serving %s", max_model_len, s.model, context)
        max_model_len = int(context)
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    gpu = int(s.gpu)
    device = visible[gpu] if gpu < len(visible) else str(gpu)
    server = EmbeddingServer(
        s.model,
        served_name=embedder.get("model"),
        python=s.python or sys.executable,
        host=bind,
        advertise_host=advertise,
        port=s.port,
        gpu_memory_utilization=s.gpu_memory_utilization,
        max_model_len=max_model_len,
        extra_args=[*(["--dtype", str(s.dtype)] if s.dtype else []), *s.extra_args],
        env={"CUDA_VISIBLE_DEVICES": device},
        startup_timeout_s=s.startup_timeout_s,
    )
    embedder["url"] = server.url
    return server


@contextlib.contextmanager
def embedding_server_for(cfg: DictConfig, reward_cfg: dict) -> Iterator[None]:
    """Start the standalone embedding server when the reward's embedder asks for url "auto";
    stop it (by its process id) when the run ends, fails or is interrupted."""
    server = planned_embedding_server(cfg, reward_cfg)
    with server if server is not None else contextlib.nullcontext():
        yield


def check_reward_endpoints(cfg: DictConfig, reward_cfg: dict) -> None:
    """On several nodes, a reward server at a loopback address is reachable from one node only: refuse it."""
    nnodes = int(OmegaConf.select(cfg, "train.nnodes", default=1))
    url = (reward_cfg.get("embedder") or {}).get("url")
    if nnodes <= 1 or not isinstance(url, str) or url == "auto":
        return
    from urllib.parse import urlparse

    host = urlparse(url).hostname or ""
    if is_loopback(host):
        raise UserError(
            f"embedding.url={url} is a loopback address but train.nnodes={nnodes}: verl's reward workers on the "
            "other nodes cannot reach it; give the server's routable address, or embedding.url=auto"
        )


def check_reward_dependencies(reward_cfg: dict) -> None:
    """The reward's embedding endpoint (its external dependency on verl: the reward itself is built in verl's
    workers) embeds one text; a dead one is a UserError naming it, before any GPU work."""
    embedder = reward_cfg.get("embedder") or {}
    if embedder.get("_target_") != "sarl.serving.http.HTTPEmbedder":
        return
    from hydra.utils import instantiate

    # deferred: imports numba, scipy and scikit-learn (sarl.structure.reward)
    from sarl.structure.reward import embedder_problem

    problem = embedder_problem(instantiate(embedder))
    if problem:
        raise UserError(f"the reward cannot run: {problem}")
