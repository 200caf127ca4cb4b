"""The Gram product of one response's step embeddings (SARL App. A.1's clustering starts from it; decisions §1.3).

`gram` is X X^T for one response, the one product whose cost grows with the embedding dimension (80% of the KMeans
stage's time). OpenBLAS's symmetric rank-k update runs at a third to a half of a core's peak on the matrices of one
response (79 x 1,024: 57 GFLOP/s on a Zen 5 core, where its large-matrix rate is 110), and picks its kernels from a
CPU table that can lag the hardware (OpenBLAS 0.3.30 runs AVX2 code on AVX-512 Zen 5). The kernel here computes the
lower triangle in register blocks (4 x 4 entries where the target has 32 vector registers: AVX-512 or AArch64; 4 x 2
with 16: AVX2), each entry a dot product over the d coordinates, and mirrors it: 2.5x OpenBLAS at 79 x 1,024 and
1.4x at 400 x 1,024 on the Zen 5 core (`python -m sarl.bench suite=structure` prints the product by response length;
docs/results.md). It is the one kernel compiled with reassociation (fastmath "reassoc" and "contract", nothing else:
NaN and infinity keep their meaning): a dot product is summed in SIMD lanes, in an order that depends on the
target's vector width, as BLAS's does on its kernel. So G differs from numpy's X @ X.T by rounding (relative 1e-7 in
float32), is exactly symmetric, and depends on the response alone, not on the batch.
"""

from __future__ import annotations

import platform

import numpy as np
from numba import types
from numba.core import config
from numba.core.codegen import get_host_cpu_features

from sarl.structure.kernels import compiled


def wide_vector_registers() -> bool:
    """Whether numba's compile target has 32 vector registers (x86 with AVX-512, AArch64), so that `gram`'s 4 x 4
    block of sums and the 8 vectors it loads fit in registers; with 16 (AVX2) it takes blocks of 4 x 2. Follows
    NUMBA_CPU_FEATURES where it is set, as numba's code generation does."""
    if platform.machine().lower() in ("aarch64", "arm64"):
        return True
    features = config.CPU_FEATURES if config.CPU_FEATURES is not None else get_host_cpu_features()
    return "+avx512f" in features.split(",")


# Reassociation only: a dot product may be summed in SIMD lanes (`gram`); no assumption about NaN or infinity.
_DOT = {"reassoc", "contract"}
# Writable and read-only inputs alike (embeddings from `np.frombuffer` or a read-only memory map are read-only).
_GRAM_SIGNATURES = [
    types.Array(t, 2, "C")(types.Array(t, 2, "C", readonly=ro)) for t in (types.float32, types.float64) for ro in (0, 1)
]
_GRAM_REST_SIGNATURES = [
    types.void(types.Array(t, 2, "C", readonly=ro), types.Array(t, 2, "C"), types.int64, t)
    for t in (types.float32, types.float64)
    for ro in (0, 1)
]


def _gram_4x4(x):
    """X X^T: the lower triangle in blocks of 4 x 4 entries (rows i..i+3 against rows j..j+3, 16 sums over the
    coordinates), the last M mod 4 rows entry by entry, then the upper triangle mirrored."""
    m, d = x.shape
    g = np.empty((m, m), dtype=x.dtype)
    zero = np.zeros(1, dtype=x.dtype)[0]
    mi = m - m % 4
    for i in range(0, mi, 4):
        a0, a1, a2, a3 = x[i], x[i + 1], x[i + 2], x[i + 3]
        for j in range(0, i + 4, 4):  # i + 4 is a multiple of 4: whole blocks up to the diagonal
            b0, b1, b2, b3 = x[j], x[j + 1], x[j + 2], x[j + 3]
            s00 = s01 = s02 = s03 = s10 = s11 = s12 = s13 = zero
            s20 = s21 = s22 = s23 = s30 = s31 = s32 = s33 = zero
            for t in range(d):
                p0, p1, p2, p3 = a0[t], a1[t], a2[t], a3[t]
                q0, q1, q2, q3 = b0[t], b1[t], b2[t], b3[t]
                s00 += p0 * q0
                s01 += p0 * q1
                s02 += p0 * q2
                s03 += p0 * q3
                s10 += p1 * q0
                s11 += p1 * q1
                s12 += p1 * q2
                s13 += p1 * q3
                s20 += p2 * q0
                s21 += p2 * q1
                s22 += p2 * q2
                s23 += p2 * q3
                s30 += p3 * q0
                s31 += p3 * q1
                s32 += p3 * q2
                s33 += p3 * q3
            g[i, j], g[i, j + 1], g[i, j + 2], g[i, j + 3] = s00, s01, s02, s03
            g[i + 1, j], g[i + 1, j + 1], g[i + 1, j + 2], g[i + 1, j + 3] = s10, s11, s12, s13
            g[i + 2, j], g[i + 2, j + 1], g[i + 2, j + 2], g[i + 2, j + 3] = s20, s21, s22, s23
            g[i + 3, j], g[i + 3, j + 1], g[i + 3, j + 2], g[i + 3, j + 3] = s30, s31, s32, s33
    _gram_rest(x, g, mi, zero)
    return g


def _gram_4x2(x):
    """X X^T as `_gram_4x4`, in blocks of 4 x 2 entries (8 sums: what fits in 16 vector registers)."""
    m, d = x.shape
    g = np.empty((m, m), dtype=x.dtype)
    zero = np.zeros(1, dtype=x.dtype)[0]
    mi = m - m % 4
    for i in range(0, mi, 4):
        a0, a1, a2, a3 = x[i], x[i + 1], x[i + 2], x[i + 3]
        for j in range(0, i + 4, 2):
            b0, b1 = x[j], x[j + 1]
            s00 = s01 = s10 = s11 = s20 = s21 = s30 = s31 = zero
            for t in range(d):
                p0, p1, p2, p3 = a0[t], a1[t], a2[t], a3[t]
                q0, q1 = b0[t], b1[t]
                s00 += p0 * q0
                s01 += p0 * q1
                s10 += p1 * q0
                s11 += p1 * q1
                s20 += p2 * q0
                s21 += p2 * q1
                s30 += p3 * q0
                s31 += p3 * q1
            g[i, j], g[i, j + 1] = s00, s01
            g[i + 1, j], g[i + 1, j + 1] = s10, s11
            g[i + 2, j], g[i + 2, j + 1] = s20, s21
            g[i + 3, j], g[i + 3, j + 1] = s30, s31
    _gram_rest(x, g, mi, zero)
    return g


@compiled(_GRAM_REST_SIGNATURES, fastmath=_DOT)
def _gram_rest(x, g, mi, zero):
    """The rows from `mi` on of the lower triangle, entry by entry, then the upper triangle mirrored from the lower."""
    m, d = x.shape
    for i in range(mi, m):
        for j in range(i + 1):
            s = zero
            for t in range(d):
                s += x[i, t] * x[j, t]
            g[i, j] = s
    for i in range(m):
        for j in range(i + 1, m):
            g[i, j] = g[j, i]


# The block shape this machine's `gram` uses, chosen once at import.
BLOCKS = "4 x 4" if wide_vector_registers() else "4 x 2"
# X X^T of one response (float32 or float64, C-contiguous), exactly symmetric; see the module's docstring.
gram = compiled(_GRAM_SIGNATURES, fastmath=_DOT)(_gram_4x4 if BLOCKS == "4 x 4" else _gram_4x2)
