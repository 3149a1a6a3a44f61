#!/usr/bin/env python3
"""The Grafana dashboard and Prometheus config against a real Prometheus (issue 4, part 4).

Starts dequantd (CPU backend, a small generated checkpoint or $DEQUANTD_MODEL_DIR) and Debian's
Prometheus on 127.0.0.1, drives traffic with dequantctl (including failing calls), then:
  * `promtool check config` on deploy/prometheus/prometheus.yml;
  * `promtool check metrics` on a scrape of the server after it served traffic, and every sample
    on it a dequantd_ family (no exposer_* series of prometheus-cpp's Exposer);
  * every PromQL expression of deploy/grafana/dashboards/*.json (panel targets and templating
    queries) evaluated through Prometheus' /api/v1/query: status "success" and a non-empty
    result. Panels whose description starts with "[hardware-counters]" may return no data (the
    Benchmark RPC collects hardware counters only on a GPU, with CUPTI; this test runs the CPU
    backend); "[benchmark]" panels may return no data only when the Benchmark RPC answered
    UNIMPLEMENTED.

Exit status: 0 pass, 1 fail, 77 skipped (prometheus or promtool not installed; CI installs them
with scripts/install-deps.sh). Stdlib only. Every process started is stopped on exit.
"""

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

SKIP = 77
DEADLINE_SECONDS = 100  # the whole test; ctest's TIMEOUT is 120
HW_TAG = "[hardware-counters]"
BENCH_TAG = "[benchmark]"
# Grafana's built-in interval variables, for a 1 s scrape interval.
GRAFANA_VARIABLES = {
    "$__rate_interval": "15s",
    "$__interval": "1s",
    "$__range": "1m",
}


class Failure(Exception):
    pass


def log(message):
    print(f"observability: {message}", flush=True)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode("utf-8")


# --- a small AWQ GEMM checkpoint (kernels/awq_format.h), written with the stdlib -------------

def write_checkpoint(directory, layers, group_size):
    """layers: [(name, K, N)]. Random qweight/qzeros; finite fp16 scales in [-0.05, 0.05)."""
    rng = random.Random(4)
    tensors = []
    for name, k, n in layers:
        groups = k // group_size
        qweight = os.urandom(k * (n // 8) * 4)
        qzeros = os.urandom(groups * (n // 8) * 4)
        scales = b"".join(struct.pack("<e", rng.uniform(-0.05, 0.05)) for _ in range(groups * n))
        tensors += [(f"{name}.qweight", "I32", [k, n // 8], qweight),
                    (f"{name}.qzeros", "I32", [groups, n // 8], qzeros),
                    (f"{name}.scales", "F16", [groups, n], scales)]
    header, offset = {}, 0
    for tensor_name, dtype, shape, data in tensors:
        header[tensor_name] = {"dtype": dtype, "shape": shape,
                               "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    header_bytes = json.dumps(header).encode()
    header_bytes += b" " * (-len(header_bytes) % 8)
    with open(os.path.join(directory, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(header_bytes)))
        f.write(header_bytes)
        for *_, data in tensors:
            f.write(data)
    config = {"model_type": "llama", "quantization_config": {
        "quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True,
        "version": "gemm"}}
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)


# --- processes --------------------------------------------------------------------------------

class Processes:
    """Processes started by the test; stop_all() ends each (SIGTERM, then SIGKILL)."""

    def __init__(self):
        self.started = []

    def start(self, name, argv, log_path):
        log_file = open(log_path, "w")
        process = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL)
        self.started.append((name, process, log_file))
        return process

    def stop_all(self):
        for name, process, log_file in reversed(self.started):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    log(f"{name} did not stop on SIGTERM: killing it")
                    process.kill()
                    process.wait()
            log_file.close()
        self.started = []


def wait_for(predicate, what, timeout, interval=0.2):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise Failure(f"timed out after {timeout:.0f} s waiting for {what}")


def start_dequantd(processes, dequantd, model_dir, work):
    log_path = os.path.join(work, "dequantd.log")
    process = processes.start("dequantd", [
        dequantd, f"--model={model_dir}", "--listen=127.0.0.1:0",
        "--metrics-listen=127.0.0.1:0", "--backend=cpu", "--cpu-threads=2"], log_path)

    def ports():
        if process.poll() is not None:
            raise Failure(f"dequantd exited with {process.returncode}:\n{open(log_path).read()}")
        text = open(log_path).read()
        grpc = re.search(r"listening on 127\.0\.0\.1:(\d+)", text)
        metrics = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", text)
        return (int(grpc.group(1)), int(metrics.group(1))) if grpc and metrics else None

    return wait_for(ports, "dequantd to listen", 30)


def run_ctl(dequantctl, grpc_port, *args, expect_ok=True):
    """Runs dequantctl; expect_ok True / False checks its exit status, None does not."""
    argv = [dequantctl, f"--server=127.0.0.1:{grpc_port}", "--deadline=30", *args]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if expect_ok is True and result.returncode != 0:
        raise Failure(f"{' '.join(argv[1:])} failed ({result.returncode}): {result.stderr}")
    if expect_ok is False and result.returncode == 0:
        raise Failure(f"{' '.join(argv[1:])} succeeded but was expected to fail")
    return result


def drive_traffic(dequantctl, grpc_port, layer_names):
    """Successful GetServerInfo, ListTensors, Dequantize and Benchmark calls and a failing
    Dequantize (NOT_FOUND); DequantizeLayers is not called. Returns whether Benchmark is
    implemented."""
    run_ctl(dequantctl, grpc_port, "info")
    run_ctl(dequantctl, grpc_port, "list")
    for name in layer_names:
        for dtype in ("fp16", "fp32"):
            run_ctl(dequantctl, grpc_port, "dequantize", f"--tensor={name}", f"--dtype={dtype}")
    # Errors that reach the server: NOT_FOUND (unknown tensor).
    failed = run_ctl(dequantctl, grpc_port, "dequantize", "--tensor=no.such.layer",
                     expect_ok=False)
    if "NOT_FOUND" not in failed.stderr:
        raise Failure(f"unknown tensor: expected NOT_FOUND, got: {failed.stderr.strip()}")
    bench = run_ctl(dequantctl, grpc_port, "benchmark", "--shapes=256x256", "--trials=1",
                    "--runs=1", expect_ok=None)
    if bench.returncode == 0:
        return True
    if "UNIMPLEMENTED" in bench.stderr:
        return False
    raise Failure(f"benchmark failed: {bench.stderr.strip()}")


# --- Prometheus -------------------------------------------------------------------------------

def start_prometheus(processes, prometheus, metrics_port, work):
    port = free_port()
    config = os.path.join(work, "prometheus.yml")
    with open(config, "w") as f:
        f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                "scrape_configs:\n  - job_name: dequantd\n    static_configs:\n"
                f"      - targets: ['127.0.0.1:{metrics_port}']\n")
    log_path = os.path.join(work, "prometheus.log")
    process = processes.start("prometheus", [
        prometheus, f"--config.file={config}", f"--storage.tsdb.path={work}/tsdb",
        f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h"], log_path)
    base = f"http://127.0.0.1:{port}"

    def ready():
        if process.poll() is not None:
            raise Failure(f"prometheus exited with {process.returncode}:\n"
                          f"{open(log_path).read()[-3000:]}")
        try:
            return http_get(f"{base}/-/ready", timeout=1).strip() != ""
        except OSError:
            return False

    wait_for(ready, "prometheus to be ready", 30)
    return base


def query(base, expr):
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        return json.loads(http_get(url))
    except urllib.error.HTTPError as e:  # 400 for a parse error: the body says why
        return json.loads(e.read().decode("utf-8"))


def scrape_count(base):
    """Scrapes of dequantd stored so far (samples of `up` in the last 5 minutes)."""
    result = query(base, 'count_over_time(up{job="dequantd"}[5m])')
    samples = result.get("data", {}).get("result", [])
    return int(float(samples[0]["value"][1])) if samples else 0


# --- the dashboard ----------------------------------------------------------------------------

def dashboard_expressions(dashboard):
    """[(where, expr, tag)] for every panel target and templating query; tag is HW_TAG,
    BENCH_TAG or None, from the panel's description."""
    found = []

    def walk_panels(panels):
        for panel in panels:
            description = panel.get("description", "")
            tag = next((t for t in (HW_TAG, BENCH_TAG) if description.startswith(t)), None)
            for target in panel.get("targets", []):
                if target.get("expr"):
                    found.append((f"panel '{panel.get('title')}' {target.get('refId')}",
                                  target["expr"], tag))
            walk_panels(panel.get("panels", []))

    walk_panels(dashboard.get("panels", []))
    for variable in dashboard.get("templating", {}).get("list", []):
        q = variable.get("query")
        if isinstance(q, dict):
            q = q.get("query")
        if variable.get("type") == "query" and q:
            found.append((f"variable '{variable.get('name')}'", q, None))
    return found


def to_promql(expr, variables):
    """Grafana's template syntax to plain PromQL: label_values(X, label) -> X; variables."""
    m = re.fullmatch(r"\s*label_values\((.+),\s*\w+\)\s*", expr)
    if m:
        expr = m.group(1)
    elif re.fullmatch(r"\s*label_values\(\s*\w+\s*\)\s*", expr):
        raise Failure(f"label_values(label) without a metric cannot be checked: {expr}")
    for name, value in sorted(variables.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace("${" + name[1:] + "}", value).replace(name, value)
    if "$" in expr:
        raise Failure(f"unknown template variable in: {expr}")
    return expr


def check_counts(base, expected):
    """Each {expr: value} as scraped by Prometheus equals the count the test made itself."""
    for expr, want in expected.items():
        result = query(base, expr)
        samples = result.get("data", {}).get("result", [])
        got = float(samples[0]["value"][1]) if len(samples) == 1 else None
        if got != want:
            raise Failure(f"{expr}: expected {want}, Prometheus has {got} ({result})")
        log(f"ok   {expr} = {got:g}")


def check_dashboards(base, dashboard_dir, benchmark_implemented):
    variables = dict(GRAFANA_VARIABLES)
    checked, empty_allowed, failures = 0, 0, []
    for file_name in sorted(os.listdir(dashboard_dir)):
        if not file_name.endswith(".json"):
            continue
        with open(os.path.join(dashboard_dir, file_name)) as f:
            dashboard = json.load(f)
        for variable in dashboard.get("templating", {}).get("list", []):
            variables["$" + variable["name"]] = variable.get("allValue") or ".*"
        for where, expr, tag in dashboard_expressions(dashboard):
            promql = to_promql(expr, variables)
            result = query(base, promql)
            checked += 1
            if result.get("status") != "success":
                failures.append(f"{file_name} {where}: {result.get('error')} in {promql}")
                continue
            data = result["data"]
            if data["resultType"] == "scalar" or data["result"]:
                values = [r["value"][1] for r in data["result"]][:4]
                log(f"ok   {where}: {len(data['result'])} series {values}")
                continue
            if tag == HW_TAG or (tag == BENCH_TAG and not benchmark_implemented):
                empty_allowed += 1
                log(f"none {where}: no data, allowed ({tag})")
                continue
            failures.append(f"{file_name} {where}: no data for {promql}")
    return checked, empty_allowed, failures


# --- main -------------------------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dequantd", required=True)
    parser.add_argument("--dequantctl", required=True)
    parser.add_argument("--source-dir", required=True)
    args = parser.parse_args()
    started = time.monotonic()

    prometheus = shutil.which("prometheus") or "/usr/bin/prometheus"
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    if not (os.access(prometheus, os.X_OK) and os.access(promtool, os.X_OK)):
        print("SKIPPED: prometheus/promtool not installed (Debian package 'prometheus'; "
              "scripts/install-deps.sh installs it)", flush=True)
        return SKIP
    for binary in (args.dequantd, args.dequantctl):
        if not os.access(binary, os.X_OK):
            raise Failure(f"{binary} is not built")

    config = os.path.join(args.source_dir, "deploy/prometheus/prometheus.yml")
    check = subprocess.run([promtool, "check", "config", config], capture_output=True, text=True)
    if check.returncode != 0:
        raise Failure(f"promtool check config {config}:\n{check.stdout}{check.stderr}")
    log(f"promtool check config: {check.stdout.strip().splitlines()[-1]}")

    processes = Processes()
    with tempfile.TemporaryDirectory(prefix="dequantd-observability-") as work:
        try:
            model_dir = os.environ.get("DEQUANTD_MODEL_DIR", "")
            shapes = None  # layer name -> (K, N), for the generated model
            if model_dir:
                layer_names = None
            else:
                model_dir = os.path.join(work, "model")
                os.mkdir(model_dir)
                layers = [("model.layers.0.self_attn.q_proj", 256, 256),
                          ("model.layers.0.mlp.up_proj", 256, 512),
                          ("model.layers.0.mlp.down_proj", 512, 256)]
                write_checkpoint(model_dir, layers, 128)
                layer_names = [name for name, _, _ in layers]
                shapes = {name: (k, n) for name, k, n in layers}

            grpc_port, metrics_port = start_dequantd(processes, args.dequantd, model_dir, work)
            log(f"dequantd on 127.0.0.1:{grpc_port}, /metrics on {metrics_port}")
            if layer_names is None:
                listing = run_ctl(args.dequantctl, grpc_port, "list").stdout
                layer_names = re.findall(r"^(\S+\.\w+_proj)\b", listing, re.M)[:3]
                if not layer_names:
                    raise Failure(f"no layers in `dequantctl list`:\n{listing}")

            base = start_prometheus(processes, prometheus, metrics_port, work)
            wait_for(lambda: scrape_count(base) >= 1, "the first scrape", 20)
            benchmark_implemented = drive_traffic(args.dequantctl, grpc_port, layer_names)
            log(f"traffic sent (Benchmark RPC {'implemented' if benchmark_implemented else 'UNIMPLEMENTED'})")
            after = scrape_count(base)
            wait_for(lambda: scrape_count(base) >= after + 2, "two scrapes after the traffic", 20)
            # A second round, so that rate() over the last seconds sees requests.
            drive_traffic(args.dequantctl, grpc_port, layer_names[:1])
            after = scrape_count(base)
            wait_for(lambda: scrape_count(base) >= after + 2, "two more scrapes", 20)

            # Two rounds: every layer, then the first one, each in fp16 and fp32; one unknown
            # tensor per round.
            dequantized = layer_names + layer_names[:1]
            expected = {
                'sum(dequantd_rpc_requests_total{method="Dequantize",code="OK"})':
                    2 * len(dequantized),
                'sum(dequantd_rpc_errors_total{method="Dequantize",code="NOT_FOUND"})': 2,
                'sum(dequantd_rpc_errors_total{method="Dequantize",code="OK"}) or vector(0)': 0,
                'sum(dequantd_dequantize_stage_duration_seconds_count{stage="kernel"})':
                    2 * len(dequantized),
            }
            if shapes is not None:
                # fp16 + fp32 = 6 bytes per element of each (K, N) result.
                out_bytes = sum(6 * shapes[n][0] * shapes[n][1] for n in dequantized)
                expected["sum(dequantd_dequantize_output_bytes_total)"] = out_bytes
                expected['sum(dequantd_kernel_written_bytes_total{backend="cpu"})'] = out_bytes
                expected["max(dequantd_model_layers)"] = len(shapes)
            check_counts(base, expected)

            scrape = http_get(f"http://127.0.0.1:{metrics_port}/metrics")
            check = subprocess.run([promtool, "check", "metrics"], input=scrape,
                                   capture_output=True, text=True)
            if check.returncode != 0:
                raise Failure(f"promtool check metrics:\n{check.stdout}{check.stderr}")
            log(f"promtool check metrics: OK ({len(scrape.splitlines())} lines)")
            foreign = [line for line in scrape.splitlines()
                       if line and not line.startswith(("#", "dequantd_"))]
            if foreign:
                raise Failure("samples outside the dequantd_ prefix on /metrics:\n  " +
                              "\n  ".join(foreign[:10]))

            checked, empty_allowed, failures = check_dashboards(
                base, os.path.join(args.source_dir, "deploy/grafana/dashboards"),
                benchmark_implemented)
            if failures:
                raise Failure(f"{len(failures)} of {checked} dashboard expressions failed:\n  " +
                              "\n  ".join(failures))
            log(f"{checked} dashboard expressions evaluated: {checked - empty_allowed} returned "
                f"data, {empty_allowed} allowed to be empty")
        finally:
            processes.stop_all()
            if time.monotonic() - started > DEADLINE_SECONDS:
                log(f"warning: took {time.monotonic() - started:.0f} s")
    log(f"PASS in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Failure as e:
        print(f"FAIL: {e}", flush=True)
        sys.exit(1)
