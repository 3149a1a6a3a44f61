"""The CUDA half of dequantize_into_tensors / read_tensors_into (issue 23) without a GPU: a real
dequantd.Client whose stub is a fake server, CPU tensors that say they are on cuda:0, and
dequantd._cuda's driver calls faked and counted. Pins what the checks cost in calls (one
allocation_of per allocation, not per tensor; one device UUID per device per client; the
server facts reused for Client.SERVER_FACTS_SECONDS and fetched again after a server error or a
restart; no ListTensors when the caller passes its listing) and that every check still raises
its exact error, naming the same tensor as before. The same checks on a real GPU:
tests/gpu/torch_loader_check.py; the CPU path against a real server: test_torch.py."""

import collections

import grpc
import pytest

torch = pytest.importorskip("torch")

import dequantd  # noqa: E402
from dequantd import client as client_module  # noqa: E402
from dequantd import tensors as dt  # noqa: E402
from dequantd._proto import dequant_pb2 as pb  # noqa: E402

CUDA0 = torch.device("cuda", 0)
UUID0 = "GPU-00000000-1111-2222-3333-444444444444"


class FakeCudaTensor(torch.Tensor):
    """A CPU tensor that says it is on cuda:0."""
    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def device(self):
        return CUDA0


def on_cuda(tensor):
    return tensor.as_subclass(FakeCudaTensor)


class RpcError(grpc.RpcError):
    def __init__(self, code, details):
        super().__init__(details)
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


class FakeCall:
    """A server-streaming call: its messages, or its error raised while it is read (as gRPC's
    calls raise theirs)."""

    def __init__(self, messages, error=None):
        self._messages, self._error = messages, error

    def __iter__(self):
        if self._error is not None:
            raise self._error
        return iter(self._messages)

    def cancel(self):
        pass


class FakeServer:
    """The RPCs of the tensors path. `layers`: {name: (K, N)}; `others`: {name: (dtype, shape)}.
    restart(): every region lost, flags as given. `calls` counts RPCs by method."""

    def __init__(self, layers, others=None, backend="cuda", mode="cuda"):
        self.layers, self.others = dict(layers), dict(others or {})
        self.backend, self.mode = backend, mode
        self.regions = {}
        self.calls = collections.Counter()
        self.written = []  # (region, offset, names)

    def restart(self, **flags):
        self.regions.clear()
        for key, value in flags.items():
            setattr(self, key, value)

    def ListTensors(self, request, timeout=None, metadata=None):  # noqa: N802
        self.calls["ListTensors"] += 1
        r = pb.ListTensorsResponse(model="/fake")
        for name, (k, n) in sorted(self.layers.items()):
            r.tensors.append(pb.QuantizedTensorInfo(name=name, in_features=k, out_features=n,
                                                    group_size=k, scale_dtype=pb.DTYPE_FP16))
        for name, (dtype, shape) in sorted(self.others.items()):
            count = 1
            for d in shape:
                count *= d
            r.other_tensors.append(pb.RawTensorInfo(name=name, dtype=dtype, shape=shape,
                                                    bytes=2 * count))
        return r

    def GetServerInfo(self, request, timeout=None, metadata=None):  # noqa: N802
        self.calls["GetServerInfo"] += 1
        return pb.GetServerInfoResponse(version="0", backend=self.backend, model="/fake",
                                        devices=[pb.DeviceInfo(index=0, name="fake")])

    def SharedMemoryStatus(self, request, timeout=None, metadata=None):  # noqa: N802
        self.calls["SharedMemoryStatus"] += 1
        return pb.SharedMemoryStatusResponse(
            mode=self.mode, regions=[pb.SharedMemoryRegionInfo(name=n, kind="device")
                                     for n in sorted(self.regions)])

    def RegisterCudaSharedMemory(self, request, timeout=None, metadata=None):  # noqa: N802
        self.calls["RegisterCudaSharedMemory"] += 1
        if self.mode not in ("cuda", "all"):
            raise RpcError(grpc.StatusCode.FAILED_PRECONDITION, "CUDA regions are off")
        self.regions[request.name] = request.byte_size
        return pb.RegisterCudaSharedMemoryResponse()

    def UnregisterCudaSharedMemory(self, request, timeout=None, metadata=None):  # noqa: N802
        self.calls["UnregisterCudaSharedMemory"] += 1
        return pb.UnregisterCudaSharedMemoryResponse(
            released=1 if self.regions.pop(request.name, None) is not None else 0)

    def _lost(self, request):
        """NOT_FOUND for a region this server does not hold (as a restarted one says)."""
        name = request.output_region.name
        if name in self.regions:
            return None
        return FakeCall([], RpcError(grpc.StatusCode.NOT_FOUND,
                                     f'output_region.name: no region "{name}" is registered'))

    def DequantizeLayers(self, request, timeout=None, metadata=None):  # noqa: N802
        self.calls["DequantizeLayers"] += 1
        region = request.output_region
        if self._lost(request):
            return self._lost(request)
        asked = list(request.tensors)
        names = asked or sorted(self.layers)  # empty: every layer, in ListTensors order
        size = {pb.DTYPE_FP16: 2, pb.DTYPE_BF16: 2, pb.DTYPE_FP32: 4}[request.output_dtype]
        total = sum(self.layers[n][0] * self.layers[n][1] * size for n in names)
        if region.expected_bytes and region.expected_bytes != total:  # before any write
            return FakeCall([], RpcError(grpc.StatusCode.FAILED_PRECONDITION,
                                         f"output_region.expected_bytes = "
                                         f"{region.expected_bytes}, but the results are {total} "
                                         f"bytes"))
        self.written.append((region.name, region.offset, asked))
        return FakeCall([pb.DequantizeResponse(region_summary=pb.RegionSummary(
            layer_count=len(names), total_bytes=total, region=region.name,
            region_offset=region.offset, dtype=request.output_dtype,
            orientation=request.orientation, backend="cuda", kernel="fake"))])

    def Dequantize(self, request, timeout=None, metadata=None):  # noqa: N802
        self.calls["Dequantize"] += 1
        region = request.output_region
        if self._lost(request):
            return self._lost(request)
        k, n = self.layers[request.tensor]
        shape = [n, k] if request.orientation == pb.ORIENTATION_NK else [k, n]
        self.written.append((region.name, region.offset, [request.tensor]))
        return FakeCall([pb.DequantizeResponse(header=pb.DequantizeHeader(
            tensor=request.tensor, shape=shape, dtype=request.output_dtype,
            total_bytes=k * n * 2, region=region.name, region_offset=region.offset,
            backend="cuda", kernel="fake"))])

    def ReadTensor(self, request, timeout=None, metadata=None):  # noqa: N802
        self.calls["ReadTensor"] += 1
        region = request.output_region
        if self._lost(request):
            return self._lost(request)
        dtype, shape = self.others[request.name]
        count = 1
        for d in shape:
            count *= d
        if region.expected_bytes and region.expected_bytes != 2 * count:  # before any write
            return FakeCall([], RpcError(grpc.StatusCode.FAILED_PRECONDITION,
                                         f"output_region.expected_bytes = "
                                         f"{region.expected_bytes}, but the results are "
                                         f"{2 * count} bytes"))
        self.written.append((region.name, region.offset, [request.name]))
        return FakeCall([pb.ReadTensorResponse(
            header=pb.RawTensorInfo(name=request.name, dtype=dtype, shape=shape,
                                    bytes=2 * count),
            region=region.name, region_offset=region.offset)])


class FakeDriver:
    """dequantd._cuda's calls, answered from the buffers given to add(); counted."""

    def __init__(self):
        self.buffers = []
        self.calls = collections.Counter()

    def add(self, tensor, device=0, ipc_capable=True, buffer_id=1):
        self.buffers.append(dt._cuda.Allocation(
            base=tensor.data_ptr(), size=tensor.untyped_storage().nbytes(), device=device,
            buffer_id=buffer_id, ipc_capable=ipc_capable, context=0))

    def allocation_of(self, ptr):
        self.calls["allocation_of"] += 1
        for a in self.buffers:
            if a.base <= ptr < a.base + a.size:
                return a
        raise dt._cuda.CudaError("cuPointerGetAttribute(2)", 1, "CUDA_ERROR_INVALID_VALUE")

    def device_uuid(self, device):
        self.calls["device_uuid"] += 1
        return UUID0 if device == 0 else f"GPU-{device}"

    def ipc_handle(self, allocation):
        self.calls["ipc_handle"] += 1
        return bytes(64)


class CountingDevice:
    entered = 0

    def __init__(self, device):
        self.device = device

    def __enter__(self):
        CountingDevice.entered += 1
        return self

    def __exit__(self, *exc):
        return False


@pytest.fixture()
def driver(monkeypatch):
    d = FakeDriver()
    monkeypatch.setattr(dt._cuda, "allocation_of", d.allocation_of)
    monkeypatch.setattr(dt._cuda, "device_uuid", d.device_uuid)
    monkeypatch.setattr(dt._cuda, "ipc_handle", d.ipc_handle)
    CountingDevice.entered = 0
    monkeypatch.setattr(torch.cuda, "device", CountingDevice)
    return d


def make_client(server):
    c = dequantd.Client("127.0.0.1:9")  # never connected: the fake server answers
    c._stub = server
    c._region_stub = server
    c._orientation = (True, "")
    return c


LAYERS = {f"model.layers.{i}.mlp.down_proj": (32, 16) for i in range(225)}


def one_buffer(driver, layers=LAYERS, orientation="KN"):
    """Views of one bf16 buffer, one per layer, back to back, as load_model makes them."""
    flat = torch.empty(sum(k * n for k, n in layers.values()), dtype=torch.bfloat16)
    driver.add(flat)
    views, at = {}, 0
    for name, (k, n) in layers.items():
        shape = (k, n) if orientation == "KN" else (n, k)
        views[name] = on_cuda(flat[at:at + k * n].view(shape))
        at += k * n
    return flat, views


# --- what a call costs in driver calls and RPCs --------------------------------------------

def test_225_tensors_in_one_buffer_ask_the_driver_once(driver):
    server = FakeServer(LAYERS)
    c = make_client(server)
    flat, views = one_buffer(driver, orientation="NK")
    targets = dt.check_targets(c, views, "NK")
    assert driver.calls["allocation_of"] == 1 and CountingDevice.entered == 1
    base = flat.data_ptr()
    assert {id(t.allocation) for t in targets} == {id(driver.buffers[0])}
    assert [t.offset for t in targets] == [v.data_ptr() - base for v in views.values()]
    dt.run(c, targets, "NK")
    assert server.calls["DequantizeLayers"] == 1 and server.calls["RegisterCudaSharedMemory"] == 1
    assert server.written == [(c.cuda_regions()[0], 0, list(LAYERS))]
    # One storage: one finalizer on the region (not one per view).
    region = next(iter(c._regions_cache()._regions.values()))
    assert len(region.storages) == 1


def test_every_layer_in_listing_order_is_sent_as_the_empty_list(driver):
    # The listing's order (sorted names here, as FakeServer lists them): the request carries no
    # names (the server's "every layer, in ListTensors order"); the summary is still checked.
    server = FakeServer(LAYERS)
    c = make_client(server)
    ordered = dict(sorted(LAYERS.items()))
    _, views = one_buffer(driver, layers=ordered, orientation="NK")
    times = dt.IntoTimes()
    dt.dequantize_into(c, views, "NK", c.list(), times)
    assert server.written == [(c.cuda_regions()[0], 0, [])]
    assert times.check_seconds > 0 and times.call_seconds > 0
    # The same layers in another order, or all but one: their names.
    server.written.clear()
    _, views = one_buffer(driver, orientation="NK")
    c.dequantize_into_tensors(views, orientation="NK")
    assert server.written[0][2] == list(LAYERS)
    server.written.clear()
    fewer = dict(list(ordered.items())[1:])
    _, views = one_buffer(driver, layers=fewer, orientation="NK")
    c.dequantize_into_tensors(views, orientation="NK")
    assert server.written[0][2] == list(fewer)


def test_a_stale_listing_is_refused_before_anything_is_written(driver):
    # A server whose "every layer" is not what the caller's listing said (here: one layer more,
    # as after a restart on another model) refuses the call by its expected_bytes: nothing is
    # written past the caller's tensors. Names (a subset) carry the same bound.
    server = FakeServer(LAYERS)
    c = make_client(server)
    ordered = dict(sorted(LAYERS.items()))
    listing = c.list()
    server.layers["model.zz.extra"] = (32, 16)
    _, views = one_buffer(driver, layers=ordered, orientation="NK")
    with pytest.raises(dequantd.DequantdError) as e:
        dt.dequantize_into(c, views, "NK", listing)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "expected_bytes = 230400, but the results are 231424 bytes" in e.value.message
    assert not server.written
    # A layer whose shape changed under a stale listing: refused the same way.
    server.layers["model.layers.0.mlp.down_proj"] = (64, 16)
    first = dict(list(ordered.items())[:2])
    _, views = one_buffer(driver, layers=first, orientation="NK")
    with pytest.raises(dequantd.DequantdError) as e:
        dt.dequantize_into(c, views, "NK", listing)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert not server.written


def test_tensors_of_several_allocations_ask_once_per_allocation(driver):
    server = FakeServer(LAYERS)
    c = make_client(server)
    a = torch.empty(32 * 16 * 3, dtype=torch.bfloat16)
    b = torch.empty(32 * 16 * 3, dtype=torch.bfloat16)
    driver.add(a, buffer_id=1)
    driver.add(b, buffer_id=2)
    names = list(LAYERS)[:6]
    views = {}
    for i, name in enumerate(names):  # a, b, a, b, ...: interleaved in the mapping
        buf = a if i % 2 == 0 else b
        views[name] = on_cuda(buf[(i // 2) * 512:(i // 2 + 1) * 512].view(32, 16))
    targets = dt.check_targets(c, views, "KN")
    assert driver.calls["allocation_of"] == 2
    assert [t.allocation.buffer_id for t in targets] == [1, 2, 1, 2, 1, 2]
    dt.run(c, targets, "KN")
    assert server.calls["DequantizeLayers"] == 2  # one run per allocation


def test_the_device_uuid_is_asked_once_per_device_per_client(driver, monkeypatch):
    """A server that names its GPUs by UUID (GetServerInfo.devices[i]["uuid"]; the client
    compares it with the driver's): asked once per device for the client's life."""
    server = FakeServer(LAYERS)
    c = make_client(server)
    info = server_info(uuid=UUID0)
    monkeypatch.setattr(c, "info", lambda **kw: info)
    _, views = one_buffer(driver)
    for _ in range(3):
        c.dequantize_into_tensors(views)
    assert driver.calls["device_uuid"] == 1
    other = server_info(uuid="GPU-not-this-one")
    monkeypatch.setattr(c, "info", lambda **kw: other)
    c._forget_server_facts()
    first = next(iter(views))
    with pytest.raises(ValueError, match=rf"^{first}: tensor on cuda:0, a GPU the server does "
                                         r"not compute on \(its devices: \[0\]; client and "
                                         r"server must see the same CUDA_VISIBLE_DEVICES\)$"):
        c.dequantize_into_tensors(views)
    assert driver.calls["device_uuid"] == 1


def server_info(uuid):
    return client_module.ServerInfo(version="0", backend="cuda", model="/fake", tensor_count=0,
                                    cpu_threads=1, model_config={},
                                    devices=[{"index": 0, "name": "fake", "uuid": uuid}])


def test_server_facts_are_reused_for_a_few_seconds_then_asked_again(driver, monkeypatch):
    server = FakeServer(LAYERS)
    c = make_client(server)
    _, views = one_buffer(driver)
    c.dequantize_into_tensors(views)
    assert server.calls["RegisterCudaSharedMemory"] == 1
    # A registration forgets the GPUs (the server may have restarted changed): asked again once.
    # The mode it confirms (a CUDA region registered: cuda or all) is kept, renewed.
    assert c._mode_cache[1] == "cuda"
    c.dequantize_into_tensors(views)
    assert (server.calls["GetServerInfo"], server.calls["SharedMemoryStatus"]) == (2, 1)
    c.dequantize_into_tensors(views)
    c.dequantize_into_tensors(views)
    assert server.calls["RegisterCudaSharedMemory"] == 1
    assert (server.calls["GetServerInfo"], server.calls["SharedMemoryStatus"]) == (2, 1)
    assert server.calls["ListTensors"] == 4  # no listing passed: asked every call
    monkeypatch.setattr(client_module, "SERVER_FACTS_SECONDS", -1.0)  # every fact too old
    c.dequantize_into_tensors(views)
    assert (server.calls["GetServerInfo"], server.calls["SharedMemoryStatus"]) == (3, 2)


def test_a_registration_keeps_only_a_mode_that_accepts_cuda_regions(driver):
    """The mode a registration renews is the one the client knew (cuda or all); an unknown one
    stays unknown (asked by the next check), as do the GPUs."""
    server = FakeServer(LAYERS)
    server.mode = "all"
    c = make_client(server)
    c.shared_memory_status()
    c.register_cuda_shared_memory("r", bytes(64), 0, 1 << 20)
    assert c._info_cache is None and c._mode_cache[1] == "all"
    c._forget_server_facts()
    c.register_cuda_shared_memory("s", bytes(64), 0, 1 << 20)
    assert c._info_cache is None and c._mode_cache is None


def test_info_and_shared_memory_status_calls_refresh_the_facts(driver):
    """load_model's own info() (server_config) is the fact its dequantize call uses."""
    server = FakeServer(LAYERS)
    c = make_client(server)
    c.info()
    c.shared_memory_status()
    _, views = one_buffer(driver)
    c.dequantize_into_tensors(views)
    assert (server.calls["GetServerInfo"], server.calls["SharedMemoryStatus"]) == (1, 1)


def test_a_passed_listing_makes_no_list_tensors_call(driver, monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    server = FakeServer(LAYERS, others={"model.norm.weight": ("BF16", [16])})
    c = make_client(server)
    listing = c.list()
    _, views = one_buffer(driver)
    c.dequantize_into_tensors(views, listing=listing)
    norm = torch.empty(64, dtype=torch.bfloat16)
    driver.add(norm, buffer_id=7)
    c.read_tensors_into({"model.norm.weight": on_cuda(norm[:16])}, listing=listing)
    assert server.calls["ListTensors"] == 1  # the caller's own
    assert server.calls["ReadTensor"] == 1 and server.calls["DequantizeLayers"] == 1


def test_a_stale_listing_of_a_stored_tensor_is_refused_before_anything_is_written(driver,
                                                                                  monkeypatch):
    # ReadTensor into a region says the bytes the caller's listing promised: a server whose
    # tensor is larger now (restarted on another model) refuses before writing past the tensor.
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    server = FakeServer(LAYERS, others={"model.norm.weight": ("BF16", [16])})
    c = make_client(server)
    listing = c.list()
    server.others["model.norm.weight"] = ("BF16", [24])
    norm = torch.empty(64, dtype=torch.bfloat16)
    driver.add(norm, buffer_id=7)
    with pytest.raises(dequantd.DequantdError) as e:
        c.read_tensors_into({"model.norm.weight": on_cuda(norm[:16])}, listing=listing)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "expected_bytes = 32, but the results are 48 bytes" in e.value.message
    assert server.calls["ReadTensor"] == 1 and not server.written


def test_a_server_restart_gets_fresh_facts_and_a_fresh_listing_before_the_retry(driver):
    server = FakeServer(LAYERS)
    c = make_client(server)
    listing = c.list()
    _, views = one_buffer(driver)
    c.dequantize_into_tensors(views, listing=listing)
    info_calls = server.calls["GetServerInfo"]
    server.restart()  # same model and flags: registered again, retried
    c.dequantize_into_tensors(views, listing=listing)
    assert server.calls["RegisterCudaSharedMemory"] == 2
    # The first call's registration forgot the facts (asked again by this call's check), and
    # the retry asks for fresh ones once more.
    assert server.calls["GetServerInfo"] == info_calls + 2
    assert server.calls["ListTensors"] == 2  # a fresh listing before the retry
    assert [w[2] == list(LAYERS) for w in server.written] == [True, True]
    # Restarted with another model: the retry is refused before any write, as the check
    # against a fresh listing refuses it.
    written = len(server.written)
    first = next(iter(LAYERS))
    server.restart(layers={**LAYERS, first: (64, 16)})
    with pytest.raises(ValueError, match=rf"^{first}: tensor shape \(32, 16\) != the layer's "
                                         r"\(K, N\) = \(64, 16\)$"):
        c.dequantize_into_tensors(views, listing=listing)
    assert len(server.written) == written


def test_a_restart_with_other_flags_raises_the_checks_error_not_the_servers(driver):
    """Facts reused from an earlier call, then the server restarted with --shared-memory=off:
    registration fails on the server; the call raises what a check with fresh facts raises."""
    server = FakeServer(LAYERS)
    c = make_client(server)
    _, views = one_buffer(driver)
    c.dequantize_into_tensors(views)
    server.restart(mode="off")
    first = next(iter(views))
    with pytest.raises(ValueError, match=rf"^{first}: the server runs with --shared-memory=off; "
                                         r"CUDA tensors need --shared-memory=cuda or all$"):
        c.dequantize_into_tensors(views)
    server.restart(mode="cuda", backend="cpu")
    with pytest.raises(ValueError, match=rf"^{first}: tensor on cuda:0 but the server's backend "
                                         r"is 'cpu'"):
        c.dequantize_into_tensors(views)


def test_any_server_error_forgets_the_facts(driver):
    server = FakeServer(LAYERS)
    c = make_client(server)
    _, views = one_buffer(driver)
    c.dequantize_into_tensors(views)
    server.mode = "off"  # registration fails (FAILED_PRECONDITION) for a new allocation
    _, more = one_buffer(driver)
    first = next(iter(more))
    with pytest.raises(ValueError, match=rf"^{first}: the server runs with --shared-memory=off"):
        c.dequantize_into_tensors(more)
    server.mode = "cuda"
    c.dequantize_into_tensors(more)
    # The first call; the second's check (the mode kept from the first's registration: the
    # refused registration is the server error), its re-check; the next call.
    assert server.calls["GetServerInfo"] == 4


def test_unavailable_forgets_the_facts(driver):
    server = FakeServer(LAYERS)
    c = make_client(server)
    c.info()
    c.shared_memory_status()
    assert c._info_cache is not None and c._mode_cache is not None

    def gone(request, timeout=None, metadata=None):
        raise RpcError(grpc.StatusCode.UNAVAILABLE, "connection refused")
    server.ListTensors = gone
    with pytest.raises(dequantd.DequantdError):
        c.list()
    assert c._info_cache is None and c._mode_cache is None


# --- every check, its exact error, the same tensor named ------------------------------------

def test_memory_that_is_no_device_allocation_is_refused(driver):
    c = make_client(FakeServer(LAYERS))
    _, views = one_buffer(driver)
    name = list(views)[3]
    views[name] = on_cuda(torch.empty((32, 16), dtype=torch.bfloat16))  # not known to the driver
    with pytest.raises(ValueError, match=rf"^{name}: the tensor's memory is no exportable device "
                                         r"allocation: cuPointerGetAttribute\(2\) failed: "
                                         r"CUDA_ERROR_INVALID_VALUE \(1\)$"):
        c.dequantize_into_tensors(views)


def test_memory_cuda_ipc_cannot_export_is_refused(driver):
    c = make_client(FakeServer(LAYERS))
    flat = torch.empty(1024, dtype=torch.bfloat16)
    driver.add(flat, ipc_capable=False)
    name = next(iter(LAYERS))
    with pytest.raises(ValueError, match=rf"^{name}: the tensor's allocation cannot be exported "
                                         r"with CUDA IPC \(torch's expandable segments\?"):
        c.dequantize_into_tensor(name, on_cuda(flat[:512].view(32, 16)))


def test_a_start_not_16_byte_aligned_is_refused(driver):
    c = make_client(FakeServer(LAYERS))
    flat = torch.empty(2048, dtype=torch.bfloat16)
    driver.add(flat)
    names = list(LAYERS)[:2]
    views = {names[0]: on_cuda(flat[:512].view(32, 16)),
             names[1]: on_cuda(flat[516:1028].view(32, 16))}  # 1032 bytes in
    with pytest.raises(ValueError, match=rf"^{names[1]}: the tensor starts 1032 bytes into its "
                                         r"allocation, not a multiple of 16 \(the server's "
                                         r"region offsets are\)$"):
        c.dequantize_into_tensors(views)


def test_a_tensor_on_a_gpu_the_server_does_not_use_is_refused(driver):
    c = make_client(FakeServer(LAYERS))
    flat = torch.empty(1024, dtype=torch.bfloat16)
    driver.add(flat, device=1)  # the server computes on device 0 only
    name = next(iter(LAYERS))
    with pytest.raises(ValueError, match=rf"^{name}: tensor on cuda:0, a GPU the server does not "
                                         r"compute on \(its devices: \[0\]"):
        c.dequantize_into_tensor(name, on_cuda(flat[:512].view(32, 16)))


def test_overlapping_cuda_tensors_are_refused(driver):
    c = make_client(FakeServer(LAYERS))
    flat = torch.empty(2048, dtype=torch.bfloat16)
    driver.add(flat)
    names = list(LAYERS)[:2]
    views = {names[0]: on_cuda(flat[:512].view(32, 16)),
             names[1]: on_cuda(flat[256:768].view(32, 16))}
    with pytest.raises(ValueError, match=rf"^{names[0]} and {names[1]}: their tensors overlap "
                                         r"in memory$"):
        c.dequantize_into_tensors(views)


@pytest.mark.parametrize("backend,mode,message", [
    ("cpu", "cuda", r"tensor on cuda:0 but the server's backend is 'cpu': CUDA tensors need a "
                    r"server run with --backend=cuda"),
    ("cuda", "host", r"the server runs with --shared-memory=host; CUDA tensors need "
                     r"--shared-memory=cuda or all$"),
])
def test_a_server_without_cuda_regions_is_refused(driver, backend, mode, message):
    server = FakeServer(LAYERS, backend=backend, mode=mode)
    c = make_client(server)
    _, views = one_buffer(driver)
    with pytest.raises(ValueError, match=rf"^{next(iter(views))}: {message}"):
        c.dequantize_into_tensors(views)
    assert driver.calls["allocation_of"] == 0 and server.calls["DequantizeLayers"] == 0


def test_the_first_bad_tensor_in_mapping_order_is_named(driver):
    """With the driver asked once per allocation, the first failing tensor is still the first
    in the mapping's order: here a misaligned one before one on another GPU."""
    c = make_client(FakeServer(LAYERS))
    good = torch.empty(2048, dtype=torch.bfloat16)
    elsewhere = torch.empty(1024, dtype=torch.bfloat16)
    driver.add(good)
    driver.add(elsewhere, device=1, buffer_id=2)
    names = list(LAYERS)[:3]
    views = {names[0]: on_cuda(good[:512].view(32, 16)),
             names[1]: on_cuda(good[516:1028].view(32, 16)),
             names[2]: on_cuda(elsewhere[:512].view(32, 16))}
    with pytest.raises(ValueError, match=rf"^{names[1]}: the tensor starts 1032 bytes"):
        c.dequantize_into_tensors(views)
    del views[names[1]]
    with pytest.raises(ValueError, match=rf"^{names[2]}: tensor on cuda:0, a GPU the server"):
        c.dequantize_into_tensors(views)
