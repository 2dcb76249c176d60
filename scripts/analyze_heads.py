"""What does each head do? Importance, pruning, alignment, entropy/distance and the
grammatical relations each head tracks, for a trained run.

    python scripts/analyze_heads.py run=<run dir>
    python scripts/analyze_heads.py run=latest split=test max_sentences=0
    python scripts/analyze_heads.py run=<run dir> prune=0.3     # + checkpoints/pruned.pt
    python scripts/translate.py run=<run dir> checkpoint=<run dir>/checkpoints/pruned.pt "..."
    python scripts/train.py -m model.n_heads=1,2,4,8 hydra.sweep.dir=outputs/sweep_heads
    python scripts/analyze_heads.py run=outputs/sweep_heads pruning=false   # every run, compared

Writes <run>/heads.md (tables + figures in <run>/heads/) and <run>/heads.json in the run
dir; for a sweep folder also <sweep>/heads_sweep.md. Options: configs/analyze_heads.yaml.
"""

from tinymt.cli import one_line_errors, run_hydra  # isort: skip  (first: every way a script ends is one line)
import hydra
from omegaconf import DictConfig

from tinymt.config import check_analyze


@hydra.main(version_base="1.3", config_path="../configs", config_name="analyze_heads")
@one_line_errors
def main(cfg: DictConfig) -> dict:
    check_analyze(cfg)
    from tinymt.heads import analyze  # after the check: a bad value fails at once

    return analyze(cfg)


if __name__ == "__main__":
    run_hydra(main)
