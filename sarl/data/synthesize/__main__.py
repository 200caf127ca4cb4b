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

log = logging.getLogger("sarl.data.synthesize")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="[%(asctime)s][%(name)s] %(message)s")
    argv = list(sys.argv[1:] if argv is None else argv)
    return exit_code(
        lambda: synthesize(compose_synthesize_config(argv))[1],
        on_error=lambda err: sys.stderr.write(f"sarl.data.synthesize: {err}\n"),
        on_interrupt=lambda: log.warning("interrupted; finished problems are cached: rerun the same command to resume"),
    )


if __name__ == "__main__":
    sys.exit(main())
