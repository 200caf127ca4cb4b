"""MaxFlow reward of Structured Reasoning (Structured Reasoning Sec. 4.2-4.3, App. E.2, F).

Per response:
1. Nodes: node 0 the question (the prompt), then the reasoning steps (`baselines.structured_prompt`), the
   last node the answer (the text after `</think>`).
2. Step-to-step attention (Eq. 3), from an eager forward pass of the policy over prompt + response, averaged
   over chosen layers (the paper: layers 23-27, the last five of 28):
       A_ij = 1/(H |T_i|) sum_h sum_{a in T_i} max_{b in T_j} Att_h[a, b].
3. Capacity graph (Sec. 4.3 (a), App. E.2): an edge with capacity A_ij where A_ij > tau = 0.05; the weaker
   edges are "pruned to zero while maintaining connectivity" (App. E.2), so a weak edge stays where the
   answer could not be reached from the question without it (`capacity_graph`).
4. Step importance (Sec. 4.3 (b)): F = max flow node 0 -> node n-1; dF_k = F - F_{-k} for every
   intermediate node k (F_{-k}: max flow with k removed).
5. Quality (Eq. 4): Q = 1 - sum_{k in K_top} dF_k / sum_k dF_k, K_top the top 25% intermediate nodes by dF.
6. Reward (Sec. 4.3): r_maxflow = Q if the answer is correct, else -1; score = 2.0 r_maxflow + 1.0 format
   (App. A.4.4 weights; format score: `structured_prompt.format_score`).

Decisions where the paper is silent or contradicts itself:
- Eq. 3 fills A_ij for j <= i (causal attention: a token attends only to earlier ones), so the literal
  "edge (i, j) with capacity A_ij" would let nothing flow from the question to the answer; edges run from
  the earlier step to the later one (j -> i, j < i) with capacity A_ij. No self loops.
- Tokens are split among nodes by character: node 0 is every prompt token (chat template included), a step
  runs from its opening tag to the next node's start, the answer from its first character to the end;
  every token belongs to exactly one node (the one holding its first character).
- "Maintaining connectivity" (App. E.2, which names neither the edges nor the order) is read as: the
  answer stays reachable from the question along directed edges -- the connectivity App. F's Algorithm 2
  tests (BFS-CONNECTED(G, s, t)), and the only one the s-t flow depends on. Weak edges (0 < A_ij <= tau)
  are pruned one at a time, weakest first (ties: lower source index, then lower target index), and an
  edge whose removal would cut every question -> answer path is kept with capacity A_ij. Strong edges
  are never pruned; if even the unpruned graph has no question -> answer path, every weak edge goes.
- Q = 0 when sum dF = 0 or there are fewer than 2 intermediate nodes; |K_top| = ceil(25% of them).
- No answer text after `</think>`: the last step is the answer node (flagged `answer_is_last_step`).
- The attention pass runs only for correct answers (a wrong one scores -1 whatever the graph).
- The attention comes from a frozen copy of the configured checkpoint (by default the run's initial
  policy), not from the weights being trained.

Max flow (App. F): Dinic's algorithm on the dense residual matrix, plus residual reuse for F_{-k}: the flow
through k is cancelled along the flow paths (back to the source and on to the sink), which leaves a valid
flow of value F - x_k on the graph without k; Dinic then only augments from there, at most x_k. A node that
carries no flow has dF_k = 0 at once (the same flow avoids it). Graphs that are not in topological index
order fall back to a fresh Dinic per removed node. Measured against networkx by `python -m sarl.bench
suite=maxflow`.
"""

from __future__ import annotations

import logging
import math
from collections import Counter, deque
from typing import Any, Sequence

import numpy as np

from baselines.ground_truth import GroundTruthReward
from baselines.structured_prompt import STEP_MODES, format_score, parse_structured
from eval.grading import Grader, default_grader
from sarl.interface import RewardOutput, RolloutBatch, record_failures

log = logging.getLogger(__name__)

TAU = 0.05  # Structured Reasoning Sec. 4.3 (a), App. E.2
TOP_FRACTION = 0.25  # Structured Reasoning Sec. 4.3 (c)

# ---------------------------------------------------------------------------------------------------------
# Step attention (Eq. 3) and the capacity graph
# ---------------------------------------------------------------------------------------------------------


def step_attention(attn: Any, spans: Sequence[tuple[int, int]]) -> np.ndarray:
    """Structured Reasoning Eq. (3) for one layer: A_ij = 1/(H |T_i|) sum_h sum_{a in T_i} max_{b in T_j} Att_h[a, b].

    `attn` is one layer's attention (H x T x T, rows = queries; a torch tensor or an array), `spans` the
    token range [start, end) of each node. A node with no tokens gets a zero row and column.
    """
    import torch

    att = torch.as_tensor(attn)
    if att.ndim != 3 or att.shape[1] != att.shape[2]:
        raise ValueError(f"attention must be H x T x T, got shape {tuple(att.shape)}")
    if att.dtype != torch.float64:
        att = att.float()  # bf16/fp16 weights: the max is exact in fp32, the sums below run in fp64
    heads, t_len = att.shape[0], att.shape[1]
    n = len(spans)
    starts = torch.tensor([s for s, _ in spans], dtype=torch.long)
    ends = torch.tensor([e for _, e in spans], dtype=torch.long)
    if n and (starts.min() < 0 or ends.max() > t_len or (ends < starts).any()):
        raise ValueError(f"spans {list(spans)} do not fit a sequence of {t_len} tokens")
    # colmax[j, a] = sum_h max_{b in T_j} Att_h[a, b]
    colmax = torch.zeros((n, t_len), dtype=torch.float64, device=att.device)
    for j, (s, e) in enumerate(spans):
        if e > s:
            colmax[j] = att[:, :, s:e].amax(-1).double().sum(0)
    csum = torch.nn.functional.pad(colmax.cumsum(1), (1, 0)).cpu()  # n x (T + 1)
    sums = csum[:, ends] - csum[:, starts]  # sums[j, i] = sum_{a in T_i} colmax[j, a]
    sizes = (ends - starts).double()
    out = torch.where(sizes > 0, sums / (heads * sizes.clamp(min=1)), torch.zeros_like(sums))
    return out.T.numpy()  # A[i, j]


def capacity_graph(step_att: np.ndarray, tau: float = TAU) -> np.ndarray:
    """Capacity matrix C (C[u, v] = capacity of edge u -> v) of the reasoning graph: for j < i an edge
    j -> i with capacity A_ij where A_ij > tau (Structured Reasoning Sec. 4.3 (a); direction: module
    docstring), plus the weak edges (0 < A_ij <= tau) without which the answer (the last node) could not be
    reached from the question (node 0): App. E.2 prunes them "while maintaining connectivity" (the rule and
    its order: module docstring)."""
    a = np.asarray(step_att, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"step attention must be n x n, got shape {a.shape}")
    if tau < 0:
        raise ValueError(f"tau must be >= 0, got {tau}")
    lower = np.tril(a, -1)
    cap = np.where(lower > 0, lower, 0.0).T.copy()  # every attended pair, earlier -> later
    weak = sorted((float(cap[u, v]), int(u), int(v)) for u, v in zip(*np.nonzero((cap > 0) & (cap <= tau))))
    n = len(cap)
    if not weak:
        return cap
    succ = [set(np.flatnonzero(row).tolist()) for row in cap]
    path = _st_path_edges(succ, 0, n - 1)
    for _, u, v in weak:  # App. E.2: weakest first, each pruned unless it cuts question -> answer
        succ[u].discard(v)
        if path is not None and (u, v) in path:
            rerouted = _st_path_edges(succ, 0, n - 1)
            if rerouted is None:
                succ[u].add(v)  # a cut edge: kept to maintain connectivity
                continue
            path = rerouted
        cap[u, v] = 0.0
    return cap


def _st_path_edges(succ: list[set[int]], s: int, t: int) -> set[tuple[int, int]] | None:
    """The edges of one directed s -> t path (breadth-first search over successor sets), or None if t is
    unreachable from s. Only an edge on this path can cut s from t when removed, so `capacity_graph`
    searches again only for those."""
    parent = {s: s}
    queue = deque([s])
    while queue and t not in parent:
        u = queue.popleft()
        for v in succ[u]:
            if v not in parent:
                parent[v] = u
                queue.append(v)
    if t not in parent:
        return None
    edges = set()
    v = t
    while v != s:
        edges.add((parent[v], v))
        v = parent[v]
    return edges


# ---------------------------------------------------------------------------------------------------------
# Max flow: Dinic with residual reuse
# ---------------------------------------------------------------------------------------------------------


def _check_capacity(capacity: Any) -> np.ndarray:
    cap = np.asarray(capacity, dtype=np.float64)
    if cap.ndim != 2 or cap.shape[0] != cap.shape[1]:
        raise ValueError(f"capacity must be a square matrix, got shape {cap.shape}")
    if not np.isfinite(cap).all() or (cap < 0).any():
        raise ValueError("capacities must be finite and non-negative")
    cap = cap.copy()
    np.fill_diagonal(cap, 0.0)  # a self loop carries no s-t flow
    return cap


def _neighbours(cap: np.ndarray) -> list[list[int]]:
    """Residual neighbours of every node: both directions of every edge, in index order."""
    both = (cap > 0) | (cap.T > 0)
    return [np.flatnonzero(row).tolist() for row in both]


def _dinic(
    res: list[list[float]],
    nbrs: list[list[int]],
    s: int,
    t: int,
    eps: float,
    limit: float = math.inf,
    blocked: int = -1,
) -> float:
    """Augments `res` (residual capacities, changed in place) with Dinic's algorithm until no s-t path is
    left or `limit` is reached; returns the flow added. `blocked` is a node treated as removed."""
    n = len(res)
    total = 0.0
    while total < limit - eps:
        level = [-1] * n
        if blocked >= 0:
            level[blocked] = n + 1  # never reached, never on a level path
        level[s] = 0
        queue = deque([s])
        while queue:
            u = queue.popleft()
            ru, lu = res[u], level[u] + 1
            for v in nbrs[u]:
                if level[v] < 0 and ru[v] > eps:
                    level[v] = lu
                    queue.append(v)
        if level[t] < 0:
            break
        it = [0] * n
        while total < limit - eps:  # blocking flow: augmenting paths in the level graph
            path: list[int] = []
            u = s
            while u != t:
                adj, i, ru, want = nbrs[u], it[u], res[u], level[u] + 1
                while i < len(adj) and not (level[adj[i]] == want and ru[adj[i]] > eps):
                    i += 1
                it[u] = i
                if i < len(adj):
                    path.append(u)
                    u = adj[i]
                elif u == s:
                    break
                else:  # dead end: drop u from the level graph and retreat
                    level[u] = -1
                    u = path.pop()
                    it[u] += 1
            if u != t:
                break
            path.append(t)
            push = limit - total
            for a, b in zip(path, path[1:]):
                push = min(push, res[a][b])
            for a, b in zip(path, path[1:]):
                res[a][b] -= push
                res[b][a] += push
            total += push
    return total


def _cancel_through(res: list[list[float]], nbrs: list[list[int]], k: int, eps: float) -> float | None:
    """Removes the flow through node k from a max flow of a DAG in index order, in place: the flow on
    k's in-edges goes back to the source along flow edges (nodes in decreasing order), the flow on its
    out-edges on to the sink (increasing order). For u < v the flow on u -> v is res[v][u]. Returns the
    flow removed, or None if the flow does not decompose (float trouble): the caller starts afresh."""
    n = len(res)
    excess = [0.0] * n
    for u in nbrs[k]:
        if u < k:
            excess[u] += res[k][u]
    deficit = [0.0] * n
    for w in nbrs[k]:
        if w > k:
            deficit[w] += res[w][k]
    through = sum(excess)
    for u in range(k - 1, 0, -1):  # back to the source
        e = excess[u]
        if e <= eps:
            continue
        for v in nbrs[u]:
            if v >= u:
                continue
            d = min(res[u][v], e)
            if d > 0:
                res[u][v] -= d
                res[v][u] += d
                excess[v] += d
                e -= d
                if e <= eps:
                    break
        if e > eps * (1 + n):
            return None
    for w in range(k + 1, n - 1):  # on to the sink
        e = deficit[w]
        if e <= eps:
            continue
        for z in nbrs[w]:
            if z <= w:
                continue
            d = min(res[z][w], e)
            if d > 0:
                res[z][w] -= d
                res[w][z] += d
                deficit[z] += d
                e -= d
                if e <= eps:
                    break
        if e > eps * (1 + n):
            return None
    return through


def max_flow_value(capacity: Any, source: int = 0, sink: int = -1) -> float:
    """Maximum flow from `source` to `sink` (C[u, v] = capacity of edge u -> v), Dinic's algorithm."""
    cap = _check_capacity(capacity)
    n = len(cap)
    s, t = source % n, sink % n
    if s == t:
        return 0.0
    eps = 1e-12 * max(1.0, float(cap.max(initial=0.0)))
    return _dinic(cap.tolist(), _neighbours(cap), s, t, eps)


def step_importance(capacity: Any) -> tuple[float, np.ndarray]:
    """F and dF_k = F - F_{-k} for every intermediate node k (Structured Reasoning Sec. 4.3 (b)); node 0 is the
    source, the last node the sink; dF is 0 at both. Dinic plus residual reuse (App. F, Algorithm 2)."""
    cap = _check_capacity(capacity)
    n = len(cap)
    if n < 2:
        raise ValueError(f"a flow graph needs a source and a sink, got {n} node(s)")
    s, t = 0, n - 1
    eps = 1e-12 * max(1.0, float(cap.max(initial=0.0)))
    nbrs = _neighbours(cap)
    pristine = cap.tolist()
    res = [row[:] for row in pristine]
    flow = _dinic(res, nbrs, s, t, eps)
    delta = np.zeros(n)
    dag = not np.tril(cap).any()  # every edge goes from a lower to a higher index
    for k in range(1, n - 1):
        if dag:
            through = sum(res[k][u] for u in nbrs[k] if u < k)  # inflow of k in the max flow
            if through <= eps:
                continue  # the max flow avoids k: F_{-k} = F
            work = [row[:] for row in res]
            removed = _cancel_through(work, nbrs, k, eps)
            if removed is not None:
                added = _dinic(work, nbrs, s, t, eps, limit=removed, blocked=k)
                delta[k] = max(0.0, removed - added)
                continue
        work = [row[:] for row in pristine]
        delta[k] = max(0.0, flow - _dinic(work, nbrs, s, t, eps, blocked=k))
    return flow, delta


def maxflow_quality(capacity: np.ndarray) -> float:
    """Structured Reasoning Eq. (4): Q = 1 - sum_{k in K_top} dF_k / sum_k dF_k over the intermediate nodes, K_top the
    ceil(25%) with the largest dF; node 0 the question, the last node the answer. Q = 0 when sum dF = 0 or
    there are fewer than 2 intermediate nodes."""
    cap = _check_capacity(capacity)
    if len(cap) - 2 < 2:
        return 0.0
    _, delta = step_importance(cap)
    return quality_from_importance(delta)


def quality_from_importance(delta: np.ndarray) -> float:
    """Eq. (4) from dF (source and sink included, as `step_importance` returns it)."""
    inner = np.asarray(delta, dtype=np.float64)[1:-1]
    total = float(inner.sum())
    if len(inner) < 2 or total <= 1e-12:
        return 0.0
    top = math.ceil(TOP_FRACTION * len(inner))
    return float(1.0 - np.sort(inner)[::-1][:top].sum() / total)  # Structured Reasoning Eq. (4)


# ---------------------------------------------------------------------------------------------------------
# The attention pass (Eq. 3 over chosen layers of the policy)
# ---------------------------------------------------------------------------------------------------------


def _decoder_layers(model: Any) -> Any:
    """The decoder layers of a transformers model (CausalLM or base model)."""
    for owner in (model, getattr(model, "model", None)):
        layers = getattr(owner, "layers", None)
        if layers is not None and len(layers) and hasattr(layers[0], "self_attn"):
            return layers
    raise ValueError(
        f"{type(model).__name__} has no `layers` with `self_attn` modules (or `.model.layers`); "
        "StepAttention reads the attention weights there"
    )


class StepAttention:
    """Step-to-step attention (Structured Reasoning Eq. 3) of prompt + response, averaged over chosen layers.

    `model` is a loaded transformers model or a path/id (loaded with `AutoModel`, eager attention); `layers`
    index the decoder layers (negative: from the end; the paper's 23-27 of 28 are -5..-1). One eager forward
    pass per response; a forward hook on each chosen layer's attention reduces its weights (H x T x T) to
    the n x n step matrix at once and frees them, so no layer's weights outlive the layer.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        layers: Sequence[int] = (-5, -4, -3, -2, -1),
        max_tokens: int = 16384,
        use_chat_template: bool = True,
        device: str | None = None,
        dtype: str = "auto",
    ) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        if isinstance(model, str):
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(model)
            torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
            model = AutoModel.from_pretrained(model, attn_implementation="eager", dtype=torch_dtype)
        elif tokenizer is None:
            raise ValueError("StepAttention needs the tokenizer that goes with the given model")
        elif isinstance(tokenizer, str):
            tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        if not getattr(tokenizer, "is_fast", False):
            raise ValueError("StepAttention needs a fast tokenizer (character offsets of every token)")
        if getattr(model.config, "_attn_implementation", "eager") != "eager":
            model.set_attn_implementation("eager")  # only eager attention returns the weights
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model = model.to(device)
        self.tokenizer = tokenizer
        n_layers = len(_decoder_layers(model))
        bad = [i for i in layers if not -n_layers <= i < n_layers]
        if bad or not layers:
            raise ValueError(f"layers {list(layers)} do not all exist in a {n_layers}-layer model")
        self.layers = sorted({i % n_layers for i in layers})
        self.max_tokens = max_tokens
        self.use_chat_template = use_chat_template and bool(getattr(tokenizer, "chat_template", None))
        self._template_parts: tuple[str, str] | None = None
        self._torch = torch

    def prefix(self, prompt: str) -> str:
        """The text before the response: the chat-templated prompt (generation prompt included), the prompt
        as it is when it is already chat-templated (as TRL hands it over), or the prompt and a newline when
        the tokenizer has no chat template."""
        if not self.use_chat_template:
            return prompt + "\n"
        if self._template_parts is None:
            marker = "\x00QUESTION\x00"
            text = self._template([{"role": "user", "content": marker}])
            head, _, tail = text.partition(marker)
            self._template_parts = (head, tail)
        head, tail = self._template_parts
        if prompt.startswith(head) and prompt.endswith(tail) and len(prompt) >= len(head) + len(tail):
            return prompt
        return self._template([{"role": "user", "content": prompt}])

    def _template(self, messages: list[dict]) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def token_spans(self, text: str, node_starts: Sequence[int]) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids of `text` and each node's token range: node k owns the tokens whose first character
        lies in [node_starts[k], node_starts[k + 1]) (the last node: to the end); node_starts[0] = 0."""
        enc = self.tokenizer(
            text, add_special_tokens=not self.use_chat_template, return_offsets_mapping=True, truncation=False
        )
        first_char = np.array([a for a, _ in enc["offset_mapping"]], dtype=np.int64)
        owner = np.searchsorted(np.asarray(node_starts), first_char, side="right") - 1
        owner = np.maximum(owner, 0)  # special tokens without a character (offset 0) go to the question
        if len(owner) and (np.diff(owner) < 0).any():
            raise ValueError("token offsets are not monotone; cannot split the sequence into nodes")
        spans = []
        for k in range(len(node_starts)):
            idx = np.flatnonzero(owner == k)
            spans.append((int(idx[0]), int(idx[-1]) + 1) if len(idx) else (0, 0))
        return list(enc["input_ids"]), spans

    def __call__(self, text: str, node_starts: Sequence[int]) -> np.ndarray:
        """The n x n step attention of `text` (mean of Eq. 3 over the chosen layers)."""
        torch = self._torch
        ids, spans = self.token_spans(text, node_starts)
        if len(ids) > self.max_tokens:
            raise ValueError(f"sequence of {len(ids)} tokens exceeds max_tokens={self.max_tokens}")
        layers = _decoder_layers(self.model)
        total = np.zeros((len(spans), len(spans)))
        seen: list[int] = []

        def reduce_weights(layer_idx: int):
            def hook(module: Any, args: Any, output: Any) -> Any:
                weights = output[1]
                if weights is None:
                    raise RuntimeError("the attention module returned no weights; eager attention is required")
                total[:] += step_attention(weights[0], spans)  # Eq. (3) for this layer
                seen.append(layer_idx)
                return (output[0], None, *output[2:])

            return hook

        handles = [layers[i].self_attn.register_forward_hook(reduce_weights(i)) for i in self.layers]
        device = next(self.model.parameters()).device
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                self.model(input_ids=torch.tensor([ids], device=device), use_cache=False)
        finally:
            self.model.train(was_training)
            for h in handles:
                h.remove()
        if sorted(seen) != self.layers:
            raise RuntimeError(f"attention hooks fired for layers {seen}, expected {self.layers}")
        return total / len(self.layers)


# ---------------------------------------------------------------------------------------------------------
# The reward
# ---------------------------------------------------------------------------------------------------------


class MaxFlowReward:
    """Structured Reasoning's MaxFlow reward: maxflow_weight * r_maxflow + format_weight * format, where
    r_maxflow = Q (Eq. 4) for a correct answer and -1 otherwise (Sec. 4.3).

    `model`/`tokenizer`: the policy checkpoint whose attention builds the graph (`StepAttention`), or a
    ready `StepAttention` as `attention`. Diagnostics: `acc`, `format`, `r_maxflow`, `Q` (correct answers),
    `F` (max flow), `n_steps`, `n_edges`, `no_answer`, `answer_is_last_step`, `untagged_prefix`,
    `truncated`. A row whose gold answer is missing or whose attention pass fails scores `failed_score` and
    says why in `failed`.
    """

    diagnostic_keys = (
        "acc",
        "format",
        "r_maxflow",
        "Q",
        "F",
        "n_steps",
        "n_edges",
        "no_answer",
        "answer_is_last_step",
        "untagged_prefix",
        "truncated",
    )
    # node 0 of the graph is the prompt: a backend must hand this reward the prompt text
    # (sarl.backends.verl.reward.compute_score fails a row whose extra_info lacks it)
    needs_prompt = True

    def __init__(
        self,
        model: Any = None,
        tokenizer: Any = None,
        layers: Sequence[int] = (-5, -4, -3, -2, -1),
        tau: float = TAU,
        step_mode: str = "tags",
        maxflow_weight: float = 2.0,
        format_weight: float = 1.0,
        max_tokens: int = 16384,
        use_chat_template: bool = True,
        device: str | None = None,
        dtype: str = "auto",
        failed_score: float = 0.0,
        grader: Grader | None = None,
        attention: StepAttention | None = None,
    ) -> None:
        if step_mode not in STEP_MODES:
            raise ValueError(f"step_mode {step_mode!r} is not valid; choose one of: {', '.join(STEP_MODES)}")
        if tau < 0:
            raise ValueError(f"tau must be >= 0, got {tau}")
        if attention is None:
            if model is None:
                raise ValueError("MaxFlowReward needs the policy checkpoint: set reward.model=PATH (or attention=)")
            attention = StepAttention(model, tokenizer, layers, max_tokens, use_chat_template, device, dtype)
        self.attention = attention
        self.tau = float(tau)
        self.step_mode = step_mode
        self.maxflow_weight = float(maxflow_weight)
        self.format_weight = float(format_weight)
        self.failed_score = float(failed_score)
        self.grader = grader
        self.failure_counts: Counter[str] = Counter()

    def __call__(self, batch: RolloutBatch) -> list[RewardOutput]:
        grader = self.grader or default_grader()
        graded = GroundTruthReward(grader)(batch)
        out = []
        for i, (response, g) in enumerate(zip(batch.responses, graded)):
            out.append(self._score(batch.prompts[i], response, g))
        record_failures(self.failure_counts, out, "MaxFlow reward", log)
        return out

    def _score(self, prompt: Any, response: Any, graded: RewardOutput) -> RewardOutput:
        parsed = parse_structured(response, self.step_mode)
        fmt = format_score(parsed)
        acc = graded.diagnostics.get("acc", 0.0)
        diag = {
            "acc": acc,
            "format": fmt,
            "n_steps": float(len(parsed.steps)),
            "no_answer": graded.diagnostics.get("no_answer", 1.0),
            "untagged_prefix": float(parsed.untagged_prefix),
            "truncated": float(parsed.truncated),
        }
        if graded.failed:
            return RewardOutput(self.failed_score, diag, graded.failed)
        if acc == 1.0 and not (isinstance(prompt, str) and prompt.strip()):
            return RewardOutput(self.failed_score, diag, "no prompt text: the question is node 0 of the graph")
        if acc < 1.0:
            diag["r_maxflow"] = -1.0  # Structured Reasoning Sec. 4.3: -1 for a wrong answer
            return RewardOutput(self.maxflow_weight * -1.0 + self.format_weight * fmt, diag)
        try:
            q, flow, n_edges, last_step = self._quality(prompt, parsed)
        except Exception as err:  # the model pass must not take the run down; the row says why
            return RewardOutput(self.failed_score, diag, f"attention pass failed: {type(err).__name__}: {err}")
        diag.update({"r_maxflow": q, "Q": q, "F": flow, "n_edges": float(n_edges)})
        diag["answer_is_last_step"] = float(last_step)
        return RewardOutput(self.maxflow_weight * q + self.format_weight * fmt, diag)

    def _quality(self, prompt: str, parsed: Any) -> tuple[float, float, int, bool]:
        """(Q, F, edges, answer_is_last_step) of a correct response."""
        steps = list(parsed.steps)
        last_step = parsed.answer_start is None
        if last_step:  # no answer text after </think>: the last step is the answer node
            if not steps:
                return 0.0, 0.0, 0, True
            answer_start = steps.pop().start
        else:
            answer_start = parsed.answer_start
        if len(steps) < 2:  # fewer than 2 intermediate nodes: Q = 0 (no attention pass needed)
            return 0.0, 0.0, 0, last_step
        prefix = self.attention.prefix(prompt)
        starts = [0] + [len(prefix) + s.start for s in steps] + [len(prefix) + answer_start]
        att = self.attention(prefix + parsed.text, starts)
        cap = capacity_graph(att, self.tau)
        flow, delta = step_importance(cap)
        return quality_from_importance(delta), flow, int((cap > 0).sum()), last_step
