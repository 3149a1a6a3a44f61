#!/usr/bin/env python3
"""Asks a gRPC server's standard health service (grpc.health.v1.Health/Check) for a service's
status, as a Kubernetes gRPC probe or grpc_health_probe does, and waits until it is SERVING.

  grpc_health.py TARGET [--service NAME] [--wait SECONDS]

Needs Debian's python3-grpcio. The request and the answer are encoded by hand (two one-field
messages), so no generated stubs are needed: HealthCheckRequest{service = 1 (string)},
HealthCheckResponse{status = 1 (enum): 0 UNKNOWN, 1 SERVING, 2 NOT_SERVING, 3 SERVICE_UNKNOWN}.
Exit status: 0 SERVING, 1 anything else when the wait ran out, 2 usage.
"""

import argparse
import sys
import time

import grpc

STATUS_NAMES = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def encode_request(service):
    data = service.encode()
    if len(data) > 127:
        raise ValueError("service name longer than 127 bytes")
    return (b"\x0a" + bytes([len(data)]) + data) if data else b""


def decode_status(response):
    # The only field: tag 0x08 (field 1, varint) and a one-byte value; empty = 0 (UNKNOWN).
    if not response:
        return 0
    if len(response) != 2 or response[0] != 0x08:
        raise ValueError(f"unexpected HealthCheckResponse bytes {response!r}")
    return response[1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("target")
    parser.add_argument("--service", default="")
    parser.add_argument("--wait", type=float, default=0)
    args = parser.parse_args()
    deadline = time.monotonic() + args.wait
    with grpc.insecure_channel(args.target) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        while True:
            try:
                status = STATUS_NAMES.get(decode_status(check(encode_request(args.service),
                                                              timeout=5)), "?")
            except grpc.RpcError as e:
                status = f"{e.code().name}: {e.details()}"
            if status == "SERVING" or time.monotonic() >= deadline:
                break
            time.sleep(0.5)
    print(f"grpc_health: {args.target} service {args.service!r}: {status}")
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main())
