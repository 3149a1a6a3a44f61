"""The dequantd gRPC client (see README.md for a walk-through)."""

from __future__ import annotations

import dataclasses
import json
import numbers
import threading
import time
import weakref
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import grpc
import numpy as np

from . import _cuda
from . import dtypes
from . import tensors as tensors_module
from ._proto import dequant_pb2 as pb
from ._proto import dequant_pb2_grpc as pb_grpc
from ._parallel import current_group, run_all
from .errors import DequantdError

MiB = 1 << 20

# Most parallel byte-range streams one dequantize() opens (the same bound as dequantctl --streams:
# each stream is a thread and an RPC).
MAX_STREAMS = 64

# Channel defaults. Every response message of dequantd is at most 4 MiB (chunked streams); 64 MiB
# leaves room for a large ListTensors/Benchmark answer. Sends: inline packed layers up to the
# server's max_request_bytes (256 MiB by default). Keepalive every 5 minutes: gRPC servers by
# default refuse pings more often than that on a connection without data (GOAWAY "too_many_pings"),
# which would kill a long Benchmark call; 5 minutes still finds a dead peer.
DEFAULT_CHANNEL_OPTIONS: Tuple[Tuple[str, Any], ...] = (
    ("grpc.max_receive_message_length", 64 * MiB),
    ("grpc.max_send_message_length", 512 * MiB),
    ("grpc.keepalive_time_ms", 300_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 0),
)

# The calls that write into a region (the model loader's) go over a channel of their own, opened at
# the first such call (or before it, Client._connect_region_channel), with these options over the
# client's: "SingleThreadedUnaryStream" (grpc.experimental.ChannelOptions, grpcio >= 1.26, read by
# grpcio's Python layer) polls a server stream on the calling thread instead of handing each
# message over from a background thread. A region call is a server stream of one message: its
# client side is ~300 us shorter so (docs/performance.md, "Python region calls"). Not on the main
# channel: grpcio never frees such a call once it is cancelled before its end (~20 KB per abandoned
# stream, a caller that stops reading dequantize_layers early), and region calls are always read to
# their end. grpcio reads the key by its presence, whatever its value:
# ("SingleThreadedUnaryStream", 0) in a Client's `options` leaves it out of both channels.
SINGLE_THREADED_UNARY_STREAM = "SingleThreadedUnaryStream"
REGION_CHANNEL_OPTIONS: Tuple[Tuple[str, Any], ...] = ((SINGLE_THREADED_UNARY_STREAM, 1),)

ArrayLike = Any  # numpy.ndarray or torch.Tensor

# How long the server facts that the CUDA tensor checks use (GetServerInfo's backend and devices,
# SharedMemoryStatus's mode) are reused by later dequantize_into_tensors / read_tensors_into
# calls of the same client, in seconds: at most this old, or fresh from the client's last info()
# / shared_memory_status() call (load_model's own info() refreshes them). They change only when
# the server restarts with other flags; any server error during such a call, and UNAVAILABLE
# from any call, forgets them, and a call whose check used reused facts checks again with fresh
# ones before raising the server's error (tensors.dequantize_into).
SERVER_FACTS_SECONDS = 2.0


@dataclasses.dataclass(frozen=True)
class LayerInfo:
    """A quantized layer: `name` is its prefix ("model.layers.0.mlp.down_proj"); K =
    in_features, N = out_features; `scale_dtype` is "fp16", "bf16", "fp32" (compressed-tensors,
    fp8_block) or "uint8" (mxfp4's E8M0); `format` e.g. "awq_gemm", "gptq", "compressed_tensors",
    "fp8_block", "compressed_tensors_fp8", "mxfp4";
    `orientation` its format's own result layout, "kn" ((K, N)) or "nk" ((N, K)): what a call
    with orientation=None returns; `experts` the matrices stacked in the layer (mxfp4's MoE
    experts E: the result is (E, K, N) or (E, N, K)); 1 for every other format."""
    name: str
    in_features: int
    out_features: int
    group_size: int
    scale_dtype: str
    packed_bytes: int
    resident_on_device: bool
    format: str = "awq_gemm"
    orientation: str = "kn"
    experts: int = 1


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """A tensor served as stored (embedding, norm, bias, lm_head): `dtype` is the safetensors
    code ("F16", "BF16", "F32", "I64", ...), `shape` in elements, `bytes` its size."""
    name: str
    dtype: str
    shape: Tuple[int, ...]
    bytes: int


@dataclasses.dataclass(frozen=True)
class ModelTensors:
    """What ListTensors returns: the model directory, its quantized layers and other tensors,
    both sorted by name."""
    model: str
    layers: List[LayerInfo]
    other_tensors: List[TensorInfo]


@dataclasses.dataclass(frozen=True)
class ServerInfo:
    """GetServerInfo: version, backend ("cuda"/"cpu"), devices (dicts), model directory, the
    number of quantized layers, CPU threads, and the model's config.json (dict; {} if none)."""
    version: str
    backend: str
    devices: List[Dict[str, Any]]
    model: str
    tensor_count: int
    cpu_threads: int
    model_config: Dict[str, Any]


@dataclasses.dataclass(frozen=True)
class RegionHeader:
    """Where a call into a shared-memory region put one result: it fills bytes
    [region_offset, region_offset + total_bytes) of `region`, row-major (K, N) = `shape` of
    `dtype` ("fp16", "bf16", "fp32"). `tensor` is the layer's name in dequantize_layers_into's
    headers ("" from dequantize_into, as in a streamed Dequantize header); `backend` and `kernel`
    are the server's."""
    tensor: str
    shape: Tuple[int, ...]
    dtype: str
    total_bytes: int
    region: str
    region_offset: int
    backend: str
    kernel: str


@dataclasses.dataclass(frozen=True)
class RegionSummary:
    """The whole reply of dequantize_layers_into(..., reply="summary") (issue 23): `layer_count`
    results of `dtype` in `orientation` ("KN" or "NK") fill bytes [region_offset, region_offset +
    total_bytes) of `region`, one after another in request order, each K * N * element bytes (K
    and N from list()); `backend` and `kernel` are the server's."""
    layer_count: int
    total_bytes: int
    region: str
    region_offset: int
    dtype: str
    orientation: str
    backend: str
    kernel: str


@dataclasses.dataclass(frozen=True)
class RegionInfo:
    """One registered shared-memory region (SharedMemoryStatus): `kind` "host" (a POSIX
    shared-memory object `key`, `pinned` when the server registered it for DMA) or "device" (a
    CUDA buffer on `device_id`; `key` ""; `device_id` is -1 for host regions); bytes
    [offset, offset + byte_size) as registered; `owner` the peer that registered it
    ("ipv4:127.0.0.1:41234"); `calls_in_flight` calls writing into it now; `idle_seconds` since
    it was registered or last written."""
    name: str
    kind: str
    key: str
    device_id: int
    offset: int
    byte_size: int
    pinned: bool
    owner: str
    calls_in_flight: int
    idle_seconds: float


@dataclasses.dataclass(frozen=True)
class SharedMemoryStatus:
    """SharedMemoryStatus: the registered regions (sorted by name) and the server's settings:
    `mode` its --shared-memory (off, host, cuda or all), `max_regions` and `max_bytes` (total
    registered bytes) its limits, `idle_release_seconds` after which an idle region is released
    (0 = never)."""
    regions: List[RegionInfo]
    mode: str
    max_regions: int
    max_bytes: int
    idle_release_seconds: float


def _region_header(h: Any) -> RegionHeader:
    name = {wire: name for name, wire in dtypes.OUTPUT_DTYPES.items()}.get(h.dtype,
                                                                          pb.DType.Name(h.dtype))
    return RegionHeader(h.tensor, tuple(h.shape), name, h.total_bytes, h.region, h.region_offset,
                        h.backend, h.kernel)


def _region_summary(m: Any) -> RegionSummary:
    name = {wire: name for name, wire in dtypes.OUTPUT_DTYPES.items()}.get(m.dtype,
                                                                          pb.DType.Name(m.dtype))
    orientation = {pb.ORIENTATION_KN: "KN", pb.ORIENTATION_NK: "NK"}.get(m.orientation, "")
    return RegionSummary(m.layer_count, m.total_bytes, m.region, m.region_offset, name,
                         orientation, m.backend, m.kernel)


def _summary_of_headers(headers: List[RegionHeader], region: str, offset: int,
                        orientation: str) -> RegionSummary:
    """The summary an older server's headers add up to (it ignores region_reply and answers with
    every header); DATA_LOSS unless they lie one after another from `offset`."""
    at = offset
    for h in headers:
        if h.region_offset != at:
            raise DequantdError(grpc.StatusCode.DATA_LOSS,
                                f"reply of a DequantizeLayers into region {region!r}: layer "
                                f"{h.tensor!r} at offset {h.region_offset}, expected {at}")
        at += h.total_bytes
    first = headers[0]
    return RegionSummary(len(headers), at - offset, region, offset, first.dtype, orientation,
                         first.backend, first.kernel)


_SCALE_NAMES = {pb.DTYPE_FP16: "fp16", pb.DTYPE_BF16: "bf16", pb.DTYPE_FP32: "fp32",
                pb.DTYPE_UINT8: "uint8"}


def _scale_name(wire: int) -> str:
    name = _SCALE_NAMES.get(wire)
    return name if name is not None else pb.DType.Name(wire)


def supports_byte_ranges() -> bool:
    """Whether this package's proto has DequantizeRequest byte ranges (`offset`, `length`)."""
    fields = pb.DequantizeRequest.DESCRIPTOR.fields_by_name
    return "offset" in fields and "length" in fields


class _Progress:
    """A tqdm bar in bytes (bytes/s shown) when enabled and tqdm is installed; else nothing."""

    def __init__(self, enabled: bool, total: Optional[int], desc: str):
        self._bar = None
        if enabled:
            try:
                from tqdm.auto import tqdm  # pylint: disable=import-outside-toplevel
            except ImportError:
                return
            self._bar = tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024)

    def update(self, n: int) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


class _Assembler:
    """Collects one result's chunks into a preallocated buffer and checks that they add up
    (DATA_LOSS otherwise): offsets inside the result and, for one stream (`sequential`),
    consecutive from 0; all bytes received."""

    def __init__(self, name: str, code: str, shape: Tuple[int, ...], total: int,
                 sequential: bool = True, buffer: Optional[np.ndarray] = None):
        self.name, self.code, self.shape, self.total = name, code, shape, total
        self.sequential = sequential
        self.orientation = 0  # the header's Orientation (set by _layer_results; 0 = unsaid)
        expected = int(np.prod(shape, dtype=np.int64)) * dtypes.element_bytes(code)
        if expected != total:
            raise DequantdError(grpc.StatusCode.DATA_LOSS,
                                f"{name}: header total_bytes {total} != shape {shape} x {code}")
        if buffer is not None and buffer.nbytes != total:
            raise DequantdError(grpc.StatusCode.DATA_LOSS,
                                f"{name}: the server's result is {total} bytes, the destination "
                                f"{buffer.nbytes}")
        # The caller's memory (a uint8 view of a tensor, dequantize_into_tensors) or our own.
        self.buffer = buffer if buffer is not None else np.empty(total, dtype=np.uint8)
        self.received = 0

    def add(self, offset: int, data: bytes) -> None:
        end = offset + len(data)
        if self.sequential and offset != self.received:
            raise DequantdError(grpc.StatusCode.DATA_LOSS,
                                f"{self.name}: chunk at offset {offset}, expected {self.received}")
        if offset < 0 or end > self.total:
            raise DequantdError(grpc.StatusCode.DATA_LOSS,
                                f"{self.name}: chunk [{offset}, {end}) outside {self.total} bytes")
        self.buffer[offset:end] = np.frombuffer(data, dtype=np.uint8)
        self.received += len(data)

    def check(self) -> "_Assembler":
        """Raises DATA_LOSS unless every byte arrived."""
        if self.received != self.total:
            raise DequantdError(grpc.StatusCode.DATA_LOSS,
                                f"{self.name}: received {self.received} of {self.total} bytes")
        return self

    def result(self, as_torch: bool, bf16_bits: bool = False) -> ArrayLike:
        self.check()
        return dtypes.from_bytes(self.buffer, self.code, self.shape, as_torch, bf16_bits)


def _to_numpy(array: ArrayLike) -> np.ndarray:
    """A C-contiguous numpy view/copy of a numpy array or (CPU or GPU) torch tensor; torch
    bfloat16 becomes ml_dtypes-free uint16 bits (only the bytes are sent)."""
    if hasattr(array, "detach"):  # torch.Tensor
        t = array.detach().cpu().contiguous()
        if str(t.dtype) == "torch.bfloat16":
            import torch  # pylint: disable=import-outside-toplevel

            return t.view(torch.int16).numpy().view(np.uint16)
        return t.numpy()
    return np.ascontiguousarray(array)


def _scale_wire_dtype(scales: ArrayLike, np_scales: np.ndarray) -> int:
    name = str(getattr(scales, "dtype", np_scales.dtype))
    if "bfloat16" in name:
        return pb.DTYPE_BF16
    if name in ("float16", "torch.float16"):
        return pb.DTYPE_FP16
    raise TypeError(f"scales must be float16 or bfloat16, not {name}")


def _orientation(orientation: Optional[str]) -> int:
    """--orientation's spelling as the wire enum: None = the format's own (UNSPECIFIED)."""
    if orientation is None:
        return pb.ORIENTATION_UNSPECIFIED
    wire = {"kn": pb.ORIENTATION_KN, "nk": pb.ORIENTATION_NK}.get(str(orientation).lower())
    if wire is None:
        raise ValueError(f"orientation must be 'kn', 'nk' or None (the format's own), "
                         f"got {orientation!r}")
    return wire


def _deadline(timeout: Optional[float], what: str) -> Optional[float]:
    """A timeout argument as gRPC's: None or inf = no deadline; else a finite number > 0
    (ValueError otherwise: gRPC would fail every call at once with DEADLINE_EXCEEDED)."""
    if timeout is None or timeout == float("inf"):
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"{what} must be a number of seconds > 0, inf or None, got {timeout!r}")
    return float(timeout)


def _name(value: Any, what: str) -> str:
    """A tensor name argument: a str, else TypeError naming the argument (protobuf's own error
    for a wrong type says only "bad argument type for built-in operation")."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str (a name from list()), got "
                        f"{type(value).__name__} {value!r}")
    return value


def _expected_bytes(value: Any) -> int:
    """A region call's expected_bytes argument: an int >= 0 (0: unchecked) that fits the
    proto's int64, else TypeError / ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"expected_bytes must be an int (bytes; 0 = unchecked), got "
                        f"{type(value).__name__} {value!r}")
    if not 0 <= value < 1 << 63:
        raise ValueError(f"expected_bytes must be >= 0 and < 2**63 (0 = unchecked), got {value}")
    return int(value)


def _layer_names(names: Iterable[str]) -> List[str]:
    """`names` as a list of layer names. A single string is refused (TypeError): iterated, it
    would ask for one layer per character."""
    if isinstance(names, (str, bytes)):
        raise TypeError(f"names must be a list of layer names, not a single string: pass "
                        f"[{names!r}]")
    return [_name(n, f"names[{i}]") for i, n in enumerate(names)]


_TARGET_SCHEMES = ("unix:", "unix-abstract:", "dns:", "ipv4:", "ipv6:")


def _ignore_connectivity(state: grpc.ChannelConnectivity) -> None:
    """The subscriber of Client._connect_region_channel (it wants the connection, not the
    states)."""


def _check_target(target: Any) -> str:
    """`target` as Client takes it, by dequantctl --server's rule: a gRPC target with a scheme
    (unix:PATH, unix-abstract:NAME, dns:..., ipv4:..., ipv6:...) as it is, else HOST:PORT or
    [IPV6]:PORT with a port of ASCII digits in 1..65535 and a host without spaces. ValueError
    otherwise: gRPC itself reads a port of 506514 as 47762 and an empty target as a resolver
    error in its log."""
    if not isinstance(target, str):
        raise TypeError(f"target must be a str such as '127.0.0.1:50051', got "
                        f"{type(target).__name__}")
    if any(target.startswith(s) and len(target) > len(s) for s in _TARGET_SCHEMES):
        return target
    host, colon, port = target.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]") and len(host) > 2
    host_ok = bracketed or (host != "" and not any(c in host for c in "[]:")
                            and not any(c.isspace() for c in host))
    if (colon and host_ok and port.isascii() and port.isdigit() and len(port) <= 5
            and 1 <= int(port) <= 65535):
        return target
    raise ValueError(f"target {target!r} must be HOST:PORT with a port in 1..65535 (e.g. "
                     f"'127.0.0.1:50051'), or a gRPC target such as 'unix:/path/to.sock'")


class Client:
    """A connection to one dequantd server. Thread-safe (gRPC channels are); use as a context
    manager or call close().

    Args:
        target: "host:port" (e.g. "127.0.0.1:50051", port 1..65535), or a gRPC target with a
            scheme ("unix:/path.sock", "dns:...", ...); ValueError otherwise.
        timeout: deadline in seconds for the short calls (info, list); None or inf = no
            deadline. Default 60. ValueError for 0, a negative number or NaN.
        stream_timeout: deadline in seconds for dequantize / read_tensor / dequantize_layers
            calls; None (default) = none (a whole model may take a while on a slow link).
        credentials: grpc.ChannelCredentials for TLS (grpc.ssl_channel_credentials(...), or
            security_options(...)'s, which also does mutual TLS); None = plaintext (dequantd's
            default; its --tls-cert/--tls-key turn TLS on, docs/security.md).
        metadata: extra (key, value) metadata sent with every call: the bearer token of a
            server run with --auth-tokens, ("authorization", "Bearer TOKEN"), as
            security_options(...) gives it, or headers for a proxy in front of dequantd.
        options: extra gRPC channel options, overriding DEFAULT_CHANNEL_OPTIONS by name
            (region calls go over a second channel with REGION_CHANNEL_OPTIONS over these;
            ("SingleThreadedUnaryStream", 0) turns grpcio's single-threaded streams off there).
        chunk_bytes: payload bytes per streamed message asked for; 0 = the server's default.
    """

    def __init__(self, target: str, *, timeout: Optional[float] = 60.0,
                 stream_timeout: Optional[float] = None,
                 credentials: Optional[grpc.ChannelCredentials] = None,
                 metadata: Sequence[Tuple[str, str]] = (),
                 options: Sequence[Tuple[str, Any]] = (), chunk_bytes: int = 0):
        self.target = _check_target(target)
        self._credentials = credentials
        self._options = dict(DEFAULT_CHANNEL_OPTIONS)
        self._options.update(dict(options))
        self._channel = self._open_channel(self._options)
        self._stub = pb_grpc.DequantServiceStub(self._channel)
        # Region calls' channel (REGION_CHANNEL_OPTIONS), opened by _regions_stub.
        self._region_channel: Optional[grpc.Channel] = None
        self._region_stub: Any = None
        self._timeout = _deadline(timeout, "timeout")
        self._stream_timeout = _deadline(stream_timeout, "stream_timeout")
        self._metadata = tuple(metadata)
        self._chunk_bytes = chunk_bytes
        self._lock = threading.Lock()
        self._cuda_regions: Optional["tensors_module.RegionCache"] = None
        self._orientation: Optional[Tuple[bool, str]] = None
        # The server facts of the CUDA checks, (time.monotonic(), value), SERVER_FACTS_SECONDS;
        # this process's CUDA device UUIDs by ordinal (fixed while it lives).
        self._info_cache: Optional[Tuple[float, ServerInfo]] = None
        self._mode_cache: Optional[Tuple[float, str]] = None
        self._device_uuids: Dict[int, str] = {}

    def close(self) -> None:
        """Unregisters the CUDA regions dequantize_into_tensor(s) registered (best effort: a
        server that is gone holds none), then closes the channel; calls in flight are
        cancelled."""
        if self._cuda_regions is not None:
            self._cuda_regions.close()
        with self._lock:
            if self._region_channel is not None:
                self._region_channel.close()
            # A region call after close() fails as every other call does (grpc's closed-channel
            # error), instead of opening the region channel anew.
            self._region_stub = self._stub
        self._channel.close()

    def _open_channel(self, options: Dict[str, Any]) -> grpc.Channel:
        # grpcio turns the single-threaded path on when the key is present, whatever its value.
        opts = [(k, v) for k, v in options.items() if v or k != SINGLE_THREADED_UNARY_STREAM]
        if self._credentials is not None:
            return grpc.secure_channel(self.target, self._credentials, options=opts)
        return grpc.insecure_channel(self.target, options=opts)

    def _regions_stub(self) -> Any:
        """The stub of the region calls' channel (REGION_CHANNEL_OPTIONS over the client's
        options), opened at the first call unless _connect_region_channel opened it before."""
        if self._region_stub is None:
            with self._lock:
                if self._region_stub is None:
                    self._open_region_channel()
        return self._region_stub

    def _open_region_channel(self) -> grpc.Channel:
        """Opens the region calls' channel and its stub (self._lock held)."""
        options = dict(REGION_CHANNEL_OPTIONS)
        options.update(self._options)
        self._region_channel = self._open_channel(options)
        self._region_stub = pb_grpc.DequantServiceStub(self._region_channel)
        return self._region_channel

    def _connect_region_channel(self) -> None:
        """Opens the region calls' channel now, if it is not open yet, and starts its connection
        without waiting for it: called where a region call is coming (load_model, the CUDA
        checks), so that the first region call of a client does not wait for the channel's TCP
        and HTTP/2 setup (0.25-0.4 ms of a new client's first region call against the CPU
        dequantd on the 2-core build VM). A channel already open (or closed) is left as it is; a
        connection that fails is tried again by the call, as for a channel opened at the call."""
        if self._region_stub is not None:
            return
        with self._lock:
            if self._region_stub is not None:
                return
            channel = self._open_region_channel()
        # grpcio's public way to ask a channel to connect: a subscription with try_to_connect,
        # dropped at once (its polling thread asks once, then ends within 0.2 s).
        channel.subscribe(_ignore_connectivity, try_to_connect=True)
        channel.unsubscribe(_ignore_connectivity)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- calls -----------------------------------------------------------------------------

    def _unary(self, method: Callable, request: Any, timeout: Optional[float]) -> Any:
        timeout = _deadline(timeout, "timeout")
        group = current_group()  # a run_all worker's: a future, so that the run can cancel it
        future = getattr(method, "future", None)  # grpc's multicallables have it; fakes may not
        try:
            if group is None or future is None:
                return method(request, timeout=timeout, metadata=self._metadata)
            call = future(request, timeout=timeout, metadata=self._metadata)
            group.add(call)
            try:
                return call.result()
            finally:
                group.discard(call)
        except grpc.RpcError as e:
            raise self._error(e) from None
        except grpc.FutureCancelledError:
            raise DequantdError(grpc.StatusCode.CANCELLED,
                                "cancelled: another call of the same operation failed, or the "
                                "caller was interrupted") from None

    def _stream(self, method: Callable, request: Any) -> Iterator[Any]:
        call = method(request, timeout=self._stream_timeout, metadata=self._metadata)
        group = current_group()  # a run_all worker's: cancelled when the run is stopped
        if group is not None:
            group.add(call)
        try:
            yield from call
        except grpc.RpcError as e:
            raise self._error(e) from None
        finally:
            call.cancel()  # no-op when finished; stops the server when the caller stops early
            if group is not None:
                group.discard(call)

    def _error(self, e: grpc.RpcError) -> DequantdError:
        error = DequantdError.from_rpc_error(e)
        if error.code == grpc.StatusCode.UNAVAILABLE:
            self._forget_server_facts()  # the server went away: it may come back changed
        return error

    def _cached_info(self) -> Tuple[ServerInfo, bool]:
        """info(), reused when at most SERVER_FACTS_SECONDS old: (info, whether reused)."""
        cached = self._info_cache
        if cached is not None and time.monotonic() - cached[0] <= SERVER_FACTS_SECONDS:
            return cached[1], True
        return self.info(), False

    def _cached_mode(self) -> Tuple[str, bool]:
        """shared_memory_status().mode, reused as _cached_info: (mode, whether reused)."""
        cached = self._mode_cache
        if cached is not None and time.monotonic() - cached[0] <= SERVER_FACTS_SECONDS:
            return cached[1], True
        return self.shared_memory_status().mode, False

    def _forget_server_facts(self) -> None:
        self._info_cache = None
        self._mode_cache = None

    def _device_uuid(self, device: int) -> str:
        """_cuda.device_uuid(device), asked once per device (a process's ordinals name the same
        GPUs while it lives)."""
        uuid = self._device_uuids.get(device)
        if uuid is None:
            uuid = self._device_uuids[device] = _cuda.device_uuid(device)
        return uuid

    def info(self, *, timeout: Optional[float] = ...) -> ServerInfo:  # type: ignore[assignment]
        """GetServerInfo. Raises DequantdError (e.g. UNAVAILABLE when nothing listens)."""
        r = self._unary(self._stub.GetServerInfo, pb.GetServerInfoRequest(),
                        self._timeout if timeout is ... else timeout)
        devices = [{"index": d.index, "name": d.name, "compute_capability": d.compute_capability,
                    "memory_bytes": d.memory_bytes, "driver_version": d.driver_version,
                    # A proto with DeviceInfo.uuid: the GPU as nvidia-smi names it ("" if not).
                    "uuid": getattr(d, "uuid", "")}
                   for d in r.devices]
        config = json.loads(r.model_config_json) if r.model_config_json else {}
        info = ServerInfo(version=r.version, backend=r.backend, devices=devices, model=r.model,
                          tensor_count=r.tensor_count, cpu_threads=r.cpu_threads,
                          model_config=config)
        self._info_cache = (time.monotonic(), info)
        return info

    def list(self, *, timeout: Optional[float] = ...) -> ModelTensors:  # type: ignore[assignment]
        """ListTensors: the quantized layers and the other tensors of the loaded model (empty
        lists when none is loaded). Raises DequantdError."""
        r = self._unary(self._stub.ListTensors, pb.ListTensorsRequest(),
                        self._timeout if timeout is ... else timeout)
        layers = [LayerInfo(t.name, t.in_features, t.out_features, t.group_size,
                            _scale_name(t.scale_dtype), t.packed_bytes, t.resident_on_device,
                            t.format or "awq_gemm",
                            "nk" if t.orientation == pb.ORIENTATION_NK else "kn",
                            t.experts or 1)
                  for t in r.tensors]
        others = [TensorInfo(t.name, t.dtype, tuple(t.shape), t.bytes) for t in r.other_tensors]
        return ModelTensors(model=r.model, layers=layers, other_tensors=others)

    def dequantize(self, layer: Optional[str] = None, *, qweight: Optional[ArrayLike] = None,
                   qzeros: Optional[ArrayLike] = None, scales: Optional[ArrayLike] = None,
                   group_size: int = -1, dtype: str = "fp16", as_torch: bool = False,
                   streams: Optional[int] = None, progress: bool = False,
                   orientation: Optional[str] = None, bf16_bits: bool = False) -> ArrayLike:
        """Dequantizes one layer: of the loaded model by name, or sent inline as packed arrays.

        Args:
            layer: a name from list().layers (e.g. "model.layers.0.self_attn.q_proj"); or None
                and the three packed arrays:
            qweight: int32 (K, N/8), numpy or torch (any device; copied to host).
            qzeros: int32 (K/G, N/8).
            scales: float16 or bfloat16 (K/G, N) (numpy bf16 = ml_dtypes.bfloat16).
            group_size: G; -1 = K / scales rows (what the arrays imply; ValueError when the
                rows do not divide K).
            dtype: output dtype, "fp16", "bf16" or "fp32".
            as_torch: return a torch.Tensor (CPU) instead of a numpy array.
            streams: parallel byte-range streams for one result (DequantizeRequest.offset and
                length; supports_byte_ranges() says whether this package's proto has them);
                None or 1 = one stream; at most MAX_STREAMS (64, as dequantctl --streams); other
                values raise ValueError.
            progress: show a tqdm bar (bytes, bytes/s).
            orientation: the result's layout, written by the server's kernel: "kn" (K, N),
                "nk" (N, K) = nn.Linear.weight, or None = the layer's format's own (awq_gemm
                "kn", gptq "nk"; list().layers[i].orientation).
            bf16_bits: with dtype "bf16" and a numpy result: its raw bits as np.uint16 (no
                ml_dtypes needed; .view(ml_dtypes.bfloat16) reads them). Other dtypes: no effect.

        Returns:
            row-major array of `dtype` in `orientation`: (K, N) = (in_features, out_features)
            or (N, K): numpy float16, ml_dtypes.bfloat16 (np.uint16 bits with bf16_bits) or
            float32; or a torch tensor of the same dtype.

        Raises:
            ImportError: a bf16 numpy result without the ml-dtypes package (the message says
                how to install it), unless bf16_bits or as_torch; raised after the call.
            ValueError / TypeError: bad arguments (checked here before any call).
            DequantdError: NOT_FOUND (unknown layer), INVALID_ARGUMENT (a packed field, named),
                RESOURCE_EXHAUSTED (result or request over the server's limits), ...
        """
        request = pb.DequantizeRequest(output_dtype=dtypes.output_dtype(dtype),
                                       chunk_bytes=self._chunk_bytes,
                                       orientation=_orientation(orientation))
        packed = (qweight, qzeros, scales)
        if layer is not None:
            if any(a is not None for a in packed):
                raise ValueError("pass either a layer name or qweight/qzeros/scales, not both")
            request.tensor = _name(layer, "layer")
            desc = layer
        else:
            if any(a is None for a in packed):
                raise ValueError("pass a layer name, or all of qweight, qzeros and scales")
            qw, qz, sc = (_to_numpy(a) for a in packed)
            if qw.ndim != 2 or qz.ndim != 2 or sc.ndim != 2:
                raise ValueError("qweight, qzeros and scales must be 2-D")
            for role, a in (("qweight", qw), ("qzeros", qz)):
                # The bytes go as they are: a float32 or big-endian array would be read as
                # other words (silently wrong weights).
                if a.dtype.kind not in "iu" or a.dtype.itemsize != 4 or not a.dtype.isnative:
                    raise TypeError(f"{role} must be int32 (or uint32) in native byte order, "
                                    f"not {a.dtype.str} ({a.dtype})")
            k, rows = qw.shape[0], sc.shape[0]
            if group_size == -1:
                if rows < 1 or k % rows != 0:
                    raise ValueError(f"scales has {rows} rows, which do not divide K = {k} "
                                     "(qweight's rows): one scales row per group of inputs; "
                                     "pass group_size if the layout is not that")
                group_size = k // rows  # what the arrays imply (the wire's -1 would mean K)
            request.packed.CopyFrom(pb.InlinePackedTensor(
                in_features=k, out_features=sc.shape[1], group_size=group_size,
                scale_dtype=_scale_wire_dtype(scales, sc), qweight=qw.tobytes(),
                qzeros=qz.tobytes(), scales=sc.tobytes()))
            desc = "inline layer"
        if streams is not None and (isinstance(streams, bool)
                                    or not isinstance(streams, numbers.Integral)):
            raise TypeError(f"streams must be an int (or None), got {type(streams).__name__}")
        if streams is not None and not 1 <= int(streams) <= MAX_STREAMS:
            raise ValueError(f"streams must be in 1..{MAX_STREAMS} (or None), got {streams}")
        n_streams = 1 if streams is None or not supports_byte_ranges() else int(streams)
        if n_streams > 1:
            return self._dequantize_ranges(request, n_streams, as_torch, progress, desc,
                                           bf16_bits)
        bar = _Progress(progress, None, desc)
        try:
            result = None
            for message in self._stream(self._stub.Dequantize, request):
                if message.HasField("header"):
                    h = message.header
                    result = _Assembler(desc, dtypes.safetensors_code(h.dtype), tuple(h.shape),
                                        h.total_bytes)
                    if bar._bar is not None:  # pylint: disable=protected-access
                        bar._bar.total = h.total_bytes  # pylint: disable=protected-access
                if message.data:
                    if result is None:
                        raise DequantdError(grpc.StatusCode.DATA_LOSS, "data before the header")
                    result.add(message.offset, message.data)
                    bar.update(len(message.data))
        finally:
            bar.close()
        if result is None:
            raise DequantdError(grpc.StatusCode.DATA_LOSS, f"{desc}: the stream had no header")
        return result.result(as_torch, bf16_bits)

    def _dequantize_ranges(self, request: Any, n_streams: int, as_torch: bool, progress: bool,
                           desc: str, bf16_bits: bool = False) -> ArrayLike:
        """Byte-range streams (DequantizeRequest.offset/length):
        the first range's header gives the size; the others fill their part of one buffer.
        Response offsets are taken as offsets in the whole result."""
        # One element (ranges must be multiples of the output dtype's size): only its header.
        element = dtypes.element_bytes(dtypes.safetensors_code(
            request.output_dtype or pb.DTYPE_FP16))
        first = pb.DequantizeRequest()
        first.CopyFrom(request)
        first.offset, first.length = 0, element
        header = None
        for message in self._stream(self._stub.Dequantize, first):
            if message.HasField("header"):
                header = message.header
        if header is None:
            raise DequantdError(grpc.StatusCode.DATA_LOSS, f"{desc}: the stream had no header")
        result = _Assembler(desc, dtypes.safetensors_code(header.dtype), tuple(header.shape),
                            header.total_bytes, sequential=False)
        step = -(-header.total_bytes // n_streams)
        step = -(-step // element) * element  # whole elements per range
        bar = _Progress(progress, header.total_bytes, desc)

        def fetch(begin: int) -> None:
            part = pb.DequantizeRequest()
            part.CopyFrom(request)
            part.offset, part.length = begin, min(step, header.total_bytes - begin)
            for message in self._stream(self._stub.Dequantize, part):
                if message.data:
                    result.add(message.offset, message.data)
                    bar.update(len(message.data))

        try:
            run_all(fetch, range(0, header.total_bytes, step), n_streams)
        finally:
            bar.close()
        return result.result(as_torch, bf16_bits)

    def dequantize_layers(self, names: Optional[Iterable[str]] = None, *, dtype: str = "fp16",
                          as_torch: bool = False, progress: bool = False,
                          orientation: Optional[str] = None) -> Iterator[Tuple[str, ArrayLike]]:
        """Dequantizes layers of the loaded model in one call (on CUDA one grouped launch),
        yielding (name, array) in request order as each arrives, each (K, N) or (N, K) as
        `orientation` says (as for dequantize).

        Args:
            names: layer names (duplicates allowed, at most 10000); None = every layer, in
                list() order; an empty list yields nothing (no call is made: the protocol's
                empty list means every layer).
            dtype, as_torch, progress, orientation: as for dequantize (the bar counts all
                layers' bytes).

        Raises:
            TypeError, ValueError: a name that is not a str, a bad dtype or orientation; at the
                call, before anything is iterated.
            DequantdError: NOT_FOUND (a name), RESOURCE_EXHAUSTED (results over the server's
                max_output_bytes), FAILED_PRECONDITION (no model loaded), ...; while iterating
                (the call starts at the first item).
        """
        request = pb.DequantizeLayersRequest(output_dtype=dtypes.output_dtype(dtype),
                                             chunk_bytes=self._chunk_bytes,
                                             orientation=_orientation(orientation))
        if names is not None:
            request.tensors.extend(_layer_names(names))
            if not request.tensors:
                return iter(())
        return self._dequantize_layers(request, dtype, as_torch, progress)

    def _dequantize_layers(self, request: Any, dtype: str, as_torch: bool,
                           progress: bool) -> Iterator[Tuple[str, ArrayLike]]:
        """dequantize_layers' results for its checked request."""
        total = None
        if progress:
            wanted = set(request.tensors)
            element = {"fp16": 2, "bf16": 2, "fp32": 4}[dtype]
            total = sum(t.experts * t.in_features * t.out_features
                        for t in self.list().layers if not wanted or t.name in wanted) * element
        bar = _Progress(progress, total, "layers")
        try:
            for result in self._layer_results(request, bar):
                yield result.name, result.result(as_torch)
        finally:
            bar.close()

    def _layer_results(self, request: Any, bar: Optional[_Progress] = None,
                       buffers: Optional[Dict[str, np.ndarray]] = None) -> Iterator[_Assembler]:
        """The DequantizeLayers stream as one complete _Assembler per layer (raw bytes; into
        buffers[layer] when given: uint8 arrays of exactly the result's size)."""
        current: Optional[_Assembler] = None
        for message in self._stream(self._stub.DequantizeLayers, request):
            if message.HasField("header"):
                if current is not None:
                    yield current.check()
                h = message.header
                if buffers is not None and h.tensor not in buffers:
                    raise DequantdError(grpc.StatusCode.DATA_LOSS,
                                        f"the stream carried layer {h.tensor!r}, not requested")
                current = _Assembler(h.tensor, dtypes.safetensors_code(h.dtype), tuple(h.shape),
                                     h.total_bytes,
                                     buffer=None if buffers is None else buffers[h.tensor])
                current.orientation = h.orientation  # ORIENTATION_UNSPECIFIED from older servers
            if message.data:
                if current is None:
                    raise DequantdError(grpc.StatusCode.DATA_LOSS, "data before the header")
                current.add(message.offset, message.data)
                if bar is not None:
                    bar.update(len(message.data))
        if current is not None:
            yield current.check()

    def read_tensor(self, name: str, *, as_torch: bool = False,
                    progress: bool = False) -> ArrayLike:
        """A tensor of the checkpoint served as stored (list().other_tensors: embeddings, norms,
        biases, lm_head), in its own dtype and shape, bytes unchanged.

        Returns:
            numpy array (BF16 as ml_dtypes.bfloat16) or torch tensor of the stored shape.

        Raises:
            DequantdError: NOT_FOUND (name; a quantized layer's name too: use dequantize),
                INVALID_ARGUMENT (empty name), DATA_LOSS (file changed on the server), ...
        """
        bar = _Progress(progress, None, name)
        try:
            return self._read_tensor(name, bar).result(as_torch)
        finally:
            bar.close()

    def _read_tensor(self, name: str, bar: Optional[_Progress] = None) -> _Assembler:
        """The ReadTensor stream as one complete _Assembler (raw bytes)."""
        request = pb.ReadTensorRequest(name=_name(name, "name"), chunk_bytes=self._chunk_bytes)
        result: Optional[_Assembler] = None
        for message in self._stream(self._stub.ReadTensor, request):
            if message.HasField("header"):
                h = message.header
                result = _Assembler(h.name, h.dtype, tuple(h.shape), h.bytes)
            if message.data:
                if result is None:
                    raise DequantdError(grpc.StatusCode.DATA_LOSS, "data before the header")
                result.add(message.offset, message.data)
                if bar is not None:
                    bar.update(len(message.data))
        if result is None:
            raise DequantdError(grpc.StatusCode.DATA_LOSS, f"{name}: the stream had no header")
        return result.check()

    def read_tensor_into(self, region: str, name: str, *, offset: int = 0,
                         expected_bytes: int = 0) -> TensorInfo:
        """Copies stored tensor `name` (list().other_tensors), its bytes unchanged, into
        registered region `region` at byte `offset` (a multiple of 16) instead of streaming it
        (issue 23: the loader's embeddings, norms and lm_head reach GPU memory without crossing
        gRPC). When this returns every byte is in the region; the tensor fills
        [offset, offset + bytes). `expected_bytes` (0: unchecked): the tensor's size as the
        caller's listing says; a server whose tensor has another size (restarted on another
        model) refuses before writing.

        Raises:
            TypeError / ValueError: `name` not a str; `expected_bytes` not an int >= 0.
            DequantdError: the server's status (NOT_FOUND: name or region; INVALID_ARGUMENT: the
                tensor does not fit at `offset`; FAILED_PRECONDITION: regions off, or the tensor
                is not `expected_bytes` long; ABORTED: the
                region was unregistered during the call); UNIMPLEMENTED when the server predates
                ReadTensor into a region (it streamed the bytes instead: use read_tensor);
                DATA_LOSS when the reply does not name the region and offset.
        """
        request = pb.ReadTensorRequest(name=_name(name, "name"),
                                       output_region=pb.OutputRegion(
                                           name=region, offset=offset,
                                           expected_bytes=_expected_bytes(expected_bytes)))
        messages = []
        for message in self._stream(self._regions_stub().ReadTensor, request):
            messages.append(message)
            if message.data:
                break  # _stream cancels the rest
        if messages and messages[0].data:
            raise DequantdError(grpc.StatusCode.UNIMPLEMENTED,
                                f"{name}: this server streams ReadTensor and cannot write a "
                                "region (it predates ReadTensorRequest.output_region)")
        if (len(messages) != 1 or not messages[0].HasField("header")
                or messages[0].region != region or messages[0].region_offset != offset):
            raise DequantdError(grpc.StatusCode.DATA_LOSS,
                                f"reply of a ReadTensor into region {region!r}: expected one "
                                f"header naming the region and offset {offset}")
        h = messages[0].header
        return TensorInfo(h.name, h.dtype, tuple(h.shape), h.bytes)

    def read_tensors_into(self, tensors: Dict[str, Any], *, streams: int = 8,
                          listing: Optional[ModelTensors] = None) -> Dict[str, Any]:
        """Fills CUDA torch tensors the caller owns with stored tensors ({name: tensor}, names
        from list().other_tensors) and returns the mapping: each tensor must be contiguous, of
        the stored shape and of the stored dtype's torch dtype (cast afterwards on the device if
        the model wants another: the bytes are copied unchanged). Every tensor is checked before
        any byte is written. The memory is registered as for dequantize_into_tensors (once per
        allocation, cached) and the server copies each tensor into it (ReadTensor into a region,
        `streams` calls at once); a server that predates that gets the bytes streamed and copied
        in here, the same result more slowly. `listing`: this client's list() result when the
        caller already has it (the names, dtypes and shapes are checked against it, no
        ListTensors call); None asks the server.

        Raises:
            TypeError: a value not a torch.Tensor. ValueError: an unknown name, a shape, dtype,
                device or contiguity mismatch (naming the tensor), or the CUDA conditions of
                dequantize_into_tensors (server backend and --shared-memory, exportable memory,
                16-byte aligned starts, no overlap). DequantdError: the server's status.
        """
        if not tensors:
            return tensors
        tensors_module.read_into(self, tensors, streams, listing)
        return tensors

    # --- shared-memory regions (same host only; the server runs with --shared-memory) -----

    def register_system_shared_memory(
            self, name: str, key: str, byte_size: int, *, offset: int = 0,
            timeout: Optional[float] = ...) -> bool:  # type: ignore[assignment]
        """Registers bytes [offset, offset + byte_size) of the POSIX shared-memory object `key`
        ("/x", as shm_open; or a path under /dev/shm) as region `name`. Returns whether the
        server pinned it for DMA. Raises DequantdError (see the proto: INVALID_ARGUMENT,
        NOT_FOUND, ALREADY_EXISTS, RESOURCE_EXHAUSTED, FAILED_PRECONDITION, PERMISSION_DENIED)."""
        r = self._unary(self._stub.RegisterSystemSharedMemory,
                        pb.RegisterSystemSharedMemoryRequest(name=name, key=key, offset=offset,
                                                             byte_size=byte_size),
                        self._timeout if timeout is ... else timeout)
        return r.pinned

    def unregister_system_shared_memory(
            self, name: str = "", *,
            timeout: Optional[float] = ...) -> int:  # type: ignore[assignment]
        """Unregisters host region `name` ("" = every host region); returns how many. After it
        returns the server never touches that memory again. Raises DequantdError."""
        r = self._unary(self._stub.UnregisterSystemSharedMemory,
                        pb.UnregisterSystemSharedMemoryRequest(name=name),
                        self._timeout if timeout is ... else timeout)
        return r.released

    def register_cuda_shared_memory(
            self, name: str, raw_handle: bytes, device_id: int, byte_size: int, *,
            offset: int = 0, timeout: Optional[float] = ...) -> None:  # type: ignore[assignment]
        """Registers a CUDA buffer of this process as region `name`: `raw_handle` is its
        cudaIpcMemHandle_t (64 bytes), `offset` bytes from the start of the exported allocation.
        Raises DequantdError."""
        self._unary(self._stub.RegisterCudaSharedMemory,
                    pb.RegisterCudaSharedMemoryRequest(name=name, raw_handle=raw_handle,
                                                       device_id=device_id, offset=offset,
                                                       byte_size=byte_size),
                    self._timeout if timeout is ... else timeout)
        # A new region may be the first call to a server that restarted within
        # SERVER_FACTS_SECONDS (other GPUs, other modes): the next checks ask for its GPUs
        # again. Its mode they need not ask: a server that registered a CUDA region runs with
        # --shared-memory=cuda or all now (it refuses one otherwise), so a known cuda or all is
        # kept, as fresh as this reply (the loader's next load skips a SharedMemoryStatus).
        mode = self._mode_cache
        self._forget_server_facts()
        if mode is not None and mode[1] in ("cuda", "all"):
            self._mode_cache = (time.monotonic(), mode[1])

    def unregister_cuda_shared_memory(
            self, name: str = "", *,
            timeout: Optional[float] = ...) -> int:  # type: ignore[assignment]
        """Unregisters device region `name` ("" = every device region); returns how many."""
        r = self._unary(self._stub.UnregisterCudaSharedMemory,
                        pb.UnregisterCudaSharedMemoryRequest(name=name),
                        self._timeout if timeout is ... else timeout)
        return r.released

    def shared_memory_status(
            self, *, timeout: Optional[float] = ...) -> SharedMemoryStatus:  # type: ignore[assignment]
        """The server's registered shared-memory regions (host and device) and its region
        settings (SharedMemoryStatus; `dequantctl regions` prints the same). Answers with
        mode "off" and no regions when the server runs without --shared-memory. Raises
        DequantdError (PERMISSION_DENIED for a peer on another host, or a token without the
        admin role)."""
        r = self._unary(self._stub.SharedMemoryStatus, pb.SharedMemoryStatusRequest(),
                        self._timeout if timeout is ... else timeout)
        self._mode_cache = (time.monotonic(), r.mode)
        return SharedMemoryStatus(
            regions=[RegionInfo(i.name, i.kind, i.key, i.device_id, i.offset, i.byte_size,
                                i.pinned, i.owner, i.calls_in_flight, i.idle_seconds)
                     for i in r.regions],
            mode=r.mode, max_regions=r.max_regions, max_bytes=r.max_bytes,
            idle_release_seconds=r.idle_release_seconds)

    def _region_reply(self, method: Callable, request: Any, region: str) -> Any:
        """The one message of a region call's stream (it arrives with the OK status, once every
        byte is in the region). DATA_LOSS for no message, several, or data bytes."""
        messages = []
        for message in self._stream(method, request):
            messages.append(message)
            if len(messages) > 1:
                break  # not a region reply: _stream cancels the rest
        if len(messages) != 1 or messages[0].data:
            raise DequantdError(grpc.StatusCode.DATA_LOSS,
                                f"reply of a call into region {region!r}: expected one message "
                                f"without data, got {len(messages)}"
                                + (f" ({len(messages[0].data)} data bytes)" if messages else ""))
        return messages[0]

    def dequantize_into(self, region: str, layer: str, *, offset: int = 0,
                        dtype: str = "fp16", orientation: Optional[str] = None,
                        expected_bytes: int = 0) -> RegionHeader:
        """Dequantizes layer `layer` of the loaded model into registered region `region` at byte
        `offset` (a multiple of 16) instead of streaming it. When this returns, every byte is in
        the region (a device region: visible to later work on that device). `expected_bytes`
        (0: unchecked): the result's size as the caller's listing says (K * N * element bytes);
        a server whose layer has another size (restarted on another model) refuses before
        writing.

        Raises:
            TypeError / ValueError: `layer` not a str; `expected_bytes` not an int >= 0.
            DequantdError: the server's status (NOT_FOUND: layer or region; INVALID_ARGUMENT: the
                result does not fit at `offset`, naming region, offset and bytes;
                FAILED_PRECONDITION: the result is not `expected_bytes` long; ABORTED: the
                region was unregistered during the call; ...), DATA_LOSS when the reply is not
                one header naming the region.
        """
        return self._region_call_into(region, _name(layer, "layer"), offset, dtype,
                                      None if orientation is None else _orientation(orientation),
                                      _expected_bytes(expected_bytes))

    def _region_call_into(self, region: str, layer: str, offset: int, dtype: str,
                          orientation: Optional[int], expected_bytes: int = 0) -> RegionHeader:
        request = pb.DequantizeRequest(tensor=layer, output_dtype=dtypes.output_dtype(dtype),
                                       output_region=pb.OutputRegion(
                                           name=region, offset=offset,
                                           expected_bytes=expected_bytes))
        if orientation is not None:
            setattr(request, "orientation", orientation)
        reply = self._region_reply(self._regions_stub().Dequantize, request, region)
        if not reply.HasField("header") or reply.layer_headers or reply.header.region != region:
            raise DequantdError(grpc.StatusCode.DATA_LOSS,
                                f"reply of a Dequantize into region {region!r}: no header naming "
                                "the region")
        return _region_header(reply.header)

    def dequantize_layers_into(self, region: str, names: Optional[Sequence[str]] = None, *,
                               offset: int = 0, dtype: str = "fp16",
                               orientation: Optional[str] = None,
                               reply: str = "headers",
                               expected_bytes: int = 0) -> Union[List[RegionHeader], RegionSummary]:
        """Dequantizes layers of the loaded model (None = every layer, in list() order; an
        empty list writes nothing and returns [] without a call, as dequantize_layers) into
        registered region `region`, one after another in request order from byte `offset` (on
        CUDA in one grouped launch): layer i at offset + the bytes of the layers before it, each
        K * N * element bytes of `dtype` (K and N from list()), no padding. When this returns
        every byte is in the region.

        `reply`: "headers" (the default) returns each layer's header in request order (its
        region_offset says where it went); "summary" asks the server for the counts alone
        (REGION_REPLY_SUMMARY, issue 23: one small message whatever the layer count, which is
        what makes a whole-model call cost no more than the kernel) and returns a RegionSummary.
        A server that predates the summary answers with headers; their sum is returned then.
        `expected_bytes` (0: unchecked): the results' total as the caller's listing says; a
        server whose layers add up to another (restarted on another model) refuses before
        writing (FAILED_PRECONDITION).

        Raises:
            ValueError: `reply` is neither "headers" nor "summary"; `expected_bytes` < 0.
            TypeError: `expected_bytes` not an int.
            DequantdError: as dequantize_into; DATA_LOSS when the reply is not one message with
                a header per requested layer, in order, naming the region (or, for "summary", a
                summary naming the region and `offset` with one result per requested layer).
        """
        if reply not in ("headers", "summary"):
            raise ValueError(f"reply must be 'headers' or 'summary', not {reply!r}")
        wire = None if orientation is None else _orientation(orientation)
        expected = _expected_bytes(expected_bytes)
        if reply == "summary":
            return self._region_layers_summary(region, names, offset, dtype, wire, expected)
        return self._region_layers_into(region, names, offset, dtype, wire, expected)

    def _region_layers_request(self, region: str, names: Optional[Sequence[str]], offset: int,
                               dtype: str, orientation: Optional[int],
                               expected_bytes: int = 0) -> Any:
        request = pb.DequantizeLayersRequest(output_dtype=dtypes.output_dtype(dtype),
                                             output_region=pb.OutputRegion(
                                                 name=region, offset=offset,
                                                 expected_bytes=expected_bytes))
        if orientation is not None:
            setattr(request, "orientation", orientation)
        if names is not None:
            request.tensors.extend(_layer_names(names))
        return request

    def _region_layers_into(self, region: str, names: Optional[Sequence[str]], offset: int,
                            dtype: str, orientation: Optional[int],
                            expected_bytes: int = 0) -> List[RegionHeader]:
        request = self._region_layers_request(region, names, offset, dtype, orientation,
                                              expected_bytes)
        if names is not None and not request.tensors:
            return []
        reply = self._region_reply(self._regions_stub().DequantizeLayers, request, region)
        return self._checked_headers(reply, request, region)

    @staticmethod
    def _checked_headers(reply: Any, request: Any, region: str) -> List[RegionHeader]:
        headers = [_region_header(h) for h in reply.layer_headers]
        wanted = list(request.tensors)
        if (reply.HasField("header") or not headers
                or (wanted and [h.tensor for h in headers] != wanted)
                or any(h.region != region for h in headers)):
            raise DequantdError(grpc.StatusCode.DATA_LOSS,
                                f"reply of a DequantizeLayers into region {region!r}: "
                                f"{len(headers)} layer headers do not match the {len(wanted)} "
                                "requested layers and the region")
        return headers

    def _region_layers_summary(self, region: str, names: Optional[Sequence[str]], offset: int,
                               dtype: str, orientation: Optional[int],
                               expected_bytes: int = 0) -> RegionSummary:
        """DequantizeLayers into `region` with REGION_REPLY_SUMMARY; the summary, checked to name
        the region and `offset` with one result per requested name (an older server's headers
        summed, see _summary_of_headers). An empty `names` list returns a summary of nothing
        without a call. `expected_bytes` (0: none): the results' total as the caller worked it
        out; the server refuses any other before writing (FAILED_PRECONDITION)."""
        request = self._region_layers_request(region, names, offset, dtype, orientation,
                                              expected_bytes)
        if names is not None and not request.tensors:
            return RegionSummary(0, 0, region, offset, dtype, "", "", "")
        request.region_reply = pb.REGION_REPLY_SUMMARY
        reply = self._region_reply(self._regions_stub().DequantizeLayers, request, region)
        if not reply.HasField("region_summary"):  # a server before issue 23
            headers = self._checked_headers(reply, request, region)
            said = {pb.ORIENTATION_KN: "KN", pb.ORIENTATION_NK: "NK"}.get(
                getattr(reply.layer_headers[0], "orientation", 0), "")
            return _summary_of_headers(headers, region, offset, said)
        summary = _region_summary(reply.region_summary)
        wanted = len(request.tensors)
        if (reply.HasField("header") or reply.layer_headers or summary.region != region
                or summary.region_offset != offset
                or (wanted and summary.layer_count != wanted)):
            raise DequantdError(grpc.StatusCode.DATA_LOSS,
                                f"reply of a DequantizeLayers into region {region!r}: a summary "
                                f"of {summary.layer_count} layers in {summary.region!r} at offset "
                                f"{summary.region_offset}, asked for {wanted} at {offset}")
        return summary

    # --- torch tensors the caller owns (issue 23) -------------------------------------------

    def dequantize_into_tensor(self, layer: str, tensor: Any, *,
                               orientation: str = "KN") -> Any:
        """Dequantizes layer `layer` of the loaded model into `tensor` in place and returns it.

        Args:
            layer: a name from list().layers.
            tensor: a contiguous torch.Tensor of dtype torch.float16, torch.bfloat16 or
                torch.float32 (the output dtype follows it), shape (K, N) = (in_features,
                out_features) for orientation "KN", (N, K) for "NK" ((E, K, N) / (E, N, K)
                for a layer of E > 1 stacked experts, list().layers' `experts`); on a CUDA
                device the server computes on (written by the kernel through CUDA IPC: the
                server must run --backend=cuda --shared-memory=cuda|all on this host) or on the
                CPU (the streamed result is written into its memory).
            orientation: "KN" (AWQ's, the default) or "NK" (nn.Linear.weight's; needs a server
                that writes (N, K) results, else ValueError: dequantd never transposes on the
                host).

        When this returns every byte is in the tensor (CUDA: visible to work enqueued
        afterwards on any stream). See dequantize_into_tensors for errors and lifetimes.
        """
        self.dequantize_into_tensors({layer: tensor}, orientation=orientation)
        return tensor

    def dequantize_into_tensors(self, tensors: Dict[str, Any], *, orientation: str = "KN",
                                listing: Optional[ModelTensors] = None) -> Dict[str, Any]:
        """Dequantizes many layers into torch tensors in place ({layer name: tensor}, each as
        for dequantize_into_tensor) and returns the mapping. Every tensor is checked against
        ListTensors and the server before any byte is written. CUDA tensors that lie back to
        back in one allocation in memory order (e.g. views of one flat buffer) are written by one
        DequantizeLayers call (one grouped launch); CPU tensors by one streamed call per dtype.
        `listing`: this client's list() result when the caller already has it (load_model
        does): the layers' shapes are checked against it, no ListTensors call; None asks the
        server. The server facts of the CUDA checks are reused for SERVER_FACTS_SECONDS.

        Lifetimes: the call holds the tensors until the reply (freeing them meanwhile is safe).
        A CUDA allocation is exported (cuIpcGetMemHandle on its base, found with
        cuPointerGetAttribute) and registered once, then cached; it is unregistered when the last
        tensor storage that used it is freed, when a new allocation took its address, and on
        close(). After a server restart the region is registered again and the call retried
        once. A process that exits without close() leaves its regions on the server until its
        --shared-memory-idle-release.

        Raises:
            TypeError: a value not a torch.Tensor; a dtype other than float16/bfloat16/float32.
            ValueError: an unknown layer, a wrong shape (naming the expected (K, N) or (N, K)),
                orientation "NK" on a server without (N, K) results, a non-contiguous tensor, a
                device other than cuda/cpu, a GPU the server does not compute on, a CUDA tensor
                and a server without the cuda backend or CUDA regions, memory that CUDA IPC
                cannot export, a start not 16-byte aligned in its allocation, overlapping
                tensors; each message names the layer.
            DequantdError: the server's status (UNAVAILABLE, PERMISSION_DENIED for a peer on
                another host, RESOURCE_EXHAUSTED: region limits, ...); DATA_LOSS when a reply
                does not describe what was asked.
        """
        if not tensors:
            return tensors
        tensors_module.dequantize_into(self, tensors, orientation, listing)
        return tensors

    def cuda_regions(self) -> List[str]:
        """Names of the CUDA regions this client registered for tensors and holds now."""
        return [] if self._cuda_regions is None else self._cuda_regions.names()

    def _regions_cache(self) -> "tensors_module.RegionCache":
        with self._lock:
            if self._cuda_regions is None:
                self._cuda_regions = tensors_module.RegionCache(self)
                weakref.finalize(self, self._cuda_regions.close)  # at exit, if still open
            return self._cuda_regions

    def _orientation_support(self) -> Tuple[bool, str]:
        """(server writes (N, K) results, reason if not); probed once per client."""
        if self._orientation is None:
            self._orientation = tensors_module.probe_orientation(self)
        return self._orientation

    def benchmark(self, *, shapes: Sequence[Tuple[int, int]] = (), tensors: Sequence[str] = (),
                  group_size: int = 0, variants: Sequence[str] = (),
                  output_dtypes: Sequence[str] = (), trials: int = 0, runs: int = 0,
                  hardware_counters: bool = False, orientation: Optional[str] = None,
                  timeout: Optional[float] = None) -> Dict[str, Any]:
        """Times the server's kernel variants (the Benchmark RPC; fields as in the proto).

        Args:
            shapes: (K, N) pairs with random inputs; tensors: layer names; none = server default.
            output_dtypes: output dtype names ("fp16", ...); empty = fp16.
            orientation: every timed result's layout, "KN" or "NK" (nn.Linear's, what
                dequantd.torch asks for); None = each layer's format's own. Each row says its
                own ("orientation": "ORIENTATION_KN" / "ORIENTATION_NK"); a server that times
                another (one older than the field, which ignores it) is UNIMPLEMENTED.
            timeout: deadline in seconds; None (default) = none (a GPU benchmark with hardware
                counters can take minutes).

        Returns:
            {"device", "backend", "peak_copy_bytes_per_second", "note", "rows": [dict per
            variant x shape x dtype with the proto's field names]}.

        Raises:
            DequantdError: RESOURCE_EXHAUSTED (another benchmark runs), INVALID_ARGUMENT, ...
        """
        from google.protobuf import json_format  # pylint: disable=import-outside-toplevel

        request = pb.BenchmarkRequest(
            shapes=[pb.BenchmarkShape(in_features=k, out_features=n) for k, n in shapes],
            tensors=list(tensors), group_size=group_size, variants=list(variants),
            output_dtypes=[dtypes.output_dtype(d) for d in output_dtypes], trials=trials, runs=runs,
            hardware_counters=hardware_counters, orientation=_orientation(orientation))
        r = self._unary(self._stub.Benchmark, request, timeout)
        if request.orientation != pb.ORIENTATION_UNSPECIFIED:
            for row in r.rows:
                if row.orientation != request.orientation:
                    raise DequantdError(
                        grpc.StatusCode.UNIMPLEMENTED,
                        f"Benchmark: asked for orientation {orientation!r}, the server timed "
                        f"{pb.Orientation.Name(row.orientation)} ({row.variant} "
                        f"{row.in_features}x{row.out_features}); it predates "
                        "BenchmarkRequest.orientation")
        out = json_format.MessageToDict(r, preserving_proto_field_name=True)
        out.setdefault("rows", [])
        return out
