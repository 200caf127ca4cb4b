"""The command: a teacher model writes the SFT set of a method whose paper fine-tunes before RL.

    python -m sarl.data.synthesize recipe=grp_math source=deepscaler input_file=deepscaler.json \\
        teacher.url=http://HOST:PORT/v1 teacher.model=NAME
    python -m sarl.data.synthesize recipe=grp_code source=kodcode input_file=kodcode_sft_r1.parquet ...
    python -m sarl.data.synthesize recipe=structured source=s1k input_file=s1k.parquet ...
    python -m sarl.data.synthesize recipe=grp_math teacher.url=auto teacher.model=/path/to/model   # starts vLLM

Exit codes: 0 done; 2 a user error (one line on stderr); 3 some problems failed for good (a rerun resumes
them); 130 interrupted (finished problems are cached).
"""

from __future__ import annotations

import logging
import sys

from sarl.data.synthesize.config import compose_synthesize_config
from sarl.data.synthesize.run import synthesize
from sarl.runtime.errors import exit_code
from sarl.runtime.usage import Usage, asks_for_help, usage

log = logging.getLogger("sarl.data.synthesize")


USAGE = Usage(
    synopsis=(
        "python -m sarl.data.synthesize recipe=NAME teacher.url=URL teacher.model=NAME [source=NAME input_file=FILE]",
        "python -m sarl.data.synthesize recipe=grp_math teacher.url=auto teacher.model=/path/to/model  # starts vLLM",
    ),
    about=(
        "A teacher model writes the SFT set of a method whose paper fine-tunes before RL: GRP's graph traces, "
        "Structured Reasoning's tagged traces. Each answer is verified; finished problems are cached (a rerun "
        "resumes). Exit 0 done, 2 a user error, 3 some problems failed for good."
    ),
    keys=(
        ("teacher.url", "an OpenAI-compatible server (auto: start vLLM on teacher.model)"),
        ("teacher.model", "the teacher's model name on that server (or its path, with url=auto)"),
        ("source", "the recipe's paper data (null) or a name of conf/synthesize/sources.yaml"),
        ("input_file", "the local copy of the source's data"),
        ("concurrency", "requests in flight"),
        ("limit", "the first N usable problems only"),
    ),
    groups=(("recipe", "synthesize/recipe", "what to synthesise"),),
    more="More: docs/synthesize.md.",
)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if asks_for_help(argv):
        sys.stdout.write(usage(USAGE))
        return 0
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="[%(asctime)s][%(name)s] %(message)s")
    return exit_code(
        lambda: synthesize(compose_synthesize_config(argv))[1],
        on_error=lambda err: sys.stderr.write(f"sarl.data.synthesize: {err}\n"),
        on_interrupt=lambda: log.warning("interrupted; finished problems are cached: rerun the same command to resume"),
    )


if __name__ == "__main__":
    sys.exit(main())
