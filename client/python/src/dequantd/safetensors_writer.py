"""Streaming safetensors writer: the header first, then each tensor's bytes as they come, with the
file's sha256 computed on the way. safetensors' own Python API writes only whole dicts of
in-memory tensors; a shard of up to --max-shard-size then needed that much memory, while this
writer holds one tensor at a time. The format (8-byte little-endian header length, JSON header
with dtype/shape/data_offsets, padded with spaces to a multiple of 8, then the data) is
checked by the tests by reading every shard back with the safetensors library.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from typing import Dict, List, Optional, Tuple

from . import dtypes


class ShardWriter:
    """Writes one safetensors file atomically: to `path`.tmp, then fsync and rename on
    finish(). Tensors must be written in the order and with the sizes given to the
    constructor. Not thread-safe."""

    def __init__(self, path: str, tensors: List[Tuple[str, str, Tuple[int, ...]]],
                 metadata: Optional[Dict[str, str]] = None):
        """tensors: (name, safetensors dtype code, shape) in file order."""
        self.path = path
        self._tmp = f"{path}.tmp"
        header: Dict[str, object] = {}
        if metadata:
            header["__metadata__"] = dict(metadata)
        self._expected: List[Tuple[str, int]] = []
        offset = 0
        for name, code, shape in tensors:
            size = dtypes.element_bytes(code)
            for d in shape:
                size *= int(d)
            header[name] = {"dtype": code, "shape": [int(d) for d in shape],
                            "data_offsets": [offset, offset + size]}
            self._expected.append((name, size))
            offset += size
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        self._sha = hashlib.sha256()
        self._file = open(self._tmp, "wb")  # pylint: disable=consider-using-with
        self._size = 0
        self._write(struct.pack("<Q", len(text)) + text)
        self._next = 0

    def _write(self, data: bytes) -> None:
        try:
            self._file.write(data)
        except OSError as e:  # e.g. a full disk: name the file (write() errors carry none)
            raise OSError(e.errno, e.strerror, self._tmp) from e
        self._sha.update(data)
        self._size += len(data)

    def add(self, name: str, data: memoryview) -> None:
        """Appends the bytes of the next tensor, which must be `name` with its declared size."""
        want_name, want_size = self._expected[self._next]
        if name != want_name or len(data) != want_size:
            raise ValueError(f"shard {self.path}: got {name} ({len(data)} bytes), "
                             f"expected {want_name} ({want_size} bytes)")
        self._write(data)
        self._next += 1

    def finish(self) -> Tuple[int, str]:
        """Completes the file; returns (bytes, sha256 hex)."""
        if self._next != len(self._expected):
            raise ValueError(f"shard {self.path}: {self._next} of {len(self._expected)} tensors")
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError as e:
            raise OSError(e.errno, e.strerror, self._tmp) from e
        self._file.close()
        os.replace(self._tmp, self.path)
        return self._size, self._sha.hexdigest()

    def abort(self) -> None:
        """Drops the temporary file."""
        self._file.close()
        try:
            os.unlink(self._tmp)
        except FileNotFoundError:
            pass


def file_sha256(path: str) -> str:
    """sha256 hex of a file's bytes."""
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            sha.update(block)
    return sha.hexdigest()
