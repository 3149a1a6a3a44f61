"""Fixtures for the Python client tests: a real dequantd (CPU backend) serving the bundled model,
started once per session on 127.0.0.1 with a free port, and the paths of the C++ tools.

Environment: DEQUANTD_BUILD_DIR (default <repo>/build) for server/dequantd and
client/dequantctl; DEQUANTD_MODEL_DIR (default <repo>/models/smollm2-135m-awq).
"""

import os
import re
import shutil
import subprocess
import time

import pytest

import dequantd

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("DEQUANTD_BUILD_DIR", os.path.join(ROOT, "build"))
MODEL = os.environ.get("DEQUANTD_MODEL_DIR", os.path.join(ROOT, "models", "smollm2-135m-awq"))
DEQUANTD = os.path.join(BUILD, "server", "dequantd")
DEQUANTCTL = os.path.join(BUILD, "client", "dequantctl")


def start_server(tmp_dir, model_dir=MODEL, extra=()):
    """Starts dequantd; returns (process, "127.0.0.1:port"). The caller stops it."""
    for path in (DEQUANTD, os.path.join(model_dir, "config.json") if model_dir else DEQUANTD):
        if not os.path.exists(path):
            pytest.fail(f"{path} is missing: build with scripts/build.sh and run "
                        "scripts/make-model.sh first")
    log_path = os.path.join(tmp_dir, "dequantd.log")
    log = open(log_path, "w")  # pylint: disable=consider-using-with
    proc = subprocess.Popen([DEQUANTD, f"--model={model_dir}", "--listen=127.0.0.1:0",
                             "--metrics-listen=", "--backend=cpu", "--cpu-threads=2", *extra],
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 60
    while time.time() < deadline:
        with open(log_path) as f:
            m = re.search(r"listening on 127\.0\.0\.1:(\d+)", f.read())
        if m:
            return proc, f"127.0.0.1:{m.group(1)}"
        if proc.poll() is not None:
            pytest.fail(f"dequantd exited with {proc.returncode}:\n{open(log_path).read()}")
        time.sleep(0.05)
    proc.kill()
    pytest.fail("dequantd did not start listening within 60 s")


MXFP4_CASE = os.path.join(ROOT, "tests", "data", "formats", "mxfp4", "mxfp4_gptoss_e2")


def format_case_model(case, tmp_path):
    """A checkpoint directory made of a tests/data/formats case (CASE.safetensors and
    CASE.config.json) under tmp_path: tmp_path/model."""
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(case + ".config.json", model / "config.json")
    shutil.copy(case + ".safetensors", model / "model.safetensors")
    return model


def stop_server(proc):
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """The target "127.0.0.1:port" of a dequantd serving the bundled model."""
    proc, target = start_server(str(tmp_path_factory.mktemp("server")))
    yield target
    stop_server(proc)


@pytest.fixture()
def client(server):
    with dequantd.Client(server, timeout=60) as c:
        yield c


@pytest.fixture(scope="session")
def model_tensors():
    """Every tensor of the bundled model's safetensors file(s), as numpy arrays (F16 as
    float16; read with the safetensors library, independent of the server)."""
    from safetensors.numpy import load_file  # pylint: disable=import-outside-toplevel

    out = {}
    for name in sorted(os.listdir(MODEL)):
        if name.endswith(".safetensors"):
            out.update(load_file(os.path.join(MODEL, name)))
    return out
