"""Write the smoke run's shipped data: reasoning-format traces, GRPO prompts, DPO pairs.

    python -m sarl.smoke.make_data            # rewrites sarl/smoke/data/*.jsonl

The problems are small arithmetic questions; each trace is a Qwen3 thinking-mode answer
(`<think>` steps separated by blank lines, then a boxed final answer). The traces vary the
number and kind of steps on purpose (plans, partial results, checks, recomputations,
conclusions), so that a policy warm-started on them writes reasoning whose structure, and
hence whose structure reward, differs from sample to sample. Seeded: the output is the same
on every run.

The same traces are also written in the two other output formats the project's rewards read, for the tiny
policies that `backend=verl_cpu` gives the rows whose rewards need them (conf/model/tiny_qwen3_tagged.yaml,
tiny_qwen3_graph.yaml): `traces_tagged.jsonl`, each step opened by one of its prompt's tags under Structured
Reasoning's tagged-step prompt (App. A.8, the tag set drawn per trace as App. A.4 draws it), and
`traces_graph.jsonl`, the steps as GRP's graph blocks (baselines.grp's serialisation) under the plain prompt.
"""

from __future__ import annotations

import json
import random
import re

from sarl.data.writers import write_jsonl
from sarl.formats.tags import randomized_prompt, tags_of_prompt
from sarl.smoke import DATA_DIR

INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
OPS = ("+", "-", "*")


def _question(rng: random.Random) -> tuple[str, int, int, str, int]:
    op = rng.choice(OPS)
    if op == "*":
        a, b = rng.randint(3, 19), rng.randint(2, 9)
        value = a * b
    else:
        a, b = rng.randint(11, 99), rng.randint(11, 99)
        if op == "-" and b > a:
            a, b = b, a
        value = a + b if op == "+" else a - b
    phrasing = rng.choice(
        [
            f"What is {a} {op} {b}?",
            f"Compute {a} {op} {b}.",
            f"Find the value of {a} {op} {b}.",
            f"Evaluate {a} {op} {b}.",
        ]
    )
    return phrasing, a, b, op, value


def _steps(rng: random.Random, a: int, b: int, op: str, value: int) -> list[str]:
    name = {"+": "sum", "-": "difference", "*": "product"}[op]
    steps = [
        rng.choice(
            [
                f"I need the {name} of {a} and {b}.",
                f"The problem asks for {a} {op} {b}.",
                f"Let me work out {a} {op} {b} carefully.",
            ]
        )
    ]
    if op == "*":
        tens, ones = divmod(a, 10)
        steps.append(f"Split {a} into {tens * 10} and {ones}.")
        steps.append(f"First, {tens * 10} * {b} = {tens * 10 * b}.")
        steps.append(f"Next, {ones} * {b} = {ones * b}.")
        partial = f"Adding the parts: {tens * 10 * b} + {ones * b} = {value}."
        check = f"Check: {value} / {b} = {a}, so the product is right."
    else:
        (at, ao), (bt, bo) = divmod(a, 10), divmod(b, 10)
        steps.append(f"Split both numbers into tens and ones: {at * 10} and {ao}, {bt * 10} and {bo}.")
        steps.append(f"The tens give {at * 10} {op} {bt * 10} = {eval_op(at * 10, bt * 10, op)}.")
        steps.append(f"The ones give {ao} {op} {bo} = {eval_op(ao, bo, op)}.")
        t, o = eval_op(at * 10, bt * 10, op), eval_op(ao, bo, op)
        partial = f"Combining: {t} {'+' if o >= 0 else '-'} {abs(o)} = {value}."
        inverse = "-" if op == "+" else "+"
        check = f"Check: {value} {inverse} {b} = {eval_op(value, b, inverse)}, which matches {a}."
    steps.append(partial)
    style = rng.random()
    if style < 0.3:  # a recomputation loop: the map revisits the same kind of step
        steps.append(rng.choice(["Wait, let me recompute that.", "Hmm, let me double-check the parts."]))
        steps.append(partial)
        steps.append(check)
    elif style < 0.65:
        steps.append(check)
    elif style < 0.8:  # a short trace: plan, result
        steps = [steps[0], partial]
    steps.append(rng.choice([f"So the answer is {value}.", f"Therefore {a} {op} {b} = {value}."]))
    return steps


def eval_op(x: int, y: int, op: str) -> int:
    """Integer arithmetic on two operands (no Python eval of text)."""
    return {"+": x + y, "-": x - y, "*": x * y}[op]


def trace(rng: random.Random) -> dict:
    question, a, b, op, value = _question(rng)
    steps = _steps(rng, a, b, op, value)
    response = "<think>\n" + "\n\n".join(steps) + "\n</think>\n\nThe answer is \\boxed{" + str(value) + "}."
    return {
        "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
        "completion": [{"role": "assistant", "content": response}],
        "ground_truth": str(value),
    }


# A step's kind, from how `_steps` words it: what tag (tagged format) and graph label (GRP format) it gets.
STEP_KINDS = (
    ("split", ("Split ",)),
    ("partial", ("The tens give", "The ones give", "First, ", "Next, ")),
    ("combine", ("Combining:", "Adding the parts:")),
    ("recompute", ("Wait, ", "Hmm, ")),
    ("check", ("Check: ",)),
    ("conclude", ("So the answer", "Therefore ")),
)
# kind -> (preferred tag, tag when the preferred one is not in the prompt's set); the fallbacks are among
# Structured Reasoning's top 5 tags (sarl.formats.tags.TOP_TAGS), which every drawn set holds
TAG_OF_KIND = {
    "plan": ("rephrase", "decompose"),
    "split": ("decompose", "decompose"),
    "partial": ("formalize", "formalize"),
    "combine": ("inference", "formalize"),
    "recompute": ("verify", "verify"),
    "check": ("verify", "verify"),
    "conclude": ("summarize", "summarize"),
}


def step_kind(step: str, first: bool) -> str:
    for kind, starts in STEP_KINDS:
        if step.startswith(starts):
            return kind
    if first:
        return "plan"
    raise ValueError(f"a smoke step of no known kind: {step!r}")


def think_steps(completion: str) -> tuple[list[str], str]:
    """The blank-line separated steps inside a trace's `<think>` block and the final answer's value."""
    think = completion.split("<think>\n", 1)[1].split("\n</think>", 1)[0]
    value = re.search(r"\\boxed\{([^}]*)\}", completion).group(1)
    return think.split("\n\n"), value


def tagged_trace(row: dict, key: str, seed: int = 0) -> dict:
    """`row` (a `trace`) under the tagged-step prompt with its own tag set, each step opened by a tag of that set."""
    question = row["prompt"][0]["content"]
    prompt = randomized_prompt(question, seed=seed, key=key)
    allowed = set(tags_of_prompt(prompt))
    steps, value = think_steps(row["completion"][0]["content"])
    lines = []
    for i, step in enumerate(steps):
        preferred, fallback = TAG_OF_KIND[step_kind(step, i == 0)]
        lines.append(f"<{preferred if preferred in allowed else fallback}> {step}")
    response = "<think>\n" + "\n".join(lines) + "\n</think>\n\nThe answer is \\boxed{" + value + "}."
    return {**row, "prompt": [{"role": "user", "content": prompt}], "completion": [_assistant(response)]}


def graph_trace(row: dict) -> dict:
    """`row` (a `trace`) with its steps as GRP graph nodes: the question known, the partial results generated
    from it, a combination aggregating its parts, checks reflecting on it, the conclusion last (the answer)."""
    a, op, b = operation(row)
    steps, value = think_steps(row["completion"][0]["content"])
    nodes: list[tuple[str, list[int], str]] = [("known", [], f"{a} {op} {b}")]
    parts: list[int] = []
    last = split = 1
    for i, step in enumerate(steps):
        kind, text = step_kind(step, i == 0), _terse(step)
        if kind == "plan":  # the question is node 1
            continue
        if kind == "split":
            nodes.append(("generate", [1], text))
            split = len(nodes)
        elif kind == "partial":
            nodes.append(("generate", [split], text))
            parts.append(len(nodes))
        elif kind == "combine":
            nodes.append(("aggregate", parts[-2:], text) if len(parts) > 1 else ("generate", [1], text))
        elif kind in ("recompute", "check"):
            nodes.append(("reflect", [last], text))
        else:
            nodes.append(("aggregate", sorted({1, last}) if last != 1 else [1, split], text))
        last = len(nodes)
    lines, label = [], None
    for i, (kind, parents, content) in enumerate(nodes, start=1):
        if not kind == label == "known":  # one node per block: GRP Eq. 3 (density) and Eq. 6 (parallelism) hold
            if label is not None:
                lines.append(f"</{label}>")
            lines.append(f"<{kind}>")
            label = kind
        lines.append(json.dumps({"id": i, "parents_id": parents, "content": content}))
    lines.append(f"</{label}>")
    response = "<think>\n" + "\n".join(lines) + "\n</think>\n<answer>\\boxed{" + value + "}</answer>"
    return {**row, "completion": [_assistant(response)]}


def _terse(step: str) -> str:
    """A step's words from its first number on ("The tens give 60 - 10 = 50." -> "60 - 10 = 50."): graph nodes
    hold the computation, which keeps the graph traces short enough for the tiny policy's context."""
    digit = re.search(r"\d", step)
    return step[digit.start() :] if digit else step


def _assistant(content: str) -> dict:
    return {"role": "assistant", "content": content}


OPERATION = re.compile(r"(\d+) ([-+*]) (\d+)")


def operation(row: dict) -> tuple[int, str, int]:
    """The (a, op, b) a prompt asks about: what makes two arithmetic prompts the same problem."""
    a, op, b = OPERATION.search(row["prompt"][0]["content"]).groups()
    return int(a), op, int(b)


def heldout_prompts(rng: random.Random, n: int, exclude: set[tuple[int, str, int]]) -> list[dict]:
    """`n` prompts whose problems are neither training prompts nor warm-start traces (nor repeated)."""
    out: list[dict] = []
    seen = set(exclude)
    while len(out) < n:
        question, a, b, op, value = _question(rng)
        if (a, op, b) in seen:
            continue
        seen.add((a, op, b))
        out.append(
            {
                "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
                "ground_truth": str(value),
                "data_source": "smoke_arithmetic",
                "extra_info": {"index": len(out), "split": "heldout"},
            }
        )
    return out


def main(n_traces: int = 600, n_prompts: int = 64, n_pairs: int = 32, n_heldout: int = 64, seed: int = 0) -> None:
    rng = random.Random(seed)
    traces = [trace(rng) for _ in range(n_traces)]
    prompts = []
    for i in range(n_prompts):
        question, *_, value = _question(rng)
        prompts.append(
            {
                "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
                "ground_truth": str(value),
                "data_source": "smoke_arithmetic",
                "extra_info": {"index": i, "split": "train"},
            }
        )
    pairs = []
    for i in range(n_pairs):  # chosen: a reasoned answer; rejected: a bare (often wrong) guess
        t = trace(rng)
        guess = int(t["ground_truth"]) + rng.choice([-10, -1, 1, 10])
        pairs.append(
            {
                "prompt": t["prompt"],
                "chosen": t["completion"],
                "rejected": [{"role": "assistant", "content": f"The answer is \\boxed{{{guess}}}."}],
            }
        )
    # drawn last, so that the other files stay as they were before the held-out set existed
    heldout = heldout_prompts(rng, n_heldout, {operation(r) for r in traces + prompts})
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    write_jsonl(traces, DATA_DIR / "traces.jsonl")
    write_jsonl(prompts, DATA_DIR / "train.trl.jsonl")
    write_jsonl(pairs, DATA_DIR / "dpo.jsonl")
    write_jsonl(heldout, DATA_DIR / "heldout.trl.jsonl")
    write_jsonl([tagged_trace(t, f"trace-{i}") for i, t in enumerate(traces)], DATA_DIR / "traces_tagged.jsonl")
    write_jsonl([graph_trace(t) for t in traces], DATA_DIR / "traces_graph.jsonl")
    counts = f"{len(traces)} traces, {len(prompts)} prompts, {len(pairs)} pairs, {len(heldout)} held-out prompts"
    print(f"wrote {counts} to {DATA_DIR}")


if __name__ == "__main__":
    main()
