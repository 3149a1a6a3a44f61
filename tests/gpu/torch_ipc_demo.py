#!/usr/bin/env python3
"""Same-host zero copy from PyTorch (issue 9): dequantd writes straight into a tensor the client
allocated (CUDA IPC) and into a client's POSIX shared memory, checked bit for bit against a numpy
reference of w = (q - z) * s; timed beside the ceilings measured in the same run.

  torch_ipc_demo.py make-model DIR        # writes DIR/config.json + model.safetensors
  torch_ipc_demo.py run --server HOST:PORT --model DIR [--reps N]

`run` needs dequantd started with --backend=cuda --shared-memory=all --model DIR, torch, numpy,
safetensors, grpcio and the stubs generated from proto/dequant/v1/dequant.proto on PYTHONPATH
(dequant_pb2, dequant_pb2_grpc). It prints the checks (each "ok" or "FAIL") and a table; exit 1
when a check fails.
"""

import argparse
import json
import os
import sys
import time
from multiprocessing import shared_memory

import numpy as np

LAYERS = {  # name: (K, N); group size 128, fp16 scales
    "small.proj": (512, 1024),
    "big.proj": (8192, 28672),  # 470 MB as fp16
}
GROUP = 128
ORDER = [0, 4, 1, 5, 2, 6, 3, 7]  # column 8c+i lives in nibble ORDER[i] of word c


def random_layer(K, N, seed):
    rng = np.random.default_rng(seed)
    qweight = rng.integers(0, 2**32, size=(K, N // 8), dtype=np.uint32).view(np.int32)
    qzeros = rng.integers(0, 2**32, size=(K // GROUP, N // 8), dtype=np.uint32).view(np.int32)
    scales = (rng.uniform(-0.05, 0.05, size=(K // GROUP, N))).astype(np.float16)
    return qweight, qzeros, scales


def unpack(words):
    """int32 (R, N/8) -> int32 (R, N) of nibbles in column order."""
    w = words.view(np.uint32)
    out = np.empty((w.shape[0], w.shape[1] * 8), dtype=np.int32)
    for i, nib in enumerate(ORDER):
        out[:, i::8] = ((w >> np.uint32(4 * nib)) & np.uint32(0xF)).astype(np.int32)
    return out


def reference(qweight, qzeros, scales):
    """fp16 (K, N): float32 (q - z) * s rounded once to fp16 (numpy rounds to nearest even)."""
    K = qweight.shape[0]
    z = np.repeat(unpack(qzeros), GROUP, axis=0)[:K]
    s = np.repeat(scales.astype(np.float32), GROUP, axis=0)[:K]
    return ((unpack(qweight) - z).astype(np.float32) * s).astype(np.float16)


def make_model(directory, layers=None, first_seed=0):
    """Writes an AWQ checkpoint of random `layers` ({prefix: (K, N)}; default LAYERS) to
    `directory`: model.safetensors (qweight, qzeros, scales per layer, seeds from `first_seed`)
    and config.json. Shared with multi_gpu_check.py."""
    from safetensors.numpy import save_file

    os.makedirs(directory, exist_ok=True)
    tensors = {}
    for seed, (name, (K, N)) in enumerate((layers or LAYERS).items(), start=first_seed):
        qweight, qzeros, scales = random_layer(K, N, seed)
        tensors[f"{name}.qweight"] = qweight
        tensors[f"{name}.qzeros"] = qzeros
        tensors[f"{name}.scales"] = scales
    save_file(tensors, os.path.join(directory, "model.safetensors"))
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                   "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": GROUP,
                                           "zero_point": True, "version": "gemm"}}, f)


class Checks:
    def __init__(self):
        self.failed = 0

    def expect(self, what, ok, detail=""):
        print(f"{'ok  ' if ok else 'FAIL'} {what}{': ' + detail if detail else ''}", flush=True)
        self.failed += 0 if ok else 1


def run(args):
    import grpc
    import torch
    from safetensors.numpy import load_file

    import dequant_pb2 as pb
    import dequant_pb2_grpc as pbg

    checks = Checks()
    stub = pbg.DequantServiceStub(grpc.insecure_channel(
        args.server, options=[("grpc.max_receive_message_length", 64 << 20)]))
    model = load_file(os.path.join(args.model, "model.safetensors"))
    dev = torch.device("cuda", 0)

    def call(request, layers=False):
        """Runs a region call; returns its headers. The reply is one message, sent with the OK
        status: Dequantize's carries `header`, DequantizeLayers' every layer's header in
        `layer_headers` (request order). Anything else (data, several messages) is a failure."""
        rpc = stub.DequantizeLayers if layers else stub.Dequantize
        replies = list(rpc(request))
        if len(replies) != 1 or replies[0].data:
            raise RuntimeError(f"a region call's reply was {len(replies)} messages, expected one "
                               "without data")
        reply = replies[0]
        if layers:
            if reply.HasField("header"):
                raise RuntimeError("a DequantizeLayers region reply carried `header`")
            return list(reply.layer_headers)
        if not reply.HasField("header") or reply.layer_headers:
            raise RuntimeError("a Dequantize region reply without its one header")
        return [reply.header]

    def code_of(fn):
        try:
            fn()
            return "OK"
        except grpc.RpcError as e:
            return f"{e.code().name}: {e.details()}"

    def ipc_handle(tensor):
        storage = tensor.untyped_storage()
        shared = storage._share_cuda_()
        handle, offset = shared[1], shared[3]
        # torch >= 2.5 prefixes the cudaIpcMemHandle_t with a version byte and a kind byte ('c':
        # a cudaMalloc block, 'e': an expandable segment, which CUDA IPC cannot open).
        if len(handle) == 66:
            assert handle[1:2] == b"c", f"not a cudaMalloc handle: kind {handle[1:2]!r}"
            handle = handle[2:]
        return handle, offset + tensor.storage_offset() * tensor.element_size()

    def register_tensor(name, tensor, size=None):
        handle, offset = ipc_handle(tensor)
        stub.RegisterCudaSharedMemory(pb.RegisterCudaSharedMemoryRequest(
            name=name, raw_handle=handle, device_id=0, offset=offset,
            byte_size=size or tensor.numel() * tensor.element_size()))

    expected = {}
    for name, (K, N) in LAYERS.items():
        t0 = time.perf_counter()
        expected[name] = reference(model[f"{name}.qweight"], model[f"{name}.qzeros"],
                                   model[f"{name}.scales"]).view(np.uint16)
        print(f"numpy reference {name} ({K}x{N}) in {time.perf_counter() - t0:.1f} s", flush=True)

    # --- 1. A torch tensor filled by dequantd (device region), bit for bit.
    K, N = LAYERS["small.proj"]
    small = torch.full((K, N), float("nan"), dtype=torch.float16, device=dev)
    register_tensor("small", small)
    headers = call(pb.DequantizeRequest(tensor="small.proj", output_region=pb.OutputRegion(
        name="small", offset=0)))
    torch.cuda.synchronize()  # the reply already means visible; this is the client's own stream
    got = small.cpu().numpy().view(np.uint16)
    checks.expect("device region: torch tensor equals the numpy reference bit for bit",
                  np.array_equal(got, expected["small.proj"]),
                  f"{np.count_nonzero(got != expected['small.proj'])} of {got.size} differ")
    checks.expect("device region: one header naming the region", len(headers) == 1 and
                  headers[0].region == "small" and headers[0].region_offset == 0)

    # --- 1b. DequantizeLayers into one torch tensor (grouped launch): one reply with every
    # layer's header, in request order, and each layer bit for bit at its region_offset.
    pair = torch.full((2, K, N), float("nan"), dtype=torch.float16, device=dev)
    register_tensor("pair", pair)
    headers = call(pb.DequantizeLayersRequest(tensors=["small.proj", "small.proj"],
                                              output_region=pb.OutputRegion(name="pair")),
                   layers=True)
    checks.expect("device region, DequantizeLayers: one reply with both layers' headers",
                  [(h.tensor, h.region, h.region_offset) for h in headers]
                  == [("small.proj", "pair", 0), ("small.proj", "pair", K * N * 2)],
                  str([(h.tensor, h.region, h.region_offset) for h in headers]))
    got = pair.cpu().numpy().view(np.uint16)
    checks.expect("device region, DequantizeLayers: both layers bit for bit",
                  np.array_equal(got[0], expected["small.proj"])
                  and np.array_equal(got[1], expected["small.proj"]))
    stub.UnregisterCudaSharedMemory(pb.UnregisterCudaSharedMemoryRequest(name="pair"))
    del pair

    # --- 2. CUDA safety cases.
    K2, N2 = LAYERS["big.proj"]
    too_small = torch.empty(1 << 19, dtype=torch.uint8, device=dev)  # half the small result
    register_tensor("tiny", too_small)
    c = code_of(lambda: call(pb.DequantizeRequest(tensor="small.proj",
                                                  output_region=pb.OutputRegion(name="tiny"))))
    checks.expect("device region too small -> INVALID_ARGUMENT naming region/offset/bytes",
                  c.startswith("INVALID_ARGUMENT") and '"tiny"' in c and "offset 0" in c, c)
    handle, offset = ipc_handle(too_small)
    c = code_of(lambda: stub.RegisterCudaSharedMemory(pb.RegisterCudaSharedMemoryRequest(
        name="other", raw_handle=handle, device_id=1, offset=offset, byte_size=16)))
    checks.expect("a device the backend does not use -> FAILED_PRECONDITION",
                  c.startswith("FAILED_PRECONDITION") and "device_id 1" in c, c)
    c = code_of(lambda: stub.RegisterCudaSharedMemory(pb.RegisterCudaSharedMemoryRequest(
        name="small", raw_handle=handle, device_id=0, offset=offset, byte_size=16)))
    checks.expect("a name taken -> ALREADY_EXISTS", c.startswith("ALREADY_EXISTS"), c)
    stub.UnregisterCudaSharedMemory(pb.UnregisterCudaSharedMemoryRequest(name="tiny"))
    c = code_of(lambda: call(pb.DequantizeRequest(tensor="small.proj",
                                                  output_region=pb.OutputRegion(name="tiny"))))
    checks.expect("after Unregister the name -> NOT_FOUND", c.startswith("NOT_FOUND"), c)
    c = code_of(lambda: stub.RegisterCudaSharedMemory(pb.RegisterCudaSharedMemoryRequest(
        name="past", raw_handle=handle, device_id=0, offset=offset, byte_size=60 << 30)))
    checks.expect("byte_size past the exported allocation -> INVALID_ARGUMENT", c.startswith(
        "INVALID_ARGUMENT") and "runs past its end" in c, c)
    c = code_of(lambda: stub.RegisterCudaSharedMemory(pb.RegisterCudaSharedMemoryRequest(
        name="junk", raw_handle=bytes(range(64)), device_id=0, offset=0, byte_size=16)))
    checks.expect("a handle the driver refuses -> INVALID_ARGUMENT", c.startswith(
        "INVALID_ARGUMENT") and "raw_handle" in c, c)
    del too_small  # freed only after Unregister: the server closed its mapping first

    # --- 3. The 470 MB layer: device region, host region, stream; ceilings.
    out_bytes = K2 * N2 * 2
    big = torch.empty((K2, N2), dtype=torch.float16, device=dev)
    register_tensor("big", big)
    request = pb.DequantizeRequest(tensor="big.proj", output_region=pb.OutputRegion(name="big"))

    def timed(fn, reps):
        fn()  # warm-up (tuning, allocation)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return float(np.median(times))

    rows = []
    t = timed(lambda: call(request), args.reps)
    rows.append(("Dequantize -> device region (call)", t))
    # What the Python client adds: an empty unary RPC and a 1 MB region call, many times each.
    small_request = pb.DequantizeRequest(tensor="small.proj",
                                         output_region=pb.OutputRegion(name="small"))
    python_floor = [
        ("python: empty unary RPC (SharedMemoryStatus)",
         timed(lambda: stub.SharedMemoryStatus(pb.SharedMemoryStatusRequest()), 200)),
        ("python: Dequantize 512x1024 -> device region", timed(lambda: call(small_request), 200)),
    ]
    got = big.cpu().numpy().view(np.uint16)
    checks.expect("device region 470 MB: bit for bit", np.array_equal(got, expected["big.proj"]))

    shm = shared_memory.SharedMemory(create=True, size=out_bytes)
    try:
        reply = stub.RegisterSystemSharedMemory(pb.RegisterSystemSharedMemoryRequest(
            name="host", key="/" + shm.name, offset=0, byte_size=out_bytes))
        print(f"host region pinned: {reply.pinned}")
        hreq = pb.DequantizeRequest(tensor="big.proj", output_region=pb.OutputRegion(name="host"))
        t = timed(lambda: call(hreq), args.reps)
        rows.append(("Dequantize -> host region (call)", t))
        host = np.ndarray((K2, N2), dtype=np.uint16, buffer=shm.buf)
        checks.expect("host region 470 MB: bit for bit", np.array_equal(host, expected["big.proj"]))
        del host
        stub.UnregisterSystemSharedMemory(pb.UnregisterSystemSharedMemoryRequest(name="host"))
    finally:
        shm.close()
        shm.unlink()

    def stream():
        total = 0
        for response in stub.Dequantize(pb.DequantizeRequest(tensor="big.proj",
                                                             chunk_bytes=4 << 20)):
            total += len(response.data)
        assert total == out_bytes

    rows.append(("Dequantize streamed (gRPC, python client)", timed(stream, max(1, args.reps // 2))))

    # Ceilings, same run: pinned device-to-host copy, device-to-device copy of the same bytes.
    pinned = torch.empty((K2, N2), dtype=torch.float16, pin_memory=True)
    src = torch.empty((K2, N2), dtype=torch.float16, device=dev)
    dst = torch.empty_like(src)

    def event_time(fn, reps):
        fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(reps):
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return float(np.median(times))

    d2h = event_time(lambda: pinned.copy_(src, non_blocking=True), args.reps)
    d2d = event_time(lambda: dst.copy_(src, non_blocking=True), args.reps)
    rows.append(("ceiling: pinned device-to-host copy", d2h))
    rows.append(("ceiling: device-to-device copy", d2d))

    print(f"\n{K2}x{N2} fp16, {out_bytes / 1e6:.0f} MB output, median of {args.reps}")
    print(f"{'path':46s} {'ms':>8s} {'output GB/s':>12s}")
    for label, seconds in rows:
        print(f"{label:46s} {seconds * 1e3:8.2f} {out_bytes / seconds / 1e9:12.1f}")
    dev_call = rows[0][1]
    host_call = rows[1][1]
    for label, seconds in python_floor:
        print(f"{label:46s} {seconds * 1e6:8.0f} us")
    print(f"host region call vs pinned D2H: {d2h / host_call:.2f}")
    print(f"device region call vs device copy (output bytes): {d2d / dev_call:.2f}")

    stub.UnregisterCudaSharedMemory(pb.UnregisterCudaSharedMemoryRequest(name=""))
    status = stub.SharedMemoryStatus(pb.SharedMemoryStatusRequest())
    checks.expect("every region unregistered", len(status.regions) == 0)
    print(f"checks failed: {checks.failed}")
    return 1 if checks.failed else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    mk = sub.add_parser("make-model")
    mk.add_argument("dir")
    rn = sub.add_parser("run")
    rn.add_argument("--server", required=True)
    rn.add_argument("--model", required=True)
    rn.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    if args.command == "make-model":
        make_model(args.dir)
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
