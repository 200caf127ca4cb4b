"""Test doubles shared by the baseline tests."""

import numpy as np

from sarl.structure.embed.base import Embedder


class TableEmbedder(Embedder):
    """Looks each text up in `table` (text -> raw vector). A text not in the table fails with
    "not in table"; `crash=True` makes every call raise, like an embedding server that is down."""

    def __init__(self, table: dict | None = None, dim: int | None = None, crash: bool = False):
        super().__init__(dim=dim)
        self.table = {k: np.asarray(v, dtype=np.float64) for k, v in (table or {}).items()}
        self.crash = crash
        self.calls: list[list[str]] = []

    def _embed_unique(self, texts):
        self.calls.append(list(texts))
        if self.crash:
            raise ConnectionError("embedding server is down")
        vectors, reasons = [], {}
        for j, text in enumerate(texts):
            if text in self.table:
                vectors.append(self.table[text])
            else:
                vectors.append(None)
                reasons[j] = f"not in table: {text[:40]!r}"
        return vectors, reasons
