"""Translate with a trained run.

    python scripts/translate.py run=latest "我请李雷帮我订了去北京的机票。"
    echo "那只小猫昨天在公园里追了一只蝴蝶。" | python scripts/translate.py run=latest
    python scripts/translate.py run=<run dir> input=test.zh output=test.hyp ref=test.en decode.beam=5
    python scripts/translate.py run=latest attention=showcase.png "我请李雷帮我订了去北京的机票。"
    python scripts/translate.py run=latest -- "x=1" "-5 degrees"   # any text after --
    python scripts/translate.py engine=ct2 model_dir=exports/m30k decode.beam=5 "Ein Hund läuft."

Arguments of the form key=value are config overrides (configs/translate.yaml); every other
argument is a sentence to translate. Everything after a ``--`` argument is a sentence, so
a sentence that looks like an override (``x=1``) or a flag (``-5 degrees``) goes after it.
With no sentences and no input=, stdin is read. ``engine=ct2 model_dir=<folder>`` decodes with
CTranslate2 a model written by scripts/export.py (same inputs, outputs and scoring).
"""

from tinymt.cli import one_line_errors, run_hydra  # isort: skip  (first: every way a script ends is one line)
import re
import sys

import hydra
from omegaconf import DictConfig

from tinymt.config import check_translate

# a Hydra override or flag: key=value, +key=value, ++key=value, ~key, --flag, -m
_OVERRIDE = re.compile(r"^(\+{0,2}[A-Za-z_][A-Za-z0-9_.\-/@]*=|~[A-Za-z_][A-Za-z0-9_.]*|-)")
# Hydra's flags whose value is the next argument (``--cfg job``), and --info's choices
_VALUED = {"-c", "--cfg", "-p", "--package", "-cp", "--config-path", "-cn", "--config-name",
           "-cd", "--config-dir", "--experimental-rerun"}
_INFO = {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}
SENTENCES: list[str] = []


def split_args(args: list[str]) -> tuple[list[str], list[str]]:
    """``(overrides and flags, sentences)``: before a ``--`` by their form (a flag's value
    with its flag), after it all sentences (the first ``--`` itself is dropped)."""
    cut = args.index("--") if "--" in args else len(args)
    overrides, sentences = [], []
    for i, a in enumerate(args[:cut]):
        flag = args[i - 1] if i else ""
        value = flag in _VALUED or flag == "--info" and a in _INFO
        (overrides if value or _OVERRIDE.match(a) else sentences).append(a)
    return overrides, sentences + args[cut + 1:]


@hydra.main(version_base="1.3", config_path="../configs", config_name="translate")
@one_line_errors
def main(cfg: DictConfig) -> None:
    check_translate(cfg)
    from tinymt.translate import translate  # after the check: a bad value fails at once

    translate(cfg, SENTENCES)


if __name__ == "__main__":
    sys.argv[1:], SENTENCES[:] = split_args(sys.argv[1:])
    run_hydra(main)
