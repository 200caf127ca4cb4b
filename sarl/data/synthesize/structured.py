"""The Structured Reasoning recipe (`structured`; Sec. 3/4.1 Eq. 1, App. E.1, A.8, A.14; every number cited in
conf/synthesize/recipe/structured.yaml): answer each question several times with randomised tag orderings
through the fill-in-the-middle prefix of App. A.14; keep the samples that are correct (`sarl.checking.grading`) and
pass the tag checker (`sarl.formats.tags`); then keep the problems with the lowest correctness rate
(at least one correct) and the richest tag usage."""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from typing import Any, Mapping, Sequence

from sarl.checking.grading.extract import extract_answer
from sarl.data.synthesize.context import Context, Tally
from sarl.data.synthesize.inputs import SourceProblem
from sarl.data.synthesize.teacher import Reply, full_trace
from sarl.data.synthesize.verify import structured_issues, unusable_gold
from sarl.formats.tags import TAGS, parse_structured, structured_prompt


def structured_request(
    ctx: Context, problem: SourceProblem, tags: Sequence[str]
) -> tuple[list[dict[str, Any]], dict, str]:
    """(messages, extra body, the text the reply continues) of one App. A.14 fill-in-the-middle request.

    prefill "deepseek": the assistant message of App. A.14 verbatim (`reasoning_content` = the prefix,
    `prefix: True`, DeepSeek's prefix completion); "continue": the prefix as the start of the assistant turn
    inside `<think>` with `continue_final_message` (vLLM's way); "none": no prefix."""
    prompt = ctx.prompts["sample"].render(question=problem.question, tags=", ".join(f"<{t}>" for t in tags))
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    prefix = ctx.prompts["prefill"].text
    mode = ctx.recipe["prefill"]
    if mode == "deepseek":
        messages.append({"role": "assistant", "reasoning_content": prefix, "content": "", "prefix": True})
        return messages, {}, prefix
    if mode == "continue":
        messages.append({"role": "assistant", "content": "<think>\n" + prefix})
        return messages, {"continue_final_message": True, "add_generation_prompt": False}, prefix
    return messages, {}, ""


def _structured_text(reply: Reply, mode: str, prefix: str) -> str:
    """The whole response of a prefilled request: the prefix joined to what the teacher continued."""
    if mode == "deepseek":
        return f"<think>\n{prefix}{reply.reasoning.rstrip()}\n</think>\n\n{reply.content.strip()}"
    if mode == "continue":
        return f"<think>\n{prefix}{reply.content}".rstrip()
    return full_trace(reply)


def synthesize_structured(problem: SourceProblem, ctx: Context) -> dict[str, Any]:
    """Structured Reasoning App. E.1 for one question: `samples_per_problem` answers with randomised tag
    orderings, each checked for correctness (`sarl.checking.grading`) and format (the tag checker); the selection
    across problems happens in `select_structured`."""
    r, tally = ctx.recipe, Tally()
    tally.stages["problems"] += 1
    samples: list[dict[str, Any]] = []
    if unusable_gold(ctx, problem, tally):
        return {"id": problem.id, "samples": samples, **tally.as_dict()}
    for k in range(int(r["samples_per_problem"])):
        digest = hashlib.sha256(f"{ctx.seed}:{problem.id}:{k}".encode("utf-8", "surrogatepass")).digest()
        tags = list(TAGS)
        random.Random(int.from_bytes(digest[:8], "little")).shuffle(tags)
        messages, extra, prefix = structured_request(ctx, problem, tags)
        mode = r["prefill"]
        text, correct, issues = "", False, []
        for attempt in range(1 + int(r["format_retries"])):
            tally.stages["sample_requests"] += 1
            reply = ctx.teacher.chat(messages, r["sampling"], extra)
            text = _structured_text(reply, mode, prefix)
            if reply.finish_reason == "length":
                tally.reject("sample", "truncated")
                issues = [("truncated", "")]
                break
            pred = extract_answer(text)
            correct = pred is not None and ctx.grader.check_any(pred, problem.golds).ok
            issues = structured_issues(text)
            if not issues:
                break
            for kind, _ in issues:
                tally.reject("format", kind)
            if attempt < int(r["format_retries"]):  # re-ask in a follow-up turn, the failure as feedback
                tally.stages["format_reasks"] += 1
                feedback = "; ".join(msg for _, msg in issues)
                tags_text = ", ".join(f"<{t}>" for t in tags)
                messages = [
                    messages[0],
                    {"role": "assistant", "content": text},
                    {"role": "user", "content": ctx.prompts["feedback"].render(feedback=feedback, tags=tags_text)},
                ]
                extra, prefix, mode = {}, "", "none"
        tally.stages["samples"] += 1
        tally.stages["samples_correct"] += int(correct)
        format_ok = not issues
        tally.stages["samples_format_ok"] += int(format_ok)
        if not correct and not (issues and issues[0][0] == "truncated"):
            tally.reject("sample", "wrong_answer" if extract_answer(text) is not None else "no_answer")
        entry: dict[str, Any] = {"correct": correct, "format_ok": format_ok}
        if correct and format_ok:
            parsed = parse_structured(text, "tags")
            entry.update(
                completion=text, distinct_tags=len(parsed.tag_counts), tag_steps=sum(parsed.tag_counts.values())
            )
        samples.append(entry)
    return {"id": problem.id, "samples": samples, **tally.as_dict()}


def select_structured(
    results: Sequence[dict[str, Any]], questions: Mapping[str, str], keep: int, stages: Counter, rejections: Counter
) -> list[dict[str, str]]:
    """App. E.1's filter: among problems with at least one correct, well-formatted sample, keep the `keep`
    with the lowest correctness rate, then the richest tag usage (distinct tags, then tagged steps), ties by
    id; each contributes its richest sample, with the structured prompt I of Eq. 2 (all 23 tags in the
    paper's order) as the student's prompt."""
    ranked = []
    for res in results:
        valid = [s for s in res["samples"] if s.get("completion")]
        if not valid:
            rejections["select/no_valid_sample"] += 1
            continue
        best = max(valid, key=lambda s: (s["distinct_tags"], s["tag_steps"]))
        rate = sum(s["correct"] for s in res["samples"]) / len(res["samples"])
        ranked.append((rate, -best["distinct_tags"], -best["tag_steps"], res["id"], best))
    ranked.sort(key=lambda x: x[:4])
    stages["problems_with_valid_sample"] = len(ranked)
    chosen = ranked[:keep]
    if len(ranked) > keep:
        rejections["select/beyond_keep"] += len(ranked) - keep
    return [
        {"id": pid, "kind": "structured", "prompt": structured_prompt(questions[pid]), "completion": best["completion"]}
        for _, _, _, pid, best in chosen
    ]
