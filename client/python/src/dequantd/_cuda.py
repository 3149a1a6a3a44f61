"""The few CUDA driver calls the zero-copy path needs, through ctypes on libcuda.so.1.

Why the driver API through ctypes: it is the library every CUDA process already has loaded (the
driver; torch, CuPy and JAX all sit on it), it needs no extra package (cuda-python would be one
more wheel per CUDA major version) and no torch private API. Everything here takes a device
pointer (an int, e.g. ``tensor.data_ptr()``) and works for any allocator that gets its memory
from ``cuMemAlloc``/``cudaMalloc`` (torch's caching allocator does, unless
``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, whose ``cuMemCreate`` memory CUDA IPC
cannot export: ``allocation_of`` reports it as not IPC capable).

Sources: CUDA Driver API reference, "Unified Addressing" (cuPointerGetAttribute and the
CUpointer_attribute values used below) and "Interprocess Communication" (cuIpcGetMemHandle:
"Takes a pointer to the base of an existing device memory allocation ... the handle is 64
bytes"); the enum values are those of cuda.h (CU_POINTER_ATTRIBUTE_CONTEXT = 1,
BUFFER_ID = 7, DEVICE_ORDINAL = 9, IS_LEGACY_CUDA_IPC_CAPABLE = 10, RANGE_START_ADDR = 11,
RANGE_SIZE = 12).

Not thread-hostile: each function is a few driver calls; cuIpcGetMemHandle runs with the
allocation's own context pushed on the calling thread and popped again.
"""

from __future__ import annotations

import ctypes
import dataclasses
import threading
from typing import Optional

CU_POINTER_ATTRIBUTE_CONTEXT = 1
CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2
CU_POINTER_ATTRIBUTE_BUFFER_ID = 7
CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE = 10
CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11
CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12
CU_MEMORYTYPE_DEVICE = 2
IPC_HANDLE_BYTES = 64  # sizeof(CUipcMemHandle), CU_IPC_HANDLE_SIZE

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None


class CudaError(RuntimeError):
    """A CUDA driver call failed: `call` is its name, `code` the CUresult, `name` its
    cuGetErrorName (e.g. "CUDA_ERROR_INVALID_VALUE")."""

    def __init__(self, call: str, code: int, name: str):
        super().__init__(f"{call} failed: {name} ({code})")
        self.call, self.code, self.name = call, code, name


def _driver() -> ctypes.CDLL:
    """libcuda.so.1, loaded once (ImportError with a hint when it is missing)."""
    global _lib  # pylint: disable=global-statement
    with _lock:
        if _lib is None:
            try:
                lib = ctypes.CDLL("libcuda.so.1")
            except OSError as e:
                raise ImportError("the CUDA driver (libcuda.so.1) is not loadable here: "
                                  f"{e}") from e
            lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
            lib.cuPointerGetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int,
                                                  ctypes.c_uint64]
            lib.cuIpcGetMemHandle.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
            lib.cuCtxPushCurrent_v2.argtypes = [ctypes.c_void_p]
            lib.cuCtxPopCurrent_v2.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
            _lib = lib
        return _lib


def _check(call: str, code: int) -> None:
    if code != 0:
        name = ctypes.c_char_p()
        _driver().cuGetErrorName(code, ctypes.byref(name))
        raise CudaError(call, code, (name.value or b"?").decode())


def _attribute(ptr: int, attribute: int, ctype: type) -> int:
    value = ctype()
    _check(f"cuPointerGetAttribute({attribute})",
           _driver().cuPointerGetAttribute(ctypes.byref(value), attribute, ptr))
    return int(value.value or 0)


@dataclasses.dataclass(frozen=True)
class Allocation:
    """The device allocation holding a pointer: bytes [base, base + size) on `device` (the
    driver's ordinal in this process), `buffer_id` the driver's process-wide unique id of the
    allocation (a new cudaMalloc at the same address gets another one: the liveness check),
    `ipc_capable` whether cuIpcGetMemHandle can export it, `context` its CUcontext."""
    base: int
    size: int
    device: int
    buffer_id: int
    ipc_capable: bool
    context: int


def allocation_of(ptr: int) -> Allocation:
    """The allocation that device pointer `ptr` lies in. Raises CudaError
    (CUDA_ERROR_INVALID_VALUE for a pointer that is no device memory) or ValueError for host or
    managed memory."""
    kind = _attribute(ptr, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ctypes.c_uint)
    if kind != CU_MEMORYTYPE_DEVICE:
        raise ValueError(f"pointer 0x{ptr:x} is not device memory (CUmemorytype {kind})")
    return Allocation(
        base=_attribute(ptr, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, ctypes.c_uint64),
        size=_attribute(ptr, CU_POINTER_ATTRIBUTE_RANGE_SIZE, ctypes.c_size_t),
        device=_attribute(ptr, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ctypes.c_int),
        buffer_id=_attribute(ptr, CU_POINTER_ATTRIBUTE_BUFFER_ID, ctypes.c_uint64),
        ipc_capable=bool(_attribute(ptr, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                                    ctypes.c_int)),
        context=_attribute(ptr, CU_POINTER_ATTRIBUTE_CONTEXT, ctypes.c_void_p))


def still_allocated(allocation: Allocation) -> bool:
    """Whether `allocation` is still the live allocation at its base (same range and
    buffer id); False once it was freed, also when a new allocation took its address."""
    try:
        return (_attribute(allocation.base, CU_POINTER_ATTRIBUTE_BUFFER_ID, ctypes.c_uint64)
                == allocation.buffer_id
                and _attribute(allocation.base, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                               ctypes.c_uint64) == allocation.base)
    except CudaError:
        return False


def ipc_handle(allocation: Allocation) -> bytes:
    """The 64-byte cudaIpcMemHandle_t of `allocation` (cuIpcGetMemHandle on its base, with its
    context current). Raises CudaError."""
    lib = _driver()
    handle = (ctypes.c_ubyte * IPC_HANDLE_BYTES)()
    _check("cuCtxPushCurrent", lib.cuCtxPushCurrent_v2(ctypes.c_void_p(allocation.context)))
    try:
        _check("cuIpcGetMemHandle", lib.cuIpcGetMemHandle(ctypes.byref(handle), allocation.base))
    finally:
        popped = ctypes.c_void_p()
        lib.cuCtxPopCurrent_v2(ctypes.byref(popped))
    return bytes(handle)


def device_uuid(device: int) -> str:
    """The UUID of CUDA device `device` as nvidia-smi prints it ("GPU-xxxxxxxx-xxxx-...").
    Raises CudaError."""
    lib = _driver()
    raw = (ctypes.c_ubyte * 16)()
    handle = ctypes.c_int()
    _check("cuDeviceGet", lib.cuDeviceGet(ctypes.byref(handle), ctypes.c_int(device)))
    fn = getattr(lib, "cuDeviceGetUuid_v2", None) or lib.cuDeviceGetUuid
    _check("cuDeviceGetUuid", fn(ctypes.byref(raw), handle))
    h = bytes(raw).hex()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
