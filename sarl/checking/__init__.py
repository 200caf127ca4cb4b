"""What rewards, data preparation and the evaluation use to check model output: answers graded against a gold
answer (`sarl.checking.grading`), programs judged by their tests in a sandbox (`sarl.checking.code`), and the client of
OpenAI-compatible endpoints that judges and teachers answer on (`sarl.checking.openai_client`). A low layer: it
imports only the structure reward's step splitting and the run machinery's HTTP client (docs/design.md "Layers").
"""
