"""Parse torchtitan logs: every line kind it prints, with or without ANSI colours and torchrun
prefixes (``[rank0]:``, ``[default0]:``), ranks interleaved.

:class:`~trnqwen.logs.engine.LogParser` is the streaming parser fed raw bytes (``feed`` /
``close``) that builds a :class:`~trnqwen.logs.record.ParsedLog`; :func:`parse_stream`,
:func:`parse_file`, :func:`parse_bytes` and :func:`parse_text` wrap it.

Where things live: the step line's format in :mod:`trnqwen.contract.stepline`; every other line kind
in :mod:`trnqwen.logs.patterns` (a new informational line is one row of ``_OWN_LINES`` there);
the result in :mod:`trnqwen.logs.record`; the streaming engine in :mod:`trnqwen.logs.engine`,
with crash tracking in :mod:`trnqwen.logs.tracebacks`.
"""

from __future__ import annotations

from typing import BinaryIO

from trnqwen.logs.engine import CHUNK_SIZE, MAX_LINE, LogParser
from trnqwen.logs.record import ParsedLog


def parse_stream(stream: BinaryIO, source: str = "", *, chunk_size: int = CHUNK_SIZE, max_line: int = MAX_LINE) -> ParsedLog:
    """Parse a binary stream to the end in bounded memory."""
    parser = LogParser(source, max_line=max_line)
    read = getattr(stream, "read1", None) if chunk_size < 65536 else None
    read = read or stream.read
    while block := read(chunk_size):
        parser.feed(block)
    return parser.close()


def parse_bytes(data: bytes, source: str = "<bytes>", *, chunk_size: int = CHUNK_SIZE, max_line: int = MAX_LINE) -> ParsedLog:
    parser = LogParser(source, max_line=max_line)
    for i in range(0, len(data), chunk_size):
        parser.feed(data[i: i + chunk_size])
    return parser.close()


def parse_text(text: str, source: str = "<text>") -> ParsedLog:
    return parse_bytes(text.encode("utf-8", "surrogateescape"), source)


def parse_file(path, *, chunk_size: int = CHUNK_SIZE, max_line: int = MAX_LINE) -> ParsedLog:
    with open(path, "rb") as fh:
        return parse_stream(fh, str(path), chunk_size=chunk_size, max_line=max_line)
