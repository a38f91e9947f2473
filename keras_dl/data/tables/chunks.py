"""Where a row group's planned columns lie in its file: the byte ranges of their column chunks.

:func:`keras_dl.data.tables.rows.load_row_group` reads a row group's chunks of the columns a
read plans (and of its row filters' columns). A reader that fetches those bytes ahead of it, in
a few coalesced requests, asks :class:`FileChunks` where they are, from the file's footer alone.
"""

from __future__ import annotations

from collections.abc import Sequence

from keras_dl.data.tables.rows import read_columns, stored_names
from keras_dl.data.tables.snapshot import TableSnapshot

Range = tuple[int, int]  # (offset, length) in the file


class FileChunks:
    """The column chunks that a read of logical ``columns`` loads from each row group of file
    ``index`` (whose parsed footer is ``meta``, a ``pyarrow.parquet.FileMetaData``)."""

    def __init__(self, snapshot: TableSnapshot, index: int, meta, columns: Sequence[str]) -> None:
        self.meta = meta
        stored = stored_names(
            snapshot, meta.schema.to_arrow_schema(), read_columns(snapshot, columns)
        )
        roots = {name for name in stored.values() if name is not None}
        # A leaf belongs to the top-level column its dotted path starts with (a list column's
        # leaf is "v.list.element"). A name holding a dot may take a neighbour's leaf too:
        # fetching it is a few bytes more, never a wrong read.
        self.leaves = [
            i
            for i in range(meta.num_columns)
            if _root_of(meta.schema.column(i).path, roots) is not None
        ]

    def ranges(self, row_group: int) -> list[Range]:
        """``(offset, length)`` of each planned column chunk of ``row_group``, in file order."""
        group = self.meta.row_group(row_group)
        out = []
        for i in self.leaves:
            chunk = group.column(i)
            # As Arrow's reader computes a chunk's range: from its dictionary page when it has
            # one before the data pages, for total_compressed_size bytes.
            start = chunk.data_page_offset
            dictionary = chunk.dictionary_page_offset
            if chunk.has_dictionary_page and dictionary and 0 < dictionary < start:
                start = dictionary
            out.append((start, chunk.total_compressed_size))
        return sorted(out)

    def bytes(self, row_group: int) -> int:
        """The bytes of ``row_group``'s planned column chunks."""
        return sum(length for _, length in self.ranges(row_group))


def _root_of(path: str, roots: set[str]) -> str | None:
    head = path.split(".", 1)[0]
    if head in roots:
        return head
    return next((r for r in roots if path == r or path.startswith(r + ".")), None)
