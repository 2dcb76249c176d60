"""Train a translator: ``python scripts/train.py [group=option] [key=value ...]``.

Examples:
    python scripts/train.py                                   # built-in zh->en, tiny model
    python scripts/train.py model=small trainer.max_minutes=30
    python scripts/train.py experiment=multi30k_de_en data.path=../shared/data/multi30k-hub-layout
    python scripts/train.py -m model.n_heads=1,2,4,8          # four runs, one after another
    python scripts/train.py trainer.resume=outputs/2026-11-22/10-00-00   # continue exactly
    torchrun --nproc_per_node=2 scripts/train.py               # data-parallel (DDP)

Options: `python scripts/train.py --cfg job` prints the composed config; `--help` lists groups.
A bad value is one line on stderr (exit 2), before anything is written.
"""

from tinymt.cli import one_line_errors, run_hydra  # isort: skip  (first: every way a script ends is one line)
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from tinymt.config import as_train_config
from tinymt.errors import TinyMTError


def _remove_if_empty(run_dir: str) -> None:
    """Hydra makes the run dir before ``main``: a run that fails before writing anything
    leaves no folder behind (nor the empty parents Hydra made inside the working dir)."""
    path, cwd = Path(run_dir).absolute(), Path.cwd()
    while path != cwd:  # a named run: Hydra's dir is the working dir, never removed
        try:
            path.rmdir()  # only when empty
        except OSError:
            return
        path = path.parent
        if not path.is_relative_to(cwd):
            return


@hydra.main(version_base="1.3", config_path="../configs", config_name="train")
@one_line_errors
def main(cfg: DictConfig) -> float:
    hc = HydraConfig.get()
    try:
        cfg = as_train_config(cfg)
        # after the check: a bad value fails at once, before torch is imported
        from tinymt.trainer import resume_config, train

        unique = False  # a folder the user named must not hold a run yet
        if cfg.trainer.resume:
            cfg = resume_config(cfg, list(hc.overrides.task))
        elif cfg.run_dir is None:
            cfg.run_dir = hc.runtime.output_dir
            # named by the clock: a run started in the same second moves to <dir>_1
            unique = not any(o.startswith(("hydra.run.dir=", "hydra.sweep.dir="))
                             for o in hc.overrides.hydra)
        metrics = train(cfg, unique_run_dir=unique)
    except (TinyMTError, KeyboardInterrupt):
        _remove_if_empty(hc.runtime.output_dir)
        raise
    if cfg.trainer.resume:  # the run went on in its own folder: a sweep's job folder is empty
        _remove_if_empty(hc.runtime.output_dir)
    return metrics["best_valid_bleu"]  # what a Hydra sweeper would maximise


if __name__ == "__main__":
    run_hydra(main, sweeps=True)
