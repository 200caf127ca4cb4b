"""Compiled kernels of the structure stage: KMeans on one response's Gram matrix (SARL App. A.1;
decisions §1.3 "Clustering"), the reasoning-map metrics C and L (SARL Eqs. 4-5) and the row normalisation of the
step embeddings (SARL Sec. 3.2); HDBSCAN's are in `sarl.structure.hdbscan_kernels`. Each has a plain counterpart
written the obvious way, which tests hold it equal to: `sarl.structure.reference` (KMeans, tests/sarl/
test_cluster_reference.py), the networkx functions of `sarl.structure.graph` (tests/sarl/test_graph.py),
`sarl.structure.embed.base.row_norms` (tests/sarl/embed/test_base.py).

KMeans. `sarl.structure.gram` computes a response's Gram matrix G = X X^T, and the rest works on the M x M matrix in
loops that numba compiles (`compiled`: when this module is first imported, cached on disk). Nothing here allocates
more than a few M x M arrays.

The arithmetic is fixed operation by operation (label for label the reference's): squared distances
||x_i - x_j||^2 = (G_ii + G_jj) - 2 G_ij clipped at 0; greedy k-means++ seeding with scikit-learn's 2 + ln k local
trials, the candidate whose potential (a sequential sum) is lowest, first on ties; Lloyd iterations in kernel form,
||x_i - c_j||^2 = G_ii - 2 S_ij / n_j + (sum_{l in j} S_lj) / n_j^2 with S_ij = sum_{l in j} G_il summed
in step order, the first closest centre on ties. A Lloyd iteration costs M^2 additions (a one-hot matrix
product would cost M^2 k) and no temporary arrays. The sums read G by rows, which relies on G being
exactly symmetric: `sarl.structure.gram.gram` computes one triangle and mirrors it.

Reasoning maps. `graph_metrics_flat` takes every response's labels end to end and gives C, L, node and
edge counts with the arithmetic of the networkx reference in `sarl.structure.graph` (integer counts, then one
division each), in one compiled loop over the responses.

Embeddings. `normalise_rows` checks and unit-normalises the raw step embeddings for `Embedder.embed` (decisions
§1.2 "Embeddings") in one read and one write pass, with the norm that `sarl.structure.embed.base.row_norms` defines
in numpy (a fixed order of summation, bit-identical).

This module imports numba (with the kernels loaded from its cache, ~0.5 s): the modules that call the kernels import
it on first use (`sarl.structure.cluster.load_kernels`), so that `from sarl import StructureReward` does not.
"""

from __future__ import annotations

import numpy as np
from numba import njit


def compiled(signatures, fastmath=False):
    """numba's njit for the given signatures, compiled when its module is imported (so no call pays for it)
    and cached on disk: compiled once per installation (a few seconds), then loaded (a fraction of one).
    Where numba finds no writable cache directory (read-only install, no writable home; NUMBA_CACHE_DIR
    chooses one), the kernels are compiled at every import instead of failing. numba's cache is kept per CPU
    model and features, so a cache shared by several machines (a cluster's home directory) stays right."""

    def wrap(fn):
        try:
            return njit(signatures, cache=True, nogil=True, fastmath=fastmath)(fn)
        except RuntimeError:  # numba: "cannot cache function ...: no locator available"
            return njit(signatures, nogil=True, fastmath=fastmath)(fn)

    return wrap


# Distances below this are exact duplicates for the seeding (float noise of G_ii + G_jj - 2 G_ij).
_ZERO = 1e-12


@compiled(["Tuple((f8[:, ::1], f8, b1))(f4[:, ::1])", "Tuple((f8[:, ::1], f8, b1))(f8[:, ::1])"])
def squared_distances(g):
    """(D, min_off, finite): D[i, j] = ||x_i - x_j||^2 from the Gram matrix `g` (float32 or float64), clipped
    at 0, zero diagonal, in float64; min_off the smallest off-diagonal entry (inf for one step); finite False
    when a diagonal entry (a sum of squares) is NaN or infinite, and D is then not to be used."""
    m = g.shape[0]
    sq = np.empty(m)
    finite = True
    for i in range(m):
        sq[i] = np.float64(g[i, i])
        if not np.isfinite(sq[i]):
            finite = False
    d2 = np.empty((m, m))
    min_off = np.inf
    for i in range(m):
        for j in range(m):
            if i == j:
                d2[i, j] = 0.0
                continue
            v = (sq[i] + sq[j]) - 2.0 * np.float64(g[i, j])
            if v < 0.0:
                v = 0.0
            d2[i, j] = v
            if v < min_off:
                min_off = v
    return d2, min_off, finite


@compiled(
    [
        "i8[::1](f4[:, ::1], f8[:, ::1], i8, f8[:, ::1], i8, i8)",
        "i8[::1](f8[:, ::1], f8[:, ::1], i8, f8[:, ::1], i8, i8)",
    ]
)
def kmeans_labels(g, d2, k, u, n_trials, max_iter):
    """Labels 0..k-1 of the m steps of one response: greedy k-means++ seeding (Arthur & Vassilvitskii 2007)
    from the uniform draws `u` (row j: the draws of centre j, one per local trial; shared by every response,
    so a response's labels never depend on the others), then Lloyd iterations until no label moves or
    `max_iter` iterations. `g`: the Gram matrix; `d2`: `squared_distances(g)[0]`."""
    m = g.shape[0]
    labels = np.zeros(m, dtype=np.int64)
    if k <= 1 or m < 2:
        return labels
    # Seeding: the first centre uniform, then for each further centre n_trials D^2-sampled candidates and
    # the one that lowers the potential sum_i min(D(x_i)^2, d(x_i, cand)^2) most.
    centers = np.empty(k, dtype=np.int64)
    c0 = np.int64(u[0, 0] * m)
    if c0 > m - 1:
        c0 = m - 1
    centers[0] = c0
    closest = np.empty(m)
    for i in range(m):
        v = d2[c0, i]
        closest[i] = 0.0 if v < _ZERO else v
    cum = np.empty(m)
    for j in range(1, k):
        s = 0.0
        for i in range(m):
            s += closest[i]
            cum[i] = s
        total = cum[m - 1]
        best_pot = np.inf
        best_c = -1
        for t in range(n_trials):
            threshold = u[j, t] * total
            c = 0  # no index passes the threshold (every step a duplicate of a centre): the first step
            for i in range(m):
                if cum[i] > threshold:
                    c = i
                    break
            pot = 0.0
            for i in range(m):
                v = d2[c, i]
                if v < _ZERO:
                    v = 0.0
                pot += closest[i] if closest[i] < v else v
            if best_c < 0 or pot < best_pot:
                best_pot = pot
                best_c = c
        centers[j] = best_c
        for i in range(m):
            v = d2[best_c, i]
            if v < _ZERO:
                v = 0.0
            if v < closest[i]:
                closest[i] = v
    for i in range(m):
        best = 0
        best_d = d2[i, centers[0]]
        for c in range(1, k):
            if d2[i, centers[c]] < best_d:
                best_d = d2[i, centers[c]]
                best = c
        labels[i] = best
    # Lloyd iterations in kernel form.
    counts = np.empty(k)
    s_t = np.empty((k, m))  # s_t[c, i] = S_ic = sum of G_il over the steps l of cluster c, in step order
    cc = np.empty(k)
    new = np.empty(m, dtype=np.int64)
    for _ in range(max_iter):
        counts[:] = 0.0
        for i in range(m):
            counts[labels[i]] += 1.0
        s_t[:, :] = 0.0
        for step in range(m):  # row `step` of G (= its column: G is symmetric) added into its cluster's row
            row = s_t[labels[step]]
            for i in range(m):
                row[i] += np.float64(g[step, i])
        cc[:] = 0.0
        for i in range(m):
            cc[labels[i]] += s_t[labels[i], i]
        for c in range(k):
            safe = counts[c] if counts[c] > 1.0 else 1.0
            cc[c] = cc[c] / (safe * safe)
        moved = False
        for i in range(m):
            sq = np.float64(g[i, i])
            best = -1
            best_d = np.inf
            for c in range(k):
                if counts[c] == 0.0:
                    continue
                safe = counts[c] if counts[c] > 1.0 else 1.0
                dist = (sq - 2.0 * s_t[c, i] / safe) + cc[c]
                if best < 0 or dist < best_d:
                    best_d = dist
                    best = c
            new[i] = best
            if best != labels[i]:
                moved = True
        labels[:] = new
        if not moved:
            break
    return labels


@compiled("Tuple((f8[::1], f8[::1], i8[::1], i8[::1]))(i8[::1], i8[::1])")
def graph_metrics_flat(labels, offsets):
    """C, L (NaN where undefined), nodes and edges of the reasoning map of every response; response r's labels
    are labels[offsets[r]:offsets[r + 1]]. Nodes are the distinct labels (numbered by first occurrence), one
    undirected edge per distinct transition between consecutive steps in different clusters (SARL Sec. 3.2).
    C (SARL Eq. 4): the mean over nodes of degree >= 2 of 2 T_v / (d_v (d_v - 1)), T_v the edges among v's
    neighbours, summed in node order; 0 if no such node. L (SARL Eq. 5): the mean hop distance over ordered
    pairs of distinct nodes joined by a path (breadth-first search from every node)."""
    n = offsets.shape[0] - 1
    c_out = np.zeros(n)
    l_out = np.full(n, np.nan)
    nodes_out = np.zeros(n, dtype=np.int64)
    edges_out = np.zeros(n, dtype=np.int64)
    for r in range(n):
        lo = offsets[r]
        m = offsets[r + 1] - lo
        if m == 0:
            continue
        # Nodes by first occurrence.
        seen = np.empty(m, dtype=np.int64)
        dense = np.empty(m, dtype=np.int64)
        k = 0
        for s in range(m):
            lab = labels[lo + s]
            v = -1
            for q in range(k):
                if seen[q] == lab:
                    v = q
                    break
            if v < 0:
                seen[k] = lab
                v = k
                k += 1
            dense[s] = v
        nodes_out[r] = k
        if k < 2:
            continue
        adj = np.zeros((k, k), dtype=np.uint8)
        for s in range(m - 1):
            a = dense[s]
            b = dense[s + 1]
            if a != b:
                adj[a, b] = 1
                adj[b, a] = 1
        deg = np.zeros(k, dtype=np.int64)
        for v in range(k):
            for w in range(k):
                deg[v] += adj[v, w]
        n_edges = 0
        for v in range(k):
            n_edges += deg[v]
        edges_out[r] = n_edges // 2
        # Eq. (4): 2 T_v = sum over neighbours w of v of the common neighbours of v and w.
        c_sum = 0.0
        n_nt = 0
        for v in range(k):
            if deg[v] < 2:
                continue
            two_t = 0
            for w in range(k):
                if adj[v, w]:
                    for x in range(k):
                        two_t += adj[v, x] & adj[x, w]
            c_sum += (2.0 * (two_t / 2.0)) / (deg[v] * (deg[v] - 1))
            n_nt += 1
        c_out[r] = c_sum / n_nt if n_nt > 0 else 0.0
        # Eq. (5): breadth-first search from every node.
        dist = np.empty(k, dtype=np.int64)
        queue = np.empty(k, dtype=np.int64)
        total = 0
        pairs = 0
        for src in range(k):
            dist[:] = -1
            dist[src] = 0
            queue[0] = src
            head = 0
            tail = 1
            while head < tail:
                v = queue[head]
                head += 1
                for w in range(k):
                    if adj[v, w] and dist[w] < 0:
                        dist[w] = dist[v] + 1
                        total += dist[w]
                        pairs += 1
                        queue[tail] = w
                        tail += 1
        if pairs > 0:
            l_out[r] = total / pairs
    return c_out, l_out, nodes_out, edges_out


# `normalise_rows`'s verdicts, one per row, and the failure reason `sarl.structure.embed.base` gives a row for each
# (decisions §1.2 "Embeddings").
ROW_OK, ROW_NON_FINITE, ROW_NORM_OVERFLOW, ROW_ZERO_NORM, ROW_SKIPPED = 0, 1, 2, 3, 4
ROW_REASONS = {
    ROW_NON_FINITE: "non-finite embedding: NaN or inf in the vector",
    ROW_NORM_OVERFLOW: "non-finite embedding: the vector's norm overflows float64",
    ROW_ZERO_NORM: "zero embedding: the vector has norm 0",
}


@compiled(["u1[::1](f4[:, ::1], i8[::1], f8, f4[:, ::1])", "u1[::1](f8[:, ::1], i8[::1], f8, f4[:, ::1])"])
def normalise_rows(x, rows, norm_eps, out):
    """Writes the unit vector of each row k of the raw embeddings `x` (float32 or float64) into `out[rows[k]]`
    as float32(float64(x_ki) / norm_k), or gives the reason the row is unusable; rows[k] < 0 skips row k.
    Verdicts: ROW_OK; ROW_NON_FINITE (a NaN or inf entry); ROW_NORM_OVERFLOW (finite entries whose sum of
    squares overflows float64); ROW_ZERO_NORM (norm <= `norm_eps`, squares that underflow included);
    ROW_SKIPPED. Bad rows of `out` are not written.

    The norm is `sarl.structure.embed.base.row_norms` operation by operation: squares in float64 summed in
    8 interleaved lanes (lane l: entries l, l + 8, l + 16, ... of the first 8 floor(d / 8), each lane
    sequentially), the lanes combined as ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)), then the last
    d mod 8 squares added one by one, and the square root. Compiled without fastmath (no reassociation, no
    fused multiply-add), so a row's result depends on its entries only, not on the batch, the alignment or the
    CPU; the eight lanes are independent chains of additions that the CPU overlaps (LLVM may also pack them into
    SIMD registers, which leaves each lane's order as it is). The division is vectorised: into a scratch row, then
    copied, since on `out` itself (in place) LLVM's run-time overlap check would choose its scalar loop (2.3x the
    time). A good row is read twice (the second time from cache) and written once: about 0.13 s for 162,619 x
    1,024 float32 on one core, in place or not."""
    n, d = x.shape
    d8 = d - d % 8
    verdict = np.empty(n, dtype=np.uint8)
    unit = np.empty(d, dtype=np.float32)  # the row's unit vector, before it goes to `out`
    for k in range(n):
        r = rows[k]
        if r < 0:
            verdict[k] = ROW_SKIPPED
            continue
        v = x[k]
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0
        for i in range(0, d8, 8):
            e0 = np.float64(v[i])
            e1 = np.float64(v[i + 1])
            e2 = np.float64(v[i + 2])
            e3 = np.float64(v[i + 3])
            e4 = np.float64(v[i + 4])
            e5 = np.float64(v[i + 5])
            e6 = np.float64(v[i + 6])
            e7 = np.float64(v[i + 7])
            a0 += e0 * e0
            a1 += e1 * e1
            a2 += e2 * e2
            a3 += e3 * e3
            a4 += e4 * e4
            a5 += e5 * e5
            a6 += e6 * e6
            a7 += e7 * e7
        s = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))
        for i in range(d8, d):
            e = np.float64(v[i])
            s += e * e
        norm = np.sqrt(s)
        if not np.isfinite(norm):  # a NaN or inf entry, or finite entries whose squares overflow
            verdict[k] = ROW_NORM_OVERFLOW
            for i in range(d):
                if not np.isfinite(v[i]):
                    verdict[k] = ROW_NON_FINITE
                    break
        elif not norm > norm_eps:
            verdict[k] = ROW_ZERO_NORM
        else:
            verdict[k] = ROW_OK
            for i in range(d):
                unit[i] = np.float32(np.float64(v[i]) / norm)
            o = out[r]
            for i in range(d):
                o[i] = unit[i]
    return verdict
