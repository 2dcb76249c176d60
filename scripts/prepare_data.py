"""Prepare (load, clean, tokenize, cache) a corpus and print a summary table.

    python scripts/prepare_data.py                                  # built-in zh->en corpus
    python scripts/prepare_data.py data=multi30k data.path=../shared/data/multi30k-hub-layout
    python scripts/prepare_data.py data=tatoeba_zh_en data.vocab_size=4000

A second run with the same config is a cache hit (see tinymt.data). User errors print
``error: <message>`` on stderr and exit with status 2.
"""

from __future__ import annotations

from tinymt.cli import one_line_errors, run_hydra  # isort: skip  (first: every way a script ends is one line)
import hydra

from tinymt.config import check_data


@hydra.main(version_base="1.3", config_path="../configs", config_name="prepare_data")
@one_line_errors
def main(cfg) -> None:
    check_data(cfg.data)
    from tinymt.data import prepare, summary_table  # after the check: a bad value fails at once

    print(summary_table(prepare(cfg.data).stats))


if __name__ == "__main__":
    run_hydra(main)
