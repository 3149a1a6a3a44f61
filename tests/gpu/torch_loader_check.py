#!/usr/bin/env python3
"""The H200 check of issue 23: dequantd writing torch CUDA tensors in place through the Python
client (dequantize_into_tensor(s), CUDA IPC via the driver API) and dequantd.torch.load_model,
against dequantd servers it starts itself (CUDA backend, --shared-memory=all). One line per check,
"PASS name", "FAIL name: detail" or "SKIP name: why"; then "N passed, M failed, K skipped"; exit 1
when a check failed.

  PYTHONPATH=client/python/src python3 tests/gpu/torch_loader_check.py [--dequantd BIN]
      [--model DIR] [--device cuda:0] [--server-flag=--read-staging-bytes=0 ...]

--server-flag: one more dequantd flag for every server it starts (repeatable), e.g.
--server-flag=--read-staging-bytes=0 to check ReadTensor's one-thread path (issue 23).

--model: an AWQ checkpoint (default: models/smollm2-135m-awq when present, else a synthetic one
of its shapes written by bench/awq_model.py into a temporary directory). Needs torch,
transformers, safetensors, grpcio, protobuf, numpy; the dequantd binary (default: `dequantd` on
PATH, e.g. after `. BUNDLE/env.sh`).
"""

import argparse
import gc
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "client", "python", "src"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))  # gpt_oss_model

import grpc  # noqa: E402
import torch  # noqa: E402

import dequantd  # noqa: E402
import dequantd.torch as dtorch  # noqa: E402
from dequantd import tensors as dt  # noqa: E402

PROMPT = [[1, 504, 3458, 282, 4477, 314, 253, 2012, 30, 198, 42, 9000]]


class Server:
    """A dequantd on 127.0.0.1:`port` (CUDA backend, every shared-memory kind, and FLAGS)."""

    FLAGS = []  # --server-flag values

    def __init__(self, binary, model, port, log_dir):
        self.binary, self.model, self.port = binary, model, port
        self.log = os.path.join(log_dir, f"dequantd-{port}-{time.monotonic_ns()}.log")
        self.proc = None

    def start(self):
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [self.binary, f"--model={self.model}", f"--listen=127.0.0.1:{self.port}",
                 "--metrics-listen=", "--backend=cuda", "--shared-memory=all", *Server.FLAGS],
                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while time.time() < deadline:
            with open(self.log) as f:
                if re.search(r"listening on", f.read()):
                    return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"dequantd exited {self.proc.returncode}: "
                                   f"{open(self.log).read()[-2000:]}")
            time.sleep(0.1)
        raise RuntimeError("dequantd did not listen within 120 s")

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    @property
    def target(self):
        return f"127.0.0.1:{self.port}"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Checks:
    def __init__(self):
        self.counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}

    def run(self, name, fn):
        try:
            result = fn()
        except Exception as e:  # pylint: disable=broad-except
            self.report("FAIL", name, f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
            return
        if isinstance(result, tuple) and result and result[0] == "SKIP":
            self.report("SKIP", name, result[1])
        elif result is None or result is True:
            self.report("PASS", name, "")
        else:
            self.report("FAIL", name, str(result))

    def report(self, kind, name, detail):
        self.counts[kind] += 1
        print(f"{kind} {name}{': ' + detail if detail else ''}", flush=True)


def raises(fn, exc, fragment):
    """None when fn() raises `exc` whose message contains `fragment`; else a failure text."""
    try:
        fn()
    except exc as e:
        return None if fragment in str(e) else f"{exc.__name__} without {fragment!r}: {e}"
    except Exception as e:  # pylint: disable=broad-except
        return f"expected {exc.__name__}, got {type(e).__name__}: {e}"
    return f"expected {exc.__name__}, nothing raised"


def wait_ready(client, seconds=30):
    """Until the channel reaches the restarted server (the check's own wait, not the library's)."""
    deadline = time.time() + seconds
    while True:
        try:
            return client.info()
        except dequantd.DequantdError:
            if time.time() > deadline:
                raise
            time.sleep(0.2)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dequantd", default="dequantd")
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--server-flag", action="append", default=[])
    args = parser.parse_args()
    Server.FLAGS = list(args.server_flag)
    work = tempfile.mkdtemp(prefix="dequantd-torch-check.")
    model_dir = args.model
    if model_dir is None:
        bundled = os.path.join(ROOT, "models", "smollm2-135m-awq")
        if os.path.exists(os.path.join(bundled, "config.json")):
            model_dir = bundled
        else:
            import awq_model  # bench/awq_model.py

            model_dir = os.path.join(work, "smollm2-shaped")
            awq_model.make(model_dir, "smollm2-135m")
    print(f"model {model_dir}; torch {torch.__version__}; {torch.cuda.get_device_name(0)}; "
          f"{torch.cuda.device_count()} GPU(s)", flush=True)
    dev = torch.device(args.device)
    checks = Checks()
    server = Server(args.dequantd, model_dir, free_port(), work).start()
    client = dequantd.Client(server.target)
    layers = client.list().layers
    big = max(layers, key=lambda l: l.in_features * l.out_features)
    rect = next(l for l in layers if l.in_features != l.out_features)

    def nan(shape, dtype=torch.bfloat16, device=dev):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)

    def same_bits(a, b):
        return torch.equal(a.cpu().view(torch.uint8), b.cpu().view(torch.uint8))

    # --- values
    def one_layer_each_dtype():
        for dtype, name in ((torch.float16, "fp16"), (torch.bfloat16, "bf16"),
                            (torch.float32, "fp32")):
            t = nan((big.in_features, big.out_features), dtype)
            client.dequantize_into_tensor(big.name, t)
            if not same_bits(t, client.dequantize(big.name, dtype=name, as_torch=True)):
                return f"{name}: the CUDA tensor differs from the streamed result"
        return None
    checks.run("cuda tensor filled in place, fp16/bf16/fp32, bit for bit", one_layer_each_dtype)

    def whole_model_one_buffer():
        total = sum(l.in_features * l.out_features for l in layers)
        flat = nan((total,))
        views, off = {}, 0
        for l in layers:
            views[l.name] = flat[off:off + l.in_features * l.out_features].view(
                l.in_features, l.out_features)
            off += l.in_features * l.out_features
        t0 = time.perf_counter()
        client.dequantize_into_tensors(views)
        seconds = time.perf_counter() - t0
        regions = client.cuda_regions()
        if len(regions) != 1:
            return f"{len(regions)} regions for one buffer"
        for l in layers[:: max(1, len(layers) // 12)]:
            if not same_bits(views[l.name], client.dequantize(l.name, dtype="bf16",
                                                              as_torch=True)):
                return f"{l.name} differs"
        print(f"  whole model into one buffer: {len(layers)} layers, {total * 2 / 1e6:.0f} MB "
              f"in {seconds * 1e3:.2f} ms (first call: registration and tuning included)")
        del views, flat
        gc.collect()
        held = [r.name for r in client.shared_memory_status().regions]
        if client.cuda_regions() or regions[0] in held:
            return f"region not released after the buffer was freed: {held}"
        return None
    checks.run("whole model into views of one buffer: one region, released when freed",
               whole_model_one_buffer)

    def stored_tensors_into_cuda():
        others = client.list().other_tensors
        views = {}
        for t in others:  # poisoned: 7s (any dtype), so unwritten bytes show
            views[t.name] = torch.full(tuple(t.shape), 7, device=dev,
                                       dtype=dequantd.dtypes.torch_dtype(t.dtype))
        t0 = time.perf_counter()
        client.read_tensors_into(views)
        seconds = time.perf_counter() - t0
        for t in others:
            if not same_bits(views[t.name], client.read_tensor(t.name, as_torch=True)):
                return f"{t.name} differs from the streamed bytes"
        total = sum(t.bytes for t in others)
        print(f"  {len(others)} stored tensors, {total / 1e6:.0f} MB into CUDA tensors in "
              f"{seconds * 1e3:.1f} ms (registration included)")
        return None
    checks.run("stored tensors into CUDA tensors (ReadTensor into a region), bit for bit",
               stored_tensors_into_cuda)

    # --- bad input, each refused before any byte is written
    K, N = rect.in_features, rect.out_features

    def refused(tensor, exc, fragment, **kw):
        r = raises(lambda: client.dequantize_into_tensor(rect.name, tensor, **kw), exc, fragment)
        if r is None and tensor.is_floating_point() and not torch.isnan(tensor).all():
            return "bytes were written"
        return r

    checks.run("wrong shape -> ValueError", lambda: refused(nan((K, N + 8)), ValueError,
                                                           f"!= the layer's (K, N) = ({K}, {N})"))
    checks.run("wrong dtype -> TypeError", lambda: refused(
        torch.zeros((K, N), dtype=torch.int16, device=dev), TypeError, "dtype torch.int16"))
    checks.run("(N, K) tensor without orientation -> ValueError", lambda: refused(
        nan((N, K)), ValueError, "nn.Linear's (N, K) orientation"))

    def orientation_nk():
        supported, reason = client._orientation_support()  # pylint: disable=protected-access
        t = nan((N, K))
        if not supported:
            return refused(t, ValueError, "orientation 'NK'", orientation="NK")
        client.dequantize_into_tensor(rect.name, t, orientation="NK")
        want = client.dequantize(rect.name, dtype="bf16", as_torch=True).t().contiguous()
        return None if same_bits(t, want) else "NK result is not the transpose of KN"
    checks.run("orientation NK: refused without server support, else the exact transpose",
               orientation_nk)
    checks.run("non-contiguous -> ValueError", lambda: refused(nan((N, K)).t(), ValueError,
                                                               "not contiguous"))

    def misaligned():
        flat = nan((K * N + 1,))
        return refused(flat[1:].view(K, N), ValueError, "not a multiple of 16")
    checks.run("a start not 16-byte aligned in its allocation -> ValueError", misaligned)

    def other_gpu():
        if torch.cuda.device_count() < 2:
            return ("SKIP", "one GPU")
        served = {d["index"] for d in client.info().devices}
        t = nan((K, N), device=torch.device("cuda", 1))
        if 1 in served:
            client.dequantize_into_tensor(rect.name, t)
            return None if same_bits(t, client.dequantize(rect.name, dtype="bf16",
                                                          as_torch=True)) else "cuda:1 differs"
        return refused(t, ValueError, "a GPU the server does not compute on")
    checks.run("tensor on another GPU", other_gpu)

    # --- lifetimes
    def freed_during_call():
        """The caller drops its only reference while the call runs: the call keeps the tensor
        (and its region) alive until the reply; afterwards the region is released."""
        errors = []

        def work(mapping):
            try:
                client.dequantize_into_tensors(mapping)
            except Exception as e:  # pylint: disable=broad-except
                errors.append(e)
        thread = threading.Thread(target=work,
                                  args=({big.name: nan((big.in_features, big.out_features))},))
        thread.start()  # this frame holds no reference to the tensor: only the call does
        thread.join()
        if errors:
            return f"the call failed: {errors[0]}"
        gc.collect()
        return None if not client.cuda_regions() else f"still held: {client.cuda_regions()}"
    checks.run("memory freed while a call writes: kept alive until the reply, then released",
               freed_during_call)

    def reallocated_address():
        """A freed, cudaFree'd and re-allocated address gets a new registration (buffer-id
        check), and the bytes land in the new allocation."""
        keep = nan((K, N))
        client.dequantize_into_tensor(rect.name, keep)
        first = dt._cuda.allocation_of(keep.data_ptr())  # pylint: disable=protected-access
        names_before = client.cuda_regions()
        del keep
        gc.collect()
        torch.cuda.empty_cache()
        again = nan((K, N))
        client.dequantize_into_tensor(rect.name, again)
        second = dt._cuda.allocation_of(again.data_ptr())  # pylint: disable=protected-access
        if client.cuda_regions() == names_before:
            return "the old region was reused"
        print(f"  same base address again: {first.base == second.base}; buffer ids "
              f"{first.buffer_id} -> {second.buffer_id}")
        return None if same_bits(again, client.dequantize(rect.name, dtype="bf16",
                                                          as_torch=True)) else "bytes differ"
    checks.run("an address freed and allocated again is registered anew", reallocated_address)

    def server_restart():
        t = nan((K, N))
        client.dequantize_into_tensor(rect.name, t)  # registers
        server.stop()
        server.start()  # same port, no regions
        wait_ready(client)
        t.fill_(float("nan"))
        client.dequantize_into_tensor(rect.name, t)  # NOT_FOUND region -> register, retry
        held = [r.name for r in client.shared_memory_status().regions]
        if held != client.cuda_regions():
            return f"server holds {held}, client {client.cuda_regions()}"
        return None if same_bits(t, client.dequantize(rect.name, dtype="bf16",
                                                      as_torch=True)) else "bytes differ"
    checks.run("server restart: the region is registered again and the call retried",
               server_restart)

    def close_releases():
        other = dequantd.Client(server.target)
        t = nan((K, N))
        other.dequantize_into_tensor(rect.name, t)
        name = other.cuda_regions()[0]
        other.close()
        held = [r.name for r in client.shared_memory_status().regions]
        return None if name not in held else f"{name} still registered after close()"
    checks.run("Client.close() unregisters its regions", close_releases)

    # --- the loader
    def logits_bit_for_bit():
        import transformers

        out = os.path.join(work, "bf16")
        dequantd.convert(server.target, out, dtype="bf16")
        reference = transformers.AutoModelForCausalLM.from_pretrained(
            out, dtype=torch.bfloat16, local_files_only=True).to(dev).eval()
        model = dtorch.load_model(client, device=dev, dtype=torch.bfloat16)
        r = model.dequantd_load_report
        print(f"  loader: {r}")
        ids = torch.tensor(PROMPT, device=dev)
        with torch.no_grad():
            got, want = model(ids).logits, reference(ids).logits
        if not torch.isfinite(want.float()).all():
            return "reference logits not finite"
        ref = dict(reference.named_parameters())
        bad = [n for n, p in model.named_parameters() if not same_bits(p, ref[n])]
        if bad:
            return f"{len(bad)} parameters differ, e.g. {bad[0]}"
        if r.in_place != len(list(model.named_parameters())):
            return f"only {r.in_place} parameters are the filled tensors (transformers copied)"
        if model.config.tie_word_embeddings and (model.lm_head.weight is not
                                                 model.model.embed_tokens.weight):
            return "lm_head not tied"
        return None if torch.equal(got.view(torch.int16), want.view(torch.int16)) else (
            f"logits differ: max |diff| {(got.float() - want.float()).abs().max().item()}")
    checks.run("loader on CUDA: logits equal from_pretrained of the converted checkpoint, "
               "bit for bit", logits_bit_for_bit)

    def gpt_oss_loader():
        """A gpt-oss-shaped MXFP4 model (tests/python/gpt_oss_model.py) on its own server: the
        experts' [E, K, N] parameters written by the CUDA kernel bit-exact to transformers' own
        dequantization, and the logits equal from_pretrained of the converted checkpoint."""
        import transformers

        if not hasattr(transformers, "GptOssConfig"):
            return ("SKIP", "this transformers has no gpt-oss")
        import gpt_oss_model

        oss_dir = os.path.join(work, "gpt-oss")
        expected = gpt_oss_model.make(oss_dir)
        oss = Server(args.dequantd, oss_dir, free_port(), work).start()
        try:
            with dequantd.Client(oss.target) as c:
                wait_ready(c)
                model = dtorch.load_model(c, device=dev, dtype=torch.bfloat16)
            out = os.path.join(work, "gpt-oss-bf16")
            dequantd.convert(oss.target, out, dtype="bf16")
        finally:
            oss.stop()
        params = dict(model.named_parameters())
        for proj, shape in gpt_oss_model.PROJECTIONS:
            p = params[gpt_oss_model.EXPERTS + proj]
            if tuple(p.shape) != shape or p.device != dev:
                return f"{proj}: {tuple(p.shape)} on {p.device}"
            if p.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes() != expected[proj]:
                return f"{proj} differs from transformers' dequantization"
        reference = transformers.AutoModelForCausalLM.from_pretrained(
            out, dtype=torch.bfloat16, local_files_only=True).to(dev).eval()
        ref = dict(reference.named_parameters())
        bad = [n for n, p in params.items() if not same_bits(p, ref[n])]
        if bad:
            return f"{len(bad)} parameters differ, e.g. {bad[0]}"
        ids = torch.tensor([[1, 7, 42, 99, 3, 64]], device=dev)
        with torch.no_grad():
            got, want = model(ids).logits, reference(ids).logits
        return None if torch.equal(got.view(torch.int16), want.view(torch.int16)) else (
            f"logits differ: max |diff| {(got.float() - want.float()).abs().max().item()}")
    checks.run("gpt-oss loader on CUDA: experts from the kernel, logits equal from_pretrained",
               gpt_oss_loader)

    def server_gone_mid_load():
        """The server is killed when the load starts on the stored tensors (the layers are in by
        then): on CUDA at read_tensors_into (ReadTensor into a region), else at the fifth
        streamed read_tensor."""
        original = dtorch.READ_STREAMS
        dtorch.READ_STREAMS = 1
        reads = []
        real_read, real_into = client.read_tensor, client.read_tensors_into

        def dying(*a, **kw):
            reads.append(1)
            if len(reads) == 5:
                server.kill()
            return real_read(*a, **kw)

        def dying_into(*a, **kw):
            server.kill()  # waits for the process to end
            return real_into(*a, **kw)
        client.read_tensor, client.read_tensors_into = dying, dying_into
        result = None
        try:
            result = dtorch.load_model(client, device=dev)
        except dequantd.DequantdError as e:
            if e.code != grpc.StatusCode.UNAVAILABLE or not e.message.startswith("load_model: "):
                return f"DequantdError {e.code}: {e.message}"
        finally:
            client.read_tensor, client.read_tensors_into = real_read, real_into
            dtorch.READ_STREAMS = original
        return "a model was returned" if result is not None else None
    checks.run("server gone mid-load: UNAVAILABLE, no model returned", server_gone_mid_load)

    client.close()
    server.stop()
    c = checks.counts
    print(f"{c['PASS']} passed, {c['FAIL']} failed, {c['SKIP']} skipped")
    return 1 if c["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
