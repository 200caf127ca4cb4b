"""One rank of a TRL run over several GPUs (sarl.backends.trl.distributed), started by torchrun:

    python -m sarl.backends.trl.worker RUN_DIR

It trains on the resolved config and records that `sarl.train` wrote into the run directory (`config.yaml`,
`meta.json`); the environment (W&B's run id and mode) is the one `sarl.train` started torchrun with. On the CPU
(`backend.use_cpu`) the rank trains within `distributed.fsdp_on_the_cpu`, so that it shards as on a GPU node; a rank
whose model FSDP did not shard stops with one line (`distributed.ShardingNotInEffect`).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

from omegaconf import OmegaConf

from sarl.backends.trl import distributed
from sarl.backends.trl.run import train

log = logging.getLogger("sarl.train.trl")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="[%(asctime)s][%(name)s] %(message)s")
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        sys.stderr.write("usage: python -m sarl.backends.trl.worker RUN_DIR (started by sarl.train under torchrun)\n")
        return 2
    run_dir = Path(args[0])
    cfg = OmegaConf.load(run_dir / "config.yaml")
    meta = json.loads((run_dir / "meta.json").read_text())
    try:
        with distributed.fsdp_on_the_cpu(cfg):
            return train(cfg, run_dir, meta, dict(os.environ))
    except distributed.ShardingNotInEffect as err:
        log.error("%s", err)
        return 1


if __name__ == "__main__":
    sys.exit(main())
