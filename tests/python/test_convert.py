"""convert(): the bundled model to a plain Hugging Face checkpoint, every tensor checked against
an independent computation (the numpy reference on the checkpoint's packed tensors, read with the
safetensors library), the shard layout, config.json, the CLI, and resume after an interruption
(kept shards untouched, a corrupted one rewritten)."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import safetensors

import dequantd
from dequantd import reference
from dequantd.convert import MANIFEST
from conftest import MODEL, MXFP4_CASE, format_case_model, start_server, stop_server


class Interrupted(Exception):
    pass


def check_checkpoint(out_dir, model_tensors, dtype, max_bytes):
    """Every tensor of the converted checkpoint against the source checkpoint."""
    with open(os.path.join(out_dir, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(MODEL, "config.json")) as f:
        source = json.load(f)
    assert "quantization_config" not in config
    assert config["torch_dtype"] == {"bf16": "bfloat16", "fp16": "float16"}[dtype]
    source.pop("quantization_config")
    source.pop("torch_dtype", None)
    config.pop("torch_dtype")
    assert config == source  # everything else as the server's config.json
    with open(os.path.join(out_dir, "model.safetensors.index.json")) as f:
        index = json.load(f)
    layers = sorted(n[: -len(".qweight")] for n in model_tensors if n.endswith(".qweight"))
    parts = {f"{l}.{s}" for l in layers for s in ("qweight", "qzeros", "scales")}
    others = sorted(set(model_tensors) - parts)
    assert sorted(index["weight_map"]) == sorted([f"{l}.weight" for l in layers] + others)
    total = 0
    seen = set()
    for shard in sorted(set(index["weight_map"].values())):
        shard_bytes = 0
        # safetensors' own parser (numpy's safe_open cannot make bf16 arrays): name -> dtype
        # code, shape, bytes.
        with open(os.path.join(out_dir, shard), "rb") as f:
            tensors = safetensors.deserialize(f.read())
        for name, t in tensors:
            assert index["weight_map"][name] == shard
            seen.add(name)
            shape, data = tuple(t["shape"]), bytes(t["data"])
            shard_bytes += len(data)
            if name in model_tensors:  # copied unchanged
                want = model_tensors[name]
                assert (t["dtype"], shape) == ("F16", want.shape), name
                assert data == want.tobytes(), name
            else:
                layer = name[: -len(".weight")]
                want = reference.dequantize(model_tensors[f"{layer}.qweight"],
                                            model_tensors[f"{layer}.qzeros"],
                                            model_tensors[f"{layer}.scales"], dtype=dtype).T
                assert t["dtype"] == {"bf16": "BF16", "fp16": "F16"}[dtype], name
                assert shape == want.shape, name  # (out_features, in_features)
                assert data == np.ascontiguousarray(want).tobytes(), name
        assert shard_bytes <= max_bytes or len(tensors) == 1, shard
        total += shard_bytes
    assert seen == set(index["weight_map"])
    assert index["metadata"]["total_size"] == total


def test_convert_bf16_every_tensor_checked(server, model_tensors, tmp_path):
    out = str(tmp_path / "bf16")
    result = dequantd.convert(server, out, dtype="bf16", max_shard_size="100MB", progress=True)
    assert result.shards_kept == 0 and len(result.shards) >= 3
    assert result.tensors == 210 + len([n for n in model_tensors if not n.endswith(
        (".qweight", ".qzeros", ".scales"))])
    check_checkpoint(out, model_tensors, "bf16", 100 * 10**6)
    assert not [n for n in os.listdir(out) if n.endswith(".tmp")]


def test_convert_cli_fp16_then_resume_after_interruption(server, model_tensors, tmp_path):
    out = str(tmp_path / "fp16")
    max_bytes = 40 * 2**20
    written = []

    def stop_after_two(name, index, count):
        written.append(name)
        if index == 2:
            raise Interrupted()

    with pytest.raises(Interrupted):
        dequantd.convert(server, out, dtype="fp16", max_shard_size="40MiB",
                         on_shard_written=stop_after_two)
    assert len(written) == 2
    assert not os.path.exists(os.path.join(out, "model.safetensors.index.json"))
    with open(os.path.join(out, MANIFEST)) as f:
        assert sorted(json.load(f)["shards"]) == written
    first, second = (os.path.join(out, n) for n in written)
    first_stat = os.stat(first)
    # Corrupt the second shard (same size): resume must detect it and rewrite it.
    with open(second, "r+b") as f:
        f.seek(os.path.getsize(second) - 1)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 0xFF]))
    # A stale temporary file of an interrupted write is replaced too.
    with open(os.path.join(out, "model-00003-of-" + written[0][-17:-12] + ".safetensors.tmp"),
              "wb") as f:
        f.write(b"partial")

    proc = subprocess.run([sys.executable, "-m", "dequantd", "convert", f"--server={server}",
                           f"--out={out}", "--dtype=fp16", "--max-shard-size=40MiB",
                           "--no-progress"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "(1 kept from an earlier run)" in proc.stdout
    st = os.stat(first)
    assert (st.st_ino, st.st_mtime_ns) == (first_stat.st_ino, first_stat.st_mtime_ns)
    check_checkpoint(out, model_tensors, "fp16", max_bytes)
    assert not [n for n in os.listdir(out) if n.endswith(".tmp")]

    # A third run keeps everything.
    again = dequantd.convert(server, out, dtype="fp16", max_shard_size="40MiB")
    assert again.shards_kept == len(again.shards)


def test_convert_rejects_bad_arguments(server, tmp_path):
    with pytest.raises(ValueError):
        dequantd.convert(server, str(tmp_path), dtype="fp32")
    with pytest.raises(ValueError):
        dequantd.convert(server, str(tmp_path), max_shard_size="lots")
    assert dequantd.parse_size("5GB") == 5 * 10**9
    assert dequantd.parse_size("2GiB") == 2 * 2**30
    assert dequantd.parse_size(123) == 123
    proc = subprocess.run([sys.executable, "-m", "dequantd", "convert", "--server=127.0.0.1:1",
                           f"--out={tmp_path}", "--timeout=5"], capture_output=True, text=True)
    assert proc.returncode == 1 and "UNAVAILABLE" in proc.stderr


def test_convert_refuses_a_checkpoint_it_did_not_write(server, tmp_path):
    """The server's own model directory, and any directory with a checkpoint but no manifest of
    ours, are refused before anything is written (converting there replaced the quantized
    config.json and left the quantized shards beside the new ones)."""
    before = sorted(os.listdir(MODEL))
    with pytest.raises(ValueError, match="is the server's model directory"):
        dequantd.convert(server, MODEL)
    assert sorted(os.listdir(MODEL)) == before
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text("{}")
    (other / "model.safetensors").write_bytes(b"x")
    with pytest.raises(ValueError, match="holds config.json, model.safetensors and no "
                                         "dequantd-convert.json"):
        dequantd.convert(server, str(other))
    assert sorted(os.listdir(other)) == ["config.json", "model.safetensors"]
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    with pytest.raises(ValueError, match="exists and is not a directory"):
        dequantd.convert(server, str(a_file))
    proc = subprocess.run([sys.executable, "-m", "dequantd", "convert", f"--server={server}",
                           f"--out={other}"], capture_output=True, text=True)
    assert proc.returncode == 2 and "dequantd-convert.json" in proc.stderr, proc.stderr
    # Any file convert did not write (here dequantctl's per-layer .npy files); hidden files and
    # lost+found (a fresh volume's root) are not in the way.
    npy = tmp_path / "npy"
    npy.mkdir()
    (npy / "model.layers.0.mlp.down_proj.npy").write_bytes(b"x")
    with pytest.raises(ValueError, match="holds model.layers.0.mlp.down_proj.npy and no "):
        dequantd.convert(server, str(npy))
    assert os.listdir(npy) == ["model.layers.0.mlp.down_proj.npy"]
    volume = tmp_path / "volume"
    (volume / "lost+found").mkdir(parents=True)
    (volume / ".keep").write_text("")
    assert dequantd.convert(server, str(volume)).shards


def test_a_rerun_with_another_shard_size_removes_the_earlier_shards(server, tmp_path):
    out = tmp_path / "out"
    first = dequantd.convert(server, str(out), max_shard_size="100MiB")
    assert len(first.shards) > 1
    second = dequantd.convert(server, str(out), max_shard_size="5GB")
    assert second.shards == ["model-00001-of-00001.safetensors"]
    assert sorted(os.listdir(out)) == sorted(second.shards + [
        "config.json", "model.safetensors.index.json", MANIFEST])




def test_mxfp4_converts_to_transformers_expert_layout(tmp_path):
    """An MXFP4 (gpt-oss) checkpoint converts to transformers' bf16 GptOss layout: each MoE
    projection as "<prefix>" [E, in, out] (the server's KN result, no host transpose), bit-exact to
    transformers' own convert_moe_packed_tensors (the vectors' expected tensors); the biases are
    copied, no _blocks/_scales remain, config.json loses quantization_config."""
    model = format_case_model(MXFP4_CASE, tmp_path)
    proc, target = start_server(str(tmp_path), model_dir=str(model))
    try:
        out = tmp_path / "out"
        dequantd.convert(target, str(out), dtype="bf16")
    finally:
        stop_server(proc)
    with open(out / "model.safetensors.index.json") as f:
        index = json.load(f)
    tensors = {}
    for shard in set(index["weight_map"].values()):
        with open(out / shard, "rb") as f:
            tensors.update(dict(safetensors.deserialize(f.read())))
    with open(MXFP4_CASE + ".safetensors", "rb") as f:
        source = dict(safetensors.deserialize(f.read()))
    prefix = "model.layers.0.mlp.experts."
    for proj, shape in (("gate_up_proj", [2, 64, 64]), ("down_proj", [2, 32, 64])):
        t = tensors[prefix + proj]
        assert (t["dtype"], list(t["shape"])) == ("BF16", shape), proj
        assert bytes(t["data"]) == bytes(source[f"expected.{proj}.bf16"]["data"]), proj
        bias = f"{prefix}{proj}_bias"
        assert bytes(tensors[bias]["data"]) == bytes(source[bias]["data"]), bias
    assert not any(n.endswith(("_blocks", "_scales")) for n in tensors)
    with open(out / "config.json") as f:
        assert "quantization_config" not in json.load(f)


def test_mxfp4_one_expert_keeps_the_expert_layout(tmp_path):
    """A gpt-oss model of one expert (E = 1) converts as any E does: each MoE projection as
    "<prefix>" [1, in, out] (transformers' GptOssExperts parameter, no ".weight" suffix), equal to
    the first expert of transformers' own result."""
    from dequantd.safetensors_writer import ShardWriter

    with open(MXFP4_CASE + ".safetensors", "rb") as f:
        source = dict(safetensors.deserialize(f.read()))
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(MXFP4_CASE + ".config.json", model / "config.json")
    first = {}  # every model tensor cut to its first expert
    for name, t in source.items():
        if name.startswith("expected."):
            continue
        shape = tuple(t["shape"])
        data = bytes(t["data"])
        first[name] = (t["dtype"], (1,) + shape[1:], data[: len(data) // shape[0]])
    writer = ShardWriter(str(model / "model.safetensors"),
                         [(n, d, s) for n, (d, s, _) in sorted(first.items())])
    for n, (_, _, data) in sorted(first.items()):
        writer.add(n, memoryview(data))
    writer.finish()
    proc, target = start_server(str(tmp_path), model_dir=str(model))
    try:
        layers = {l.name: l for l in dequantd.Client(target).list().layers}
        out = tmp_path / "out"
        dequantd.convert(target, str(out), dtype="bf16")
    finally:
        stop_server(proc)
    prefix = "model.layers.0.mlp.experts."
    assert {l.experts for l in layers.values()} == {1}
    with open(out / "model.safetensors.index.json") as f:
        index = json.load(f)
    tensors = {}
    for shard in set(index["weight_map"].values()):
        with open(out / shard, "rb") as f:
            tensors.update(dict(safetensors.deserialize(f.read())))
    assert not any(n.endswith(".weight") for n in tensors)
    for proj, shape in (("gate_up_proj", [1, 64, 64]), ("down_proj", [1, 32, 64])):
        t = tensors[prefix + proj]
        assert (t["dtype"], list(t["shape"])) == ("BF16", shape), proj
        expected = bytes(source[f"expected.{proj}.bf16"]["data"])
        assert bytes(t["data"]) == expected[: len(expected) // 2], proj


def test_a_write_error_names_the_shard_file(tmp_path):
    """A full disk (here /dev/full under the writer) names the file: OSError from write() carries
    no path, and convert printed only "[Errno 28] No space left on device" (new-user review)."""
    from dequantd.safetensors_writer import ShardWriter  # pylint: disable=import-outside-toplevel

    path = str(tmp_path / "model-00001-of-00001.safetensors")
    writer = ShardWriter(path, [("t", "F16", (1024,))])
    # pylint: disable=protected-access,consider-using-with
    writer._file.close()
    writer._file = open("/dev/full", "wb", buffering=0)
    with pytest.raises(OSError, match="No space left on device: .*model-00001-of-00001"
                                      r"\.safetensors\.tmp") as raised:
        writer.add("t", memoryview(bytes(2048)))
    assert raised.value.errno == 28
    writer.abort()
