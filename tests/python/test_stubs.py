"""The checked-in generated stubs are what generate_stubs.sh makes from proto/ now."""

import os
import shutil
import subprocess

import pytest

from conftest import ROOT

PKG = os.path.join(ROOT, "client", "python")


def test_checked_in_stubs_are_up_to_date(tmp_path):
    if shutil.which("protoc") is None or shutil.which("grpc_python_plugin") is None:
        pytest.skip("protoc / grpc_python_plugin not installed (protobuf-compiler-grpc)")
    subprocess.run([os.path.join(PKG, "generate_stubs.sh"), str(tmp_path)], check=True)
    for name in ("dequant_pb2.py", "dequant_pb2_grpc.py"):
        with open(tmp_path / name) as f:
            fresh = f.read()
        with open(os.path.join(PKG, "src", "dequantd", "_proto", name)) as f:
            assert f.read() == fresh, f"{name} is stale: run client/python/generate_stubs.sh"
