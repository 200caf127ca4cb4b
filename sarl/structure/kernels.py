"""Compiled kernels of the structure stage: KMeans on one response's Gram matrix (SARL App. A.1;
decisions §1.3 "Clustering") and the reasoning-map metrics C and L (SARL Eqs. 4-5).

KMeans. `sarl.structure.gram` computes a response's Gram matrix G = X X^T, and the rest works on the M x M matrix in
loops that numba compiles (`compiled`: at import, cached on disk). Nothing here allocates more than a few M x M arrays.

The arithmetic is fixed operation by operation (tests/sarl/test_cluster_kernels.py holds it to a plain
numpy reference, label for label): squared distances ||x_i - x_j||^2 = (G_ii + G_jj) - 2 G_ij clipped
at 0; greedy k-means++ seeding with scikit-learn's 2 + ln k local trials, the candidate whose potential
(a sequential sum) is lowest, first on ties; Lloyd iterations in kernel form,
||x_i - c_j||^2 = G_ii - 2 S_ij / n_j + (sum_{l in j} S_lj) / n_j^2 with S_ij = sum_{l in j} G_il summed
in step order, the first closest centre on ties. A Lloyd iteration costs M^2 additions (a one-hot matrix
product would cost M^2 k) and no temporary arrays. The sums read G by rows, which relies on G being
exactly symmetric: `sarl.structure.gram.gram` computes one triangle and mirrors it.

HDBSCAN. `hdbscan_mst` gives the minimum spanning tree of the mutual-reachability graph of one response
from its float64 Gram matrix: Euclidean distances as scikit-learn computes them, core distances
(the min_samples-th smallest distance of a step, itself included), mutual reachability
max(core_i, core_j, d_ij), then Prim's algorithm visiting nodes as scikit-learn's
`mst_from_mutual_reachability` does (start at 0; the closest remaining node, lowest index on ties; each edge
recorded from the node added last). `hdbscan_tree_labels` then follows scikit-learn's single linkage,
condensed tree, stabilities, excess-of-mass selection and labelling step by step.

Reasoning maps. `graph_metrics_flat` takes every response's labels end to end and gives C, L, node and
edge counts with the arithmetic of the networkx reference in `sarl.structure.graph` (integer counts, then one
division each), in one compiled loop over the responses.

Embeddings. `normalise_rows` checks and unit-normalises the raw step embeddings for `Embedder.embed` (decisions
§1.2 "Embeddings") in one read and one write pass, with the norm that `sarl.structure.embed.base.row_norms` defines
in numpy (a fixed order of summation; tests/sarl/embed/test_base.py holds the two bit-identical).
"""

from __future__ import annotations

import numpy as np
from numba import njit


def compiled(signatures, fastmath=False):
    """numba's njit for the given signatures, compiled when this module is imported (so no call pays for it)
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


@compiled("Tuple((i8[::1], i8[::1], f8[::1]))(f8[:, ::1], f8[::1], i8)")
def hdbscan_mst(g, xx, min_samples):
    """(source, target, distance) of the m - 1 edges, in Prim's order, of the minimum spanning tree of the
    mutual-reachability graph (HDBSCAN, Campello et al. 2013; SARL App. A.1) of the m steps whose Gram
    matrix is `g` and squared norms `xx` (computed as scikit-learn's `row_norms`: einsum). Distances in
    scikit-learn's `euclidean_distances` order of operations, sqrt(max(0, (-2 G_ij + xx_i) + xx_j)), zero
    diagonal, so that they are bit for bit the ones `HDBSCAN(algorithm="brute")` computes."""
    m = g.shape[0]
    d = np.empty((m, m))
    for i in range(m):
        for j in range(m):
            v = (-2.0 * g[i, j] + xx[i]) + xx[j]
            d[i, j] = np.sqrt(v) if v > 0.0 else 0.0
        d[i, i] = 0.0
    # Core distance: the min_samples-th smallest entry of the row (one insertion pass over a sorted buffer
    # of the min_samples smallest; min_samples is at most 4 for decisions §1's parameters).
    core = np.empty(m)
    smallest = np.empty(min_samples)
    for i in range(m):
        smallest[:] = np.inf
        for j in range(m):
            v = d[i, j]
            if v < smallest[min_samples - 1]:
                q = min_samples - 1
                while q > 0 and smallest[q - 1] > v:
                    smallest[q] = smallest[q - 1]
                    q -= 1
                smallest[q] = v
        core[i] = smallest[min_samples - 1]
    src = np.empty(m - 1, dtype=np.int64)
    dst = np.empty(m - 1, dtype=np.int64)
    dist = np.empty(m - 1)
    in_tree = np.zeros(m, dtype=np.bool_)
    best = np.full(m, np.inf)
    current = 0
    for e in range(m - 1):
        in_tree[current] = True
        nxt = -1
        nxt_d = np.inf
        for j in range(m):
            # mutual reachability of (current, j)
            r = d[current, j]
            if core[current] > r:
                r = core[current]
            if core[j] > r:
                r = core[j]
            if r < best[j]:
                best[j] = r
            if not in_tree[j] and (nxt < 0 or best[j] < nxt_d):
                nxt = j
                nxt_d = best[j]
        src[e] = current
        dst[e] = nxt
        dist[e] = nxt_d
        current = nxt
    return src, dst, dist


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


@compiled("i8(i8, i8[::1], i8[::1], i8, i8[::1])")
def _tree_bfs(start, left, right, n, out):
    """The nodes of a binary tree below `start` (itself included) breadth first, left child before right, as
    scikit-learn's `bfs_from_hierarchy` and `bfs_from_cluster_tree` list them: written to `out`, their number
    returned. Nodes below n are leaves; node n + i has the children left[i] and right[i], or none if left[i] is -1.
    The single-linkage hierarchy: nodes below n are points, node n + i is merge i; the cluster tree: n is the
    first cluster's id."""
    out[0] = start
    tail = 1
    head = 0
    while head < tail:
        node = out[head]
        if node >= n and left[node - n] >= 0:
            out[tail] = left[node - n]
            out[tail + 1] = right[node - n]
            tail += 2
        head += 1
    return tail


@compiled("i8(i8[::1], i8)")
def _root(parent, x):
    """The root of x in scikit-learn's TreeUnionFind (parent[x] == x at a root), compressing the path."""
    r = x
    while parent[r] != r:
        r = parent[r]
    while parent[x] != r:
        nxt = parent[x]
        parent[x] = r
        x = nxt
    return r


@compiled("i8[::1](i8[::1], i8[::1], f8[::1], i8)")
def hdbscan_tree_labels(src, dst, dist, min_cluster_size):
    """HDBSCAN's labels (-1 noise) from the minimum spanning tree's edges sorted by distance: scikit-learn's
    `make_single_linkage` and `tree_to_labels(tree, min_cluster_size, "eom", allow_single_cluster=False,
    cluster_selection_epsilon=0.0, max_cluster_size=None)` (sklearn/cluster/_hdbscan/_linkage.pyx, _tree.pyx),
    step by step: the single-linkage hierarchy, the tree condensed at min_cluster_size (Campello et al. 2013),
    cluster stabilities, excess-of-mass selection, then the labelling by union-find."""
    n = src.shape[0] + 1
    n_merge = n - 1
    # Single linkage (make_single_linkage): merge i creates node n + i.
    up = np.full(2 * n - 1, -1, dtype=np.int64)
    size = np.zeros(2 * n - 1, dtype=np.int64)
    size[:n] = 1
    left = np.empty(n_merge, dtype=np.int64)
    right = np.empty(n_merge, dtype=np.int64)
    for i in range(n_merge):
        a = src[i]
        while up[a] != -1:
            a = up[a]
        b = dst[i]
        while up[b] != -1:
            b = up[b]
        left[i] = a
        right[i] = b
        up[a] = n + i
        up[b] = n + i
        size[n + i] = size[a] + size[b]
    # Condensed tree (_condense_tree): nodes visited breadth first from the root, left before right.
    root = 2 * n_merge
    order = np.empty(2 * n - 1, dtype=np.int64)
    tail = _tree_bfs(root, left, right, n, order)
    relabel = np.empty(root + 1, dtype=np.int64)
    relabel[root] = n
    next_label = n + 1
    ignore = np.zeros(2 * n - 1, dtype=np.bool_)
    c_parent = np.empty(2 * n, dtype=np.int64)
    c_child = np.empty(2 * n, dtype=np.int64)
    c_lambda = np.empty(2 * n)
    c_size = np.empty(2 * n, dtype=np.int64)
    rows = 0
    queue = np.empty(2 * n - 1, dtype=np.int64)
    for idx in range(tail):
        node = order[idx]
        if ignore[node] or node < n:
            continue
        lft = left[node - n]
        rgt = right[node - n]
        distance = dist[node - n]
        lam = 1.0 / distance if distance > 0.0 else np.inf
        left_count = size[lft]
        right_count = size[rgt]
        if left_count >= min_cluster_size and right_count >= min_cluster_size:
            relabel[lft] = next_label
            next_label += 1
            c_parent[rows], c_child[rows], c_lambda[rows], c_size[rows] = relabel[node], relabel[lft], lam, left_count
            rows += 1
            relabel[rgt] = next_label
            next_label += 1
            c_parent[rows], c_child[rows], c_lambda[rows], c_size[rows] = relabel[node], relabel[rgt], lam, right_count
            rows += 1
            continue
        # The small side(s) fall out of the cluster point by point, breadth first; a large side keeps its label.
        for side in range(2):
            start = lft if side == 0 else rgt
            count = left_count if side == 0 else right_count
            if count >= min_cluster_size:
                relabel[start] = relabel[node]
                continue
            for q in range(_tree_bfs(start, left, right, n, queue)):
                sub = queue[q]
                if sub < n:
                    c_parent[rows], c_child[rows], c_lambda[rows], c_size[rows] = relabel[node], sub, lam, 1
                    rows += 1
                ignore[sub] = True
    labels = np.full(n, -1, dtype=np.int64)
    if rows == 0:
        return labels
    # Stabilities (_compute_stability): sum over rows of (lambda - birth of the parent) * child size.
    smallest = n
    largest_parent = n
    largest_child = 0
    for r in range(rows):
        if c_parent[r] > largest_parent:
            largest_parent = c_parent[r]
        if c_child[r] > largest_child:
            largest_child = c_child[r]
    births = np.full(max(largest_child, smallest) + 1, np.nan)
    for r in range(rows):
        births[c_child[r]] = c_lambda[r]
    births[smallest] = 0.0
    n_clusters = largest_parent - smallest + 1
    stability = np.zeros(n_clusters)
    for r in range(rows):
        stability[c_parent[r] - smallest] += (c_lambda[r] - births[c_parent[r]]) * c_size[r]
    # Excess of mass (_get_clusters): from the highest cluster id down, not the root, a cluster is selected
    # unless its two child clusters together are more stable (then it carries their sum up).
    selected = np.zeros(n_clusters, dtype=np.bool_)
    selected[1:] = True
    # The cluster tree (the rows whose child is a cluster): a cluster splits into two or not at all.
    kid_left = np.full(n_clusters, -1, dtype=np.int64)
    kid_right = np.full(n_clusters, -1, dtype=np.int64)
    for r in range(rows):
        if c_size[r] > 1:
            if kid_left[c_parent[r] - smallest] < 0:
                kid_left[c_parent[r] - smallest] = c_child[r]
            else:
                kid_right[c_parent[r] - smallest] = c_child[r]
    kids = np.empty(n_clusters, dtype=np.int64)
    for node in range(largest_parent, smallest, -1):
        sub_sum = 0.0
        for r in range(rows):
            if c_size[r] > 1 and c_parent[r] == node:
                sub_sum += stability[c_child[r] - smallest]
        if sub_sum > stability[node - smallest]:
            selected[node - smallest] = False
            stability[node - smallest] = sub_sum
        else:  # every cluster below it is unselected (breadth first over the cluster tree)
            for q in range(1, _tree_bfs(node, kid_left, kid_right, smallest, kids)):
                selected[kids[q] - smallest] = False
    # Labelling (_do_labelling): union-find over rows whose child is not a selected cluster (union by rank,
    # scikit-learn's TreeUnionFind), then each point's root names its cluster; the root cluster is noise.
    uf = np.arange(largest_parent + 1)
    rank = np.zeros(largest_parent + 1, dtype=np.int64)
    for r in range(rows):
        child = c_child[r]
        if smallest <= child <= largest_parent and selected[child - smallest]:
            continue
        x_root = _root(uf, c_parent[r])
        y_root = _root(uf, child)
        if rank[x_root] < rank[y_root]:
            uf[x_root] = y_root
        elif rank[x_root] > rank[y_root]:
            uf[y_root] = x_root
        else:
            uf[y_root] = x_root
            rank[x_root] += 1
    label_of = np.full(n_clusters, -1, dtype=np.int64)
    k = 0
    for c in range(n_clusters):
        if selected[c]:
            label_of[c] = k
            k += 1
    for p in range(n):
        cluster = _root(uf, p)
        if cluster != smallest:
            labels[p] = label_of[cluster - smallest]
    return labels


# `normalise_rows`'s verdicts, one per row; `sarl.structure.embed.base` turns them into failure reasons.
ROW_OK, ROW_NON_FINITE, ROW_NORM_OVERFLOW, ROW_ZERO_NORM, ROW_SKIPPED = 0, 1, 2, 3, 4


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
