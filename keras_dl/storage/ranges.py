"""Byte ranges of a remote file: coalesced into few requests, and served from memory once fetched.

A reader that knows which parts of a file it will need (a row group's column chunks) asks for
them in a few large range requests instead of one request per part: :func:`coalesce` merges
ranges separated by less than a hole and cuts ranges longer than a limit (so one large range is
still fetched by several requests at once). :class:`RangeFile` then hands a reader (``pyarrow``'s
Parquet reader) a file object whose reads are served from the fetched bytes; a read outside
them goes to the file itself, so a wrong guess costs a request, never a wrong byte.
"""

from __future__ import annotations

import bisect
import io
from collections.abc import Iterable, Sequence

Range = tuple[int, int]  # (offset, length)

# pyarrow's own defaults for its read coalescing (pyarrow.CacheOptions): a hole of up to 8 KiB
# between two ranges is read rather than paying for a second request, and one request carries
# at most 32 MiB.
HOLE_BYTES = 8 << 10
RANGE_BYTES = 32 << 20


def coalesce(
    ranges: Iterable[Range], hole: int = HOLE_BYTES, limit: int = RANGE_BYTES
) -> list[Range]:
    """Sorted ranges merged across holes of at most ``hole`` bytes, each at most ``limit`` long.

    Example:
        >>> coalesce([(100, 10), (0, 50), (60, 20)], hole=10)
        [(0, 80), (100, 10)]
    """
    merged: list[list[int]] = []
    for offset, length in sorted(r for r in ranges if r[1] > 0):
        if merged and offset - (merged[-1][0] + merged[-1][1]) <= hole:
            end = max(merged[-1][0] + merged[-1][1], offset + length)
            merged[-1][1] = end - merged[-1][0]
        else:
            merged.append([offset, length])
    out: list[Range] = []
    for offset, length in merged:
        parts = max(1, -(-length // limit))  # equal parts of at most ``limit`` bytes
        step = -(-length // parts)
        out.extend(
            (o, min(step, offset + length - o)) for o in range(offset, offset + length, step)
        )
    return out


class RangeFile(io.RawIOBase):
    """A read-only file of ``size`` bytes whose reads are served from fetched ranges.

    Args:
        size: The file's size.
        parts: ``(offset, bytes)`` of the fetched ranges.
        fallback: ``read_at(offset, length) -> bytes``, for a read outside the fetched ranges
            (counted in :attr:`missed_bytes`).
    """

    def __init__(self, size: int, parts: Sequence[tuple[int, bytes]], fallback):
        super().__init__()
        self._size = size
        self._parts = sorted(parts, key=lambda p: p[0])
        self._starts = [offset for offset, _ in self._parts]
        self._fallback = fallback
        self._pos = 0
        self.missed_bytes = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def size(self) -> int:
        return self._size

    def read(self, n: int = -1):
        """``n`` bytes at the position (a view of the fetched bytes when they hold them all)."""
        if n is None or n < 0:
            n = self._size - self._pos
        n = max(0, min(n, self._size - self._pos))
        data = self._view(self._pos, n)
        if data is None:
            data = self._fallback(self._pos, n)
            self.missed_bytes += len(data)
        self._pos += len(data)
        return data

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def _view(self, offset: int, n: int):
        """The bytes from the fetched parts: a view of one part, or a copy of the adjacent
        parts a read spans (a range cut at the limit); None when some byte was not fetched."""
        i = bisect.bisect_right(self._starts, offset) - 1
        if i < 0:
            return None
        start, data = self._parts[i]
        if offset + n <= start + len(data):
            return memoryview(data)[offset - start : offset - start + n]
        pieces, at = [], offset
        while at < offset + n:
            if i >= len(self._parts):
                return None
            start, data = self._parts[i]
            if not start <= at < start + len(data):
                return None
            pieces.append(memoryview(data)[at - start : min(offset + n, start + len(data)) - start])
            at = start + len(data)
            i += 1
        return b"".join(pieces)
