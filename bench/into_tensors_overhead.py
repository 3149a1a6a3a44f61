#!/usr/bin/env python3
"""CPU-side Python overhead of Client.dequantize_into_tensors for the loader's whole-model call
(issue 23), on a machine without a GPU: 225 (N, K) bf16 views of one buffer shaped like
Llama-3-8B's quantized linears (32 blocks x q, k, v, o, gate, up, down, and lm_head), filled
with orientation "NK" as dequantd.torch.load_model fills them, through the real check_targets /
run code of dequantd.tensors with every GPU and RPC call faked:

- CUDA: the tensors are CPU tensors whose `device` says cuda:0 (a torch.Tensor subclass with
  torch-function dispatch off, so its other attributes cost what a real tensor's do);
  torch.cuda.device is a counting no-op context manager; dequantd._cuda.allocation_of /
  device_uuid / ipc_handle are counting fakes that answer from the buffer's address range.
- RPCs: a real dequantd.Client whose stub is replaced by prebuilt responses (ListTensors of the
  225 layers with their stored tensors and 66 other tensors, GetServerInfo with one CUDA device,
  SharedMemoryStatus with mode "cuda" and the registered regions, Register/Unregister, and the
  DequantizeLayers summary reply). The client's request building and response parsing are timed;
  the network, the server and the faked driver calls are not (their counts are printed: on the
  H200 each RPC is a loopback round trip plus the server's work, each allocation_of six
  cuPointerGetAttribute calls through ctypes).

Scenarios (each a median over --calls calls, after one untimed warm-up call):
  loader          what load_model's second load does: client.info() (server_config) and
                  client.list() untimed just before, then the timed call; the region stays
                  registered between calls. The listing is passed to the call when the client
                  accepts it (listing=), as load_model passes it.
  loader+register the same, with the buffer's region released after each call (load_model
                  unregisters it once the model is filled: every load registers it anew).
  plain           client.dequantize_into_tensors(views, orientation="NK") back to back, nothing
                  else.

Then per-phase inclusive microseconds per call (the loader scenario's timed call, with timing
wrappers on the phase functions: a little above the clean median) and, with --cprofile, the top
functions by own time in that call.

With --server HOST:PORT it also times, against that running dequantd, the three RPCs the check
made on every call before this was cut (ListTensors, GetServerInfo, SharedMemoryStatus): the
round trip and the server's work that the fakes leave out.

  python3 bench/into_tensors_overhead.py [--calls 50] [--cprofile] [--server HOST:PORT]
      [--json OUT.json]

Needs torch (CPU is enough) and the dequantd package (PYTHONPATH=client/python/src).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import cProfile
import functools
import inspect
import io
import json
import pstats
import statistics
import subprocess
import sys
import time

import torch

import dequantd
from dequantd import _cuda
from dequantd import client as client_module
from dequantd import tensors as dt
from dequantd._proto import dequant_pb2 as pb

CUDA0 = torch.device("cuda", 0)
UUID = "GPU-00000000-1111-2222-3333-444444444444"

# Llama-3-8B: hidden 4096, intermediate 14336, 32 blocks, 8 KV heads of 128.
HIDDEN, INTERMEDIATE, BLOCKS, KV, VOCAB = 4096, 14336, 32, 1024, 128256


def layer_shapes(scale: int):
    """[(name, K, N)] block by block (named_parameters' order), / scale."""
    h, i, kv, v = HIDDEN // scale, INTERMEDIATE // scale, KV // scale, VOCAB // scale
    out = []
    for b in range(BLOCKS):
        p = f"model.layers.{b}."
        out += [(p + "self_attn.q_proj", h, h), (p + "self_attn.k_proj", h, kv),
                (p + "self_attn.v_proj", h, kv), (p + "self_attn.o_proj", h, h),
                (p + "mlp.gate_proj", h, i), (p + "mlp.up_proj", h, i),
                (p + "mlp.down_proj", i, h)]
    out.append(("lm_head", h, v))
    return out


class FakeCudaTensor(torch.Tensor):
    """A CPU tensor that says it is on cuda:0, by `device` and `is_cuda` (everything else as a
    plain tensor's)."""
    __torch_function__ = torch._C._disabled_torch_function_impl  # pylint: disable=protected-access

    @property
    def device(self):  # pylint: disable=invalid-overridden-method
        return CUDA0

    @property
    def is_cuda(self):  # pylint: disable=invalid-overridden-method
        return True


class Counts(collections.Counter):
    pass


COUNTS = Counts()
TIMED = [False]  # phase wrappers record only inside the timed call
PROFILE = [None]  # a cProfile.Profile enabled around the timed call only


class FakeCudaDeviceContext:
    """torch.cuda.device stand-in: counts entries."""

    def __init__(self, device):
        self.device = device

    def __enter__(self):
        COUNTS["torch.cuda.device entered"] += 1
        return self

    def __exit__(self, *exc):
        return False


class FakeDriver:
    """dequantd._cuda's driver calls, answered from the known buffers' address ranges."""

    def __init__(self):
        self.buffers = []  # (base, size, buffer_id)

    def add(self, base, size, buffer_id):
        self.buffers.append((base, size, buffer_id))

    def allocation_of(self, ptr):
        COUNTS["_cuda.allocation_of"] += 1
        for base, size, buffer_id in self.buffers:
            if base <= ptr < base + size:
                return _cuda.Allocation(base=base, size=size, device=0, buffer_id=buffer_id,
                                        ipc_capable=True, context=0)
        raise _cuda.CudaError("cuPointerGetAttribute(2)", 1, "CUDA_ERROR_INVALID_VALUE")

    @staticmethod
    def device_uuid(device):
        COUNTS["_cuda.device_uuid"] += 1
        return UUID

    @staticmethod
    def ipc_handle(allocation):
        COUNTS["_cuda.ipc_handle"] += 1
        return bytes(64)


class FakeCall:
    """A server-streaming call: iterable, cancel()."""

    def __init__(self, messages):
        self._messages = messages

    def __iter__(self):
        return iter(self._messages)

    def cancel(self):
        pass


class FakeStub:
    """The RPCs the tensors path makes, answered instantly with prebuilt responses."""

    def __init__(self, shapes, uuid: str):
        self.element = 2  # bf16
        self.listing = pb.ListTensorsResponse(model="/models/llama-8b-awq")
        for name, k, n in sorted(shapes):
            self.listing.tensors.append(pb.QuantizedTensorInfo(
                name=name, in_features=k, out_features=n, group_size=128,
                scale_dtype=pb.DTYPE_FP16, packed_bytes=k * n // 2 + k * n // 128 * 5 // 2,
                resident_on_device=True, format="awq_gemm", orientation=pb.ORIENTATION_KN,
                experts=1, stored_tensors=[
                    pb.StoredTensorInfo(role="qweight", dtype=pb.DTYPE_INT32, shape=[k, n // 8]),
                    pb.StoredTensorInfo(role="qzeros", dtype=pb.DTYPE_INT32,
                                        shape=[k // 128, n // 8]),
                    pb.StoredTensorInfo(role="scales", dtype=pb.DTYPE_FP16,
                                        shape=[k // 128, n])]))
        others = [("model.embed_tokens.weight", "F16", [VOCAB, HIDDEN]),
                  ("model.norm.weight", "F16", [HIDDEN])]
        for b in range(BLOCKS):
            others += [(f"model.layers.{b}.input_layernorm.weight", "F16", [HIDDEN]),
                       (f"model.layers.{b}.post_attention_layernorm.weight", "F16", [HIDDEN])]
        for name, dtype, shape in sorted(others):
            count = 1
            for d in shape:
                count *= d
            self.listing.other_tensors.append(pb.RawTensorInfo(name=name, dtype=dtype,
                                                               shape=shape, bytes=2 * count))
        device = pb.DeviceInfo(index=0, name="NVIDIA H200", compute_capability="9.0",
                               memory_bytes=150_000_000_000, driver_version="13.0")
        if uuid and "uuid" in pb.DeviceInfo.DESCRIPTOR.fields_by_name:
            setattr(device, "uuid", uuid)
        self.info = pb.GetServerInfoResponse(
            version="0.1.0", backend="cuda", devices=[device], model="/models/llama-8b-awq",
            tensor_count=len(shapes), cpu_threads=16,
            model_config_json=json.dumps({"model_type": "llama", "hidden_size": HIDDEN,
                                          "num_hidden_layers": BLOCKS}))
        self.nbytes = {name: k * n * self.element for name, k, n in shapes}
        self.all_bytes = sum(self.nbytes.values())
        self.regions = {}  # name -> (device, size)

    def _count(self, name):
        COUNTS[f"rpc {name}"] += 1

    def ListTensors(self, request, timeout=None, metadata=None):  # pylint: disable=invalid-name
        self._count("ListTensors")
        return self.listing

    def GetServerInfo(self, request, timeout=None, metadata=None):  # pylint: disable=invalid-name
        self._count("GetServerInfo")
        return self.info

    def SharedMemoryStatus(self, request, timeout=None, metadata=None):  # pylint: disable=invalid-name
        self._count("SharedMemoryStatus")
        return pb.SharedMemoryStatusResponse(
            regions=[pb.SharedMemoryRegionInfo(name=n, kind="device", device_id=d, byte_size=s,
                                               owner="ipv4:127.0.0.1:1")
                     for n, (d, s) in sorted(self.regions.items())],
            mode="cuda", max_regions=64, max_bytes=64 << 30)

    def RegisterCudaSharedMemory(self, request, timeout=None, metadata=None):  # pylint: disable=invalid-name
        self._count("RegisterCudaSharedMemory")
        self.regions[request.name] = (request.device_id, request.byte_size)
        return pb.RegisterCudaSharedMemoryResponse()

    def UnregisterCudaSharedMemory(self, request, timeout=None, metadata=None):  # pylint: disable=invalid-name
        self._count("UnregisterCudaSharedMemory")
        released = 1 if self.regions.pop(request.name, None) else 0
        return pb.UnregisterCudaSharedMemoryResponse(released=released)

    def DequantizeLayers(self, request, timeout=None, metadata=None):  # pylint: disable=invalid-name
        self._count("DequantizeLayers")
        count = len(request.tensors) or len(self.nbytes)  # no names: every layer
        total = (self.all_bytes if count == len(self.nbytes)
                 else sum(self.nbytes[n] for n in request.tensors))
        region = request.output_region
        return FakeCall([pb.DequantizeResponse(region_summary=pb.RegionSummary(
            layer_count=count, total_bytes=total, region=region.name,
            region_offset=region.offset, dtype=request.output_dtype,
            orientation=request.orientation or pb.ORIENTATION_KN, backend="cuda",
            kernel="fake"))])


def make_views(shapes, driver):
    """The loader's parameters: (N, K) views of one flat bf16 buffer, as FakeCudaTensors, laid
    out in the listing's order (sorted by name, FakeStub's) as load_model lays them out: its
    call of every layer in that order sends the empty list of names."""
    total = sum(k * n for _, k, n in shapes)
    flat = torch.empty(total, dtype=torch.bfloat16)  # untouched: no pages are committed
    driver.add(flat.data_ptr(), total * 2, buffer_id=1)
    views, offset = {}, 0
    for name, k, n in sorted(shapes):
        views[name] = flat[offset:offset + k * n].view(n, k).as_subclass(FakeCudaTensor)
        offset += k * n
    return flat, views


# Phase functions timed by wrappers (those that exist in this version of the package).
PHASES = [
    (dt, "check_targets"),
    (dt, "_check_targets"),
    (client_module.Client, "list"),
    (client_module.Client, "info"),
    (client_module.Client, "shared_memory_status"),
    (dt, "_check_cuda_targets"),
    (dt, "_check_server_facts"),
    (dt, "_check_no_overlap"),
    (dt, "run"),
    (dt, "_runs"),
    (dt, "_run_regions"),
    (dt.RegionCache, "region_for_run"),
    (dt.RegionCache, "region_for"),
    (client_module.Client, "_region_layers_summary"),
    (dt, "check_summary"),
]


@contextlib.contextmanager
def phase_timers(totals):
    saved = []
    for owner, name in PHASES:
        fn = owner.__dict__.get(name)
        if fn is None:
            continue

        def wrapper(*args, __fn=fn, __name=name, **kwargs):
            if not TIMED[0]:
                return __fn(*args, **kwargs)
            t0 = time.perf_counter_ns()
            try:
                return __fn(*args, **kwargs)
            finally:
                totals[__name] += time.perf_counter_ns() - t0
                totals[__name + " calls"] += 1

        saved.append((owner, name, fn))
        setattr(owner, name, functools.wraps(fn)(wrapper))
    try:
        yield
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50, help="timed calls per scenario")
    parser.add_argument("--scale", type=int, default=1,
                        help="divide every dimension by this (the buffer is 15 GB of untouched "
                             "virtual memory at 1)")
    parser.add_argument("--uuid", action="store_true",
                        help="the server reports device UUIDs (a proto with DeviceInfo.uuid): "
                             "the client then compares them with _cuda.device_uuid")
    parser.add_argument("--cprofile", action="store_true", help="print cProfile's top functions")
    parser.add_argument("--server", default=None,
                        help="a running dequantd: time its ListTensors, GetServerInfo and "
                             "SharedMemoryStatus round trips too")
    parser.add_argument("--json", default=None, help="write the numbers here")
    args = parser.parse_args()
    rpcs = time_rpcs(args.server, args.calls) if args.server else {}

    shapes = layer_shapes(args.scale)
    driver = FakeDriver()
    torch.cuda.device = FakeCudaDeviceContext  # only this process's view
    _cuda.allocation_of = driver.allocation_of
    _cuda.device_uuid = driver.device_uuid
    _cuda.ipc_handle = driver.ipc_handle

    client = dequantd.Client("127.0.0.1:9")  # never connected: the stub below answers
    stub = FakeStub(shapes, UUID if args.uuid else "")
    client._stub = stub  # pylint: disable=protected-access
    client._region_stub = stub  # pylint: disable=protected-access
    client._orientation = (True, "")  # pylint: disable=protected-access  (probed once per client)
    flat, views = make_views(shapes, driver)
    takes_listing = "listing" in inspect.signature(client.dequantize_into_tensors).parameters

    def loader_call(release=False):
        client.info()        # load_model: server_config
        listing = client.list()  # load_model: its own listing
        extra = {"listing": listing} if takes_listing else {}
        COUNTS.clear()
        TIMED[0] = True
        if PROFILE[0] is not None:
            PROFILE[0].enable()
        t0 = time.perf_counter_ns()
        client.dequantize_into_tensors(views, orientation="NK", **extra)
        elapsed = time.perf_counter_ns() - t0
        if PROFILE[0] is not None:
            PROFILE[0].disable()
        TIMED[0] = False
        counts = dict(COUNTS)
        if release:
            client._regions_cache().release_tensor(flat)  # pylint: disable=protected-access
        return elapsed, counts

    def plain_call():
        COUNTS.clear()
        t0 = time.perf_counter_ns()
        client.dequantize_into_tensors(views, orientation="NK")
        return time.perf_counter_ns() - t0, dict(COUNTS)

    scenarios = {"loader": lambda: loader_call(False),
                 "loader+register": lambda: loader_call(True),
                 "plain": plain_call}
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=False).stdout.strip()
    except OSError:
        commit = ""
    print(f"dequantize_into_tensors, {len(shapes)} (N, K) bf16 views of one buffer, orientation "
          f"NK, faked GPU and RPCs; torch {torch.__version__}, Python "
          f"{sys.version.split()[0]}, commit {commit or '?'}; listing passed: {takes_listing}")
    results = {}
    for label, fn in scenarios.items():
        fn()  # warm-up: registration, caches
        times, counts = [], None
        for _ in range(args.calls):
            elapsed, counts = fn()
            times.append(elapsed / 1000)
        results[label] = {"median_us": statistics.median(times), "min_us": min(times),
                          "counts_per_call": counts}
        print(f"  {label:16s} median {statistics.median(times):8.0f} us  min {min(times):8.0f} us"
              f"   per call: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))

    totals = collections.Counter()
    with phase_timers(totals):
        for _ in range(args.calls):
            scenarios["loader"]()
    print("phases (loader scenario, inclusive us per call, with timing wrappers):")
    phases = {}
    for _, name in PHASES:
        if totals[name + " calls"]:
            per = totals[name] / 1000 / args.calls
            calls = totals[name + " calls"] / args.calls
            phases[name] = {"us": per, "calls": calls}
            print(f"  {name:24s} {per:8.1f} us  ({calls:g} calls)")
    results["phases_loader"] = phases

    if args.cprofile:
        profile = PROFILE[0] = cProfile.Profile()
        for _ in range(args.calls):
            scenarios["loader"]()
        PROFILE[0] = None
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(25)
        print(out.getvalue())
    if rpcs:
        print(f"real RPCs against {args.server} (median us per call, including parsing):")
        for name, us in rpcs.items():
            print(f"  {name:24s} {us:8.0f} us")
        results["rpcs_us"] = rpcs
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"commit": commit, "layers": len(shapes), "calls": args.calls,
                       "listing_passed": takes_listing, "results": results}, f, indent=1)


def time_rpcs(target, calls):
    """Median microseconds of list(), info() and shared_memory_status() against `target`
    (before any faking: a plain client)."""
    out = {}
    with dequantd.Client(target) as real:
        layers = len(real.list().layers)
        for label, fn in ((f"list ({layers} layers)", real.list), ("info", real.info),
                          ("shared_memory_status", real.shared_memory_status)):
            fn()
            times = []
            for _ in range(calls):
                t0 = time.perf_counter_ns()
                fn()
                times.append((time.perf_counter_ns() - t0) / 1000)
            out[label] = statistics.median(times)
    return out


if __name__ == "__main__":
    main()
