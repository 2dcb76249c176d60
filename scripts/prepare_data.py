"""Prepare (load, clean, tokenize, cache) a corpus and print a summary table.

    python scripts/prepare_data.py                                  # built-in zh->en corpus
    python scripts/prepare_data.py data=multi30k data.path=../shared/data/multi30k-hub-layout
    python scripts/prepare_data.py data=tatoeba_zh_en data.vocab_size=4000

A second run with the same config is a cache hit (see tinymt.data). User errors print
``error: <message>`` on stderr and exit with status 2.
"""

from __future__ import annotations

import sys

import hydra

import tinymt.config  # noqa: F401  (registers prepare_schema)
from tinymt.data import prepare, summary_table
from tinymt.errors import TinyMTError


@hydra.main(version_base="1.3", config_path="../configs", config_name="prepare_data")
def main(cfg) -> None:
    try:
        data = prepare(cfg.data)
    except TinyMTError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(summary_table(data.stats))


if __name__ == "__main__":
    main()
