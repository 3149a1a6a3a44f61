#!/usr/bin/env python3
"""deploy/kubernetes/dequantd.yaml (Deployment or StatefulSet): probes and Prometheus annotations.

gRPC listens only after the model is loaded, uploaded and (--pretune) tuned, so the container
needs a startup probe on the gRPC health service that allows at least 10 minutes
(periodSeconds x failureThreshold) before liveness may kill it; liveness and readiness probe the
same port. The prometheus.io/port annotation and the metrics containerPort match the
--metrics-listen port, and the gRPC port matches --listen.

Usage: kubernetes_manifest_test.py MANIFEST. Exit status: 0 pass, 1 fail, 77 skipped (PyYAML,
Debian's python3-yaml, not installed).
"""

import sys

SKIP = 77
MIN_STARTUP_SECONDS = 600


def port_of(args, flag):
    for arg in args:
        if arg.startswith(f"--{flag}="):
            return int(arg.rsplit(":", 1)[1])
    raise AssertionError(f"no --{flag}= in args {args}")


def check(documents):
    deployment = next(d for d in documents
                      if d and d.get("kind") in ("Deployment", "StatefulSet"))
    pod = deployment["spec"]["template"]
    container = next(c for c in pod["spec"]["containers"] if c["name"] == "dequantd")
    grpc_port = port_of(container["args"], "listen")
    metrics_port = port_of(container["args"], "metrics-listen")
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": grpc_port, "metrics": metrics_port}, ports
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(metrics_port), annotations

    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert probe in container, f"no {probe}"
        assert container[probe].get("grpc", {}).get("port") == grpc_port, (probe, container[probe])
    startup = container["startupProbe"]
    # Kubernetes' defaults: periodSeconds 10, failureThreshold 3.
    allowed = startup.get("periodSeconds", 10) * startup.get("failureThreshold", 3)
    assert allowed >= MIN_STARTUP_SECONDS, \
        f"startupProbe allows {allowed} s < {MIN_STARTUP_SECONDS} s"
    return allowed


def main():
    try:
        import yaml  # pylint: disable=import-outside-toplevel
    except ImportError:
        print("SKIP: PyYAML (python3-yaml) not installed")
        return SKIP
    with open(sys.argv[1], encoding="utf-8") as f:
        documents = list(yaml.safe_load_all(f))
    try:
        allowed = check(documents)
    except (AssertionError, KeyError, StopIteration) as e:
        print(f"FAIL: {sys.argv[1]}: {type(e).__name__}: {e}")
        return 1
    print(f"PASS: startup probe allows {allowed} s; probes, ports and annotations agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
