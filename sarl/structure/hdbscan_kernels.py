"""Compiled HDBSCAN of one response (SARL App. A.1; decisions §1.3 "Clustering"; Campello et al. 2013): ports of
scikit-learn's brute-force path, step by step, so that the labels equal `sklearn.cluster.HDBSCAN(algorithm="brute")`
exactly, ties included. `sarl.structure.reference` writes each function the obvious way (numpy, plain Python);
tests/sarl/test_cluster_reference.py holds them equal.

`hdbscan_mst` gives the minimum spanning tree of the mutual-reachability graph of one response from its float64 Gram
matrix: Euclidean distances as scikit-learn computes them, core distances (the min_samples-th smallest distance of a
step, itself included), mutual reachability max(core_i, core_j, d_ij), then Prim's algorithm visiting nodes as
scikit-learn's `mst_from_mutual_reachability` does (start at 0; the closest remaining node, lowest index on ties; each
edge recorded from the node added last). `sarl.structure.cluster` sorts the edges as scikit-learn sorts them, and
`hdbscan_tree_labels` then follows scikit-learn's single linkage, condensed tree, stabilities, excess-of-mass selection
and labelling (sklearn/cluster/_hdbscan/_linkage.pyx, _tree.pyx). Compiled as the other kernels
(`sarl.structure.kernels.compiled`: cached on disk).
"""

from __future__ import annotations

import numpy as np

from sarl.structure.kernels import compiled


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
