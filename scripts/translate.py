"""Translate with a trained run.

    python scripts/translate.py run=latest "我请李雷帮我订了去北京的机票。"
    echo "那只小猫昨天在公园里追了一只蝴蝶。" | python scripts/translate.py run=latest
    python scripts/translate.py run=<run dir> input=test.zh output=test.hyp ref=test.en decode.beam=5
    python scripts/translate.py run=latest attention=showcase.png "我请李雷帮我订了去北京的机票。"

Arguments of the form key=value are config overrides (configs/translate.yaml); every other
argument is a sentence to translate. With no sentences and no input=, stdin is read.
"""

import re
import sys

import hydra
from omegaconf import DictConfig

import tinymt.config  # noqa: F401  (registers the schemas)
from tinymt.cli import one_line_errors
from tinymt.translate import translate

# a Hydra override or flag: key=value, +key=value, ++key=value, ~key, --flag, -m
_OVERRIDE = re.compile(r"^(\+{0,2}[A-Za-z_][A-Za-z0-9_.\-/@]*=|~[A-Za-z_][A-Za-z0-9_.]*|-)")
SENTENCES = [a for a in sys.argv[1:] if not _OVERRIDE.match(a)]
sys.argv = [sys.argv[0]] + [a for a in sys.argv[1:] if _OVERRIDE.match(a)]


@hydra.main(version_base="1.3", config_path="../configs", config_name="translate")
@one_line_errors
def main(cfg: DictConfig) -> None:
    translate(cfg, SENTENCES)


if __name__ == "__main__":
    main()
