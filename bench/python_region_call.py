#!/usr/bin/env python3
"""The Python client's own cost on a region call (issue 23: the model loader's whole-model call
is one region call), against a running dequantd, with and without grpcio's single-threaded
server-streaming path (the client's region channel has "SingleThreadedUnaryStream" by default:
dequantd.client.REGION_CHANNEL_OPTIONS; ("SingleThreadedUnaryStream", 0) turns it off).

Each region call (Dequantize or DequantizeLayers into a registered region) is a server stream of
one message. The rows time, for the smallest layer of the served model into a host region (POSIX
shared memory, made and registered here), the client's p50 beside the server's mean handler time
for the same calls (dequantd_rpc_duration_seconds of the calls that ended OK, from --metrics), so
`client - server` is the transport and the Python client. GetServerInfo (unary, no work) is the
floor of one RPC.

  PYTHONPATH=client/python/src python3 bench/python_region_call.py --server HOST:PORT \
      --metrics http://HOST:PORT/metrics [--calls 300]

(or with the package installed: pip install ./client/python). The server needs
--shared-memory=host|all. Works on any backend (the layer is small: the server's time is mostly
its per-call work). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import time
import urllib.request
from typing import Any, Callable, Dict, Tuple

import grpc

import dequantd


def rpc_seconds(metrics_url: str, method: str) -> Tuple[float, float]:
    """(sum, count) of dequantd_rpc_duration_seconds for `method`'s calls that ended OK."""
    total = count = 0.0
    for line in urllib.request.urlopen(metrics_url, timeout=10).read().decode().splitlines():
        if (not line.startswith("dequantd_rpc_duration_seconds")
                or f'method="{method}"' not in line or 'code="OK"' not in line):
            continue
        family = line.split("{", 1)[0]
        if family.endswith("_sum"):
            total = float(line.split()[-1])
        elif family.endswith("_count"):
            count = float(line.split()[-1])
    return total, count


def timed(fn: Callable[[], object], calls: int, metrics_url: str,
          method: str) -> Tuple[float, float]:
    """(client p50 s, server mean s) over `calls` calls after 20 untimed ones."""
    for _ in range(20):
        fn()
    s0, n0 = rpc_seconds(metrics_url, method)
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    s1, n1 = rpc_seconds(metrics_url, method)
    if n1 - n0 != calls:
        raise SystemExit(f"{method}: the server counted {n1 - n0:.0f} calls ending OK, not "
                         f"{calls} (another client on this server?)")
    return statistics.median(times), (s1 - s0) / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--server", required=True)
    ap.add_argument("--metrics", required=True, help="the server's /metrics URL")
    ap.add_argument("--calls", type=int, default=300)
    args = ap.parse_args()

    probe = dequantd.Client(args.server)
    small = min(probe.list().layers, key=lambda l: l.in_features * l.out_features)
    nbytes = small.in_features * small.out_features * 2  # bf16
    key = f"/dequantd-bench-{os.getpid()}"
    region = f"bench-{os.getpid()}"
    channels: Tuple[Tuple[str, Tuple[Tuple[str, Any], ...]], ...] = (
        ("single-threaded region channel (default)", ()),
        ('multi-threaded ("SingleThreadedUnaryStream", 0)', (("SingleThreadedUnaryStream", 0),)),
    )
    rows: Dict[str, Dict[str, Tuple[float, float]]] = {}
    fd = os.open(f"/dev/shm{key}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    registered = False
    try:
        os.ftruncate(fd, mmap.PAGESIZE * ((nbytes + mmap.PAGESIZE - 1) // mmap.PAGESIZE))
        probe.register_system_shared_memory(region, key, nbytes)
        registered = True
        for label, options in channels:
            with dequantd.Client(args.server, options=options) as client:
                rows[label] = {
                    "GetServerInfo (unary)": timed(client.info, args.calls, args.metrics,
                                                   "GetServerInfo"),
                    "Dequantize into the region": timed(
                        lambda c=client: c.dequantize_into(region, small.name, dtype="bf16"),
                        args.calls, args.metrics, "Dequantize"),
                    "DequantizeLayers [1] into the region, summary": timed(
                        lambda c=client: c.dequantize_layers_into(
                            region, [small.name], dtype="bf16", reply="summary"),
                        args.calls, args.metrics, "DequantizeLayers"),
                }
    finally:
        if registered:
            probe.unregister_system_shared_memory(region)
        os.close(fd)
        os.unlink(f"/dev/shm{key}")
        probe.close()
    print(f"Python region calls: {small.name} ({small.in_features} x {small.out_features}, "
          f"{nbytes} B bf16), {args.calls} calls each, grpcio {grpc.__version__}\n")
    print("| channel | call | client p50 us | server mean us | client - server us |")
    print("|---|---|---:|---:|---:|")
    for label, calls in rows.items():
        for call, (client_s, server_s) in calls.items():
            print(f"| {label} | {call} | {client_s * 1e6:.0f} | {server_s * 1e6:.0f} | "
                  f"{(client_s - server_s) * 1e6:.0f} |")


if __name__ == "__main__":
    main()
