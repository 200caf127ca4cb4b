"""The GRP recipe (`grp_math`, `grp_code`; GRP Sec. 3.1.3, App. C-D; every number cited in
conf/synthesize/recipe/): per problem, sample a trace from the teacher and verify its final answer against the
gold with `sarl.checking.grading`, regenerating up to a bound (grp_code reads the data set's own test-verified R1 trace
instead); translate the verified trace into the graph format with App. C's prompt; check the graph with the
project's parser (`sarl.formats.graph.parse_graph` and the format rules of Sec. 3.2.1) and, optionally, with the
teacher as App. D's verifier (node-label consistency, parent-child coherence); on a failure re-translate with
the failures as feedback, up to a bound. A verified trace that never becomes a valid graph is kept as a plain
CoT example ("mixed reasoning formats")."""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any, Mapping, Sequence

from sarl.data.synthesize.context import Context, Tally
from sarl.data.synthesize.inputs import SourceProblem
from sarl.data.synthesize.teacher import full_trace
from sarl.data.synthesize.verify import graph_issues, llm_verify, trace_rejection, unusable_gold
from sarl.formats.graph import parse_graph


def synthesize_grp(problem: SourceProblem, ctx: Context) -> dict[str, Any]:
    """GRP Sec. 3.1.3 for one problem: a verified trace, its graph translation checked and re-translated with
    feedback (App. C-D), or the trace kept as plain CoT when no valid graph comes out."""
    r, tally = ctx.recipe, Tally()
    tally.stages["problems"] += 1
    if r["trace_source"] == "teacher" and unusable_gold(ctx, problem, tally):
        return {"id": problem.id, "examples": [], **tally.as_dict()}
    student_prompt = ctx.prompts["sample"].render(question=problem.question)
    trace = None
    if r["trace_source"] == "dataset":
        trace = problem.trace
        tally.stages["traces_from_dataset"] += 1
    else:
        for attempt in range(1 + int(r["sample"]["max_retries"])):
            tally.stages["sample_requests"] += 1
            reply = ctx.teacher.chat([{"role": "user", "content": student_prompt}], r["sample"]["sampling"])
            why = trace_rejection(ctx, problem, reply)
            if why is None:
                trace = full_trace(reply)
                tally.stages["traces_verified"] += 1
                tally.stages["verified_first_try" if attempt == 0 else "verified_after_regeneration"] += 1
                break
            tally.reject("sample", why)
    examples: list[dict[str, str]] = []
    if trace is None:
        tally.stages["no_verified_trace"] += 1
        return {"id": problem.id, "examples": examples, **tally.as_dict()}
    translate = ctx.prompts["translate"].render(question=problem.question, trace=trace)
    request, graph = translate, None
    t = r["translate"]
    for attempt in range(int(t["max_attempts"])):
        tally.stages["translate_requests"] += 1
        reply = ctx.graph_teacher.chat([{"role": "user", "content": request}], t["sampling"])
        candidate = reply.content.strip()
        if reply.finish_reason == "length":
            issues = [("truncated", "the translation was cut off by the length limit; write it more concisely")]
        else:
            issues = graph_issues(parse_graph(candidate), problem.golds, r["task"], ctx.grader)
        stage = "check"
        if not issues and t["llm_verify"]:
            stage = "verify"
            issues = llm_verify(ctx, problem, candidate, tally)
        if not issues:
            graph = candidate
            tally.stages["graphs_first_try" if attempt == 0 else "graphs_after_feedback"] += 1
            break
        for kind, _ in dict.fromkeys(issues):
            tally.reject(stage, kind)
        feedback = "\n".join(f"- [{kind}] {msg}" for kind, msg in dict.fromkeys(issues))
        request = ctx.prompts["refine"].render(translation_prompt=translate, graph=candidate, feedback=feedback)
    if graph is not None:
        examples.append({"kind": "graph", "prompt": student_prompt, "completion": graph})
    else:  # a candidate for the mixed-format remainder; `cot_remainder` decides on it in `grp_examples`
        tally.stages["unconverted"] += 1
        examples.append({"kind": "cot", "prompt": student_prompt, "completion": trace})
    return {"id": problem.id, "examples": examples, **tally.as_dict()}


def grp_examples(results: Sequence[dict[str, Any]], keep: Mapping[str, Any], seed: int, stages: Counter) -> list[dict]:
    """The graph examples and the mixed-format remainder (GRP Sec. 3.1.3, "Supervised Fine-Tuning with Mixed
    Reasoning Formats"): the unconverted CoT traces if `keep.keep`, a fixed hashed share `keep.fraction` of
    them (decided here, after the cache, so changing it asks the teacher nothing)."""
    out = []
    for res in results:
        for ex in res["examples"]:
            if ex["kind"] == "cot" and not (keep["keep"] and _share(res["id"], seed) < float(keep["fraction"])):
                stages["unconverted_dropped"] += 1
                continue
            out.append({"id": res["id"], **ex})
    return out


def _share(key: str, seed: int) -> float:
    """A deterministic number in [0, 1) per (seed, key): which unconverted traces a fraction keeps."""
    digest = hashlib.sha256(f"{seed}:{key}".encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "little") / 2**64
