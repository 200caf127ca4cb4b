"""Data preparation: the training sets and evaluation benchmarks, built reproducibly and checked.

    python -m sarl.data.prepare dataset=NAME        # NAME: a file of conf/data/

- `sources`: rows from a Hugging Face dataset id or a local CSV/JSON/JSONL/parquet file.
- `answers`: gold answer normalisation (leading zeros, several accepted answers).
- `build`: one builder per kind of set (math problems, OpenRubrics prompts, WildBench), each filter counted.
- `writers`: atomic parquet / JSONL / JSON writes.
- `prepare`: the Hydra entry point that ties them together and writes the manifest.
"""
