#!/usr/bin/env python3
"""What the Kubernetes schemas cannot check in deploy/kubernetes, against the Dockerfile:

  check_deploy.py RENDERED.yaml SERVICEMONITOR.yaml KUSTOMIZATION.yaml

RENDERED is `kubectl kustomize deploy/kubernetes`. Checks: kustomization.yaml lists every
manifest of its directory (the optional servicemonitor.yaml aside); the dequantd workload runs
as the Dockerfile's numeric USER, non-root, read-only root filesystem, no privilege escalation,
all capabilities dropped; its image can be loaded locally (a tag other than latest, pull policy
IfNotPresent or Never); CPU/memory requests, a memory limit and one nvidia.com/gpu; the grace
period outlasts --shutdown-deadline; the tune cache ($XDG_CACHE_HOME/dequantd of the Dockerfile)
is on a persistent volume; a ClusterIP and a headless Service select the pods and reach the gRPC
port; a PodDisruptionBudget covers them; the ServiceMonitor selects a Service with its port.
Needs PyYAML. Exit status 0 pass, 1 fail.
"""

import pathlib
import re
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]


def dockerfile_runtime():
    """USER and XDG_CACHE_HOME of the Dockerfile's last (runtime) stage."""
    stage = ROOT.joinpath("Dockerfile").read_text().split("\nFROM ")[-1]
    user = re.search(r"^USER (\S+)", stage, re.M).group(1)
    cache = re.search(r"^ENV XDG_CACHE_HOME=(\S+)", stage, re.M).group(1)
    return user, cache


def matches(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


def check(docs, monitor, kustomization):
    errors = []

    def expect(condition, message):
        if not condition:
            errors.append(message)

    directory = ROOT / "deploy" / "kubernetes"
    listed = set(kustomization["resources"])
    present = {p.name for p in directory.glob("*.yaml")} - {"kustomization.yaml",
                                                            "servicemonitor.yaml"}
    expect(listed == present, f"kustomization.yaml lists {sorted(listed)}, files {sorted(present)}")

    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    workload = next(d for d in docs if d["kind"] in ("StatefulSet", "Deployment"))
    pod = workload["spec"]["template"]
    labels = pod["metadata"]["labels"]
    spec = pod["spec"]
    container = next(c for c in spec["containers"] if c["name"] == "dequantd")
    user, cache = dockerfile_runtime()
    uid = int(user.split(":")[0])

    pod_sc, sc = spec.get("securityContext", {}), container.get("securityContext", {})
    expect(uid != 0, f"the Dockerfile's USER {user} is root")
    for where, ctx in (("pod", pod_sc), ("container", sc)):
        expect(ctx.get("runAsNonRoot") is True, f"{where} securityContext: runAsNonRoot")
        expect(ctx.get("runAsUser") == uid, f"{where} securityContext: runAsUser != {uid}")
    expect(sc.get("allowPrivilegeEscalation") is False, "allowPrivilegeEscalation is not false")
    expect(sc.get("readOnlyRootFilesystem") is True, "readOnlyRootFilesystem is not true")
    expect(sc.get("capabilities", {}).get("drop") == ["ALL"], "capabilities do not drop ALL")

    image = container["image"]
    expect(":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest"),
           f"image {image}: a :latest or missing tag is pulled Always")
    expect(container.get("imagePullPolicy") in ("IfNotPresent", "Never"),
           f"imagePullPolicy {container.get('imagePullPolicy')} cannot use a loaded image")

    requests = container["resources"].get("requests", {})
    limits = container["resources"].get("limits", {})
    expect("cpu" in requests and "memory" in requests, f"requests {requests}: cpu and memory")
    expect("memory" in limits, f"limits {limits}: memory")
    expect(str(limits.get("nvidia.com/gpu")) == "1", "limits: nvidia.com/gpu is not 1")
    expect(str(requests.get("nvidia.com/gpu", limits.get("nvidia.com/gpu"))) == "1",
           "requests: nvidia.com/gpu differs from the limit")

    deadline = next((float(a.split("=", 1)[1]) for a in container["args"]
                     if a.startswith("--shutdown-deadline=")), 5.0)
    expect(spec.get("terminationGracePeriodSeconds", 30) > deadline,
           f"terminationGracePeriodSeconds <= --shutdown-deadline {deadline}")

    mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
    volume = mounts.get(f"{cache}/dequantd")
    claims = {t["metadata"]["name"] for t in workload["spec"].get("volumeClaimTemplates", [])}
    pod_volumes = {v["name"]: v for v in spec.get("volumes", [])}
    persistent = volume in claims or any(
        k in pod_volumes.get(volume, {}) for k in ("persistentVolumeClaim", "hostPath"))
    expect(persistent, f"the tune cache {cache}/dequantd is not on a persistent volume")

    grpc_port = next(p for p in container["ports"] if p["name"] == "grpc")["containerPort"]
    services = by_kind.get("Service", [])
    for service in services:
        expect(matches(service["spec"]["selector"], labels),
               f"Service {service['metadata']['name']} does not select the pods")
    headless = [s for s in services if s["spec"].get("clusterIP") == "None"]
    cluster_ip = [s for s in services if s["spec"].get("clusterIP") != "None"]
    for kind, group in (("headless", headless), ("ClusterIP", cluster_ip)):
        expect(any(p.get("targetPort") in ("grpc", grpc_port)
                   for s in group for p in s["spec"]["ports"]),
               f"no {kind} Service reaches the gRPC port")
    if workload["kind"] == "StatefulSet":
        expect(workload["spec"]["serviceName"] in {s["metadata"]["name"] for s in headless},
               "the StatefulSet's serviceName is not the headless Service")

    pdbs = by_kind.get("PodDisruptionBudget", [])
    expect(any(matches(p["spec"]["selector"]["matchLabels"], labels) for p in pdbs),
           "no PodDisruptionBudget selects the pods")

    expect(monitor["apiVersion"] == "monitoring.coreos.com/v1"
           and monitor["kind"] == "ServiceMonitor", "servicemonitor.yaml is not a ServiceMonitor")
    for endpoint in monitor["spec"]["endpoints"]:
        expect(any(matches(monitor["spec"]["selector"]["matchLabels"],
                           s["metadata"].get("labels", {}))
                   and endpoint["port"] in {p["name"] for p in s["spec"]["ports"]}
                   for s in services),
               f"the ServiceMonitor's port {endpoint['port']} is on no Service it selects")
    return errors


def main():
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 1
    with open(sys.argv[1], encoding="utf-8") as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    with open(sys.argv[2], encoding="utf-8") as f:
        monitor = yaml.safe_load(f)
    with open(sys.argv[3], encoding="utf-8") as f:
        kustomization = yaml.safe_load(f)
    errors = check(docs, monitor, kustomization)
    for error in errors:
        print(f"check_deploy: FAIL: {error}")
    if not errors:
        print(f"check_deploy: PASS: {len(docs)} manifests and the ServiceMonitor agree with the "
              "Dockerfile and each other")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
