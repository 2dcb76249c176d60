"""Average the weights of a run's last N step checkpoints into one checkpoint.

    python scripts/average_checkpoints.py run=outputs/2026-11-22/10-00-00 last=5
    python scripts/translate.py run=outputs/2026-11-22/10-00-00 checkpoint=avg ...

The run must have kept step checkpoints (trainer.keep_last=N); the trainer can also do
this itself at the end of training (trainer.average_last=N). Options:
configs/average_checkpoints.yaml (schema: tinymt.config.AverageConfig).
"""

from tinymt.cli import one_line_errors, run_hydra  # isort: skip  (first: every way a script ends is one line)
import hydra
from omegaconf import DictConfig

from tinymt.config import check_average
from tinymt.errors import TinyMTError


@hydra.main(version_base="1.3", config_path="../configs", config_name="average_checkpoints")
@one_line_errors
def main(cfg: DictConfig) -> None:
    check_average(cfg)
    # after the check: a bad value fails at once, before torch is imported
    from tinymt.checkpoint import average_checkpoints, save_checkpoint
    from tinymt.files import check_output
    from tinymt.rundir import find_run, step_checkpoints
    run_dir = find_run(cfg.run, cfg.outputs_root)
    out = check_output(run_dir / "checkpoints" / "avg.pt" if cfg.output is None else cfg.output,
                       "output")  # never the run's last.pt, best.pt, ... (nor empty)
    if (out.parent / "last.pt").is_file() and not out.parent.samefile(run_dir / "checkpoints"):
        raise TinyMTError(f"output={cfg.output} is in another run's checkpoints/: a run's "
                          f"average goes in its own ({run_dir / 'checkpoints'}) or outside any run")
    steps = step_checkpoints(run_dir)[-cfg.last:]
    if len(steps) < 2:
        raise TinyMTError(f"{run_dir}/checkpoints has {len(steps)} step checkpoint(s) "
                          "(ckpt_<step>.pt); train with trainer.keep_last=N to keep several")
    last = run_dir / "checkpoints" / "last.pt"  # the run they must all be of
    save_checkpoint(average_checkpoints(steps, last if last.is_file() else None), out)
    print(f"averaged {', '.join(p.name for p in steps)} -> {out}")


if __name__ == "__main__":
    run_hydra(main)
