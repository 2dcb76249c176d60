"""Columns written and read a chunk at a time: the Arrow stream files a build passes through.

A build never holds a whole corpus: each step reads one file chunk by chunk and writes the
next (:class:`ChunkWriter`, :func:`read_chunks`; Arrow's IPC stream format). The last step
writes the cache's own files (:class:`tinymt.data.prepared.SplitWriter`).

>>> with ChunkWriter(folder / "train.arrow") as out:
...     out.write({"src": ["ein Hund"], "tgt": ["a dog"]})
>>> [chunk["tgt"] for chunk in read_chunks(folder / "train.arrow", ["tgt"])]
[['a dog']]
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pyarrow as pa

from tinymt.data.sources import Columns, as_table


class ChunkWriter:
    """Appends chunks of columns (names from :data:`tinymt.data.sources.ARROW_TYPES`) to one Arrow stream file,
    created by the first chunk (whose columns are the file's); ``rows``: how many so far."""

    def __init__(self, path: Path):
        self.path, self.rows, self._writer = Path(path), 0, None

    def write(self, cols: Columns) -> None:
        table = as_table(cols)
        if self._writer is None:
            self._writer = pa.ipc.new_stream(str(self.path), table.schema)
        self._writer.write_table(table)
        self.rows += table.num_rows

    def __enter__(self) -> ChunkWriter:
        return self

    def __exit__(self, *exc) -> None:
        if self._writer is not None:
            self._writer.close()


def read_chunks(path: Path, columns: Sequence[str] | None = None) -> Iterator[Columns]:
    """The chunks of a :class:`ChunkWriter` file as plain columns (all, or ``columns``),
    one in memory at a time (read, not memory-mapped: pages once read are not kept)."""
    with pa.OSFile(str(path)) as source:
        reader = pa.ipc.open_stream(source)
        for batch in reader:
            names = batch.schema.names if columns is None else columns
            yield {name: batch.column(name).to_pylist() for name in names}

