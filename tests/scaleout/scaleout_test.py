#!/usr/bin/env python3
"""Scale-out over replicas, on one machine: three dequantd processes (CPU backend) bound to
127.0.0.1, 127.0.0.2 and 127.0.0.3 on the same port stand in for pods behind a headless Service,
and one gRPC channel reaches them through one target, ipv4:127.0.0.1:P,127.0.0.2:P,127.0.0.3:P.
Each call is counted by the replica that served it (dequantd_rpc_requests_total{method=
"Dequantize",code="OK"} on its /metrics) and by the client (scaleout_driver), and every result is
compared byte for byte with the model's reference weights (numpy, independent of the C++ code).

 1. dequantctl: --lb other than pick_first/round_robin is a usage error (exit 2, names --lb);
    the multi-address target and a dns:/// target work for `list`.
 2. pick_first (gRPC's default): every call goes to one replica.
 3. --lb round_robin: the calls spread over all three (each serves at least half its share) and
    the replicas' counts add up to the client's.
 4. One-shot processes: 30 `dequantctl --lb round_robin dequantize` runs, one call each, spread
    over the three (each serves at least 5; before issue 24 a new channel's first call nearly
    always went to the first address: 10, 1 and 1 of 12), every result byte for byte;
    `dequantize-layers --streams 6` puts its 6 calls on all three replicas; a dead address in
    the list is skipped.
 5. Failover: while 6 streams call without pause, replica 3 is killed (SIGKILL); the calls in
    flight on it (and any sent to it before the channel saw the connection close) fail with
    UNAVAILABLE and are retried after a pause (counted; at most 2 calls per stream), no call
    fails for good, the other replicas keep serving; replica 3 is restarted on its address and
    gets calls again.
 6. Throughput (printed, never asserted): 16 streams against one replica, then against three.

Usage: scaleout_test.py --dequantd D --dequantctl C --driver S [--throughput-calls N]
Needs DEQUANTD_MODEL_DIR (the bundled model and its -reference directory); exit 77 without it.
"""

import argparse
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "container"))
import model_facts  # noqa: E402  pylint: disable=wrong-import-position

SKIP = 77
LAYER = "model.layers.0.self_attn.q_proj"
HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]


def ok_series(method):
    """The /metrics line of `method`'s calls finished with OK; group 1 is the count."""
    return re.compile(r'^dequantd_rpc_requests_total\{(?=[^}]*code="OK")'
                      rf'(?=[^}}]*method="{method}")[^}}]*\}} (\S+)$', re.M)


OK_SERIES = ok_series("Dequantize")


def free_port():
    """A port free on every replica address (bound and released; the replicas bind it next)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind((HOSTS[0], 0))
            port = s.getsockname()[1]
        try:
            for host in HOSTS[1:]:
                with socket.socket() as s:
                    s.bind((host, port))
            return port
        except OSError:
            continue
    raise RuntimeError("no port free on all replica addresses")


class Replica:
    def __init__(self, args, host, port, metrics_port, log_dir):
        self.args, self.host, self.port, self.metrics_port = args, host, port, metrics_port
        self.log_path = pathlib.Path(log_dir) / f"dequantd-{host}.log"
        self.process = None

    def start(self):
        log = open(self.log_path, "ab")  # pylint: disable=consider-using-with
        self.process = subprocess.Popen(  # pylint: disable=consider-using-with
            [self.args.dequantd, f"--model={self.args.model}", "--backend=cpu", "--cpu-threads=1",
             f"--listen={self.host}:{self.port}",
             f"--metrics-listen={self.host}:{self.metrics_port}"],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"dequantd on {self.host} exited: {self.log_tail()}")
            if run([self.args.dequantctl, f"--server={self.host}:{self.port}", "--deadline=2",
                    "info"], check=False).returncode == 0:
                return
            time.sleep(0.2)
        raise RuntimeError(f"dequantd on {self.host} did not answer within 60 s")

    def kill(self):
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def dequantize_ok(self, series=OK_SERIES):
        """Dequantize calls (or those of `series`) this process finished with OK (its /metrics)."""
        url = f"http://{self.host}:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as page:
            match = series.search(page.read().decode())
        return int(float(match.group(1))) if match else 0

    def log_tail(self):
        return self.log_path.read_text(errors="replace")[-2000:]


def run(command, check=True, **kwargs):
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False,
                            **kwargs)
    if check and result.returncode != 0:
        raise AssertionError(f"{command} exited {result.returncode}: {result.stderr.strip()}")
    return result


def target(replicas):
    return "ipv4:" + ",".join(f"{r.host}:{r.port}" for r in replicas)


def drive(args, server, lb, streams, calls):
    """Runs scaleout_driver to completion; returns its JSON summary."""
    command = [args.driver, f"--server={server}", f"--tensor={LAYER}", f"--expect={args.expect}",
               f"--streams={streams}", f"--calls_per_stream={calls}"]
    if lb:
        command.append(f"--lb={lb}")
    result = run(command, check=False)
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert result.returncode == 0, f"driver failed: {summary} {result.stderr[-2000:]}"
    return summary


def counts(replicas):
    return [r.dequantize_ok() for r in replicas]


def check_dequantctl(args, replicas):
    bad = run([args.dequantctl, f"--server={target(replicas)}", "--lb=random", "list"],
              check=False)
    assert bad.returncode == 2 and "--lb" in bad.stderr, (bad.returncode, bad.stderr)
    for server in (target(replicas), f"dns:///localhost:{replicas[0].port}"):
        listed = run([args.dequantctl, f"--server={server}", "--lb=round_robin", "--deadline=30",
                      "list"])
        assert LAYER in listed.stdout, listed.stdout[:500]
    print("1. dequantctl: --lb=random is a usage error; ipv4:A,B,C and dns:/// targets answer")


def check_pick_first(args, replicas):
    before = counts(replicas)
    summary = drive(args, target(replicas), "", streams=4, calls=10)
    delta = [a - b for a, b in zip(counts(replicas), before)]
    assert summary["ok"] == 40 and sorted(delta) == [0, 0, 40], (summary, delta)
    print(f"2. pick_first: 40 calls, per replica {delta} (all on one)")


def check_round_robin(args, replicas):
    before = counts(replicas)
    summary = drive(args, target(replicas), "round_robin", streams=6, calls=20)
    delta = [a - b for a, b in zip(counts(replicas), before)]
    assert summary["ok"] == 120 and sum(delta) == 120, (summary, delta)
    assert min(delta) >= 20, f"round_robin left a replica with {min(delta)} of 120 calls: {delta}"
    print(f"3. round_robin: 120 calls, per replica {delta}")


def check_one_shot_spread(args, replicas, tmp):
    calls = 30
    before = counts(replicas)
    out = pathlib.Path(tmp, "one-shot.bin")
    expected = pathlib.Path(args.expect).read_bytes()
    for i in range(calls):
        run([args.dequantctl, f"--server={target(replicas)}", "--lb=round_robin", "--deadline=30",
             "dequantize", f"--tensor={LAYER}", f"--out={out}"])
        assert out.read_bytes() == expected, f"one-shot call {i}: the result differs"
    delta = [a - b for a, b in zip(counts(replicas), before)]
    assert sum(delta) == calls, (calls, delta)
    assert min(delta) >= 5, f"{calls} one-shot processes left a replica with {min(delta)}: {delta}"
    print(f"4. one-shot: {calls} dequantctl processes, one Dequantize each, per replica {delta}")

    layers = ok_series("DequantizeLayers")
    before = [r.dequantize_ok(layers) for r in replicas]
    out_dir = pathlib.Path(tmp, "layers")
    run([args.dequantctl, f"--server={target(replicas)}", "--lb=round_robin", "--deadline=60",
         "dequantize-layers", "--streams=6", f"--out-dir={out_dir}"])
    delta = [r.dequantize_ok(layers) - b for r, b in zip(replicas, before)]
    assert sum(delta) == 6 and min(delta) >= 1, f"--streams 6: DequantizeLayers per replica {delta}"
    assert pathlib.Path(out_dir, f"{LAYER}.npy").read_bytes().endswith(expected), \
        "dequantize-layers --streams 6: the layer's .npy does not end with the reference bytes"
    print(f"   dequantize-layers --streams 6: DequantizeLayers calls per replica {delta}")

    # An address nothing listens on is only skipped: each of three processes (one of them starts
    # at the dead address) is answered by the next address of its list.
    dead = "ipv4:127.0.0.4:" + str(replicas[0].port) + "," + target(replicas[:2])[len("ipv4:"):]
    for _ in range(3):
        listed = run([args.dequantctl, f"--server={dead}", "--lb=round_robin", "--deadline=30",
                      "list"])
        assert LAYER in listed.stdout, listed.stdout[:500]
    print("   a list with a dead address: 3 of 3 one-shot processes answered")


def read_progress(driver, at_least):
    """Reads the driver's progress lines until ok >= at_least; returns the last ok."""
    for line in driver.stdout:
        match = re.match(r"progress ok=(\d+)", line)
        if match and int(match.group(1)) >= at_least:
            return int(match.group(1))
    raise AssertionError("the driver stopped before reaching ok=%d" % at_least)


def check_failover(args, replicas):
    streams = 6
    before = counts(replicas)
    driver = subprocess.Popen(  # pylint: disable=consider-using-with
        [args.driver, f"--server={target(replicas)}", "--lb=round_robin", f"--tensor={LAYER}",
         f"--expect={args.expect}", f"--streams={streams}", "--calls_per_stream=0"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ok_at_kill = read_progress(driver, 60)
        replicas[2].kill()
        survivors_at_kill = counts(replicas[:2])
        ok_after = read_progress(driver, ok_at_kill + 60)
        survivors_after = counts(replicas[:2])
        replicas[2].start()
        deadline = time.monotonic() + 60  # a bound, not a measurement: gRPC's reconnect backoff
        rejoined = 0
        while rejoined < 5 and time.monotonic() < deadline:
            read_progress(driver, 0)
            rejoined = replicas[2].dequantize_ok()
        driver.stdin.close()
        summary = json.loads(driver.stdout.read().strip().splitlines()[-1])
        stderr = driver.stderr.read()
        driver.wait(timeout=60)
    finally:
        if driver.poll() is None:
            driver.kill()
    print(f"5. failover: killed replica 3 at ok={ok_at_kill}; {ok_after - ok_at_kill}+ calls "
          f"on after; driver {summary}")
    assert summary["failed"] == 0 and summary["mismatched"] == 0, (summary, stderr[-2000:])
    # What the kill may cost: the calls in flight on replica 3 (at most one per stream) and the
    # calls the channel sent to it before it saw the connection close; each such call is retried
    # after a pause and succeeds (failed == 0), and a stream whose call was retried then finds
    # the channel updated, so at most two calls per stream are affected.
    assert summary["retried_ok"] <= 2 * streams, \
        f"{summary['retried_ok']} calls needed a retry > 2 x {streams} streams"
    assert summary["unavailable"] >= summary["retried_ok"], summary
    grew = [a > b for a, b in zip(survivors_after, survivors_at_kill)]
    assert all(grew), f"a surviving replica stopped serving: {survivors_at_kill} -> " \
                      f"{survivors_after}"
    assert rejoined >= 5, f"the restarted replica 3 served {rejoined} calls within 60 s"
    print(f"   UNAVAILABLE attempts {summary['unavailable']}, calls retried OK "
          f"{summary['retried_ok']}; survivors kept serving "
          f"{survivors_at_kill} -> {survivors_after}; restarted replica 3 served {rejoined}+; "
          f"calls before the kill per replica {before}")


def throughput(args, replicas, calls):
    rows = []
    for name, group in (("1 replica", replicas[:1]), ("3 replicas", replicas)):
        summary = drive(args, target(group), "round_robin", streams=16, calls=calls)
        rows.append((name, summary))
    mib = len(pathlib.Path(args.expect).read_bytes()) / 2**20
    print(f"6. throughput: 16 streams x {calls} calls of {LAYER} (fp16, {mib:.2f} MiB), CPU "
          f"backend, --cpu-threads=1 per replica, {os.cpu_count()} CPUs")
    print("| replicas | calls | seconds | calls/s | MiB/s | speed-up |")
    print("|---|---|---|---|---|---|")
    base = rows[0][1]["ok"] / rows[0][1]["seconds"]
    for name, s in rows:
        rate = s["ok"] / s["seconds"]
        print(f"| {name} | {s['ok']} | {s['seconds']:.2f} | {rate:.1f} | "
              f"{s['bytes'] / 2**20 / s['seconds']:.1f} | {rate / base:.2f}x |")


def rotation_counters():
    """dequantctl's per-target rotation counters of this user in /dev/shm
    (client/address_rotation.h RotationKey)."""
    prefix = f"dequantctl-rotation.{os.geteuid()}."
    return {p.name for p in pathlib.Path("/dev/shm").glob(prefix + "*")}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dequantd", required=True)
    parser.add_argument("--dequantctl", required=True)
    parser.add_argument("--driver", required=True)
    parser.add_argument("--throughput-calls", type=int, default=8)
    args = parser.parse_args()
    model = os.environ.get("DEQUANTD_MODEL_DIR")
    if not model or not pathlib.Path(model, "config.json").is_file():
        print("SKIP: DEQUANTD_MODEL_DIR is not the bundled model (scripts/make-model.sh)")
        return SKIP
    args.model = model.rstrip("/")
    reference = pathlib.Path(f"{args.model}-reference/expected.{LAYER}.fp16.safetensors")
    with tempfile.TemporaryDirectory(prefix="scaleout.") as tmp:
        args.expect = str(pathlib.Path(tmp, "expected.bin"))
        pathlib.Path(args.expect).write_bytes(model_facts.tensor_bytes(reference,
                                                                       f"{LAYER}.weight"))
        port, metrics_port = free_port(), free_port()
        replicas = [Replica(args, host, port, metrics_port, tmp) for host in HOSTS]
        counters = rotation_counters()
        try:
            for replica in replicas:
                replica.start()
            check_dequantctl(args, replicas)
            check_pick_first(args, replicas)
            check_round_robin(args, replicas)
            check_one_shot_spread(args, replicas, tmp)
            check_failover(args, replicas)
            throughput(args, replicas, args.throughput_calls)
        except (AssertionError, RuntimeError) as e:
            print(f"FAIL: {e}")
            for replica in replicas:
                print(f"--- {replica.log_path.name}:\n{replica.log_tail()}")
            return 1
        finally:
            for replica in replicas:
                replica.stop()
            for name in rotation_counters() - counters:  # this run's ports: never used again
                pathlib.Path("/dev/shm", name).unlink(missing_ok=True)
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
