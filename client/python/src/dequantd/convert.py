"""Whole-model conversion: a dequantd server's AWQ checkpoint -> a plain Hugging Face checkpoint
directory (fp16 or bf16 safetensors shards + index + config.json), resumable and atomic.

Layout written to OUT:
  model-0000i-of-0000n.safetensors   every quantized layer L as "L.weight" (out_features,
                                     in_features) in the target dtype (requested from the
                                     server as ORIENTATION_NK: its kernel writes the (N, K)
                                     result, no transpose here), and every other tensor of the
                                     checkpoint (embeddings, norms, biases, lm_head) with its
                                     stored dtype, shape and bytes unchanged; a layer of a
                                     format of stacked experts (mxfp4: gpt-oss's MoE
                                     projections L_blocks / L_scales) as "L" (E, in_features,
                                     out_features) for any E, 1 included: transformers'
                                     GptOssExperts parameters (mlp.experts.gate_up_proj, no
                                     ".weight"), its bf16 layout (requested as
                                     ORIENTATION_KN). Tensors sorted by
                                     name, packed greedily into shards of at most max_shard_size
                                     bytes of tensor data (a larger single tensor gets a shard
                                     of its own).
  model.safetensors.index.json       {"metadata": {"total_size"}, "weight_map": {name: shard}}
  config.json                        the server's config.json without "quantization_config",
                                     with "torch_dtype" = "float16" / "bfloat16"
  dequantd-convert.json              the manifest: the plan's fingerprint and, per finished
                                     shard, its size and sha256

Resume: a rerun with the same server model, dtype and shard size keeps every shard the manifest
lists whose size and sha256 still match and writes the rest. Atomic: every file is written to
NAME.tmp, fsynced and renamed; the manifest is updated after each shard; index and config.json
are written last, so a directory with them is complete.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from typing import Any, Callable, Dict, List, Optional, Tuple, Union


from . import dtypes
from .client import Client, _Progress
from .parameters import layer_parameter
from .safetensors_writer import ShardWriter, file_sha256

MANIFEST = "dequantd-convert.json"
INDEX = "model.safetensors.index.json"
TORCH_DTYPE = {"fp16": "float16", "bf16": "bfloat16"}
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40}


def parse_size(size: Union[int, str]) -> int:
    """Bytes of "5GB" (10^9, as Hugging Face counts), "500MiB" (2^20), "1000" or an int.
    Raises ValueError for anything else or a size < 1."""
    if isinstance(size, int):
        value = size
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*", size.upper())
        if m is None or m.group(2) not in _UNITS:
            raise ValueError(f"max shard size {size!r}: want e.g. 5GB, 500MB, 2GiB or bytes")
        value = int(float(m.group(1)) * _UNITS[m.group(2)])
    if value < 1:
        raise ValueError(f"max shard size must be >= 1 byte, not {size!r}")
    return value


@dataclasses.dataclass(frozen=True)
class _Entry:
    name: str                # output tensor name
    source: str              # layer prefix (layer) or tensor name (raw)
    is_layer: bool
    dtype: str               # safetensors code written
    shape: Tuple[int, ...]
    bytes: int


@dataclasses.dataclass(frozen=True)
class ConvertResult:
    """What convert wrote: the directory, shard file names, tensor count, tensor bytes, and how
    many shards were kept from an earlier run (verified by size and sha256)."""
    out_dir: str
    shards: List[str]
    tensors: int
    total_bytes: int
    shards_kept: int


def _plan(listing: Any, dtype: str, max_bytes: int) -> List[List[_Entry]]:
    code = {"fp16": "F16", "bf16": "BF16"}[dtype]
    entries: Dict[str, _Entry] = {}
    for layer in listing.layers:
        param = layer_parameter(layer)  # "<name>.weight" (N, K), or gpt-oss's experts [E, K, N]
        name, shape = param.name, param.shape
        entries[name] = _Entry(name, layer.name, True, code, shape,
                               layer.experts * layer.out_features * layer.in_features * 2)
    for t in listing.other_tensors:
        if t.name in entries:
            raise ValueError(f"tensor {t.name} is both a stored tensor and a dequantized layer")
        entries[t.name] = _Entry(t.name, t.name, False, t.dtype, tuple(t.shape), t.bytes)
    shards: List[List[_Entry]] = []
    size = 0
    for name in sorted(entries):
        e = entries[name]
        if not shards or (size + e.bytes > max_bytes and shards[-1]):
            shards.append([])
            size = 0
        shards[-1].append(e)
        size += e.bytes
    return shards


def _atomic_write_text(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _kept_shards(out_dir: str, fingerprint: str) -> Dict[str, Dict[str, Any]]:
    """The manifest's finished shards whose files still match (size, sha256), if the manifest
    is of the same plan; else {}."""
    try:
        with open(os.path.join(out_dir, MANIFEST), encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return {}
    if manifest.get("plan") != fingerprint:
        return {}
    kept = {}
    for name, meta in manifest.get("shards", {}).items():
        path = os.path.join(out_dir, name)
        if (os.path.isfile(path) and os.path.getsize(path) == meta.get("bytes")
                and file_sha256(path) == meta.get("sha256")):
            kept[name] = meta
    return kept


_SHARD_NAME = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")


def _earlier_shards(out_dir: str, model_dir: str) -> List[str]:
    """Checks that `out_dir` may be written and returns the shard files an earlier convert into
    it wrote (its manifest's, whatever its plan), for removal once this one is complete. Raises
    ValueError for a path that is not a directory, the server's own model directory, or a
    directory that holds files (other than hidden ones and lost+found) with no manifest of ours:
    writing there would replace them (the quantized checkpoint itself, when it is the model the
    server reads) or leave them beside the new ones."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ValueError(f"out_dir {out_dir!r} exists and is not a directory")
    if (model_dir and os.path.isdir(model_dir)
            and os.path.realpath(out_dir) == os.path.realpath(model_dir)):
        raise ValueError(f"out_dir {out_dir!r} is the server's model directory: converting into "
                         "it would overwrite the quantized checkpoint; choose a new directory")
    if not os.path.isdir(out_dir):
        return []
    try:
        with open(os.path.join(out_dir, MANIFEST), encoding="utf-8") as f:
            shards = json.load(f).get("shards", {})
        return sorted(name for name in shards if _SHARD_NAME.fullmatch(name))
    except FileNotFoundError:
        pass
    except (OSError, ValueError, AttributeError) as e:
        raise ValueError(f"out_dir {out_dir!r}: its {MANIFEST} cannot be read ({e}); remove it "
                         "or choose a new directory") from None
    # Anything but hidden files and a file system's lost+found: files convert did not write
    # (a checkpoint, or e.g. dequantctl's .npy files), which it would replace or leave beside
    # the converted checkpoint.
    foreign = sorted(f for f in os.listdir(out_dir)
                     if not f.startswith(".") and f != "lost+found")
    if foreign:
        raise ValueError(f"out_dir {out_dir!r} holds {', '.join(foreign[:4])}"
                         f"{', ...' if len(foreign) > 4 else ''} and no {MANIFEST}: files "
                         "that dequantd convert did not write; convert into a new or empty "
                         "directory, or an earlier convert's output")
    return []


def _orientation(entry: _Entry) -> int:
    """The orientation a layer entry is requested in: (E, K, N) for stacked experts (3 dims),
    else (N, K)."""
    from ._proto import dequant_pb2 as pb  # pylint: disable=import-outside-toplevel

    return pb.ORIENTATION_KN if len(entry.shape) == 3 else pb.ORIENTATION_NK


def _run_from(shard: List[_Entry], i: int) -> List[_Entry]:
    """The layers from shard[i] (a layer) on, up to the first layer of another orientation."""
    run = []
    for e in shard[i:]:
        if e.is_layer:
            if _orientation(e) != _orientation(shard[i]):
                break
            run.append(e)
    return run


def _same_run(shard: List[_Entry], i: int) -> bool:
    """Whether layer shard[i] belongs to the run of the previous layer (same orientation)."""
    previous = [e for e in shard[:i] if e.is_layer]
    return bool(previous) and _orientation(previous[-1]) == _orientation(shard[i])


def _layer_bytes(assembler: Any, entry: _Entry) -> memoryview:
    """The served result in the entry's orientation, as bytes. A server that does not say it
    wrote it (one before DequantizeRequest.orientation, which serves (K, N)) is refused: no host
    transpose."""
    if assembler.orientation != _orientation(entry):
        raise ValueError(f"{entry.source}: the server did not serve the result in the orientation "
                         "asked for; it predates result orientations")
    shape = tuple(assembler.shape)
    if len(entry.shape) == 3 and entry.shape[0] == 1 and len(shape) == 2:
        shape = (1,) + shape  # one expert: the server's header is (K, N), the bytes the same
    if shape != entry.shape or assembler.code != entry.dtype:
        raise ValueError(f"{entry.source}: served {assembler.code} {assembler.shape}, "
                         f"planned {entry.dtype} {entry.shape}")
    return memoryview(assembler.buffer).cast("B")


def convert(server: Union[str, Client], out_dir: str, *, dtype: str = "bf16",
            max_shard_size: Union[int, str] = "5GB", progress: bool = False,
            on_shard_written: Optional[Callable[[str, int, int], None]] = None) -> ConvertResult:
    """Converts the model a dequantd server has loaded into a plain fp16/bf16 Hugging Face
    checkpoint directory (layout in this module's docstring). Resumable, atomic.

    Args:
        server: a "host:port" target or a Client.
        out_dir: the directory to write (created if missing).
        dtype: "bf16" or "fp16" for the dequantized layers (and config.json's torch_dtype).
            Other tensors keep their stored dtype.
        max_shard_size: most tensor bytes per shard: int or "5GB"/"500MB"/"2GiB".
        progress: show a tqdm bar of tensor bytes written (bytes/s).
        on_shard_written: called as (shard file name, index from 1, count) after each shard is
            renamed into place and recorded in the manifest.

    Returns:
        ConvertResult.

    Raises:
        ValueError: bad dtype or size; the server has no model; a name clash.
        DequantdError: a failed call.
        OSError: writing the directory.
    """
    if dtype not in TORCH_DTYPE:
        raise ValueError(f"dtype must be 'bf16' or 'fp16', not {dtype!r}")
    max_bytes = parse_size(max_shard_size)
    client = Client(server) if isinstance(server, str) else server
    try:
        info = client.info()
        if not info.model_config:
            raise ValueError(f"the server at {client.target} has no model loaded")
        listing = client.list()
        plan = _plan(listing, dtype, max_bytes)
        count = len(plan)
        names = [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]
        fingerprint = hashlib.sha256(json.dumps({
            "config": info.model_config, "dtype": dtype,
            "shards": [[dataclasses.astuple(e) for e in shard] for shard in plan],
        }, sort_keys=True).encode()).hexdigest()
        earlier = _earlier_shards(out_dir, info.model)
        os.makedirs(out_dir, exist_ok=True)
        done = _kept_shards(out_dir, fingerprint)
        kept = len(done)
        total = sum(e.bytes for shard in plan for e in shard)

        def save_manifest() -> None:
            _atomic_write_text(os.path.join(out_dir, MANIFEST), json.dumps(
                {"plan": fingerprint, "dtype": dtype, "max_shard_size": max_bytes,
                 "shards": done}, indent=1, sort_keys=True))

        save_manifest()
        bar = _Progress(progress, total, "convert")
        try:
            for index, (name, shard) in enumerate(zip(names, plan), start=1):
                if name in done:
                    bar.update(sum(e.bytes for e in shard))
                    continue
                _write_shard(client, os.path.join(out_dir, name), shard, dtype, bar, done)
                save_manifest()
                if on_shard_written is not None:
                    on_shard_written(name, index, count)
        finally:
            bar.close()

        weight_map = {e.name: name for name, shard in zip(names, plan) for e in shard}
        _atomic_write_text(os.path.join(out_dir, INDEX), json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
        config = {k: v for k, v in info.model_config.items() if k != "quantization_config"}
        config["torch_dtype"] = TORCH_DTYPE[dtype]
        _atomic_write_text(os.path.join(out_dir, "config.json"), json.dumps(config, indent=2) + "\n")
        for name in earlier:  # an earlier plan's shards this one did not write (other count)
            if name not in names:
                os.remove(os.path.join(out_dir, name))
        return ConvertResult(out_dir=out_dir, shards=names, tensors=len(weight_map),
                             total_bytes=total, shards_kept=kept)
    finally:
        if isinstance(server, str):
            client.close()


def _write_shard(client: Client, path: str, shard: List[_Entry], dtype: str, bar: _Progress,
                 done: Dict[str, Dict[str, Any]]) -> None:
    from ._proto import dequant_pb2 as pb  # pylint: disable=import-outside-toplevel

    writer = ShardWriter(path, [(e.name, e.dtype, e.shape) for e in shard],
                         metadata={"format": "pt", "converted_by": "dequantd"})
    try:
        # One DequantizeLayers call per run of layers (in shard order) of one orientation: NK,
        # or KN for stacked experts; a run's stream is read to its end before the next opens.
        stream: Any = iter(())
        for i, e in enumerate(shard):
            if e.is_layer and not _same_run(shard, i):
                for extra in stream:
                    raise ValueError(f"the server sent an unrequested layer {extra.name}")
                run = _run_from(shard, i)
                request = pb.DequantizeLayersRequest(output_dtype=dtypes.output_dtype(dtype),
                                                     tensors=[r.source for r in run],
                                                     orientation=_orientation(e))
                stream = client._layer_results(request)  # pylint: disable=protected-access
            if e.is_layer:
                assembler = next(stream)
                if assembler.name != e.source:
                    raise ValueError(f"expected layer {e.source}, got {assembler.name}")
                data = _layer_bytes(assembler, e)
            else:
                assembler = client._read_tensor(e.source)  # pylint: disable=protected-access
                if (assembler.code, assembler.shape) != (e.dtype, e.shape):
                    raise ValueError(f"{e.name}: served {assembler.code} {assembler.shape}, "
                                     f"listed {e.dtype} {e.shape}")
                data = memoryview(assembler.buffer)
            writer.add(e.name, data)
            bar.update(e.bytes)
        for extra in stream:
            raise ValueError(f"the server sent an unrequested layer {extra.name}")
        size, sha = writer.finish()
    except BaseException:
        writer.abort()
        raise
    done[os.path.basename(path)] = {"bytes": size, "sha256": sha}
