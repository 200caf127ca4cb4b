"""Embedding servers and their clients: the vLLM embedding server (`server`), the HTTP embedder that reads it
(`http`), and which embedder and server a run gets (`auto`)."""
