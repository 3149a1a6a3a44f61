"""A ready transformers model from a dequantd server, filled in place (issue 23).

    import dequantd, dequantd.torch, torch
    with dequantd.Client("127.0.0.1:50051") as c:
        model = dequantd.torch.load_model(c, device="cuda:0", dtype=torch.bfloat16)

The model's parameters are learnt from a meta-device build of the server's config.json (or
`model`'s) without its quantization_config; then every parameter is allocated on `device` and
filled: each quantized linear's weight by dequantd (on CUDA the kernel writes the GPU memory
through CUDA IPC; a CPU model gets the streamed result written into its memory), every other
tensor (embeddings, norms, biases, an untied lm_head) by ReadTensor (on CUDA into GPU memory
through a region, without the bytes crossing gRPC), cast to `dtype` on the device as
transformers casts a checkpoint's tensors. The model itself is built once, first, from its
config with every parameter on the meta device and its non-persistent buffers computed on the
CPU as from_pretrained computes them (_model_on_meta); the filled tensors then become its
parameters (assigned, no copy: _assign), weights are tied, the buffers moved to `device`, and the
model is put in eval mode and returned.
If anything fails (the server gone mid-load, a tensor missing), the error is raised and no model
is returned: nothing half-filled escapes.

Orientation: nn.Linear.weight is (N, K) = (out_features, in_features), AWQ's result (K, N); a
layer of stacked MoE experts (gpt-oss's MXFP4) fills transformers' GptOssExperts parameter named
as the layer, [E, K, N], its format's own result (dequantd.parameters says which parameter a
layer fills). With a server that writes (N, K) results (the request orientation of issue 21,
checked once per client) the kernel writes straight into the parameters, which are then views of
one buffer (one region, one DequantizeLayers call per orientation and 16 GiB). With an older
server each batch of linear layers is written as (K, N) into a staging buffer on `device` and
transposed there by torch (`copy_` of the transpose: a device copy on CUDA, exact);
LoadReport.transposed says which path ran.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Dict, List, Optional, Tuple, Union

import torch

from . import dtypes
from . import tensors as tensors_module
from ._parallel import run_all
from .client import Client, LayerInfo
from .errors import DequantdError
from .parameters import LayerParameter, layer_parameter

# Config keys that describe the quantized checkpoint, not the model: dropped.
_DROP_CONFIG_KEYS = ("quantization_config", "dequantd_source")
# Largest staging buffer of the (K, N) path, bytes (at least the largest layer).
STAGING_BYTES = 1 << 30
# ReadTensor calls in flight at once for the tensors that are not quantized layers.
READ_STREAMS = 8
_FLOATING = ("F16", "BF16", "F32", "F64")


@dataclasses.dataclass
class LoadReport:
    """What load_model did: seconds per phase (`build`: meta model; `allocate`: parameter
    memory; `dequantize`: every quantized layer, registration included (`register`: the part of
    it spent exporting and registering the parameters' memory with the server; `check`: the
    parameters checked against the listing; `call`: the DequantizeLayers RPCs, the server's
    kernel and work and the transport); `read`: every other
    tensor; `assemble`: those tensors made the parameters of the model built in `build`, tied,
    its buffers moved to the device), the bytes written per
    kind, the number of calls, whether the layers went through a (K, N) staging buffer and a
    transpose on the device (`transposed`), and how many of the model's parameters are the
    tensors dequantd filled, not copies (`in_place`: every parameter when transformers kept
    them)."""
    build_seconds: float = 0.0
    allocate_seconds: float = 0.0
    dequantize_seconds: float = 0.0
    register_seconds: float = 0.0
    check_seconds: float = 0.0
    call_seconds: float = 0.0
    read_seconds: float = 0.0
    total_seconds: float = 0.0
    layer_bytes: int = 0
    other_bytes: int = 0
    layers: int = 0
    others: int = 0
    dequantize_calls: int = 0
    transposed: bool = False
    device: str = ""
    assemble_seconds: float = 0.0
    in_place: int = 0


class LoadError(RuntimeError):
    """load_model could not build a model: a parameter with no tensor on the server, a shape that
    does not match the config, ... (server failures are DequantdError)."""


def server_config(client: Client, model: Optional[str] = None) -> Any:
    """The transformers config of the model: `model`'s (a Hugging Face id or directory, passed to
    AutoConfig.from_pretrained) or, when None, the server's config.json; without
    quantization_config. Raises LoadError when the server has no config."""
    import transformers  # pylint: disable=import-outside-toplevel

    if model is not None:
        config = transformers.AutoConfig.from_pretrained(model)
        for key in _DROP_CONFIG_KEYS:
            if hasattr(config, key):
                delattr(config, key)
        return config
    raw = dict(client.info().model_config)
    if not raw:
        raise LoadError("the server has no config.json for its model (GetServerInfo."
                        "model_config_json is empty); pass model=<id or directory>")
    for key in _DROP_CONFIG_KEYS:
        raw.pop(key, None)
    model_type = raw.pop("model_type", None)
    if model_type is None:
        raise LoadError("the server's config.json has no model_type")
    return transformers.AutoConfig.for_model(model_type, **raw)


def _model_on_meta(config: Any, dtype: torch.dtype) -> torch.nn.Module:
    """The model built from its config with every parameter on the meta device (no memory)
    and its buffers (rotary inv_freq) computed on the CPU as from_pretrained computes them: its
    parameter names, shapes and tying, and the model the filled tensors are assigned into.

    Accelerate's init_empty_weights(include_buffers=False) pattern: nn.Module.register_parameter
    is wrapped while the model is built, so this must not run beside another thread building
    modules. Each meta parameter is marked `_is_hf_initialized`, so transformers' weight
    initialization (normal_, ones_, ... on every parameter: most of from_config's time) skips
    them: their values are never read, every one is replaced by a filled tensor. The buffers
    are not marked and are initialized as before."""
    import transformers  # pylint: disable=import-outside-toplevel

    register = torch.nn.Module.register_parameter

    def register_on_meta(module: torch.nn.Module, name: str, param: Any) -> None:
        register(module, name, param)
        if param is not None:
            held = module._parameters[name]  # pylint: disable=protected-access
            meta = torch.nn.Parameter(held.to("meta"), requires_grad=held.requires_grad)
            meta._is_hf_initialized = True  # pylint: disable=protected-access
            module._parameters[name] = meta  # pylint: disable=protected-access

    torch.nn.Module.register_parameter = register_on_meta
    try:
        try:
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
        except TypeError:  # transformers 4.x names it torch_dtype
            model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=dtype)
    finally:
        torch.nn.Module.register_parameter = register
    # Built this way transformers leaves a tied lm_head untied (a meta-device build ties it):
    # tie it, so that named_parameters lists a tied weight once, as the tensors to fill.
    model.tie_weights()
    return model


def _fill_stored_on_device(client: Client, params: Dict[str, torch.Tensor], stored: List[str],
                           others: Dict[str, Any], device: torch.device,
                           listing: Any = None) -> None:
    """Stored tensors straight into GPU memory (ReadTensor into a region): one staging buffer
    holds every tensor as stored (16-byte aligned places), registered once; then each is cast
    into its parameter on the device (round to nearest even, as transformers casts a
    checkpoint's tensors). The staging is unregistered and freed before returning."""
    if not stored:
        return
    places, at = [], 0
    for name in stored:
        places.append((name, at))
        at += (others[name].bytes + 15) // 16 * 16
    staging = torch.empty(at, dtype=torch.uint8, device=device)
    views = {name: staging[begin:begin + others[name].bytes]
             .view(dtypes.torch_dtype(others[name].dtype)).view(tuple(others[name].shape))
             for name, begin in places}
    try:
        client.read_tensors_into(views, streams=READ_STREAMS, listing=listing)
        for name in stored:
            params[name].copy_(views[name])
        torch.cuda.synchronize(device)
    finally:
        client._regions_cache().release_tensor(staging)  # pylint: disable=protected-access


def _fill_stored_streamed(client: Client, params: Dict[str, torch.Tensor], stored: List[str],
                          others: Dict[str, Any]) -> None:
    """Stored tensors through several ReadTensor streams at once (gRPC waits outside the GIL;
    the embeddings and an untied lm_head are the largest tensors of a model), largest first."""
    def fill(name: str) -> None:
        params[name].copy_(client.read_tensor(name, as_torch=True))

    run_all(fill, sorted(stored, key=lambda n: -others[n].bytes), READ_STREAMS)


def _assign(model: torch.nn.Module, params: Dict[str, torch.Tensor],
            device: torch.device) -> torch.nn.Module:
    """Makes `params`' tensors the parameters of `model` (from _model_on_meta; names from its
    named_parameters, shapes checked against them by _load): each becomes an nn.Parameter of the
    meta parameter's requires_grad, set on its module, as load_state_dict(assign=True) sets it,
    without a pass over every module and key. from_pretrained(None, state_dict=) is not used: on
    a CUDA state dict transformers 5 copies every tensor (measured on the H200: none of the 272
    parameters kept). Then tie_weights ties a tied lm_head to the embeddings and model.to(device)
    moves the buffers (parameters already there stay). LoadError when a parameter has no
    tensor or a tensor no parameter."""
    for name, tensor in params.items():
        owner, _, leaf = name.rpartition(".")
        try:
            module = model.get_submodule(owner)
        except AttributeError:
            module = None
        # pylint: disable-next=protected-access
        held = module._parameters.get(leaf) if module is not None else None
        if held is None:
            raise LoadError(f"the model's parameters and the filled tensors differ: no parameter "
                            f"for {name}")
        setattr(module, leaf, torch.nn.Parameter(tensor, requires_grad=held.requires_grad))
    model.tie_weights()
    empty = [name for name, p in model.named_parameters() if p.is_meta]
    if empty:
        raise LoadError(f"the model's parameters and the filled tensors differ: no tensor for "
                        f"{empty[:5]}")
    return model.to(device)


def _elements(shape: Tuple[int, ...]) -> int:
    count = 1
    for d in shape:
        count *= d
    return count


def _batches(layers: List[Tuple[str, LayerInfo]], element: int,
             limit: int) -> List[List[Tuple[str, LayerInfo]]]:
    out: List[List[Tuple[str, LayerInfo]]] = [[]]
    used = 0
    for item in layers:
        nbytes = item[1].in_features * item[1].out_features * element
        if out[-1] and used + nbytes > limit:
            out.append([])
            used = 0
        out[-1].append(item)
        used += nbytes
    return [b for b in out if b]


def load_model(client: Union[Client, str], model: Optional[str] = None, *,
               device: Union[str, torch.device] = "cuda:0",
               dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
    """Builds a transformers causal-LM from a dequantd server's model and fills it in place.

    Args:
        client: a dequantd.Client, or a target ("127.0.0.1:50051") for one made and closed here.
        model: config source (Hugging Face id or directory); None = the server's config.json.
        device: where the parameters go: a CUDA device the server computes on (the server runs
            --backend=cuda --shared-memory=cuda|all on this host) or "cpu" (any server; results
            are streamed into the parameters' memory).
        dtype: torch.float16, torch.bfloat16 or torch.float32: the quantized layers are
            dequantized to it by the server, other tensors cast to it as transformers does.

    Returns:
        The model in eval mode, on `device`, weights tied; `model.dequantd_load_report` is a
        LoadReport. Quantized layers' weights are (N, K) parameters as nn.Linear wants.

    Raises:
        DequantdError: the server failed or went away (the code of the failing call; message
            names the phase); no model is returned.
        LoadError: a parameter of the model has no tensor on the server, or a shape differs.
        ValueError / TypeError: bad device or dtype (as dequantize_into_tensors checks them).
        ImportError: transformers (and, for transformers without its own init_empty_weights,
            accelerate) missing.
    """
    if isinstance(client, str):
        with Client(client) as own:
            return load_model(own, model, device=device, dtype=dtype)
    if dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"dtype must be torch.float16, torch.bfloat16 or torch.float32, not {dtype}")
    device = torch.device(device)
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"device must be a CUDA device or cpu, not {device}")
    report = LoadReport(device=str(device))
    t_start = time.perf_counter()
    try:
        built = _load(client, model, device, dtype, report)
    except DequantdError as e:
        raise DequantdError(e.code, f"load_model: {e.message}") from e
    report.total_seconds = time.perf_counter() - t_start
    built.dequantd_load_report = report
    return built


def _load(client: Client, model_source: Optional[str], device: torch.device,
          dtype: torch.dtype, report: LoadReport) -> torch.nn.Module:
    t0 = time.perf_counter()
    config = server_config(client, model_source)
    if device.type == "cuda":
        # The region calls' channel connects while the model is built (a new client's: one made
        # for this load from a target string) instead of inside the first region call.
        client._connect_region_channel()  # pylint: disable=protected-access
    meta = _model_on_meta(config, dtype)
    listing = client.list()
    layers = {layer.name: layer for layer in listing.layers}
    others = {t.name: t for t in listing.other_tensors}
    report.build_seconds = time.perf_counter() - t0

    # Which parameter comes from where; every parameter must have a source (tied ones, such as
    # a tied lm_head, appear once). A layer fills "<layer>.weight" (N, K), or for stacked MoE
    # experts the (E, K, N) parameter named as the layer (dequantd.parameters).
    by_parameter = {p.name: (layer, p) for layer, p in
                    ((layer, layer_parameter(layer)) for layer in listing.layers)}
    quantized: List[Tuple[str, LayerInfo, LayerParameter]] = []
    stored: List[str] = []
    for name, param in meta.named_parameters():
        found = by_parameter.get(name)
        if found is not None:
            layer, wanted = found
            if tuple(param.shape) != wanted.shape:
                layout = "(E, K, N)" if len(wanted.shape) == 3 else "(N, K)"
                raise LoadError(f"{name}: the model wants {tuple(param.shape)}, the server's layer "
                                f"is {layout} = {wanted.shape}")
            quantized.append((name, layer, wanted))
        elif name in others:
            if tuple(param.shape) != tuple(others[name].shape):
                raise LoadError(f"{name}: the model wants {tuple(param.shape)}, the server stores "
                                f"{tuple(others[name].shape)}")
            stored.append(name)
        else:
            raise LoadError(f"{name}: the model has this parameter and the server's model has no "
                            "tensor for it (neither a quantized layer nor a stored tensor)")

    t0 = time.perf_counter()
    element = torch.empty((), dtype=dtype).element_size()
    nk = client._orientation_support()[0]  # pylint: disable=protected-access
    # The kernel writes each parameter in its own orientation ((N, K) linear weights where the
    # server has (N, K) results; stacked experts' (E, K, N), their format's own, always) into
    # views of one buffer, one call per orientation. Linear weights of a server without (N, K)
    # results are each their own tensor, filled from a (K, N) staging buffer.
    # In the listing's order: a call of every layer in that order sends the empty list, not 224
    # names (tensors.run).
    rank = {layer.name: i for i, layer in enumerate(listing.layers)}
    direct = sorted((q for q in quantized if nk or q[2].orientation == "KN"),
                    key=lambda q: rank[q[1].name])
    staged = [q for q in quantized if not (nk or q[2].orientation == "KN")]
    flat = torch.empty(sum(_elements(p.shape) for _, _, p in direct), dtype=dtype, device=device)
    params: Dict[str, torch.Tensor] = {}
    offset = 0
    for name, _, wanted in direct:
        count = _elements(wanted.shape)
        params[name] = flat[offset:offset + count].view(wanted.shape)
        offset += count
    for name, _, wanted in staged:
        params[name] = torch.empty(wanted.shape, dtype=dtype, device=device)
    for name in stored:
        # Floating tensors get `dtype`, the cast transformers applies to a checkpoint's tensor
        # (copy_ below: round to nearest even); others keep their own dtype.
        code = others[name].dtype
        params[name] = torch.empty(tuple(others[name].shape), device=device,
                                   dtype=dtype if code in _FLOATING else dtypes.torch_dtype(code))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    report.allocate_seconds = time.perf_counter() - t0

    # pylint: disable-next=protected-access
    regions = client._regions_cache() if device.type == "cuda" else None
    registered = regions.register_seconds if regions is not None else 0.0
    t0 = time.perf_counter()
    times = tensors_module.IntoTimes()
    for orientation in ("NK", "KN"):
        group = {layer.name: params[name] for name, layer, wanted in direct
                 if wanted.orientation == orientation}
        if group:
            tensors_module.dequantize_into(client, group, orientation, listing, times)
            report.dequantize_calls += 1
    if staged:
        report.transposed = True
        largest = max(layer.in_features * layer.out_features for _, layer, _ in staged) * element
        batches = _batches([(name, layer) for name, layer, _ in staged], element,
                           max(STAGING_BYTES, largest))
        views: Dict[str, torch.Tensor] = {}
        staging = torch.empty(max((sum(layer.in_features * layer.out_features for _, layer in b)
                                   for b in batches), default=0), dtype=dtype, device=device)
        for batch in batches:
            views, offset = {}, 0
            for _, layer in batch:
                count = layer.in_features * layer.out_features
                views[layer.name] = staging[offset:offset + count].view(layer.in_features,
                                                                        layer.out_features)
                offset += count
            tensors_module.dequantize_into(client, views, "KN", listing, times)
            report.dequantize_calls += 1
            for name, layer in batch:
                params[name].copy_(views[layer.name].t())  # on `device`; exact
        del views, staging  # its region is unregistered when the storage goes (finalizer)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    report.dequantize_seconds = time.perf_counter() - t0
    report.check_seconds, report.call_seconds = times.check_seconds, times.call_seconds
    if regions is not None:
        report.register_seconds = regions.register_seconds - registered
    report.layers = len(quantized)
    report.layer_bytes = sum(_elements(p.shape) for _, _, p in quantized) * element

    t0 = time.perf_counter()
    if device.type == "cuda":
        _fill_stored_on_device(client, params, stored, others, device, listing)
    else:
        _fill_stored_streamed(client, params, stored, others)
    report.other_bytes = sum(params[n].numel() * params[n].element_size() for n in stored)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    report.read_seconds = time.perf_counter() - t0
    report.others = len(stored)

    # The server needs no mapping of the model's memory once it is filled.
    if flat.numel() > 0 and device.type == "cuda":
        client._regions_cache().release_tensor(flat)  # pylint: disable=protected-access
    del flat

    t0 = time.perf_counter()
    pointers = {name: t.data_ptr() for name, t in params.items()}
    model = _assign(meta, params, device)
    del params, meta
    report.in_place = sum(1 for name, p in model.named_parameters()
                          if pointers.get(name) == p.data_ptr())
    report.assemble_seconds = time.perf_counter() - t0
    model.eval()
    return model
