"""Read and validate safetensors headers without reading any tensor data.

A safetensors file is ``<u64 little-endian N><N bytes of JSON header><tensor bytes>``.  The
header maps each tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets
relative to the start of the data section) plus an optional ``__metadata__`` string map.

The ``safetensors`` library validates the same rules when it opens a file, but it does not
expose the byte offsets (which the streaming scan needs) and its errors
("MetadataIncompleteBuffer") do not tell a user what happened.  So this module parses the header
itself, applies the library's rules (contiguous, non-overlapping, sized exactly, data section
filling the rest of the file) and words each failure for a person.  Tests check that everything
rejected here is rejected by ``safetensors.safe_open`` too.

One reader for the whole package: ``fetch`` checks every downloaded shard with it, preflight
checks the shards a fine-tune will load (:mod:`trnqwen.assets`), and ``verify-ckpt`` reads the
exported checkpoint's headers and byte ranges from it.  ``verify-ckpt`` scans values and so needs
every dtype known (``known_dtypes=True``); fetch and preflight accept any dtype the format has.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

# safetensors refuses headers above 100 MB; so do we (a corrupt size field could ask for TBs).
MAX_HEADER_BYTES = 100_000_000


@dataclass(frozen=True)
class DType:
    """One safetensors dtype: element size, and for float types how to spot non-finite bits.

    A float value is non-finite exactly when all its exponent bits are ones.  With the sign bit
    cleared (``bits & abs_mask``), the value is non-finite iff ``>= exp_all_ones``; it is infinite
    iff ``== exp_all_ones`` and NaN iff ``>``.  For float8 e4m3fn there is no infinity: only
    the all-ones pattern ``S.1111.111`` is NaN.
    """

    name: str
    itemsize: int
    abs_mask: int = 0  # 0 = not a float type (always finite)
    exp_all_ones: int = 0
    torch_name: str = ""

    @property
    def is_float(self) -> bool:
        return self.abs_mask != 0


DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        DType("BF16", 2, 0x7FFF, 0x7F80, "bfloat16"),
        DType("F16", 2, 0x7FFF, 0x7C00, "float16"),
        DType("F32", 4, 0x7FFF_FFFF, 0x7F80_0000, "float32"),
        DType("F64", 8, 0x7FFF_FFFF_FFFF_FFFF, 0x7FF0_0000_0000_0000, "float64"),
        DType("F8_E5M2", 1, 0x7F, 0x7C, "float8_e5m2"),
        DType("F8_E4M3", 1, 0x7F, 0x7F, "float8_e4m3fn"),
        DType("BOOL", 1, torch_name="bool"),
        DType("U8", 1, torch_name="uint8"),
        DType("I8", 1, torch_name="int8"),
        DType("I16", 2, torch_name="int16"),
        DType("U16", 2, torch_name="uint16"),
        DType("I32", 4, torch_name="int32"),
        DType("U32", 4, torch_name="uint32"),
        DType("I64", 8, torch_name="int64"),
        DType("U64", 8, torch_name="uint64"),
    )
}
# Element sizes of the format's other dtypes: a header with them is valid, only the value scan
# of verify-ckpt cannot read them.  F4 packs two values per byte (no whole-byte size).
OTHER_DTYPE_BYTES = {"F8_E8M0": 1, "C64": 8}
OTHER_DTYPES = ("F4", *OTHER_DTYPE_BYTES)
TORCH_TO_ST = {d.torch_name: d.name for d in DTYPES.values()}
TORCH_TO_ST.update({"float": "F32", "half": "F16", "double": "F64"})


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # byte offset inside the data section
    end: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass
class SafetensorsHeader:
    path: Path
    header_len: int
    file_size: int
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def data_start(self) -> int:
        return 8 + self.header_len

    @property
    def data_len(self) -> int:
        return self.file_size - self.data_start

    def ordered(self) -> list[TensorInfo]:
        """Tensors in file order (by byte offset), the order a sequential scan meets them."""
        return sorted(self.tensors.values(), key=lambda t: t.begin)


class SafetensorsFormatError(ValueError):
    """The file is not a valid safetensors file; the message says how, for a person."""


def read_header(path: Path, *, known_dtypes: bool = True) -> SafetensorsHeader:
    """Parse and validate one file's header; reads 8 + N bytes, never the tensor data.

    ``known_dtypes=False`` also accepts the format's dtypes trnqwen cannot scan (F4, F8_E8M0, C64)."""
    path = Path(path)
    try:
        file_size = os.path.getsize(path)
        with open(path, "rb") as fh:
            prefix = fh.read(8)
            if len(prefix) < 8:
                raise SafetensorsFormatError(
                    f"truncated: {file_size} bytes, too short to hold a safetensors header"
                )
            (n,) = struct.unpack("<Q", prefix)
            if n > MAX_HEADER_BYTES or n > file_size - 8:
                if file_size - 8 < n <= MAX_HEADER_BYTES:
                    raise SafetensorsFormatError(
                        f"truncated: the header alone should be {n:,} bytes but the file has only {file_size:,}"
                    )
                raise SafetensorsFormatError(
                    f"bad header: its size field says {n:,} bytes (not a safetensors file, or corrupt)"
                )
            raw = fh.read(n)
    except OSError as exc:
        raise SafetensorsFormatError(f"cannot read: {exc.strerror or exc}") from None
    return parse_header(path, raw, file_size, known_dtypes=known_dtypes)


def parse_header(path: Path, raw: bytes, file_size: int, *, known_dtypes: bool = True) -> SafetensorsHeader:
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise SafetensorsFormatError("bad header: not valid JSON (not a safetensors file, or corrupt)") from None
    if not isinstance(doc, dict):
        raise SafetensorsFormatError("bad header: not a JSON object")
    metadata = doc.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise SafetensorsFormatError("bad header: __metadata__ is not a string map")
    tensors: dict[str, TensorInfo] = {}
    for name, entry in doc.items():
        try:
            dtype = entry["dtype"]
            shape = tuple(int(s) for s in entry["shape"])
            begin, end = (int(o) for o in entry["data_offsets"])
        except (TypeError, KeyError, ValueError):
            raise SafetensorsFormatError(f"bad header: entry for {name!r} lacks dtype/shape/data_offsets") from None
        if dtype not in DTYPES and (known_dtypes or dtype not in OTHER_DTYPES):
            raise SafetensorsFormatError(f"tensor {name!r} has a dtype trnqwen cannot check: {dtype}")
        if any(s < 0 for s in shape) or begin < 0 or end < begin:
            raise SafetensorsFormatError(f"bad header: negative shape or offsets for {name!r}")
        width = DTYPES[dtype].itemsize if dtype in DTYPES else OTHER_DTYPE_BYTES.get(dtype)
        expected = math.prod(shape) * width if width else end - begin
        if end - begin != expected:
            raise SafetensorsFormatError(
                f"bad header: {name!r} is {dtype}{list(shape)} = {expected:,} bytes but its offsets span {end - begin:,}"
            )
        tensors[name] = TensorInfo(name, dtype, shape, begin, end)
    header = SafetensorsHeader(Path(path), len(raw), file_size, tensors, {str(k): str(v) for k, v in metadata.items()})
    # The library's rule: tensors tile the data section exactly, in offset order, from 0.
    position = 0
    for info in header.ordered():
        if info.begin != position:
            kind = "overlap" if info.begin < position else "a gap"
            raise SafetensorsFormatError(f"bad header: tensor data has {kind} at byte {info.begin:,} ({info.name!r})")
        position = info.end
    if position > header.data_len:
        raise SafetensorsFormatError(
            f"truncated: the header describes {position:,} bytes of tensor data but the file holds "
            f"{max(header.data_len, 0):,} (an interrupted copy or save?)"
        )
    if position < header.data_len:
        raise SafetensorsFormatError(
            f"corrupt: {header.data_len - position:,} unexpected bytes after the last tensor"
        )
    return header

