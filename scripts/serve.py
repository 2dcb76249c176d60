"""Serve a trained run over HTTP: LibreTranslate's API and a page that shows every head.

    python scripts/serve.py run=latest                     # http://127.0.0.1:5000/
    python scripts/serve.py run=latest decode.beam=5 port=8080 api_keys=keys.txt
    python scripts/serve.py engine=ct2 model_dir=exports/m30k host=0.0.0.0

``configs/serve.yaml`` lists every setting (limits, micro-batching); docs/serve.md the API.
"""

from tinymt.cli import one_line_errors, run_hydra  # isort: skip  (first: every way a script ends is one line)
import hydra
from omegaconf import DictConfig

from tinymt.config import check_serve


@hydra.main(version_base="1.3", config_path="../configs", config_name="serve")
@one_line_errors
def main(cfg: DictConfig) -> dict:
    check_serve(cfg)
    from tinymt.serve import serve  # after the check: a bad value fails at once

    return serve(cfg)


if __name__ == "__main__":
    run_hydra(main)
