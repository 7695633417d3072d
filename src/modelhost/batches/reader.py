"""A batch's input, read lazily: where each line lies, not the lines.

The runner scans the input once (`Offsets.scan`), keeping of each request line its number, byte offset
and size (three machine integers: 1.2 MB for 50,000 lines), and parses a line only when it sends it
(`Offsets.read`). A batch of 200 MB of input costs the supervisor its offsets, not its 200 MB and the
Python objects of every parsed line. Lines are numbered as `bytes.splitlines` numbers them, as the
upload's check (`batches.input.check_jsonl`) does.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from typing import BinaryIO

from modelhost.batches.input import Line, LineError, parse_line


class Offsets:
    """The request lines of one input file: `numbers[i]` (1-based, in the file), `offsets[i]` and
    `sizes[i]` (bytes, without the line's end)."""

    def __init__(self) -> None:
        self.numbers = array("L")
        self.offsets = array("Q")
        self.sizes = array("L")

    def __len__(self) -> int:
        return len(self.numbers)

    @classmethod
    def scan(cls, handle: BinaryIO) -> Offsets:
        """Where each non-blank line of the file is (read one line at a time)."""
        found = cls()
        for number, offset, raw in lines_of(handle):
            found.add(number, offset, len(raw))
        return found

    def add(self, number: int, offset: int, size: int) -> None:
        self.numbers.append(number)
        self.offsets.append(offset)
        self.sizes.append(size)

    def read(self, handle: BinaryIO, index: int) -> Line | LineError:
        """The `index`-th request line, parsed now."""
        handle.seek(self.offsets[index])
        return parse_line(self.numbers[index], handle.read(self.sizes[index]))

    def shortest_first(self, skip: set[int]) -> array[int]:
        """Indexes of the lines whose numbers are not in `skip` (answered already), shortest first:
        lines in flight together, which a replica batches together, are then of like length."""
        left = (i for i in range(len(self)) if self.numbers[i] not in skip)
        return array("L", sorted(left, key=self.sizes.__getitem__))


def lines_of(handle: BinaryIO) -> Iterator[tuple[int, int, bytes]]:
    """(1-based number, byte offset, the line without its end) of each non-blank line: one line in
    memory at a time. `\\r` ends a line too, as for `bytes.splitlines`."""
    handle.seek(0)
    number, offset = 0, 0
    for chunk in handle:  # up to each b"\n"
        for piece in chunk.splitlines(keepends=True):
            number += 1
            raw = piece.rstrip(b"\r\n")
            if raw.strip():
                yield number, offset, raw
            offset += len(piece)
