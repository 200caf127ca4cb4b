"""GRP's output format (GRP Sec. 3.1; decisions §4): inside `<think>...</think>`, blocks wrapped in one of 7 cognitive
labels, one node per line as a JSON object `{"id": int, "parents_id": [int], "content": str}`, the final answer in
`<answer>...</answer>` after `</think>` (the full description: `baselines.grp`, whose rewards score it). The parser
is strict and total: it never raises on model output; a malformed response gives `GraphParse.error`.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from sarl.checking.grading.extract import extract_answer
from sarl.structure.steps import THINK_CLOSE, THINK_OPEN, sanitize

LABELS = ("known", "generate", "aggregate", "reflect", "refine", "reverse", "associate")  # GRP App. B

_LINE = re.compile(r"^(?:<(\w+)>)?(.*?)(?:</(\w+)>)?$", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@dataclass
class Node:
    """v = (id, parents_id, content) (GRP Eq. 1), with its label and label block."""

    id: int
    parents: list[int]
    content: str
    label: str
    block: int


@dataclass
class GraphParse:
    """A parsed response: the nodes in text order, the label blocks (node ids per block), the answer text,
    and the reason the parse failed (None if it did not)."""

    nodes: list[Node] = field(default_factory=list)
    blocks: list[list[int]] = field(default_factory=list)
    answer: str | None = None
    error: str | None = None


def _node(obj: Any) -> tuple[int, list[int], str] | str:
    """The fields of one node object, or the reason it is not one."""
    if not isinstance(obj, dict):
        return "a node line is not a JSON object"
    if set(obj) != {"id", "parents_id", "content"}:
        return "a node must have exactly the keys id, parents_id, content"
    nid, parents, content = obj["id"], obj["parents_id"], obj["content"]
    if isinstance(nid, bool) or not isinstance(nid, int):
        return "a node id is not an integer"
    if not isinstance(parents, list) or any(isinstance(p, bool) or not isinstance(p, int) for p in parents):
        return "parents_id is not a list of integers"
    if not isinstance(content, str):
        return "a node's content is not a string"
    return nid, list(parents), content


def parse_graph(response: Any) -> GraphParse:
    """The reasoning graph of a response in GRP's format (module docstring). Total: never raises; a
    malformed response gives `GraphParse.error` (the first problem found)."""
    if not isinstance(response, str):
        return GraphParse(error="response is not text")
    text, _ = sanitize(response)
    open_at = text.find(THINK_OPEN)
    body_start = open_at + len(THINK_OPEN) if open_at >= 0 else 0
    close_at = text.find(THINK_CLOSE, body_start)
    answers = _ANSWER.findall(text[close_at:]) if close_at >= 0 else []
    out = GraphParse(answer=answers[-1].strip() if answers else None)
    if close_at < 0:
        out.error = "truncated: no </think>"
        return out
    label: str | None = None
    ids: set[int] = set()
    for raw in text[body_start:close_at].split("\n"):
        line = raw.strip()
        if not line:
            continue
        m = _LINE.match(line)
        opening, middle, closing = m.group(1), m.group(2).strip(), m.group(3)
        if opening is not None:
            if opening not in LABELS:
                out.error = f"unknown label <{opening}>"
                return out
            if label is not None:
                out.error = f"<{opening}> opened inside <{label}>"
                return out
            label = opening
            out.blocks.append([])
        if middle:
            if label is None:
                out.error = "text outside a label block"
                return out
            try:
                fields = _node(json.loads(middle))
            except (ValueError, RecursionError):
                fields = "a node line is not valid JSON"
            if isinstance(fields, str):
                out.error = fields
                return out
            nid, parents, content = fields
            if nid in ids:
                out.error = f"duplicate node id {nid}"
                return out
            ids.add(nid)
            out.nodes.append(Node(nid, parents, content, label, len(out.blocks) - 1))
            out.blocks[-1].append(nid)
        if closing is not None:
            if closing != label:
                out.error = f"</{closing}> does not close <{label}>" if label else f"</{closing}> closes nothing"
                return out
            if not out.blocks[-1]:
                out.error = f"empty <{label}> block"
                return out
            label = None
    if label is not None:
        out.error = f"<{label}> is never closed"
    elif not out.nodes:
        out.error = "no nodes"
    return out


def reasoning_graph(parse: GraphParse) -> tuple[nx.DiGraph, Counter]:
    """Directed graph parent -> child of a parsed response, and counts of what was dropped
    (`dangling_parents`: ids that are no node; `repeated_parents`)."""
    g = nx.DiGraph()
    g.add_nodes_from(n.id for n in parse.nodes)
    dropped: Counter = Counter()
    for n in parse.nodes:
        seen = set()
        for p in n.parents:
            if p in seen:
                dropped["repeated_parents"] += 1
            elif p not in g:
                dropped["dangling_parents"] += 1
            else:
                g.add_edge(p, n.id)
            seen.add(p)
    return g, dropped


def gradable_answer(answer: str | None) -> str:
    """The text `GroundTruthReward` grades: the `\\boxed{}` of the answer block, else the block boxed."""
    if answer is None:
        return ""
    return answer if extract_answer(answer) is not None else f"\\boxed{{{answer}}}" if answer else ""
