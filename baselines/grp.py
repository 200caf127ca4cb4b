"""Graph Reasoning Paradigm rewards (GRP Sec. 3.1-3.2.1); PASC-GRPO's SCAE advantage is `baselines.pasc_grpo`.

Output format (the paper shows it only in figures; our serialisation): inside `<think>...</think>`, blocks
wrapped in one of 7 cognitive labels, one node per line as a JSON object, the final answer in
`<answer>...</answer>` after `</think>`:

    <think>
    <known>
    {"id": 1, "parents_id": [], "content": "x + y = 10"}
    {"id": 2, "parents_id": [], "content": "x - y = 2"}
    </known>
    <aggregate>
    {"id": 3, "parents_id": [1, 2], "content": "2x = 12, so x = 6"}
    </aggregate>
    </think>
    <answer>\\boxed{6}</answer>

A node is v = (id, parents_id, content) (Eq. 1); edges run parent -> child. Rewards, each in [0, 1]:
- R_fmt = (R_dens + R_topo + R_para) / 3 (Eq. 2): R_dens (Eq. 3) the share of aggregate/refine nodes whose
  label block holds exactly one node; R_topo (Eq. 4-5) the share of known/aggregate/refine nodes with the
  right parent count (known 0, aggregate > 1, refine 1); R_para (Eq. 6) the share of label blocks in which
  no node is a parent of another.
- R_conn = 1 / (number of weakly connected components) (Eq. 7).
- R_ers = tokens of the effective reasoning subgraph {v : start ~> v ~> end} / tokens of all nodes (Eq. 8-9).
- R_reach = 1 if a directed path start ~> end exists (Eq. 10).
- R_rev = share of nodes from which the answer node is reachable (Eq. 11-12).
- R_graph = w1 R_fmt + w2 R_conn + w3 R_ers + w4 R_reach + w5 R_rev, sum w = 1 (Eq. 13).

Decisions where the paper is silent (decisions §4):
- the parser is strict and total: a line that is not an opening label, a closing label or one JSON object
  with exactly the keys id (int), parents_id (list of int) and content (str); text outside label blocks; an
  unknown label; nested, unclosed or empty blocks; duplicate ids; or no `</think>` (truncated) -> a parse
  failure, R_graph = 0, counted by reason. It never raises on model output.
- dangling parent ids are dropped and counted; a repeated parent id counts once; a node listing itself as
  a parent makes a cycle; a cycle sets R_topo and R_reach to 0.
- start = the first known node (`start="all_known"`: any known node, the plural "initial conditions" of
  Sec. 3.2.1), end = the answer node = the last node (in text order); ~> is reflexive (a node reaches
  itself), so a one-node graph has R_reach = R_rev = 1 when that node is known.
- empty denominators give 1 for R_dens, R_topo and R_para (nothing violated); R_ers = 0 when there is no
  start ~> end path or the nodes hold no tokens; token counts via `sarl.contract.token_count` (the policy
  tokenizer when configured, else whitespace words).
- default weights uniform (0.2 each).
- accuracy: the `\\boxed{}` inside the last `<answer>` block, or the block's whole text when it has none,
  checked against the gold answer with `sarl.checking.grading`.

For PASC-GRPO, `GRPReward(combine="scae")` packs accuracy and R_graph into one score
(`baselines.pasc_grpo.pack_scae`) for the `scae` advantage estimator, which unpacks it.

Code (GRP Sec. 4, App. C.3, E; decisions §4): the graph is scored as for math, the accuracy r_acc of Eq. (14) is
the execution outcome (`outcome="code_exec"`): the last fenced Python block inside the last `<answer>` block
runs against the row's tests (`baselines.code_exec.CodeExecReward`, all tests pass -> 1, else 0). No `<answer>`
block, or none with a fenced block, scores 0 (`code/no_code_block`); a row the sandbox could not judge is
masked (failed), never a 0.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from typing import Any, Mapping

import networkx as nx
import numpy as np

from baselines.code_exec import DIAGNOSTIC_KEYS as CODE_DIAGNOSTIC_KEYS
from baselines.code_exec import CodeExecReward
from baselines.ground_truth import GroundTruthReward
from baselines.pasc_grpo import (
    pack_scae,
)
from sarl.checking.grading.grader import Grader, default_grader
from sarl.contract.reward import RewardFunction, RewardOutput, RolloutBatch
from sarl.contract.token_count import TokenCounter
from sarl.formats.graph import GraphParse, Node, gradable_answer, parse_graph, reasoning_graph
from sarl.structure.steps import THINK_CLOSE

log = logging.getLogger(__name__)

REWARD_NAMES = ("R_fmt", "R_conn", "R_ers", "R_reach", "R_rev")  # the terms of Eq. (13), in order
DEFAULT_WEIGHTS = {name: 0.2 for name in REWARD_NAMES}
START_MODES = ("first_known", "all_known")


def _reach(g: nx.DiGraph, source: int) -> set[int]:
    """Nodes reachable from `source`, itself included (~> is reflexive)."""
    return nx.descendants(g, source) | {source}


def _reached_by(g: nx.DiGraph, target: int) -> set[int]:
    """Nodes that reach `target`, itself included."""
    return nx.ancestors(g, target) | {target}


def graph_rewards(parse: GraphParse, count_tokens: Any = None, start: str = "first_known") -> dict[str, float]:
    """The rewards of GRP Sec. 3.2.1 for a successfully parsed response (each in [0, 1]), plus
    `n_nodes`, `n_edges`, `n_blocks`, `cycle`, `dangling_parents`, `repeated_parents`.

    `start`: "first_known" (v_start is the first known node, decisions §4) or "all_known" (every
    known node is an initial condition: v ~> end from any of them)."""
    if start not in START_MODES:
        raise ValueError(f"start={start!r} is not valid; choose one of: {', '.join(START_MODES)}")
    if parse.error is not None or not parse.nodes:
        raise ValueError(f"graph_rewards needs a parsed graph; this parse failed: {parse.error or 'no nodes'}")
    count_tokens = count_tokens or TokenCounter()
    g, dropped = reasoning_graph(parse)
    nodes = parse.nodes
    parents = {n.id: set(g.predecessors(n.id)) for n in nodes}
    block_size = [len(b) for b in parse.blocks]
    cycle = not nx.is_directed_acyclic_graph(g)

    ar = [n for n in nodes if n.label in ("aggregate", "refine")]
    r_dens = float(np.mean([block_size[n.block] == 1 for n in ar])) if ar else 1.0  # Eq. (3)

    def phi(n: Node) -> bool:  # Eq. (5)
        k = len(parents[n.id])
        return {"known": k == 0, "aggregate": k > 1, "refine": k == 1}[n.label]

    kar = [n for n in nodes if n.label in ("known", "aggregate", "refine")]
    r_topo = 0.0 if cycle else (float(np.mean([phi(n) for n in kar])) if kar else 1.0)  # Eq. (4)
    blocks = [(b, set(b)) for b in parse.blocks]  # each block's members built once: linear in its size, not quadratic
    r_para = float(np.mean([not any(p in m for nid in b for p in parents[nid]) for b, m in blocks]))  # Eq. (6)
    r_fmt = (r_dens + r_topo + r_para) / 3.0  # Eq. (2)
    r_conn = 1.0 / nx.number_weakly_connected_components(g)  # Eq. (7)

    known = [n.id for n in nodes if n.label == "known"]
    starts = known[:1] if start == "first_known" else known
    end = nodes[-1].id
    reaches_end = _reached_by(g, end)
    sources = [s for s in starts if s in reaches_end]
    r_reach = float(bool(sources) and not cycle)  # Eq. (10)
    ers = set().union(*(_reach(g, s) for s in sources)) & reaches_end  # Eq. (8)
    tokens = {n.id: count_tokens(n.content) for n in nodes}
    total = sum(tokens.values())
    r_ers = sum(tokens[v] for v in ers) / total if total > 0 else 0.0  # Eq. (9)
    r_rev = len(reaches_end) / len(nodes)  # Eq. (11)-(12)
    return {
        "R_fmt": r_fmt,
        "R_dens": r_dens,
        "R_topo": r_topo,
        "R_para": r_para,
        "R_conn": r_conn,
        "R_ers": r_ers,
        "R_reach": r_reach,
        "R_rev": r_rev,
        "n_nodes": float(len(nodes)),
        "n_edges": float(g.number_of_edges()),
        "n_blocks": float(len(parse.blocks)),
        "cycle": float(cycle),
        "dangling_parents": float(dropped["dangling_parents"]),
        "repeated_parents": float(dropped["repeated_parents"]),
    }


def check_weights(weights: Mapping[str, float]) -> dict[str, float]:
    """Eq. (13)'s weights: one per reward in REWARD_NAMES, non-negative, summing to 1."""
    if set(weights) != set(REWARD_NAMES):
        raise ValueError(f"GRP weights must name exactly {list(REWARD_NAMES)}, got {sorted(weights)}")
    w = {k: float(v) for k, v in weights.items()}
    if any(v < 0 or not math.isfinite(v) for v in w.values()):
        raise ValueError(f"GRP weights must be finite and >= 0, got {w}")
    if abs(sum(w.values()) - 1.0) > 1e-9:
        raise ValueError(f"GRP weights must sum to 1 (GRP Eq. 13), got {sum(w.values())}")
    return w


def r_graph(rewards: Mapping[str, float], weights: Mapping[str, float] = DEFAULT_WEIGHTS) -> float:
    """GRP Eq. (13): R_graph = sum_i w_i R_i."""
    return float(sum(weights[k] * rewards[k] for k in REWARD_NAMES))


# ---------------------------------------------------------------------------------------------------------
# The reward
# ---------------------------------------------------------------------------------------------------------

COMBINE_MODES = ("sum", "scae")
ACCURACY_OUTCOMES = ("answer", "code_exec")  # the accuracy term: the graded \boxed{} answer | the executed code


class GRPReward(RewardFunction):
    """GRP's process-aware graph reward with an outcome term (GRP Sec. 3.2).

    The outcome term r_acc (`outcome`): "answer" (math: the `\\boxed{}` of the `<answer>` block graded against
    the gold answer with `sarl.checking.grading`) or "code_exec" (code: the `<answer>` block's last fenced Python block
    run against the row's tests `{"tests": SOURCE}` by `baselines.code_exec.CodeExecReward`, built from the
    `code_exec` settings, conf/reward/code_exec.yaml's keys). combine="sum" (GRPO): score = acc_weight * r_acc
    + R_graph; combine="scae" (PASC-GRPO): the packed score `pack_scae(r_acc, R_graph)` for the `scae` advantage
    estimator (Eq. 14-16 need r_acc in {0, 1}: the execution outcome must be all-pass). Diagnostics: `acc`,
    `R_graph`, each reward of Eq. (2)-(13), `n_nodes`, `n_edges`, `n_blocks`, `cycle`, `dangling_parents`,
    `repeated_parents`, `parse_failed`, `no_answer`, and for code the execution reward's `pass_fraction` and
    `code/<outcome>`. A parse failure scores R_graph = 0 (counted by reason in `parse_errors`); a missing gold
    answer or tests, or a program the sandbox could not judge, fails the row (`failed`, masked; r_acc 0).
    """

    diagnostic_keys: tuple[str, ...] = (
        "acc",
        "R_graph",
        "R_fmt",
        "R_dens",
        "R_topo",
        "R_para",
        "R_conn",
        "R_ers",
        "R_reach",
        "R_rev",
        "n_nodes",
        "n_edges",
        "n_blocks",
        "cycle",
        "dangling_parents",
        "repeated_parents",
        "parse_failed",
        "no_answer",
    )
    failure_label = "GRP reward"

    # Its code sandbox where outcome=code_exec (also with `code_exec: null`, no CodeExecReward `_target_` to find):
    # the same hook as CodeExecReward's, so a config naming both asks it once (sarl.contract.reward.reward_hooks)
    preflight_checks = classmethod(CodeExecReward.preflight_checks.__func__)

    def __init__(
        self,
        weights: Mapping[str, float] | None = None,
        combine: str = "sum",
        acc_weight: float = 1.0,
        start: str = "first_known",
        tokenizer: Any = None,
        grader: Grader | None = None,
        outcome: str = "answer",
        code_exec: Mapping[str, Any] | CodeExecReward | None = None,
    ) -> None:
        super().__init__()
        if start not in START_MODES:
            raise ValueError(f"start={start!r} is not valid; choose one of: {', '.join(START_MODES)}")
        if combine not in COMBINE_MODES:
            raise ValueError(f"combine={combine!r} is not valid; choose one of: {', '.join(COMBINE_MODES)}")
        if outcome not in ACCURACY_OUTCOMES:
            raise ValueError(f"reward.outcome={outcome!r} is not valid; choose one of: {', '.join(ACCURACY_OUTCOMES)}")
        self.weights = check_weights(dict(weights) if weights is not None else DEFAULT_WEIGHTS)
        self.combine = combine
        self.acc_weight = float(acc_weight)
        self.start = start
        self.count_tokens = TokenCounter(tokenizer)
        self.grader = grader
        self.outcome = outcome
        self.code_exec: CodeExecReward | None = None
        if outcome == "code_exec":
            built = code_exec if isinstance(code_exec, CodeExecReward) else CodeExecReward(**dict(code_exec or {}))
            if combine == "scae" and built.mode != "all_pass":
                raise ValueError(
                    f"combine=scae needs an accuracy in {{0, 1}} (GRP Eq. 14): reward.code_exec.score={built.mode!r} "
                    "is not; use all_pass"
                )
            self.code_exec = built
            extra = tuple(k for k in CODE_DIAGNOSTIC_KEYS if k not in type(self).diagnostic_keys)
            self.diagnostic_keys = (*type(self).diagnostic_keys, *extra)
        elif code_exec is not None:
            raise ValueError("reward.code_exec is set but reward.outcome=answer: set reward.outcome=code_exec")
        self.parse_errors: Counter[str] = Counter()

    def check_ready(self) -> str | None:
        return self.code_exec.check_ready() if self.code_exec is not None else None

    def _outcomes(self, batch: RolloutBatch, parses: list[GraphParse]) -> list[RewardOutput]:
        """r_acc per response from its `<answer>` block (class docstring)."""
        if self.code_exec is not None:  # the block's text as a final answer: code_exec runs its last fenced block
            responses = [f"{THINK_CLOSE}\n{p.answer}" if p.answer else "" for p in parses]
            code = RolloutBatch(prompts=list(batch.prompts), responses=responses, ground_truths=batch.ground_truths)
            return self.code_exec.score(code)
        answers = [gradable_answer(p.answer) for p in parses]
        to_grade = RolloutBatch(prompts=list(batch.prompts), responses=answers, ground_truths=batch.ground_truths)
        return GroundTruthReward(self.grader or default_grader())(to_grade)

    def score(self, batch: RolloutBatch) -> list[RewardOutput]:
        parses = [parse_graph(r) for r in batch.responses]
        out = []
        for p, g in zip(parses, self._outcomes(batch, parses)):
            if p.error is None:
                diag = graph_rewards(p, self.count_tokens, self.start)
                diag["R_graph"] = r_graph(diag, self.weights)  # Eq. (13)
                diag["parse_failed"] = 0.0
            else:
                self.parse_errors[p.error] += 1
                diag = {"R_graph": 0.0, "parse_failed": 1.0}
            acc = g.diagnostics.get("acc", 0.0)
            if self.code_exec is not None:  # pass_fraction, code/<outcome>
                diag.update({k: v for k, v in g.diagnostics.items() if k in CODE_DIAGNOSTIC_KEYS})
            diag.update({"acc": acc, "no_answer": float(p.answer is None or not p.answer)})
            if self.combine == "scae":  # Eq. (14)-(16) in the `scae` estimator
                score = pack_scae(acc, min(1.0, max(0.0, diag["R_graph"])))
            else:
                score = self.acc_weight * g.score + diag["R_graph"]
            out.append(RewardOutput(score, diag, g.failed))
        n_bad = sum(p.error is not None for p in parses)
        if n_bad:
            log.info("GRP reward: %d of %d responses did not parse as a graph", n_bad, len(parses))
        return out
