"""The client API against a real dequantd serving the bundled model: every call, results
bit-exact against dequantctl (the C++ client's output of the same server) and against the
package's numpy reference (which is itself checked against make-model's independently computed
expected files), bf16, torch, error mapping."""

import io
import json
import os
import subprocess
import sys

import grpc
import ml_dtypes
import numpy as np
import pytest

import dequantd
from dequantd import reference
from conftest import DEQUANTCTL, MODEL

LAYER_Q = "model.layers.0.self_attn.q_proj"     # (576, 576), G = 64
LAYER_DOWN = "model.layers.0.mlp.down_proj"      # (1536, 576), G = 128


def packed(model_tensors, layer):
    return (model_tensors[f"{layer}.qweight"], model_tensors[f"{layer}.qzeros"],
            model_tensors[f"{layer}.scales"])


def test_info_reports_cpu_backend_model_and_config(client):
    info = client.info()
    assert info.backend == "cpu"
    assert info.version
    assert info.model == MODEL
    assert info.tensor_count == 210
    with open(os.path.join(MODEL, "config.json")) as f:
        assert info.model_config == json.load(f)
    assert info.model_config["quantization_config"]["quant_method"] == "awq"


def test_list_has_every_layer_and_every_other_tensor(client, model_tensors):
    listing = client.list()
    layers = {t.name: t for t in listing.layers}
    expected_layers = sorted(n[: -len(".qweight")] for n in model_tensors if n.endswith(".qweight"))
    assert sorted(layers) == expected_layers and len(layers) == 210
    q = layers[LAYER_Q]
    assert (q.in_features, q.out_features, q.group_size, q.scale_dtype) == (576, 576, 64, "fp16")
    assert layers[LAYER_DOWN].group_size == 128
    parts = {f"{l}.{s}" for l in layers for s in ("qweight", "qzeros", "scales")}
    others = {t.name: t for t in listing.other_tensors}
    assert sorted(others) == sorted(set(model_tensors) - parts)
    assert "model.embed_tokens.weight" in others and "model.norm.weight" in others
    for name, t in others.items():
        arr = model_tensors[name]
        assert t.dtype == "F16" and t.shape == arr.shape and t.bytes == arr.nbytes, name


def test_reference_matches_make_models_expected_files(model_tensors):
    from safetensors.numpy import load_file  # pylint: disable=import-outside-toplevel

    for layer in (LAYER_Q, LAYER_DOWN):
        expected = load_file(os.path.join(f"{MODEL}-reference",
                                          f"expected.{layer}.fp16.safetensors"))[f"{layer}.weight"]
        got = reference.dequantize(*packed(model_tensors, layer), dtype="fp16")
        assert got.dtype == np.float16 and got.shape == expected.shape
        assert np.array_equal(got.view(np.uint16), expected.view(np.uint16)), layer


def dequantctl(server, tmp_path, layer, dtype):
    out = tmp_path / f"{dtype}.npy"
    subprocess.run([DEQUANTCTL, f"--server={server}", "--deadline=60", "dequantize",
                    f"--tensor={layer}", f"--dtype={dtype}", f"--out={out}"], check=True,
                   capture_output=True)
    return np.load(out)


@pytest.mark.parametrize("streams", ["2", 2.0, True])
def test_streams_of_another_type_is_a_type_error_before_any_call(client, streams):
    with pytest.raises(TypeError, match="streams must be an int \\(or None\\), got "):
        client.dequantize(LAYER_Q, streams=streams)


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("layer", [LAYER_Q, LAYER_DOWN])
def test_dequantize_by_name_is_bit_exact(client, server, model_tensors, tmp_path, layer, dtype):
    got = client.dequantize(layer, dtype=dtype)
    want_dtype = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16, "fp32": np.float32}[dtype]
    assert got.dtype == want_dtype
    k = model_tensors[f"{layer}.qweight"].shape[0]
    assert got.shape == (k, model_tensors[f"{layer}.scales"].shape[1])
    bits = got.view(np.uint32 if dtype == "fp32" else np.uint16)
    ctl = dequantctl(server, tmp_path, layer, dtype)  # bf16 .npy holds the uint16 bits
    assert np.array_equal(bits, ctl.view(bits.dtype)), "differs from dequantctl"
    ref = reference.dequantize(*packed(model_tensors, layer), dtype=dtype)
    assert np.array_equal(bits, ref.view(bits.dtype)), "differs from the numpy reference"


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("layer", [LAYER_Q, LAYER_DOWN])
def test_dequantize_nk_is_the_kernels_transpose_of_kn(client, model_tensors, layer, dtype):
    """orientation="nk": the server's kernel writes (N, K) = nn.Linear.weight, bit for bit the
    transpose of the numpy reference's (K, N); "kn" and None (awq_gemm's own) give (K, N)."""
    ref = reference.dequantize(*packed(model_tensors, layer), dtype=dtype)
    width = np.uint32 if dtype == "fp32" else np.uint16
    nk = client.dequantize(layer, dtype=dtype, orientation="nk")
    assert nk.shape == ref.shape[::-1]
    assert np.array_equal(nk.view(width), np.ascontiguousarray(ref.view(width).T))
    for orientation in ("kn", None):
        kn = client.dequantize(layer, dtype=dtype, orientation=orientation)
        assert np.array_equal(kn.view(width), ref.view(width)), orientation
    layers = dict(client.dequantize_layers([layer], dtype=dtype, orientation="nk"))
    assert np.array_equal(layers[layer].view(width), nk.view(width))


def test_dequantize_nk_over_byte_range_streams(client):
    one = client.dequantize(LAYER_DOWN, dtype="bf16", orientation="nk")
    ranged = client.dequantize(LAYER_DOWN, dtype="bf16", orientation="nk", streams=3)
    assert np.array_equal(one.view(np.uint16), ranged.view(np.uint16))


def test_list_reports_each_layers_format_and_own_orientation(client):
    layer = client.list().layers[0]
    assert (layer.format, layer.orientation) == ("awq_gemm", "kn")


def test_orientation_other_than_kn_nk_is_a_value_error(client):
    with pytest.raises(ValueError, match="orientation must be 'kn', 'nk' or None"):
        client.dequantize(LAYER_Q, orientation="t")


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_dequantize_inline_packed_arrays(client, model_tensors, dtype):
    qw, qz, sc = packed(model_tensors, LAYER_DOWN)
    got = client.dequantize(qweight=qw, qzeros=qz, scales=sc, dtype=dtype)
    assert np.array_equal(got.view(np.uint16), client.dequantize(LAYER_DOWN, dtype=dtype).view(np.uint16))


def test_inline_words_that_are_not_native_int32_are_a_type_error(client, model_tensors):
    """qweight / qzeros bytes go as they are: a float32 or big-endian array would be other words
    (silently wrong weights), so only native int32 / uint32 is sent."""
    qw, qz, sc = packed(model_tensors, LAYER_DOWN)
    for bad_qw, bad_qz, role, code in ((qw.astype(np.float32), qz, "qweight", "<f4"),
                                       (qw, qz.astype(">i4"), "qzeros", ">i4"),
                                       (qw.astype(np.int64), qz, "qweight", "<i8")):
        with pytest.raises(TypeError, match=f"{role} must be int32 .* not {code}"):
            client.dequantize(qweight=bad_qw, qzeros=bad_qz, scales=sc)
    as_uint = client.dequantize(qweight=qw.view(np.uint32), qzeros=qz.view(np.uint32), scales=sc)
    assert np.array_equal(as_uint.view(np.uint16),
                          client.dequantize(LAYER_DOWN).view(np.uint16))


def test_timeouts_inf_means_none_and_nonpositive_or_nan_is_a_value_error(server):
    """gRPC fails every call at once with DEADLINE_EXCEEDED for an infinite, zero or negative
    deadline: inf means no deadline, the others are refused where they are given."""
    with dequantd.Client(server, timeout=float("inf"), stream_timeout=float("inf")) as c:
        assert c.info().tensor_count > 0
        assert c.info(timeout=float("inf")).tensor_count > 0
        for bad in (0, -1, float("nan")):
            with pytest.raises(ValueError, match="timeout must be a number of seconds > 0"):
                c.info(timeout=bad)
    for bad in (0, -1.5, float("nan")):
        with pytest.raises(ValueError, match="stream_timeout must be"):
            dequantd.Client(server, stream_timeout=bad)
    proc = subprocess.run([sys.executable, "-m", "dequantd", "info", f"--server={server}",
                           "--timeout=0"], capture_output=True, text=True)
    assert proc.returncode == 2 and "--timeout must be > 0" in proc.stderr, proc.stderr


def test_module_dequantize_orientation_and_no_progress_into_a_pipe(client, server, tmp_path):
    """python -m dequantd dequantize: --orientation nk is the kernel's (N, K), and with stderr a
    pipe there is no progress bar (tqdm drew one into pipes and logs: new-user review)."""
    out = str(tmp_path / "down_nk.npy")
    proc = subprocess.run([sys.executable, "-m", "dequantd", "dequantize", f"--server={server}",
                           "--tensor", LAYER_DOWN, "--orientation", "nk", "--out", out],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", proc.stderr
    got = np.load(out)
    assert got.shape == (576, 1536)
    assert np.array_equal(got, client.dequantize(LAYER_DOWN, orientation="kn").T)


def test_a_single_layer_name_string_is_a_type_error(client):
    """A string is iterable: dequantize_layers("name") would ask for one layer per character."""
    with pytest.raises(TypeError, match="not a single string"):
        list(client.dequantize_layers(LAYER_Q))
    with pytest.raises(TypeError, match="not a single string"):
        client.dequantize_layers_into("some-region", LAYER_Q)


def test_dequantize_inline_bf16_scales_and_explicit_group_size(client):
    rng = np.random.default_rng(5)
    k, n, g = 256, 64, 128
    qw = rng.integers(-2**31, 2**31, size=(k, n // 8), dtype=np.int64).astype(np.int32)
    qz = rng.integers(-2**31, 2**31, size=(k // g, n // 8), dtype=np.int64).astype(np.int32)
    sc = rng.uniform(-0.05, 0.05, size=(k // g, n)).astype(ml_dtypes.bfloat16)
    got = client.dequantize(qweight=qw, qzeros=qz, scales=sc, group_size=g, dtype="fp32")
    want = reference.dequantize(qw, qz, sc, dtype="fp32")
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_dequantize_as_torch(client):
    torch = pytest.importorskip("torch")
    for dtype, tdtype in (("fp16", torch.float16), ("bf16", torch.bfloat16), ("fp32", torch.float32)):
        t = client.dequantize(LAYER_Q, dtype=dtype, as_torch=True)
        assert isinstance(t, torch.Tensor) and t.dtype == tdtype and tuple(t.shape) == (576, 576)
        a = client.dequantize(LAYER_Q, dtype=dtype)
        assert np.array_equal(t.view(torch.int16 if dtype != "fp32" else torch.int32).numpy(),
                              a.view(np.int16 if dtype != "fp32" else np.int32))


def test_dequantize_layers_yields_requested_layers_in_order(client):
    names = [LAYER_DOWN, LAYER_Q, LAYER_DOWN]
    got = list(client.dequantize_layers(names, dtype="bf16", progress=True))
    assert [n for n, _ in got] == names
    for name, arr in got:
        assert np.array_equal(arr.view(np.uint16), client.dequantize(name, dtype="bf16").view(np.uint16))


def test_dequantize_layers_of_an_empty_list_yields_nothing(client):
    assert list(client.dequantize_layers([])) == []
    assert list(client.dequantize_layers(iter(()))) == []


def test_dequantize_layers_all(client):
    count = 0
    for name, arr in client.dequantize_layers(dtype="fp16"):
        count += 1
        assert arr.dtype == np.float16 and arr.ndim == 2, name
    assert count == 210


def test_read_tensor_returns_stored_bytes(client, model_tensors):
    for name in ("model.embed_tokens.weight", "model.norm.weight",
                 "model.layers.3.input_layernorm.weight"):
        got = client.read_tensor(name, progress=True)
        want = model_tensors[name]
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16)), name


def test_errors_map_to_dequantd_error(client, server):
    with pytest.raises(dequantd.DequantdError) as e:
        client.dequantize("no.such.layer")
    assert e.value.code == grpc.StatusCode.NOT_FOUND and "no.such.layer" in e.value.message
    with pytest.raises(dequantd.DequantdError) as e:
        client.read_tensor(LAYER_Q)
    assert e.value.code == grpc.StatusCode.NOT_FOUND and "Dequantize" in e.value.message
    with pytest.raises(dequantd.DequantdError) as e:
        client.read_tensor("")
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(dequantd.DequantdError) as e:
        list(client.dequantize_layers(["model.norm.weight"]))
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    qw = np.zeros((64, 2), np.int32)
    with pytest.raises(ValueError, match=r"scales has 3 rows, which do not divide K = 64"):
        client.dequantize(qweight=qw, qzeros=np.zeros((3, 2), np.int32),
                          scales=np.zeros((3, 16), np.float16))
    with pytest.raises(dequantd.DequantdError) as e:  # a group_size given: the server checks it
        client.dequantize(qweight=qw, qzeros=np.zeros((3, 2), np.int32),
                          scales=np.zeros((3, 16), np.float16), group_size=32)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(ValueError):
        client.dequantize(LAYER_Q, dtype="int8")
    with pytest.raises(ValueError):
        client.dequantize()
    with pytest.raises(dequantd.DequantdError) as e:  # a port nothing listens on
        with dequantd.Client("127.0.0.1:1", timeout=5) as dead:
            dead.info()
    assert e.value.code == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(dequantd.DequantdError) as e:
        with dequantd.Client(server, stream_timeout=1e-4) as hasty:
            hasty.dequantize(LAYER_DOWN, dtype="fp32")
    assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


def test_benchmark_runs_on_the_cpu_backend(client):
    r = client.benchmark(shapes=[(256, 256)], trials=1, runs=1, output_dtypes=["fp16"])
    assert r["backend"] == "cpu" and r["rows"]
    for row in r["rows"]:
        assert int(row["in_features"]) == 256 and int(row["out_features"]) == 256
        assert row.get("correct") is True, row  # every trial matched the CPU reference
        assert float(row["median_seconds"]) > 0


def test_benchmark_times_the_orientation_asked_for(client):
    # A given shape and a loaded layer (bench/time_to_model.py times the loader's kernel so).
    for orientation, wire in (("NK", "ORIENTATION_NK"), ("kn", "ORIENTATION_KN")):
        r = client.benchmark(shapes=[(256, 128)], tensors=[LAYER_Q], trials=1, runs=1,
                             output_dtypes=["bf16"], orientation=orientation)
        assert r["rows"]
        for row in r["rows"]:
            assert row["orientation"] == wire, row
            assert row.get("correct") is True, row  # against the reference in that layout
    with pytest.raises(ValueError, match="orientation must be"):
        client.benchmark(shapes=[(256, 128)], orientation="MN")


def test_benchmark_refuses_a_server_that_timed_another_orientation(client, monkeypatch):
    # A server older than BenchmarkRequest.orientation ignores it: its rows say no orientation.
    from dequantd._proto import dequant_pb2 as pb  # pylint: disable=import-outside-toplevel
    older = pb.BenchmarkResponse(
        rows=[pb.BenchmarkRow(variant="cpu_threads", in_features=256, out_features=128)])
    monkeypatch.setattr(client, "_unary", lambda *args, **kwargs: older)
    with pytest.raises(dequantd.DequantdError) as e:
        client.benchmark(shapes=[(256, 128)], orientation="NK")
    assert e.value.code == grpc.StatusCode.UNIMPLEMENTED
    assert "predates BenchmarkRequest.orientation" in str(e.value)
    assert client.benchmark(shapes=[(256, 128)])["rows"]  # not asked: the rows as they are


@pytest.mark.parametrize("streams", [0, -1, 65, 100000])
def test_streams_outside_1_to_64_is_a_value_error_before_any_call(client, streams):
    # 100000 used to open ~98000 one-element range RPCs, one thread each (new-user review).
    with pytest.raises(ValueError, match=f"streams must be in 1..64 \\(or None\\), got {streams}"):
        client.dequantize(LAYER_Q, streams=streams)


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("streams", [2, 3, 4, 7])
def test_byte_range_streams_equal_one_stream(client, dtype, streams):
    assert dequantd.supports_byte_ranges()
    one = client.dequantize(LAYER_Q, dtype=dtype)
    many = client.dequantize(LAYER_Q, dtype=dtype, streams=streams)
    assert many.shape == one.shape and many.dtype == one.dtype
    assert one.tobytes() == many.tobytes()


def _without_ml_dtypes(monkeypatch):
    """Makes `import ml_dtypes` fail in this process, as when the package is not installed."""
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)


def test_bf16_without_ml_dtypes_names_the_package_or_gives_the_bits(client, monkeypatch):
    """numpy has no bfloat16. Without ml-dtypes, a bf16 numpy result is an ImportError naming
    the package and how to install it; bf16_bits=True gives the same bits as np.uint16."""
    want = client.dequantize(LAYER_Q, dtype="bf16").view(np.uint16)
    _without_ml_dtypes(monkeypatch)
    with pytest.raises(ImportError) as e:
        client.dequantize(LAYER_Q, dtype="bf16")
    assert str(e.value) == (
        "BF16 numpy arrays need the ml-dtypes package (numpy has no bfloat16): pip install "
        "ml-dtypes (or 'dequantd[ml-dtypes]'); or pass as_torch=True, or bf16_bits=True for the "
        "raw bits as uint16")
    for streams in (None, 2):
        bits = client.dequantize(LAYER_Q, dtype="bf16", bf16_bits=True, streams=streams)
        assert bits.dtype == np.dtype("<u2") and bits.shape == (576, 576)
        assert np.array_equal(bits, want)
    # Other dtypes are untouched by bf16_bits.
    assert client.dequantize(LAYER_Q, dtype="fp16", bf16_bits=True).dtype == np.float16


def test_cli_dequantize_bf16_writes_uint16_bits_without_ml_dtypes(client, server, tmp_path):
    """python -m dequantd dequantize --dtype bf16 writes the bits as uint16 (its --help says so)
    and needs no ml-dtypes: run in a process where importing ml_dtypes fails."""
    out = tmp_path / "bf16.npy"
    code = ("import sys; sys.modules['ml_dtypes'] = None; from dequantd.cli import main; "
            f"sys.exit(main(['dequantize', '--server', {server!r}, '--tensor', {LAYER_Q!r}, "
            f"'--dtype', 'bf16', '--out', {str(out)!r}]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == (f"{LAYER_Q}: (576, 576) bf16 -> {out} (bf16 as uint16 bits: numpy has "
                        "no bfloat16; read with np.load(...).view(ml_dtypes.bfloat16))\n")
    got = np.load(out)
    assert got.dtype == np.uint16
    assert np.array_equal(got, client.dequantize(LAYER_Q, dtype="bf16").view(np.uint16))


def test_cli_list_prints_each_layers_format_shape_group_and_scale_dtype(client, server):
    """python -m dequantd list: a line per quantized layer (name, format, (K, N), G, scale
    dtype, and E= for stacked experts only), then the stored tensors."""
    r = subprocess.run([sys.executable, "-m", "dequantd", "list", "--server", server],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    listing = client.list()
    assert len(lines) == len(listing.layers) + len(listing.other_tensors)
    assert f"{LAYER_Q}\tawq_gemm\t(576, 576)\tG=64\tfp16" in lines
    assert f"{LAYER_DOWN}\tawq_gemm\t(1536, 576)\tG=128\tfp16" in lines


def test_a_target_that_is_not_host_port_is_refused_before_any_call():
    """gRPC reads a port of 506514 as 47762 and an empty target as a resolver error in its log:
    Client refuses them (as dequantctl --server does) and passes targets with a scheme as they
    are (fresh-user review)."""
    for bad in ("127.0.0.1:506514", "127.0.0.1:0", "", "localhost", ":50051", "host:5o051",
                "a:b:50051", " 127.0.0.1:50051", "127.0.0.1:50051 ", "127.0.0.1:\uff15\uff10",
                "127.0.0.1:\u00b2", "http://127.0.0.1:50051"):
        with pytest.raises(ValueError, match="must be HOST:PORT with a port in 1..65535"):
            dequantd.Client(bad)
    with pytest.raises(TypeError, match="target must be a str"):
        dequantd.Client(50051)
    for good in ("127.0.0.1:65535", "[::1]:50051", "localhost:1", "unix:/tmp/d.sock",
                 "dns:///example.com:443", "ipv4:127.0.0.1:50051", "unix-abstract:dequantd"):
        dequantd.Client(good).close()
    proc = subprocess.run([sys.executable, "-m", "dequantd", "info", "--server", ""],
                          capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == ("error: target '' must be HOST:PORT with a port in 1..65535 (e.g. "
                           "'127.0.0.1:50051'), or a gRPC target such as 'unix:/path/to.sock'\n")


def test_a_name_that_is_not_a_string_is_a_type_error_naming_the_argument(client):
    with pytest.raises(TypeError,
                       match=r"^layer must be a str \(a name from list\(\)\), got int 123$"):
        client.dequantize(123)
    with pytest.raises(TypeError, match=r"^name must be a str"):
        client.read_tensor(b"model.norm.weight")
    # At the call, not at the first item of the iterator it returns.
    with pytest.raises(TypeError, match=r"^names\[1\] must be a str"):
        client.dequantize_layers([LAYER_Q, 7])
    with pytest.raises(ValueError, match=r"^dtype must be one of"):
        client.dequantize_layers([LAYER_Q], dtype="int8")


def test_module_dequantize_out_dash_writes_the_npy_to_stdout_and_a_directory_is_refused(
        client, server, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "dequantd", "dequantize", f"--server={server}",
                           "--tensor", LAYER_Q, "--dtype", "fp32", "--out", "-"],
                          capture_output=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    got = np.load(io.BytesIO(proc.stdout))
    want = client.dequantize(LAYER_Q, dtype="fp32")
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert proc.stderr.decode().endswith(" fp32 -> standard output\n"), proc.stderr
    assert list(tmp_path.iterdir()) == []  # no file named '-' or '-.npy'
    # /dev/stdout is the same as -, not a file /dev/stdout.npy.
    proc = subprocess.run([sys.executable, "-m", "dequantd", "dequantize", f"--server={server}",
                           "--tensor", LAYER_Q, "--dtype", "fp32", "--out", "/dev/stdout"],
                          capture_output=True)
    assert proc.returncode == 0, proc.stderr
    assert np.array_equal(np.load(io.BytesIO(proc.stdout)).view(np.uint32), want.view(np.uint32))
    assert not os.path.exists("/dev/stdout.npy")
    # Standard output closed (`>&-`): a usage error, not a traceback.
    proc = subprocess.run([sys.executable, "-m", "dequantd", "dequantize", f"--server={server}",
                           "--tensor", LAYER_Q, "--out", "-"], stderr=subprocess.PIPE, text=True,
                          preexec_fn=lambda: os.close(1))
    assert proc.returncode == 2
    assert "--out -: standard output is closed" in proc.stderr, proc.stderr
    # A reader that goes away early: one clear line, exit 1.
    with subprocess.Popen([sys.executable, "-m", "dequantd", "dequantize", f"--server={server}",
                           "--tensor", LAYER_Q, "--dtype", "fp32", "--out", "-"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=False) as p:
        p.stdout.read(10)
        p.stdout.close()
        err = p.stderr.read().decode()
        assert p.wait() == 1
    assert err == ("error: --out -: standard output was closed by its reader before the whole "
                   ".npy was written\n"), err
    proc = subprocess.run([sys.executable, "-m", "dequantd", "dequantize", f"--server={server}",
                           "--tensor", LAYER_Q, "--out", str(tmp_path)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert f"--out {tmp_path} is a directory: give the .npy file to write" in proc.stderr
    assert list(tmp_path.iterdir()) == []
    os.mkdir(tmp_path / "w.npy")  # --out w: np.save would write w.npy, a directory here
    proc = subprocess.run([sys.executable, "-m", "dequantd", "dequantize", f"--server={server}",
                           "--tensor", LAYER_Q, "--out", str(tmp_path / "w")],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert f"--out {tmp_path / 'w.npy'} is a directory" in proc.stderr, proc.stderr


def test_cli_ctrl_c_during_a_call_exits_130_without_a_traceback(tmp_path):
    """A peer that accepts the connection and never answers: the CLI's call waits; SIGINT then
    ends it with exit status 130 and one line on stderr, as a shell reports Ctrl-C."""
    import signal
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        proc = subprocess.Popen([sys.executable, "-m", "dequantd", "dequantize",
                                 f"--server=127.0.0.1:{port}", f"--tensor={LAYER_Q}",
                                 f"--out={tmp_path / 'w.npy'}"],
                                stderr=subprocess.PIPE, text=True)
        listener.settimeout(60)
        conn, _ = listener.accept()  # the client is connecting: its call has started
        with conn:
            proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert stderr.strip() == "interrupted" and "Traceback" not in stderr, stderr
    assert not (tmp_path / "w.npy").exists()
