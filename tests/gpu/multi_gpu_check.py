#!/usr/bin/env python3
"""Several GPUs in one dequantd (issue 14): the checks multi_gpu_check.sh runs against a server.

  multi_gpu_check.py make-model DIR
  multi_gpu_check.py PHASE --server HOST:PORT --metrics HOST:PORT --model DIR [options]

Phases (each prints "ROW <check> | <ok|FAIL> | <detail>" lines, exit 1 when one failed):
  exact   every layer (Dequantize) and the whole model (one DequantizeLayers call) equal the numpy
          reference bit for bit; --expect-spread: the DequantizeLayers call ran kernels on every
          device in rotation (per-device kernel seconds grew on each)
  load    --clients C threads x --reps R Dequantize calls of random layers; every result exact;
          per-device kernel seconds / bytes deltas from /metrics (every device in rotation
          busy), and the aggregate kernel bytes per wall second (printed as RATE <bytes/s>)
  region  a torch tensor on CUDA device --region-device registered as a device region and filled
          by Dequantize; bit-exact, and only workers on that GPU ran kernels
  info    GetServerInfo: --expect-serving LABELS and --expect-failed LABELS (comma lists);
          --expect-split: every worker holds some layers and each layer exactly once
Stdlib + numpy + grpcio (+ torch for `region`). Stubs: dequant_pb2 on PYTHONPATH, else the
checked-in ones of client/python (found from this file's place in the repository).
"""

import argparse
import os
import random
import re
import sys
import threading
import time
import urllib.request

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_ipc_demo as demo  # noqa: E402  (random_layer, reference, GROUP)

# 8 layers of 4096 x 8192: 64 MiB of fp16 each, 512 MiB for the whole model, so one
# DequantizeLayers call of the whole model is cut into parts (>= 256 MiB each) over two GPUs.
LAYERS = {f"model.layers.{i}.mlp.proj": (4096, 8192) for i in range(8)}


def stubs():
    try:
        import dequant_pb2 as pb
        import dequant_pb2_grpc as pbg
    except ImportError:
        sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python", "src"))
        from dequantd._proto import dequant_pb2 as pb
        from dequantd._proto import dequant_pb2_grpc as pbg
    return pb, pbg


def make_model(directory):
    demo.make_model(directory, LAYERS, first_seed=100)


class Rows:
    def __init__(self):
        self.failed = 0

    def row(self, check, ok, detail=""):
        print(f"ROW {check} | {'ok' if ok else 'FAIL'} | {detail}", flush=True)
        self.failed += 0 if ok else 1


def scrape(metrics):
    """{(family, device): value} of the per-device families."""
    text = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10).read().decode()
    values = {}
    for line in text.splitlines():
        m = re.match(r'^(dequantd_device_\w+)\{device="([^"]+)"\} (\S+)$', line)
        if m:
            values[(m.group(1), m.group(2))] = float(m.group(3))
    return values


def delta(before, after, family):
    return {dev: after[(fam, dev)] - before.get((fam, dev), 0.0)
            for (fam, dev) in after if fam == family}


def references(model_dir):
    from safetensors.numpy import load_file
    model = load_file(os.path.join(model_dir, "model.safetensors"))
    return {name: demo.reference(model[f"{name}.qweight"], model[f"{name}.qzeros"],
                                 model[f"{name}.scales"]).view(np.uint16).reshape(-1)
            for name in LAYERS}


def fetch(stub, pb, name):
    parts, total = [], None
    for r in stub.Dequantize(pb.DequantizeRequest(tensor=name)):
        if r.HasField("header"):
            total = r.header.total_bytes
        if r.data:
            parts.append(r.data)
    data = b"".join(parts)
    assert total == len(data), f"{name}: {len(data)} of {total} bytes"
    return np.frombuffer(data, dtype=np.uint16)


def fetch_layers(stub, pb):
    results, current = {}, None
    for r in stub.DequantizeLayers(pb.DequantizeLayersRequest()):
        if r.HasField("header"):
            current = r.header.tensor
            results[current] = []
        if r.data:
            results[current].append(r.data)
    return {k: np.frombuffer(b"".join(v), dtype=np.uint16) for k, v in results.items()}


def serving_labels(stub, pb):
    info = stub.GetServerInfo(pb.GetServerInfoRequest())
    return [d.label for d in info.devices if d.serving], info


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("phase")
    ap.add_argument("dir", nargs="?")
    ap.add_argument("--server")
    ap.add_argument("--metrics")
    ap.add_argument("--model")
    ap.add_argument("--tag", default="")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--expect-spread", action="store_true")
    ap.add_argument("--region-device", type=int, default=0)
    ap.add_argument("--expect-serving", default="")
    ap.add_argument("--expect-failed", default="")
    ap.add_argument("--expect-split", action="store_true")
    args = ap.parse_args()
    if args.phase == "make-model":
        make_model(args.dir)
        return 0

    import grpc
    pb, pbg = stubs()
    stub = pbg.DequantServiceStub(grpc.insecure_channel(
        args.server, options=[("grpc.max_receive_message_length", 64 << 20)]))
    rows = Rows()
    tag = f"[{args.tag}] " if args.tag else ""
    refs = references(args.model) if args.phase in ("exact", "load", "region") else {}

    if args.phase == "exact":
        bad = [n for n in LAYERS if not np.array_equal(fetch(stub, pb, n), refs[n])]
        rows.row(f"{tag}Dequantize of every layer bit-exact", not bad, ",".join(bad))
        live, _ = serving_labels(stub, pb)
        before = scrape(args.metrics)
        got = fetch_layers(stub, pb)
        busy = delta(before, scrape(args.metrics), "dequantd_device_kernel_seconds_total")
        bad = [n for n in LAYERS if n not in got or not np.array_equal(got[n], refs[n])]
        rows.row(f"{tag}DequantizeLayers (whole model) bit-exact", not bad, ",".join(bad))
        detail = " ".join(f"{d}={busy.get(d, 0) * 1e3:.2f}ms" for d in live)
        if args.expect_spread:
            rows.row(f"{tag}DequantizeLayers spread over every GPU in rotation",
                     all(busy.get(d, 0) > 0 for d in live), "kernel time " + detail)
        else:
            print(f"INFO {tag}DequantizeLayers kernel time {detail}")

    elif args.phase == "load":
        live, _ = serving_labels(stub, pb)
        names = list(LAYERS)
        errors = []
        def client(seed):
            rng = random.Random(seed)
            for _ in range(args.reps):
                n = rng.choice(names)
                try:
                    if not np.array_equal(fetch(stub, pb, n), refs[n]):
                        errors.append(f"{n} differs")
                except Exception as e:  # noqa: BLE001 - reported as a failed row
                    errors.append(str(e)[:200])
        before = scrape(args.metrics)
        t0 = time.perf_counter()
        threads = [threading.Thread(target=client, args=(c,)) for c in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        after = scrape(args.metrics)
        busy = delta(before, after, "dequantd_device_kernel_seconds_total")
        moved = delta(before, after, "dequantd_device_kernel_bytes_total")
        calls = args.clients * args.reps
        rows.row(f"{tag}{args.clients} clients x {args.reps} calls: every result bit-exact",
                 not errors, "; ".join(errors[:3]))
        detail = " ".join(f"{d}: {busy.get(d, 0) / wall:.1%} busy, "
                          f"{moved.get(d, 0) / wall / 1e9:.1f} GB/s" for d in live)
        rows.row(f"{tag}every GPU in rotation busy under load", all(busy.get(d, 0) > 0 for d in live),
                 detail)
        rate = sum(moved.values()) / wall
        print(f"RATE {tag}{rate:.6e} wall {wall:.2f}s calls {calls}")

    elif args.phase == "region":
        import torch
        dev = torch.device("cuda", args.region_device)
        name = next(iter(LAYERS))
        K, N = LAYERS[name]
        out = torch.full((K, N), float("nan"), dtype=torch.float16, device=dev)
        storage = out.untyped_storage()._share_cuda_()
        handle, offset = storage[1], storage[3]
        if len(handle) == 66:
            handle = handle[2:]
        stub.RegisterCudaSharedMemory(pb.RegisterCudaSharedMemoryRequest(
            name="mgpu", raw_handle=handle, device_id=args.region_device, offset=offset,
            byte_size=K * N * 2))
        before = scrape(args.metrics)
        # The reply is one message, the header naming the region, sent with the OK status.
        replies = list(stub.Dequantize(pb.DequantizeRequest(
            tensor=name, output_region=pb.OutputRegion(name="mgpu", offset=0))))
        assert len(replies) == 1 and not replies[0].data and replies[0].header.region == "mgpu"
        busy = delta(before, scrape(args.metrics), "dequantd_device_kernel_seconds_total")
        torch.cuda.synchronize(dev)
        got = out.cpu().numpy().view(np.uint16).reshape(-1)
        rows.row(f"{tag}device region on GPU {args.region_device} bit-exact",
                 np.array_equal(got, refs[name]))
        ran = [d for d, s in busy.items() if s > 0]
        on_gpu = all(re.fullmatch(rf"cuda:{args.region_device}(\.\d+)?", d) for d in ran)
        rows.row(f"{tag}device region on GPU {args.region_device} written by a worker of that GPU",
                 bool(ran) and on_gpu, "kernels ran on " + ",".join(ran))
        stub.UnregisterCudaSharedMemory(pb.UnregisterCudaSharedMemoryRequest(name="mgpu"))

    elif args.phase == "info":
        live, info = serving_labels(stub, pb)
        for d in info.devices:
            print(f"INFO {tag}{d.label} ordinal {d.index} serving={d.serving} "
                  f"layers={d.resident_layers} bytes={d.resident_bytes} failure={d.failure!r}")
        want = [x for x in args.expect_serving.split(",") if x]
        rows.row(f"{tag}in rotation: {','.join(want)}", sorted(live) == sorted(want),
                 "GetServerInfo says " + ",".join(live))
        for label in [x for x in args.expect_failed.split(",") if x]:
            d = next((d for d in info.devices if d.label == label), None)
            m = scrape(args.metrics)
            ok = (d is not None and not d.serving and "injected" in d.failure
                  and m.get(("dequantd_device_serving", label)) == 0
                  and m.get(("dequantd_device_failures_total", label)) == 1)
            rows.row(f"{tag}{label} out of rotation (info + metrics)", ok,
                     d.failure if d is not None else "not listed")
        if args.expect_split:
            layers = [d.resident_layers for d in info.devices if d.serving]
            rows.row(f"{tag}split placement: each GPU holds part, each layer once",
                     all(n > 0 for n in layers) and sum(layers) == len(LAYERS),
                     f"layers per GPU {layers}")
    return 1 if rows.failed else 0


if __name__ == "__main__":
    sys.exit(main())
