"""Export a trained run for CTranslate2 (float32 or int8 weights).

    python scripts/export.py run=outputs/m30k out=exports/m30k
    python scripts/export.py run=outputs/m30k checkpoint=avg quantization=int8 out=exports/m30k-int8
    python scripts/translate.py engine=ct2 model_dir=exports/m30k-int8 decode.beam=5 "Ein Hund läuft."

Needs the optional extra: ``pip install -e '.[ct2]'``. Options: configs/export.yaml (schema:
tinymt.config.ExportConfig); the conversion: tinymt.ct2.
"""

from tinymt.cli import one_line_errors, run_hydra  # isort: skip  (first: every way a script ends is one line)
import hydra
from omegaconf import DictConfig

from tinymt.config import check_export


@hydra.main(version_base="1.3", config_path="../configs", config_name="export")
@one_line_errors
def main(cfg: DictConfig) -> None:
    check_export(cfg)
    # after the check: a bad value fails at once, before torch is imported
    from tinymt.ct2 import export_run, require_ct2
    from tinymt.files import check_output
    from tinymt.rundir import load_run

    require_ct2()  # before the run is loaded: say at once when the extra is missing
    check_output(cfg.out, "out", folder=True)  # never an existing folder, nor in a run
    run = load_run(cfg.run, cfg.checkpoint, "cpu", cfg.outputs_root)
    out = export_run(run, cfg.out, cfg.quantization)
    print(f"exported {run.checkpoint} ({cfg.quantization}) -> {out}")
    print(f"translate: python scripts/translate.py engine=ct2 model_dir={out} \"<sentence>\"")


if __name__ == "__main__":
    run_hydra(main)
