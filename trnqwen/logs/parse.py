"""Parse a torchtitan log from a stream, a file, bytes or text: wrappers of the streaming parser
(:class:`~trnqwen.logs.engine.LogParser`, which says where each line kind is read)."""

from __future__ import annotations

import io
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
    return parse_stream(io.BytesIO(data), source, chunk_size=chunk_size, max_line=max_line)


def parse_text(text: str, source: str = "<text>") -> ParsedLog:
    return parse_bytes(text.encode("utf-8", "surrogateescape"), source)


def parse_file(path, *, chunk_size: int = CHUNK_SIZE, max_line: int = MAX_LINE) -> ParsedLog:
    with open(path, "rb") as fh:
        return parse_stream(fh, str(path), chunk_size=chunk_size, max_line=max_line)
