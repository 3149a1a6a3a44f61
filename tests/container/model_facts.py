#!/usr/bin/env python3
"""Facts about the bundled model read straight from its safetensors files (no numpy), for the
container and scale-out tests to check a server's answers against:

  model_facts.py layers MODEL_DIR            the quantized layers (names before .qweight), sorted
  model_facts.py tensor-bytes FILE NAME OUT  writes tensor NAME's raw bytes (row-major) to OUT
  model_facts.py same-bytes FILE NAME RAW    exit 0 when RAW holds exactly NAME's bytes, else 1

A safetensors file is an 8-byte little-endian header length, a JSON header mapping each tensor
to {dtype, shape, data_offsets: [begin, end]} (relative to the end of the header), then the data.
"""

import json
import pathlib
import struct
import sys


def read_header(path):
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(length)), 8 + length


def tensor_bytes(path, name):
    header, data_start = read_header(path)
    if name not in header:
        raise SystemExit(f"model_facts: {path} has no tensor {name!r}")
    begin, end = header[name]["data_offsets"]
    with open(path, "rb") as f:
        f.seek(data_start + begin)
        return f.read(end - begin)


def layers(model_dir):
    names = set()
    for path in sorted(pathlib.Path(model_dir).glob("*.safetensors")):
        header, _ = read_header(path)
        names.update(k[: -len(".qweight")] for k in header if k.endswith(".qweight"))
    return sorted(names)


def main(argv):
    if len(argv) == 3 and argv[1] == "layers":
        print("\n".join(layers(argv[2])))
        return 0
    if len(argv) == 5 and argv[1] == "tensor-bytes":
        pathlib.Path(argv[4]).write_bytes(tensor_bytes(argv[2], argv[3]))
        return 0
    if len(argv) == 5 and argv[1] == "same-bytes":
        expected, got = tensor_bytes(argv[2], argv[3]), pathlib.Path(argv[4]).read_bytes()
        if expected == got:
            print(f"model_facts: {argv[4]}: the {len(got)} bytes of {argv[3]}, exactly")
            return 0
        differ = next((i for i, (a, b) in enumerate(zip(expected, got)) if a != b), None)
        print(f"model_facts: {argv[4]}: {len(got)} bytes, expected {len(expected)} bytes of "
              f"{argv[3]}; first differing byte: {differ}")
        return 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
