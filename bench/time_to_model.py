#!/usr/bin/env python3
"""Time to a ready model (issue 23 part 4): seconds from nothing to a transformers model whose
weights are on the device, for one model, each way, beside the ceilings measured in the same run.

Rows:
  (a) dequantd.torch.load_model from a running dequantd (first load: registration and tuning
      included; then a second load);
  (b) transformers' from_pretrained of the converted bf16 safetensors checkpoint (written by
      dequantd.convert, shards of --max-shard-size), from a warm page cache and cold (every file
      posix_fadvise(DONTNEED)ed first);
  (c) safetensors.torch.load_file(shard, device=DEVICE) of the same files, warm and cold;
  ceilings: reading the files (cold and warm, 64 MiB reads), one DequantizeLayers call of every
  layer into one (K, N) device buffer (dequantd's part of (a) with no transposes), the kernel
  alone (the Benchmark RPC's best variant per distinct shape, times the layers of that shape), a
  device-to-device copy of the bf16 bytes.

  time_to_model.py --server HOST:PORT --model AWQ_DIR --work DIR [--device cuda:0]
      [--max-shard-size 5GB] [--metrics URL] [--json OUT.json]

With --metrics (the server's /metrics URL) the loader's and the one-buffer rows also say how long
the server's kernels ran during them (dequantd_device_kernel_seconds_total: from the call's first
launch to its last kernel's end, CUDA events), so the call's time splits into kernel and the rest.

The server must serve AWQ_DIR (CUDA: --backend=cuda --shared-memory=cuda|all). bench/
time_to_model.sh makes the 8B-shaped checkpoint, starts the server and runs this on the H200
host in one call. Prints a markdown table (GB of bf16, seconds, GB/s) for docs/performance.md.
"""

import argparse
import gc
import glob
import json
import os
import time
import urllib.request

import torch

import dequantd
import dequantd.torch as dtorch


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def drop_page_cache(paths):
    """posix_fadvise(DONTNEED) on every file: its pages leave the page cache (where the kernel
    honours it; the cold read row shows whether it did)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_files(paths, chunk=64 << 20):
    total = 0
    buf = bytearray(chunk)
    view = memoryview(buf)
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while True:
                n = f.readinto(view)
                if not n:
                    break
                total += n
    return total


def kernel_seconds(url):
    """The server's dequantd_device_kernel_seconds_total summed over its devices (None without
    --metrics)."""
    if not url:
        return None
    with urllib.request.urlopen(url, timeout=10) as reply:
        body = reply.read().decode()
    total = 0.0
    for line in body.splitlines():
        if line.startswith("dequantd_device_kernel_seconds_total"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def kernel_note(before, after, calls=1):
    """", server kernel X ms" per call from two kernel_seconds readings, or ""."""
    if before is None or after is None:
        return ""
    return f", server kernel {(after - before) / calls * 1e3:.1f} ms"


def free(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--model", required=True, help="the AWQ checkpoint the server serves")
    parser.add_argument("--work", required=True, help="where the converted checkpoint goes")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--max-shard-size", default="5GB")
    parser.add_argument("--metrics", default=None,
                        help="the server's metrics URL, e.g. http://127.0.0.1:9400/metrics")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    rows = []  # (label, seconds, bytes, note)
    client = dequantd.Client(args.server)
    listing = client.list()
    info = client.info()
    bf16_layers = sum(l.in_features * l.out_features for l in listing.layers) * 2
    bf16_others = sum(t.bytes // (4 if t.dtype == "F32" else 2) * 2 for t in listing.other_tensors)
    bf16_bytes = bf16_layers + bf16_others
    print(f"model {args.model}: {len(listing.layers)} layers ({bf16_layers / 1e9:.2f} GB bf16), "
          f"{len(listing.other_tensors)} other tensors ({bf16_others / 1e9:.2f} GB bf16); server "
          f"backend {info.backend}, {info.devices[0]['name'] if info.devices else 'no GPU'}",
          flush=True)

    # Imports and the meta model once, untimed: every row below then starts with transformers
    # loaded (the first `import transformers` and model-class import take seconds).
    import transformers  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    # pylint: disable-next=protected-access
    dtorch._model_on_meta(dtorch.server_config(client), torch.bfloat16)

    # (a) the loader, twice.
    for attempt in ("first", "second"):
        free(device)
        k0 = kernel_seconds(args.metrics)
        t0 = time.perf_counter()
        model = dtorch.load_model(client, device=device, dtype=torch.bfloat16)
        sync(device)
        seconds = time.perf_counter() - t0
        k1 = kernel_seconds(args.metrics)
        r = model.dequantd_load_report
        rows.append((f"(a) dequantd.torch.load_model, {attempt} load", seconds, bf16_bytes,
                     f"build {r.build_seconds:.2f} s, allocate {r.allocate_seconds:.2f} s, "
                     f"dequantize {r.dequantize_seconds * 1e3:.1f} ms (registration "
                     f"{r.register_seconds * 1e3:.1f} ms, checks {r.check_seconds * 1e3:.1f} ms, "
                     f"calls {r.call_seconds * 1e3:.1f} ms; {r.dequantize_calls} calls"
                     f"{kernel_note(k0, k1)}"
                     f"{', (K, N) staging + device transpose' if r.transposed else ''}), "
                     f"ReadTensor {r.read_seconds:.2f} s ({r.other_bytes / 1e9:.2f} GB), "
                     f"assemble {r.assemble_seconds:.2f} s, in place {r.in_place}"))
        print(rows[-1], flush=True)
        del model
    free(device)

    # Ceiling: dequantd's part alone, every layer (K, N) into one device buffer, one call.
    flat = torch.empty(bf16_layers // 2, dtype=torch.bfloat16, device=device)
    views, off = {}, 0
    for l in listing.layers:
        n = l.in_features * l.out_features
        views[l.name] = flat[off:off + n].view(l.in_features, l.out_features)
        off += n
    client.dequantize_into_tensors(views)  # registration, tuning
    times = []
    k0 = kernel_seconds(args.metrics)
    for _ in range(5):
        t0 = time.perf_counter()
        client.dequantize_into_tensors(views, listing=listing)
        sync(device)
        times.append(time.perf_counter() - t0)
    k1 = kernel_seconds(args.metrics)
    rows.append(("ceiling: dequantize_into_tensors, every layer into one buffer, listing passed, "
                 "the empty list (median of 5)",
                 sorted(times)[2], bf16_layers, ("one DequantizeLayers call into a region"
                 if device.type == "cuda" else "streamed") + kernel_note(k0, k1, 5)))
    # The same call in the loader's orientation, (N, K) (nn.Linear's): the loader's call differs
    # from the row above in orientation and in writing 224 separate parameters; this row
    # separates the two.
    nk_views, off = {}, 0
    for l in listing.layers:
        n = l.in_features * l.out_features
        nk_views[l.name] = flat[off:off + n].view(l.out_features, l.in_features)
        off += n
    client.dequantize_into_tensors(nk_views, orientation="NK")  # tuning of the (N, K) shapes
    times = []
    k0 = kernel_seconds(args.metrics)
    for _ in range(5):
        t0 = time.perf_counter()
        client.dequantize_into_tensors(nk_views, orientation="NK", listing=listing)
        sync(device)
        times.append(time.perf_counter() - t0)
    k1 = kernel_seconds(args.metrics)
    rows.append(("ceiling: the same, (N, K) as the loader asks (median of 5)",
                 sorted(times)[2], bf16_layers,
                 ("one DequantizeLayers call into a region, orientation NK"
                  if device.type == "cuda" else "streamed, orientation NK")
                 + kernel_note(k0, k1, 5)))
    del nk_views
    if device.type == "cuda":
        dst = torch.empty_like(flat)
        dst.copy_(flat)
        sync(device)
        t0 = time.perf_counter()
        dst.copy_(flat)
        sync(device)
        rows.append(("ceiling: device-to-device copy of the layers' bf16 bytes",
                     time.perf_counter() - t0, bf16_layers, "one copy_"))
        del dst
    del views, flat
    free(device)

    # Ceiling: the kernel alone, from the Benchmark RPC (best variant per distinct shape), in the
    # layers' own orientation ((K, N) for AWQ) and in the loader's, (N, K) (the kernel its
    # dequantize phase runs; Client.benchmark refuses a server older than Benchmark's orientation,
    # and the row is left out).
    shapes = {}
    for l in listing.layers:
        shapes.setdefault((l.in_features, l.out_features), []).append(l.name)
    for orientation, label in ((None, "(K, N)"), ("NK", "(N, K), as the loader asks")):
        try:
            bench = client.benchmark(tensors=[names[0] for names in shapes.values()],
                                     output_dtypes=["bf16"], orientation=orientation)
            best = {}
            for row in bench["rows"]:
                if row.get("variant") == "copy" or not row.get("correct", False):
                    continue
                key = (int(row["in_features"]), int(row["out_features"]))
                best[key] = min(best.get(key, 1e9), float(row["median_seconds"]))
            if len(best) < len(shapes):
                print(f"kernel ceiling {label} not measured: {len(best)} of {len(shapes)} shapes")
                continue
            kernel = sum(best[key] * len(names) for key, names in shapes.items())
            rows.append((f"ceiling: kernel {label} (Benchmark RPC, best variant, summed over "
                         "layers)", kernel, bf16_layers, f"{len(best)} distinct shapes"))
        except (dequantd.DequantdError, KeyError) as e:
            print(f"kernel ceiling {label} not measured: {e}")

    # The converted bf16 checkpoint.
    out = os.path.join(args.work, "bf16")
    t0 = time.perf_counter()
    dequantd.convert(args.server, out, dtype="bf16", max_shard_size=args.max_shard_size)
    print(f"converted to {out} in {time.perf_counter() - t0:.1f} s", flush=True)
    files = sorted(glob.glob(os.path.join(out, "*.safetensors")))
    file_bytes = sum(os.path.getsize(f) for f in files)

    drop_page_cache(files)
    t0 = time.perf_counter()
    read_files(files)
    rows.append(("ceiling: read the files, cold (after fadvise DONTNEED)",
                 time.perf_counter() - t0, file_bytes, f"{len(files)} files, 64 MiB reads"))
    t0 = time.perf_counter()
    read_files(files)
    rows.append(("ceiling: read the files, warm page cache", time.perf_counter() - t0, file_bytes,
                 ""))

    def from_pretrained():
        try:
            import accelerate  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
            del accelerate  # only whether it is there: device_map needs it
            m = transformers.AutoModelForCausalLM.from_pretrained(
                out, dtype=torch.bfloat16, device_map={"": device}, local_files_only=True)
            how = "device_map"
        except ImportError:
            m = transformers.AutoModelForCausalLM.from_pretrained(
                out, dtype=torch.bfloat16, local_files_only=True).to(device)
            how = "then .to(device)"
        sync(device)
        return m, how

    for cache in ("warm", "cold"):
        free(device)
        if cache == "cold":
            drop_page_cache(files)
        else:
            read_files(files)
        t0 = time.perf_counter()
        m, how = from_pretrained()
        rows.append((f"(b) from_pretrained of the bf16 checkpoint, {cache} page cache",
                     time.perf_counter() - t0, file_bytes, how))
        print(rows[-1], flush=True)
        del m

    from safetensors.torch import load_file  # pylint: disable=import-outside-toplevel

    for cache in ("warm", "cold"):
        free(device)
        if cache == "cold":
            drop_page_cache(files)
        else:
            read_files(files)
        t0 = time.perf_counter()
        loaded = [load_file(f, device=str(device)) for f in files]
        sync(device)
        rows.append((f"(c) safetensors.torch.load_file(device={str(device)!r}), {cache}",
                     time.perf_counter() - t0, file_bytes, ""))
        print(rows[-1], flush=True)
        del loaded

    print("\n| row | GB (bf16) | seconds | GB/s | note |\n| --- | --- | --- | --- | --- |")
    for label, seconds, nbytes, note in rows:
        print(f"| {label} | {nbytes / 1e9:.2f} | {seconds:.4f} | {nbytes / seconds / 1e9:.1f} | "
              f"{note} |")
    a = min(s for label, s, _, _ in rows if label.startswith("(a)"))
    b = next(s for label, s, _, _ in rows if label.startswith("(b)") and "warm" in label)
    print(f"\n(b) warm / (a) best: {b / a:.1f}x (target >= 10x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": [dict(label=l, seconds=s, bytes=n, note=note)
                                for l, s, n, note in rows], "server": info.version,
                       "device": info.devices[0]["name"] if info.devices else "cpu",
                       "torch": torch.__version__, "transformers": transformers.__version__},
                      f, indent=1)
    client.close()


if __name__ == "__main__":
    main()
