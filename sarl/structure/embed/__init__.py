"""Step embedders: e_t = M(s_t) / ||M(s_t)||_2 (SARL Sec. 3.2).

All embedders share `Embedder.embed(texts) -> EmbeddingResult` (`base`): duplicate texts are
embedded once, every vector is checked (dimension, finite, non-zero) and
normalised, and a text whose vector could not be had is reported in `failed`
with its reason; no vector is ever invented. `local` embeds with a sentence-transformers model, `hidden` with the
policy's own hidden states; the HTTP embedder of a vLLM server is sarl.serving.http.
"""
