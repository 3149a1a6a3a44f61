"""Dequantize into torch tensors the caller owns (issue 23): the checks, the CUDA-region cache and
the calls behind Client.dequantize_into_tensor / Client.dequantize_into_tensors.

CUDA tensors are written in place by the server's kernel through a CUDA IPC region: the tensor's
allocation (found with cuPointerGetAttribute, dequantd._cuda) is exported once with
cuIpcGetMemHandle, registered once (RegisterCudaSharedMemory) and cached; every later tensor in
the same allocation is a byte offset in that region. CPU tensors get the normal streamed result
written straight into their memory (a numpy view of the tensor's bytes; no second buffer).

Lifetimes (docs/python-client.md, "Torch tensors"):
- A call holds its tensors until the server's reply has come: freeing them during a call is
  safe (the memory is released after the reply).
- A registered allocation is unregistered when the last tensor storage that used it is freed
  (a weakref finalizer on each storage), when a call finds that a new allocation took its
  address (buffer-id check), and on Client.close().
- A server restart loses every region: a call that gets NOT_FOUND for its region registers
  the allocation again and is retried once (after checking the tensors again against a fresh
  listing when the caller passed its own).

Costs per call (bench/into_tensors_overhead.py): the driver is asked once per allocation, not
per tensor; the device UUID once per device per client; GetServerInfo / SharedMemoryStatus are
reused for dequantd.client.SERVER_FACTS_SECONDS (and forgotten on a server error or a refusal);
ListTensors is skipped when the caller passes the listing it has (load_model does).
- A client process that exits without close() leaves its regions registered on the server until
  the server's --shared-memory-idle-release or an Unregister (dequantd cannot see a client die).
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import itertools
import os
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import grpc
import numpy as np

from . import _cuda
from ._proto import dequant_pb2 as pb
from ._parallel import run_all
from .errors import DequantdError

ORIENTATIONS = ("KN", "NK")
ALIGNMENT = 16  # region offsets: a multiple of the kernels' widest store (the server's rule)
# Most result bytes one DequantizeLayers region call carries. Servers since issue 22 part 1
# bound each tensor's result by --max-output-bytes, not a call's sum; older ones refuse a call
# whose results add up to more than it (16 GiB by default) with RESOURCE_EXHAUSTED.
MAX_CALL_BYTES = 16 << 30

_TORCH_DTYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
_ELEMENT_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}
_names = itertools.count()


def orientation_wire(orientation: str) -> Optional[int]:
    """The wire value of `orientation` ("KN" or "NK") when this package's proto has
    DequantizeRequest.orientation and DequantizeLayersRequest.orientation (an enum with values
    whose names end in "KN" / "NK": ORIENTATION_KN, ORIENTATION_NK); None otherwise. Requests
    always carry it explicitly when it exists: its unset value means "the format's own", which is
    (N, K) for gptq layers."""
    value = None
    for message in (pb.DequantizeRequest, pb.DequantizeLayersRequest):
        field = message.DESCRIPTOR.fields_by_name.get("orientation")
        if field is None or field.enum_type is None:
            return None
        found = [v.number for v in field.enum_type.values if v.name.upper().endswith(orientation)]
        if not found:
            return None
        value = found[0]
    return value


def orientation_nk_value() -> Optional[int]:
    """orientation_wire("NK")."""
    return orientation_wire("NK")


def probe_orientation(client: Any) -> Tuple[bool, str]:
    """Whether the server writes (N, K) results when asked: (supported, reason if not). A tiny
    inline layer (K=16, N=8, G=16) asked for with the NK orientation must come back with header
    shape [8, 16]; a server that predates the field ignores it and answers [16, 8]."""
    nk = orientation_nk_value()
    if nk is None:
        return False, ("this dequantd package's proto has no DequantizeRequest.orientation "
                       "(the request orientation of issue 21 has not landed)")
    k, n, g = 16, 8, 16
    request = pb.DequantizeRequest(packed=pb.InlinePackedTensor(
        in_features=k, out_features=n, group_size=g, scale_dtype=pb.DTYPE_FP16,
        qweight=bytes(k * n // 2), qzeros=bytes(n // 2), scales=bytes(2 * n)))
    setattr(request, "orientation", nk)
    try:
        shapes = [tuple(m.header.shape) for m in client._stream(  # pylint: disable=protected-access
            client._stub.Dequantize, request) if m.HasField("header")]  # pylint: disable=protected-access
    except DequantdError as e:
        return False, f"the server refused the orientation probe: {e}"
    if shapes == [(n, k)]:
        return True, ""
    return False, (f"the server ignores the orientation field (a (K, N) = ({k}, {n}) probe came "
                   f"back as {shapes}): it predates (N, K) results")


@dataclasses.dataclass
class IntoTimes:
    """Where dequantize_into's seconds went, summed over calls: `check` (the tensors checked
    against the listing and the server's facts, no RPC unless those were not cached) and `call`
    (the DequantizeLayers / Dequantize RPCs, request sent to reply checked: the server's work,
    its kernel included, and the transport; region calls of CUDA tensors, failed attempts before
    a retry included, and the streamed calls of CPU tensors). Registration is
    RegionCache.register_seconds."""
    check_seconds: float = 0.0
    call_seconds: float = 0.0


@dataclasses.dataclass
class _Target:
    """One (layer, tensor) pair, checked. `nbytes` of the result; `cuda` whether the tensor is
    on a CUDA device; for CUDA tensors `allocation` and `offset` (bytes from the allocation's
    base); `ptr` the tensor's data_ptr() (asked once, by the check that makes the target)."""
    name: str
    tensor: Any
    dtype: str
    nbytes: int
    shape: Tuple[int, int]
    allocation: Optional[_cuda.Allocation] = None
    offset: int = 0
    cuda: bool = False
    ptr: int = 0


def dequantize_into(client: Any, tensors: Mapping[str, Any], orientation: str,
                    listing: Any = None, times: Optional[IntoTimes] = None) -> None:
    """Client.dequantize_into_tensors: check_targets, then run. A server error during the run
    forgets the client's cached server facts (Client._cached_info / _cached_mode); when the
    check used cached ones, they are fetched again and checked first, so that a server restarted
    with other flags since they were fetched gets the check's ValueError, as a check with fresh
    facts would have raised before any call. With the caller's `listing`, a retry after a
    server restart first checks the CUDA tensors again against a fresh listing. `times`: where
    the seconds went, added to it (IntoTimes)."""
    t0 = time.perf_counter()
    if listing is None:
        listing = client.list()
        fetched = True
    else:
        fetched = False
    targets, reused = _check_targets(client, tensors, orientation, listing)
    if times is not None:
        times.check_seconds += time.perf_counter() - t0
    every_layer = [layer.name for layer in listing.layers]

    def recheck() -> None:
        # A restarted server may serve another model than the caller's listing described:
        # before a retry the CUDA tensors are checked again, against a fresh listing and facts.
        client._forget_server_facts()  # pylint: disable=protected-access
        _check_targets(client, {t.name: t.tensor for t in targets if t.cuda}, orientation, None)

    try:
        run(client, targets, orientation, None if fetched else recheck, times, every_layer)
    except DequantdError:
        _after_server_error(client, [t for t in targets if t.allocation is not None], reused)
        raise


def read_into(client: Any, tensors: Mapping[str, Any], streams: int,
              listing: Any = None) -> None:
    """Client.read_tensors_into: check_stored_targets, then run_stored (server errors as for
    dequantize_into)."""
    targets, reused = _check_stored_targets(client, tensors, listing)

    def recheck() -> None:
        client._forget_server_facts()  # pylint: disable=protected-access
        _check_stored_targets(client, tensors, None)

    try:
        run_stored(client, targets, streams, None if listing is None else recheck)
    except DequantdError:
        _after_server_error(client, targets, reused)
        raise


def _after_server_error(client: Any, cuda: Sequence[_Target], reused: bool) -> None:
    client._forget_server_facts()  # pylint: disable=protected-access
    if reused and cuda:
        try:
            _check_server_facts(client, cuda, {})  # fresh facts: the check's ValueError, if any
        except DequantdError:
            pass  # the server's first error is the one raised
        except ValueError as e:
            raise e from None  # as the check raises it, not as a consequence of the error


def check_targets(client: Any, tensors: Mapping[str, Any], orientation: str,
                  listing: Any = None) -> List[_Target]:
    """Checks every (layer, tensor) of `tensors` against ListTensors (`listing`, a
    Client.list() result the caller already has, or asked now) and the server before any byte
    is written. Raises TypeError (not a tensor, a dtype dequantd does not write) or ValueError
    (unknown layer, shape, orientation, contiguity, device, alignment, overlap), each naming the
    layer and the mismatch."""
    return _check_targets(client, tensors, orientation, listing)[0]


def _check_targets(client: Any, tensors: Mapping[str, Any], orientation: str,
                   listing: Any) -> Tuple[List[_Target], bool]:
    """check_targets, and whether the CUDA checks used server facts cached by an earlier call."""
    import torch  # pylint: disable=import-outside-toplevel

    if orientation not in ORIENTATIONS:
        raise ValueError(f"orientation must be 'KN' ((K, N) = (in_features, out_features), "
                         f"AWQ's) or 'NK' (nn.Linear's (out_features, in_features)), not "
                         f"{orientation!r}")
    if not isinstance(tensors, Mapping):
        raise TypeError(f"tensors must be a mapping of layer name -> torch.Tensor, not "
                        f"{type(tensors).__name__}")
    if listing is None:
        listing = client.list()
    layers = {layer.name: layer for layer in listing.layers}
    targets = []
    codes: Dict[Any, Optional[str]] = {}  # torch dtype -> dequantd's name, this call
    for name, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(tensor).__name__}")
        layer = layers.get(name)
        if layer is None:
            raise ValueError(f"{name}: not a quantized layer of the server's model "
                             f"{listing.model!r} (Client.list().layers names its "
                             f"{len(layers)} layers)")
        dtype = codes.get(tensor.dtype, "")
        if dtype == "":
            dtype = codes[tensor.dtype] = _TORCH_DTYPES.get(
                str(tensor.dtype).replace("torch.", ""))
        if dtype is None:
            raise TypeError(f"{name}: dtype {tensor.dtype} is not one dequantd writes; use "
                            "torch.float16, torch.bfloat16 or torch.float32")
        k, n, experts = layer.in_features, layer.out_features, layer.experts
        # A layer of stacked experts (mxfp4's MoE projections, E > 1) is E matrices, one after
        # another: its tensor is (E, K, N) or (E, N, K). list() gives 1 for an older server's 0.
        want = (k, n) if orientation == "KN" else (n, k)
        if experts > 1:
            want = (experts,) + want
        # torch.Size compares as the tuple it is: no copy of the shape unless it differs.
        if tensor.shape != want:
            _raise_shape(name, tuple(tensor.shape), want, orientation, experts)
        if not tensor.is_contiguous():
            raise ValueError(f"{name}: tensor is not contiguous (strides {tuple(tensor.stride())}); "
                             "dequantd writes row-major bytes: pass a contiguous tensor")
        # is_cuda answers without building a torch.device (the loader's tensors are all CUDA).
        cuda = tensor.is_cuda or tensor.device.type == "cuda"
        if not cuda and tensor.device.type != "cpu":
            raise ValueError(f"{name}: tensor on {tensor.device}; dequantd writes CUDA tensors "
                             "(through CUDA IPC) and CPU tensors (streamed)")
        targets.append(_Target(name, tensor, dtype, experts * k * n * _ELEMENT_BYTES[dtype],
                               want, cuda=cuda, ptr=tensor.data_ptr()))

    if orientation == "NK":
        supported, reason = client._orientation_support()  # pylint: disable=protected-access
        if not supported:
            raise ValueError(f"orientation 'NK': {reason}; with this server pass (K, N) tensors "
                             "(orientation='KN') and use .T for nn.Linear")
    cuda = [t for t in targets if t.cuda]
    reused = _check_cuda_targets(client, cuda) if cuda else False
    _check_no_overlap(targets)
    return targets, reused


def _raise_shape(name: str, got: Tuple[int, ...], want: Tuple[int, ...], orientation: str,
                 experts: int) -> None:
    """The ValueError of a tensor whose shape `got` is not the layer's `want`, with a hint when
    `got` is the other orientation's shape or one expert's matrix."""
    stack = want[:-2]
    other = stack + (want[-1], want[-2])
    hint = ""
    if orientation == "KN" and got == other:
        hint = (": that is nn.Linear's (N, K) orientation; pass orientation='NK' (needs a "
                "server that writes (N, K) results) or a (K, N) tensor")
    elif orientation == "NK" and got == other:
        hint = ": that is AWQ's (K, N) orientation; pass orientation='KN'"
    elif stack and got == want[1:]:
        hint = f": the layer stacks {experts} experts, one matrix each"
    axes = "(K, N)" if orientation == "KN" else "(N, K)"
    raise ValueError(f"{name}: tensor shape {got} != the layer's "
                     f"{'(E, ' + axes[1:] if stack else axes} = {want}{hint}")


def check_stored_targets(client: Any, tensors: Mapping[str, Any],
                         listing: Any = None) -> List[_Target]:
    """Checks every (stored tensor, CUDA tensor) of `tensors` against ListTensors' other_tensors
    (`listing`, a Client.list() result the caller already has, or asked now) and the server
    before any byte is written (read_tensors_into). `dtype` of a target is the stored
    safetensors code. Raises TypeError or ValueError naming the tensor."""
    return _check_stored_targets(client, tensors, listing)[0]


def _check_stored_targets(client: Any, tensors: Mapping[str, Any],
                          listing: Any) -> Tuple[List[_Target], bool]:
    import torch  # pylint: disable=import-outside-toplevel

    from . import dtypes  # pylint: disable=import-outside-toplevel

    if not isinstance(tensors, Mapping):
        raise TypeError(f"tensors must be a mapping of tensor name -> torch.Tensor, not "
                        f"{type(tensors).__name__}")
    if listing is None:
        listing = client.list()
    stored = {t.name: t for t in listing.other_tensors}
    targets = []
    for name, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(tensor).__name__}")
        info = stored.get(name)
        if info is None:
            raise ValueError(f"{name}: not a stored tensor of the server's model (list()."
                             f"other_tensors names its {len(stored)} tensors; quantized layers "
                             "go through dequantize_into_tensors)")
        want = dtypes.torch_dtype(info.dtype)
        if tensor.dtype != want:
            raise ValueError(f"{name}: tensor dtype {tensor.dtype} != the stored {info.dtype} "
                             f"({want}); the bytes are copied unchanged: read into a {want} "
                             "tensor and cast on the device")
        if tuple(tensor.shape) != tuple(info.shape):
            raise ValueError(f"{name}: tensor shape {tuple(tensor.shape)} != the stored "
                             f"{tuple(info.shape)}")
        if not tensor.is_contiguous():
            raise ValueError(f"{name}: tensor is not contiguous (strides {tuple(tensor.stride())})")
        if tensor.device.type != "cuda":
            raise ValueError(f"{name}: tensor on {tensor.device}; read_tensors_into fills CUDA "
                             "tensors (read_tensor streams to the host)")
        targets.append(_Target(name, tensor, info.dtype, info.bytes, tuple(info.shape),
                               cuda=True, ptr=tensor.data_ptr()))
    reused = _check_cuda_targets(client, targets)
    _check_no_overlap(targets)
    return targets, reused


def run_stored(client: Any, targets: List[_Target], streams: int,
               before_retry: Optional[Callable[[], Any]] = None) -> None:
    """One ReadTensor into a region per target, `streams` at once (largest first). A server
    that predates ReadTensor into a region (UNIMPLEMENTED from read_tensor_into) gets every
    remaining target streamed and copied in; one that lost our region (a restart) gets it
    registered again and the target retried once, after `before_retry()` (run once per call;
    what it raises, every retry raises)."""

    import torch  # pylint: disable=import-outside-toplevel

    cache = client._regions_cache()  # pylint: disable=protected-access
    streamed = threading.Event()
    rechecked: List[Optional[BaseException]] = []
    recheck_lock = threading.Lock()

    def recheck() -> None:
        if before_retry is None:
            return
        with recheck_lock:
            if not rechecked:
                try:
                    before_retry()
                    rechecked.append(None)
                except BaseException as e:  # pylint: disable=broad-except
                    rechecked.append(e)
        if rechecked[0] is not None:
            raise rechecked[0]

    def streamed_copy(t: _Target) -> None:
        t.tensor.copy_(client.read_tensor(t.name, as_torch=True).view(t.tensor.shape))

    def one(t: _Target) -> None:
        if streamed.is_set():
            streamed_copy(t)
            return
        for attempt in range(2):
            region = cache.region_for(t)
            try:
                client.read_tensor_into(region, t.name, offset=t.offset, expected_bytes=t.nbytes)
                return
            except DequantdError as e:
                if e.code == grpc.StatusCode.UNIMPLEMENTED:
                    streamed.set()
                    streamed_copy(t)
                    return
                mine = cache.names()
                if (attempt == 1 or e.code != grpc.StatusCode.NOT_FOUND
                        or f'"{region}"' not in e.message):
                    raise
                held = {r.name for r in client.shared_memory_status().regions}
                cache.forget([n for n in mine if n not in held])
                recheck()

    ordered = sorted(targets, key=lambda t: -t.nbytes)
    run_all(one, ordered, streams)
    for device in {t.tensor.device for t in targets}:
        torch.cuda.synchronize(device)  # the streamed fallback's copies


def _check_server_facts(client: Any, targets: Sequence[_Target],
                        ok: Dict[int, bool]) -> Tuple[Dict[int, Any], bool]:
    """The server half of the CUDA checks: backend cuda, --shared-memory cuda or all (raised
    naming targets[0]), and, for each target whose allocation is known, its GPU among the
    server's (raised naming the first target on another GPU). Facts from Client._cached_info /
    _cached_mode (reused for a few seconds: dequantd.client.SERVER_FACTS_SECONDS); a refusal
    forgets them, so the next call asks again. `ok` keeps the per-device verdict within one
    check. Returns the server's devices by index and whether any fact was reused from an
    earlier call."""
    info, info_reused = client._cached_info()  # pylint: disable=protected-access
    if info.backend != "cuda":
        client._forget_server_facts()  # pylint: disable=protected-access  (a refusal: ask again)
        raise ValueError(f"{targets[0].name}: tensor on {targets[0].tensor.device} but the "
                         f"server's backend is {info.backend!r}: CUDA tensors need a server run "
                         "with --backend=cuda and --shared-memory=cuda (or all); pass CPU "
                         "tensors to stream")
    mode, mode_reused = client._cached_mode()  # pylint: disable=protected-access
    if mode not in ("cuda", "all"):
        client._forget_server_facts()  # pylint: disable=protected-access
        raise ValueError(f"{targets[0].name}: the server runs with --shared-memory={mode}; CUDA "
                         "tensors need --shared-memory=cuda or all")
    by_index = {d["index"]: d for d in info.devices}
    for t in targets:
        if t.allocation is not None:
            _check_device(client, t, t.allocation, by_index, ok)
    return by_index, info_reused or mode_reused


def _check_device(client: Any, t: _Target, allocation: _cuda.Allocation,
                  by_index: Dict[int, Any], ok: Dict[int, bool]) -> None:
    """ValueError unless `allocation`'s GPU is one the server computes on (by index, and by
    UUID where the server reports one); the verdict is kept in `ok` per device."""
    good = ok.get(allocation.device)
    if good is None:
        device = by_index.get(allocation.device)
        uuid = device.get("uuid") if device else None
        good = ok[allocation.device] = not (
            device is None or (uuid and uuid != client._device_uuid(allocation.device)))  # pylint: disable=protected-access
    if not good:
        client._forget_server_facts()  # pylint: disable=protected-access
        index = t.tensor.device.index if t.tensor.device.index is not None else 0
        raise ValueError(f"{t.name}: tensor on cuda:{index}, a GPU the server does not "
                         f"compute on (its devices: {sorted(by_index)}; client and server "
                         "must see the same CUDA_VISIBLE_DEVICES)")


class _Allocations:
    """The allocations found during one check, by address: a pointer inside one already found
    is in that allocation (live allocations do not overlap, and the call holds its tensors), so
    the driver is asked once per allocation, not once per tensor."""

    def __init__(self) -> None:
        self._bases: List[int] = []
        self._found: List[_cuda.Allocation] = []

    def get(self, ptr: int) -> Optional[_cuda.Allocation]:
        i = bisect.bisect_right(self._bases, ptr) - 1
        if i >= 0:
            allocation = self._found[i]
            if ptr < allocation.base + allocation.size:
                return allocation
        return None

    def add(self, allocation: _cuda.Allocation) -> None:
        i = bisect.bisect_right(self._bases, allocation.base)
        self._bases.insert(i, allocation.base)
        self._found.insert(i, allocation)


def _check_cuda_targets(client: Any, targets: Sequence[_Target]) -> bool:
    """The CUDA checks of every target, in order (the first failure raises, naming its target):
    the server's backend and --shared-memory, then per tensor its allocation (exportable device
    memory), its GPU among the server's, CUDA IPC, a 16-byte aligned start. Sets each target's
    allocation and offset. The driver is asked once per allocation (_Allocations), with the
    tensor's device current (torch.cuda.device, entered when the device changes, not per
    tensor), the device's UUID once per device per client (Client._device_uuid). Returns
    whether server facts were reused from an earlier call."""
    import torch  # pylint: disable=import-outside-toplevel

    by_index, reused = _check_server_facts(client, targets, {})
    # Region calls follow these checks: the region channel connects meanwhile (a new client's).
    client._connect_region_channel()  # pylint: disable=protected-access
    found = _Allocations()
    ok: Dict[int, bool] = {}
    # The allocation of the previous target, whose GPU passed the device check: a target
    # inside it (live allocations do not overlap) needs no lookup and no device check. Views of
    # one buffer (the loader's) are all in it: a range test and _check_export each.
    last: Optional[_cuda.Allocation] = None
    last_end = 0
    with contextlib.ExitStack() as current:
        current_device = None
        for t in targets:
            ptr = t.ptr
            if last is not None and last.base <= ptr < last_end:
                _check_export(t, last, ptr)
                continue
            allocation = found.get(ptr)
            if allocation is None:
                try:
                    if current_device is None or t.tensor.device != current_device:
                        current.pop_all().close()
                        # Its context current on this thread for the driver's calls.
                        current.enter_context(torch.cuda.device(t.tensor.device))
                        current_device = t.tensor.device
                    allocation = _cuda.allocation_of(ptr)
                except (_cuda.CudaError, ValueError) as e:
                    raise ValueError(f"{t.name}: the tensor's memory is no exportable device "
                                     f"allocation: {e}") from None
                found.add(allocation)
            _check_device(client, t, allocation, by_index, ok)
            _check_export(t, allocation, ptr)
            last, last_end = allocation, allocation.base + allocation.size
    return reused


def _check_export(t: _Target, allocation: _cuda.Allocation, ptr: int) -> None:
    """CUDA IPC can export `allocation`, and `t` starts 16-byte aligned in it: sets t's
    allocation and offset."""
    if not allocation.ipc_capable:
        raise ValueError(f"{t.name}: the tensor's allocation cannot be exported with CUDA "
                         "IPC (torch's expandable segments? unset "
                         "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)")
    t.allocation = allocation
    t.offset = ptr - allocation.base
    if t.offset % ALIGNMENT:
        raise ValueError(f"{t.name}: the tensor starts {t.offset} bytes into its allocation, "
                         f"not a multiple of {ALIGNMENT} (the server's region offsets are)")


def _check_no_overlap(targets: Sequence[_Target]) -> None:
    spans = sorted((t.ptr, t.ptr + t.nbytes, t.name) for t in targets)
    for (_, end, a), (begin, _, b) in zip(spans, spans[1:]):
        if begin < end:
            raise ValueError(f"{a} and {b}: their tensors overlap in memory")


@dataclasses.dataclass
class _Region:
    """One registered allocation: region `name` covers [base, base + size) of `allocation`;
    `storages` the finalizers of the tensor storages that used it (keyed by id)."""
    name: str
    allocation: _cuda.Allocation
    storages: Dict[int, Any] = dataclasses.field(default_factory=dict)


class RegionCache:
    """A client's registered CUDA allocations, keyed by (device, base). Thread-safe (one
    re-entrant lock: a finalizer can run inside a locked section on the same thread)."""

    def __init__(self, client: Any):
        self._client = weakref.ref(client)
        self._lock = threading.RLock()
        self._regions: Dict[Tuple[int, int], _Region] = {}
        self._closed = False
        # Seconds spent registering allocations (export + RegisterCudaSharedMemory), summed over
        # this cache's life: what a caller subtracts to see a call's own time (load_model).
        self.register_seconds = 0.0

    def names(self) -> List[str]:
        with self._lock:
            return sorted(r.name for r in self._regions.values())

    def region_for(self, target: _Target) -> str:
        """The region holding `target`'s tensor, registered now if needed; tracks its storage."""
        allocation = target.allocation
        key = (allocation.device, allocation.base)
        with self._lock:
            region = self._regions.get(key)
            if region is not None and (region.allocation.buffer_id != allocation.buffer_id
                                       or region.allocation.size != allocation.size):
                self._release(key)  # freed, and a new allocation took the address
                region = None
            if region is None:
                region = self._register(allocation)
                self._regions[key] = region
            self._track(region, key, target.tensor, target.tensor.untyped_storage())
            return region.name

    def region_for_run(self, targets: Sequence[_Target]) -> str:
        """region_for of every target of a run (targets of one allocation, _runs): the region of
        the first, every storage tracked, each distinct storage once (the loader's 225 views
        of one buffer: one)."""
        first = targets[0].allocation
        with self._lock:
            name = self.region_for(targets[0])
            key = (first.device, first.base)
            region = self._regions[key]
            held = [targets[0].tensor.untyped_storage()]  # alive: their ids stay distinct
            seen = {id(held[0])}
            for t in targets[1:]:
                if t.allocation is not first and t.allocation != first:
                    self.region_for(t)  # not one allocation after all: the general path
                    continue
                storage = t.tensor.untyped_storage()
                if id(storage) not in seen:
                    seen.add(id(storage))
                    held.append(storage)
                    self._track(region, key, t.tensor, storage)
            return name

    def _track(self, region: _Region, key: Tuple[int, int], tensor: Any, storage: Any) -> None:
        """A finalizer on `tensor`'s storage (`storage`, its untyped_storage()) that releases
        `region` with the last storage that used it."""
        # The storage's Python object outlives this call only where torch preserves it
        # (torch >= 2.1: one object per storage); else the tensor is watched instead.
        owner = storage if tensor.untyped_storage() is storage else tensor
        if id(owner) not in region.storages:
            region.storages[id(owner)] = weakref.finalize(
                owner, self._storage_freed, key, id(owner), region.name)
            region.storages[id(owner)].atexit = False

    def release_tensor(self, tensor: Any) -> None:
        """Unregisters the region holding `tensor`'s allocation now, if one is registered (the
        loader does this once the model is filled: the model's memory then has no server
        mapping)."""
        allocation = _cuda.allocation_of(tensor.data_ptr())
        with self._lock:
            if (allocation.device, allocation.base) in self._regions:
                self._release((allocation.device, allocation.base))

    def _register(self, allocation: _cuda.Allocation) -> _Region:
        client = self._client()
        name = f"dequantd-py.{os.getpid()}.{id(self):x}.{next(_names)}"
        t0 = time.perf_counter()
        client.register_cuda_shared_memory(name, _cuda.ipc_handle(allocation),
                                           allocation.device, allocation.size, offset=0)
        self.register_seconds += time.perf_counter() - t0
        return _Region(name, allocation)

    def forget(self, names: Sequence[str]) -> None:
        """Drops regions the server no longer has (after a restart) without an Unregister; the
        next region_for registers their allocations again."""
        with self._lock:
            for key in [k for k, r in self._regions.items() if r.name in names]:
                for fin in self._regions.pop(key).storages.values():
                    fin.detach()

    def _storage_freed(self, key: Tuple[int, int], storage_id: int, name: str) -> None:
        with self._lock:
            region = self._regions.get(key)
            if region is None or region.name != name:
                return
            region.storages.pop(storage_id, None)
            if not region.storages:
                self._release(key)

    def _release(self, key: Tuple[int, int]) -> None:
        region = self._regions.pop(key)
        for fin in region.storages.values():
            fin.detach()
        client = self._client()
        if client is None or self._closed:
            return
        try:
            client.unregister_cuda_shared_memory(region.name, timeout=5.0)
        except DequantdError:
            pass  # the server is gone or restarted: it holds no region of ours any more

    def close(self) -> None:
        """Unregisters every region (Client.close)."""
        with self._lock:
            for key in list(self._regions):
                self._release(key)
            self._closed = True


def _torch_bytes(tensor: Any) -> np.ndarray:
    """A writable uint8 numpy view of a contiguous CPU tensor's bytes (no copy)."""
    import torch  # pylint: disable=import-outside-toplevel

    return tensor.detach().reshape(-1).view(torch.uint8).numpy()


def run(client: Any, targets: List[_Target], orientation: str,
        before_retry: Optional[Callable[[], Any]] = None,
        times: Optional[IntoTimes] = None,
        every_layer: Optional[List[str]] = None) -> None:
    """Writes every target: CUDA ones through regions (consecutive tensors of one allocation in
    one DequantizeLayers call), CPU ones through one streamed DequantizeLayers per dtype. After
    a server restart (NOT_FOUND for one of our regions) the regions are registered again and
    the region calls retried once, after `before_retry()`. `every_layer`: the names of the
    listing the targets were checked against, in its order: a run of exactly those sends the
    empty list (every layer, in ListTensors order: the proto's contract) instead of the names;
    the retry always sends names."""
    wire = orientation_wire(orientation)  # None: a proto before orientations (KN only)
    cpu = [t for t in targets if t.allocation is None]
    t0 = time.perf_counter()
    for dtype in sorted({t.dtype for t in cpu}):
        group = {t.name: _torch_bytes(t.tensor) for t in cpu if t.dtype == dtype}
        request = pb.DequantizeLayersRequest(output_dtype=_wire(dtype), tensors=list(group),
                                             chunk_bytes=client._chunk_bytes)  # pylint: disable=protected-access
        if wire is not None:
            setattr(request, "orientation", wire)
        seen = []
        for result in client._layer_results(request, buffers=group):  # pylint: disable=protected-access
            said = getattr(result, "orientation", 0)  # 0: a server that does not say
            if wire is not None and said not in (0, wire):
                raise DequantdError(grpc.StatusCode.DATA_LOSS,
                                    f"{result.name}: the server wrote orientation {said}, asked "
                                    f"for {wire} ({orientation})")
            seen.append(result.name)
        if seen != list(group):
            raise DequantdError(grpc.StatusCode.DATA_LOSS,
                                f"streamed layers {seen} != the requested {list(group)}")
    if times is not None and cpu:
        times.call_seconds += time.perf_counter() - t0
    cuda = [t for t in targets if t.allocation is not None]
    if not cuda:
        return
    try:
        _run_regions(client, cuda, wire, times, every_layer)
    except DequantdError as e:
        mine = client._regions_cache().names()  # pylint: disable=protected-access
        if e.code != grpc.StatusCode.NOT_FOUND or not any(f'"{n}"' in e.message for n in mine):
            raise
        # The server lost our region (a restart): register again and retry once.
        held = {r.name for r in client.shared_memory_status().regions}
        client._regions_cache().forget([n for n in mine if n not in held])  # pylint: disable=protected-access
        if before_retry is not None:
            before_retry()
        _run_regions(client, cuda, wire, times)


def _runs(targets: List[_Target]) -> List[List[_Target]]:
    """Targets grouped into runs of one allocation, one dtype, each tensor starting where the
    previous one ends, at most MAX_CALL_BYTES each (one DequantizeLayers call each), in memory
    order."""
    ordered = targets
    if not _in_memory_order(targets):
        ordered = sorted(targets, key=lambda t: (t.allocation.device, t.allocation.base,
                                                 t.offset))
    runs: List[List[_Target]] = []
    current: List[_Target] = []  # runs[-1]
    run_bytes = 0  # of current
    last: Optional[_Target] = None  # current[-1]
    for t in ordered:
        a = t.allocation
        if (last is not None and (a is last.allocation or (a.base == last.allocation.base
                                                           and a.device == last.allocation.device))
                and last.dtype == t.dtype and last.offset + last.nbytes == t.offset
                and run_bytes + t.nbytes <= MAX_CALL_BYTES):
            current.append(t)
            run_bytes += t.nbytes
        else:
            current = [t]
            runs.append(current)
            run_bytes = t.nbytes
        last = t
    return runs


def _in_memory_order(targets: Sequence[_Target]) -> bool:
    """Whether `targets` are already in _runs' order: each of one allocation object with the
    one before it at a higher offset (the loader's views, laid out in its order), so that the
    sort, a key tuple per target, is skipped. False sends any other case through the sort."""
    for before, t in zip(targets, targets[1:]):
        if t.allocation is not before.allocation or t.offset <= before.offset:
            return False
    return True


def _run_regions(client: Any, targets: List[_Target], wire: Optional[int],
                 times: Optional[IntoTimes] = None,
                 every_layer: Optional[List[str]] = None) -> None:
    """One region call per run. A run of several tensors is one DequantizeLayers whose reply is
    the summary alone (REGION_REPLY_SUMMARY, issue 23): each tensor's place was worked out before
    the call from ListTensors (check_targets: K * N * element bytes) and _runs (one after another
    from the first tensor's offset, the server's placement rule), so the summary only has to
    confirm the count, the bytes, the region, the offset, the dtype and the orientation. Every
    call says the bytes it expects (output_region.expected_bytes): a server whose model is not
    the listing's (restarted on another model) refuses before writing, so memory past the
    tensors is never touched (a server older than the field ignores it). A run of every layer in
    `every_layer`'s order sends no names (the request stays ~100 bytes instead of ~30 per layer,
    and the server skips the name lookups)."""
    cache = client._regions_cache()  # pylint: disable=protected-access
    for run_ in _runs(targets):
        region = cache.region_for_run(run_)  # tracks every storage of the run
        t0 = time.perf_counter()
        try:
            _run_region_call(client, run_, region, wire, every_layer)
        finally:  # a failed call's seconds too (a retry follows it)
            if times is not None:
                times.call_seconds += time.perf_counter() - t0


def _run_region_call(client: Any, run_: List[_Target], region: str, wire: Optional[int],
                     every_layer: Optional[List[str]]) -> None:
    """_run_regions' call for one run: Dequantize for one tensor, else DequantizeLayers with
    the summary reply; DATA_LOSS when the reply does not describe the run."""
    first = run_[0]
    if len(run_) == 1:
        header = client._region_call_into(region, first.name, first.offset, first.dtype, wire,  # pylint: disable=protected-access
                                          first.nbytes)
        header = dataclasses.replace(header, tensor=first.name)
        if (header.region_offset != first.offset or tuple(header.shape) != first.shape
                or header.total_bytes != first.nbytes):
            raise DequantdError(grpc.StatusCode.DATA_LOSS,
                                f"{first.name}: the server wrote {header.shape} "
                                f"({header.total_bytes} bytes) at offset "
                                f"{header.region_offset}, expected {first.shape} "
                                f"({first.nbytes} bytes) at {first.offset}")
    else:
        names: Optional[List[str]] = [t.name for t in run_]
        if names == every_layer:
            names = None  # every layer, in ListTensors order
        summary = client._region_layers_summary(region, names, first.offset,  # pylint: disable=protected-access
                                                first.dtype, wire,
                                                sum(t.nbytes for t in run_))
        check_summary(summary, run_, region, wire)


def check_summary(summary: Any, run_: Sequence[_Target], region: str,
                  wire: Optional[int]) -> None:
    """DATA_LOSS unless `summary` (a RegionSummary) is what writing `run_` (tensors one after
    another from run_[0].offset) into `region` must report."""
    want_bytes = sum(t.nbytes for t in run_)
    want_orientation = {pb.ORIENTATION_KN: "KN", pb.ORIENTATION_NK: "NK"}.get(wire, "")
    problems = []
    if summary.layer_count != len(run_):
        problems.append(f"{summary.layer_count} layers, expected {len(run_)}")
    if summary.total_bytes != want_bytes:
        problems.append(f"{summary.total_bytes} bytes, expected {want_bytes}")
    if summary.region != region or summary.region_offset != run_[0].offset:
        problems.append(f"region {summary.region!r} at {summary.region_offset}, expected "
                        f"{region!r} at {run_[0].offset}")
    if summary.dtype != run_[0].dtype:
        problems.append(f"dtype {summary.dtype}, expected {run_[0].dtype}")
    if want_orientation and summary.orientation not in ("", want_orientation):
        problems.append(f"orientation {summary.orientation}, expected {want_orientation}")
    if problems:
        raise DequantdError(grpc.StatusCode.DATA_LOSS,
                            f"{run_[0].name}..{run_[-1].name}: the server's summary says "
                            + "; ".join(problems))


def _wire(dtype: str) -> int:
    return {"fp16": pb.DTYPE_FP16, "bf16": pb.DTYPE_BF16, "fp32": pb.DTYPE_FP32}[dtype]
