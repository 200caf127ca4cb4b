"""The checks a synthesised trace must pass: the final answer against the gold (`trace_rejection`,
`unusable_gold`), a GRP graph against the project's parser and GRP's format rules (`graph_issues`, Sec.
3.2.1) and against the teacher as App. D's verifier (`llm_verify`, `parse_verdict`), and a Structured
Reasoning response against the tag checker (`structured_issues`)."""

from __future__ import annotations

import json
from typing import Any, Sequence

from sarl.checking.grading.extract import extract_answer
from sarl.data.synthesize.context import Context, Tally
from sarl.data.synthesize.inputs import SourceProblem
from sarl.data.synthesize.teacher import Reply, full_trace
from sarl.formats.graph import gradable_answer, reasoning_graph
from sarl.formats.tags import format_score, parse_structured


def graph_issues(parse: Any, golds: Sequence[str], task: str, grader: Any) -> list[tuple[str, str]]:
    """(violation type, message naming the node) for a translated graph: the parse error of
    `sarl.formats.graph.parse_graph`, GRP's format rules (Sec. 3.2.1: known nodes have no parents, an aggregate
    node > 1 parent, a refine node exactly 1, an aggregate or refine label wraps exactly one node, nodes in
    one label are parallel), parents that are no node, cycles, and the answer: present, and for math equal to
    the gold (`sarl.checking.grading`). Empty when the graph passes."""
    import networkx as nx

    if parse.error is not None:
        return [("format", parse.error)]
    issues: list[tuple[str, str]] = []
    ids = {n.id for n in parse.nodes}
    for n in parse.nodes:
        for p in n.parents:
            if p not in ids:
                issues.append(("dangling_parent", f"node {n.id} lists parent {p}, which is no node"))
    g, _ = reasoning_graph(parse)
    if not nx.is_directed_acyclic_graph(g):
        cycle = [u for u, _ in nx.find_cycle(g)]
        issues.append(("cycle", f"nodes {cycle} form a cycle; a node's parents must come before it"))
    block_size = [len(b) for b in parse.blocks]
    for n in parse.nodes:
        k = len(set(g.predecessors(n.id)))
        if n.label == "known" and k != 0:
            issues.append(("known_has_parents", f"node {n.id} (<known>) has parents; a known node has none"))
        elif n.label == "aggregate" and k < 2:
            issues.append(("aggregate_parents", f"node {n.id} (<aggregate>) has {k} parent(s); it needs more than one"))
        elif n.label == "refine" and k != 1:
            issues.append(("refine_parents", f"node {n.id} (<refine>) has {k} parents; it needs exactly one"))
        if n.label in ("aggregate", "refine") and block_size[n.block] != 1:
            issues.append(
                (
                    f"{n.label}_block_size",
                    f"node {n.id}: its <{n.label}> block holds {block_size[n.block]} nodes; it must wrap exactly one",
                )
            )
    for b, members in enumerate(parse.blocks):
        inside = set(members)
        for nid in members:
            bad = sorted(set(g.predecessors(nid)) & inside)
            if bad:
                issues.append(
                    (
                        "not_parallel",
                        f"node {nid} has parent(s) {bad} in its own label block; nodes in one block must be parallel",
                    )
                )
    if not parse.answer:
        issues.append(("no_answer", "there is no non-empty <answer>...</answer> after </think>"))
    elif task == "math":
        pred = extract_answer(gradable_answer(parse.answer))
        if pred is None or not grader.check_any(pred, golds).ok:
            issues.append(("answer_mismatch", "the <answer> block does not state the trace's verified final answer"))
    return issues


def parse_verdict(text: str) -> dict[str, Any] | None:
    """The verifier's JSON verdict (App. D) {"passed": bool, "issues": [...]}, or None if there is none."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        return None
    try:
        obj = json.loads(text[start : end + 1])
    except (ValueError, RecursionError):
        return None
    if (
        not isinstance(obj, dict)
        or not isinstance(obj.get("passed"), bool)
        or not isinstance(obj.get("issues", []), list)
    ):
        return None
    issues = [i for i in obj.get("issues", []) if isinstance(i, dict)]
    if obj["passed"] == bool(issues):  # "passed" must agree with the issues
        return None
    return {"passed": obj["passed"], "issues": issues}


def structured_issues(text: str) -> list[tuple[str, str]]:
    """Why a response fails the tag checker (`sarl.formats.tags`: `format_score` 1 and no unknown
    tag): [(reason, message)], empty when it passes."""
    p = parse_structured(text, "tags")
    if format_score(p) == 1.0 and p.unknown_tags == 0:
        return []
    out = []
    if not p.closed:
        out.append(("not_closed", "the reasoning is not closed by </think>"))
    if not any(s.tag for s in p.steps):
        out.append(("no_tagged_step", "no step starts with one of the tags"))
    if p.untagged_prefix:
        out.append(("untagged_prefix", "the reasoning starts with text before the first tag"))
    if p.unknown_tags:
        out.append(("unknown_tags", f"{p.unknown_tags} tag(s) that are not among the allowed ones"))
    if extract_answer(p.text) is None:
        out.append(("no_boxed_answer", "no \\boxed{ } answer after </think>"))
    return out or [("format", "the response fails the format check")]


def trace_rejection(ctx: Context, problem: SourceProblem, reply: Reply) -> str | None:
    """None when the reply is a usable, correct trace; else the rejection reason."""
    if reply.finish_reason == "length":
        return "truncated"
    trace = full_trace(reply)
    if not trace:
        return "empty"
    if ctx.recipe["task"] == "code":
        return None
    pred = extract_answer(trace)
    if pred is None:
        return "no_answer"
    return None if ctx.grader.check_any(pred, problem.golds).ok else "wrong_answer"


def unusable_gold(ctx: Context, problem: SourceProblem, tally: Tally) -> bool:
    """A math problem none of whose gold answers math-verify can parse could never verify a trace: it is
    rejected (`input/gold_does_not_parse`) before any teacher call."""
    if ctx.recipe["task"] != "math" or any(ctx.grader.parses(g).ok for g in problem.golds):
        return False
    tally.reject("input", "gold_does_not_parse")
    return True


def llm_verify(ctx: Context, problem: SourceProblem, graph: str, tally: Tally) -> list[tuple[str, str]]:
    """App. D's check by the teacher: [] when it passes, else the issues; a verdict that is not the asked
    JSON is asked again, up to `verify_attempts` times, then rejects the graph."""
    v = ctx.recipe["translate"]
    request = ctx.prompts["verify"].render(question=problem.question, graph=graph)
    for _ in range(int(v["verify_attempts"])):
        tally.stages["verify_requests"] += 1
        reply = ctx.graph_teacher.chat([{"role": "user", "content": request}], v["verify_sampling"])
        verdict = parse_verdict(reply.content)
        if verdict is None:
            tally.reject("verify", "unparseable_verdict")
            continue
        out = []
        for issue in verdict["issues"]:
            kind = issue.get("type") if issue.get("type") in ("node_label", "parent_child") else "other"
            out.append((kind, f"node {issue.get('node')}: {issue.get('problem', '')}".strip()))
        return out
    return [("unparseable_verdict", "the verification could not be completed")]
