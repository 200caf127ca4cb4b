"""MaxFlow reward of Structured Reasoning (Structured Reasoning Sec. 4.2-4.3, App. E.2, F).

Three modules: `flow` (capacity graph, max flow, step importance, Q), `attention` (Eq. 3 and the policy's
attention pass), `reward` (the reward object). Their public names are importable from here.

Per response:
1. Nodes: node 0 the question (the prompt), then the reasoning steps (`sarl.formats.tags`), the
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
