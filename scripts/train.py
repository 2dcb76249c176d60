"""Train a translator: ``python scripts/train.py [group=option] [key=value ...]``.

Examples:
    python scripts/train.py                                   # built-in zh->en, tiny model
    python scripts/train.py model=small trainer.max_minutes=30
    python scripts/train.py experiment=multi30k_de_en data.path=../shared/data/multi30k-hub-layout
    python scripts/train.py -m model.n_heads=1,2,4,8          # four runs side by side
    python scripts/train.py trainer.resume=outputs/2026-11-22/10-00-00   # continue exactly
    torchrun --nproc_per_node=2 scripts/train.py               # data-parallel (DDP)

Options: `python scripts/train.py --cfg job` prints the composed config; `--help` lists groups.
"""

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

import tinymt.config  # noqa: F401  (registers the schemas)
from tinymt.cli import one_line_errors
from tinymt.trainer import resume_config, train


@hydra.main(version_base="1.3", config_path="../configs", config_name="train")
@one_line_errors
def main(cfg: DictConfig) -> float:
    hc = HydraConfig.get()
    if cfg.trainer.resume:
        cfg = resume_config(cfg, list(hc.overrides.task))
    elif cfg.run_dir is None:
        cfg.run_dir = hc.runtime.output_dir
    metrics = train(cfg)
    return metrics["best_valid_bleu"]  # what a Hydra sweeper would maximise


if __name__ == "__main__":
    main()
