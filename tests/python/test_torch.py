"""Torch tensors the caller owns and the model loader (issue 23), against a real dequantd (CPU
backend) serving the bundled model: every argument check raises its exact exception naming the
layer before any byte is written; CPU tensors are filled bit for bit like dequantize(); the
loader's logits equal those of transformers' from_pretrained of the converted bf16 checkpoint bit
for bit; a server killed during a load raises UNAVAILABLE and returns no model. Needs torch (and
transformers for the loader): skipped without them (tests/python/run.sh installs them when
DEQUANTD_TEST_TORCH=1). The CUDA cases are in tests/gpu/torch_loader_check.py."""

import dataclasses
import os

import grpc
import pytest

torch = pytest.importorskip("torch")

import dequantd  # noqa: E402
from dequantd import tensors as dt  # noqa: E402
from dequantd._proto import dequant_pb2 as pb  # noqa: E402
from conftest import MODEL, MXFP4_CASE, format_case_model, start_server, stop_server  # noqa: E402

Q = "model.layers.0.self_attn.q_proj"   # K = N = 576
DOWN = "model.layers.0.mlp.down_proj"   # K = 1536, N = 576
UP = "model.layers.0.mlp.up_proj"       # K = 576, N = 1536


def nan_tensor(shape, dtype=torch.bfloat16):
    return torch.full(shape, float("nan"), dtype=dtype)


# --- argument checks: exact exception, message names the layer and the mismatch -----------

def test_a_value_that_is_not_a_tensor_is_a_type_error(client):
    with pytest.raises(TypeError, match=rf"^{DOWN}: expected a torch.Tensor, got ndarray$"):
        import numpy as np
        client.dequantize_into_tensors({DOWN: np.zeros((1536, 576), np.float16)})


def test_a_mapping_is_required(client):
    with pytest.raises(TypeError, match=r"tensors must be a mapping of layer name -> "
                                        r"torch.Tensor, not list"):
        client.dequantize_into_tensors([(DOWN, nan_tensor((1536, 576)))])


def test_an_unknown_layer_is_a_value_error(client):
    with pytest.raises(ValueError, match=r"^model.layers.99.mlp.down_proj: not a quantized "
                                         r"layer of the server's model .* names its 210 layers"):
        client.dequantize_into_tensor("model.layers.99.mlp.down_proj", nan_tensor((1536, 576)))


def test_a_dtype_dequantd_does_not_write_is_a_type_error(client):
    with pytest.raises(TypeError, match=rf"^{DOWN}: dtype torch.int8 is not one dequantd writes; "
                                        r"use torch.float16, torch.bfloat16 or torch.float32$"):
        client.dequantize_into_tensor(DOWN, torch.zeros((1536, 576), dtype=torch.int8))


def test_a_wrong_shape_names_the_expected_k_n(client):
    with pytest.raises(ValueError, match=rf"^{DOWN}: tensor shape \(1536, 575\) != the layer's "
                                         r"\(K, N\) = \(1536, 576\)$"):
        client.dequantize_into_tensor(DOWN, nan_tensor((1536, 575)))


def test_an_nn_linear_shaped_tensor_names_the_orientation(client):
    with pytest.raises(ValueError, match=rf"^{DOWN}: tensor shape \(576, 1536\) != the layer's "
                                         r"\(K, N\) = \(1536, 576\): that is nn.Linear's \(N, K\) "
                                         r"orientation; pass orientation='NK'"):
        client.dequantize_into_tensor(DOWN, nan_tensor((576, 1536)))


def test_orientation_nk_is_refused_before_any_write_by_a_server_without_it(client,
                                                                           monkeypatch):
    """A server that predates result orientations (what the probe finds out): NK is refused with
    the probe's reason, and the tensor stays untouched."""
    monkeypatch.setattr(client, "_orientation", (False, "the server ignores the orientation "
                                                       "field"))
    t = nan_tensor((576, 1536))
    with pytest.raises(ValueError, match=r"^orientation 'NK': the server ignores the "
                                         r"orientation field; with this server pass \(K, N\) tensors"):
        client.dequantize_into_tensor(DOWN, t, orientation="NK")
    assert torch.isnan(t).all()


@pytest.mark.parametrize("dtype,name", [(torch.bfloat16, "bf16"), (torch.float32, "fp32")])
def test_orientation_nk_writes_nn_linear_layout_bit_for_bit(client, dtype, name):
    """This server writes (N, K) results: the tensor gets exactly the transpose of (K, N)."""
    t = nan_tensor((576, 1536), dtype)
    client.dequantize_into_tensor(DOWN, t, orientation="NK")
    kn = client.dequantize(DOWN, dtype=name, as_torch=True)
    assert torch.equal(t.view(torch.uint8), kn.t().contiguous().view(torch.uint8))


def test_requests_name_the_orientation_explicitly():
    """Unset means the format's own (gptq: (N, K)), so KN is sent as KN."""
    from dequantd._proto import dequant_pb2 as pb
    assert (dt.orientation_wire("KN"), dt.orientation_wire("NK")) == (pb.ORIENTATION_KN,
                                                                       pb.ORIENTATION_NK)


def test_an_unknown_orientation_is_a_value_error(client):
    with pytest.raises(ValueError, match=r"^orientation must be 'KN' .* or 'NK' .*, not 'kn'$"):
        client.dequantize_into_tensor(DOWN, nan_tensor((1536, 576)), orientation="kn")


def test_a_non_contiguous_tensor_is_refused(client):
    t = nan_tensor((576, 1536)).T  # shape (1536, 576), strides (1, 1536)
    with pytest.raises(ValueError, match=rf"^{DOWN}: tensor is not contiguous \(strides \(1, "
                                         r"1536\)\); dequantd writes row-major bytes"):
        client.dequantize_into_tensor(DOWN, t)


def test_a_meta_tensor_is_refused(client):
    with pytest.raises(ValueError, match=rf"^{DOWN}: tensor on meta; dequantd writes CUDA "
                                         r"tensors .* and CPU tensors"):
        client.dequantize_into_tensor(DOWN, torch.empty((1536, 576), dtype=torch.bfloat16,
                                                        device="meta"))


def test_overlapping_tensors_are_refused(client):
    flat = nan_tensor((1536 * 576 + 576 * 1536,))
    a = flat[:1536 * 576].view(1536, 576)
    b = flat[1536 * 576 - 576:].view(-1)[:576 * 1536].view(576, 1536)
    with pytest.raises(ValueError, match=rf"^{DOWN} and {UP}: their tensors overlap in memory$"):
        client.dequantize_into_tensors({DOWN: a, UP: b})
    assert torch.isnan(flat).all()


def test_one_bad_tensor_stops_the_whole_call_before_any_write(client):
    good = nan_tensor((576, 576))
    with pytest.raises(ValueError, match=rf"^{DOWN}: tensor shape"):
        client.dequantize_into_tensors({Q: good, DOWN: nan_tensor((2, 2))})
    assert torch.isnan(good).all()


def test_a_cuda_tensor_needs_a_cuda_server(client):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here (tests/gpu/torch_loader_check.py has the CUDA cases)")
    with pytest.raises(ValueError, match=rf"^{DOWN}: tensor on cuda:0 but the server's backend "
                                         r"is 'cpu'"):
        client.dequantize_into_tensor(DOWN, torch.empty((1536, 576), dtype=torch.bfloat16,
                                                        device="cuda:0"))


EMBED = "model.embed_tokens.weight"  # F16 (49152, 576)


def test_read_tensors_into_checks_name_dtype_shape_contiguity_and_device(client):
    with pytest.raises(ValueError, match=r"^model.nope: not a stored tensor of the server's "
                                         r"model .*quantized layers go through "
                                         r"dequantize_into_tensors"):
        client.read_tensors_into({"model.nope": torch.empty(1)})
    with pytest.raises(ValueError, match=rf"^{EMBED}: tensor dtype torch.bfloat16 != the stored "
                                         r"F16 \(torch.float16\); the bytes are copied unchanged"):
        client.read_tensors_into({EMBED: torch.empty((49152, 576), dtype=torch.bfloat16)})
    with pytest.raises(ValueError, match=rf"^{EMBED}: tensor shape \(576, 49152\) != the stored "
                                         r"\(49152, 576\)$"):
        client.read_tensors_into({EMBED: torch.empty((576, 49152), dtype=torch.float16)})
    with pytest.raises(ValueError, match=rf"^{EMBED}: tensor is not contiguous"):
        client.read_tensors_into({EMBED: torch.empty((576, 49152), dtype=torch.float16).t()})
    with pytest.raises(ValueError, match=rf"^{EMBED}: tensor on cpu; read_tensors_into fills "
                                         r"CUDA tensors"):
        client.read_tensors_into({EMBED: torch.empty((49152, 576), dtype=torch.float16)})
    with pytest.raises(TypeError, match=rf"^{EMBED}: expected a torch.Tensor, got list$"):
        client.read_tensors_into({EMBED: [1.0]})
    assert client.read_tensors_into({}) == {}


# --- values --------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,name", [(torch.float16, "fp16"), (torch.bfloat16, "bf16"),
                                        (torch.float32, "fp32")])
def test_a_cpu_tensor_is_filled_bit_for_bit(client, dtype, name):
    expected = client.dequantize(DOWN, dtype=name, as_torch=True)
    t = nan_tensor((1536, 576), dtype)
    assert client.dequantize_into_tensor(DOWN, t) is t
    assert torch.equal(t.view(torch.uint8), expected.view(torch.uint8))


def test_a_layer_of_stacked_experts_fills_an_e_k_n_tensor(tmp_path):
    """An MXFP4 layer of E experts is E matrices: its tensor is (E, K, N) (or (E, N, K)), filled
    bit for bit like dequantize(); a (K, N) tensor is refused before any call, naming E."""
    model = format_case_model(MXFP4_CASE, tmp_path)
    proc, target = start_server(str(tmp_path), model_dir=str(model))
    try:
        with dequantd.Client(target) as c:
            name = "model.layers.0.mlp.experts.down_proj"
            layer = next(l for l in c.list().layers if l.name == name)
            e, k, n = layer.experts, layer.in_features, layer.out_features
            assert e == 2
            for orientation, shape in (("KN", (e, k, n)), ("NK", (e, n, k))):
                expected = c.dequantize(name, dtype="bf16", as_torch=True,
                                        orientation=orientation.lower())
                t = nan_tensor(shape)
                c.dequantize_into_tensor(name, t, orientation=orientation)
                assert torch.equal(t.view(torch.uint8), expected.view(torch.uint8)), orientation
            with pytest.raises(ValueError, match=r"\(E, K, N\) = \(2, 32, 64\): the layer "
                                                 r"stacks 2 experts"):
                c.dequantize_into_tensor(name, nan_tensor((k, n)))
    finally:
        stop_server(proc)


def test_many_layers_into_views_of_one_buffer(client):
    names = [Q, DOWN, UP]
    shapes = {Q: (576, 576), DOWN: (1536, 576), UP: (576, 1536)}
    flat = nan_tensor((sum(k * n for k, n in shapes.values()),))
    views, offset = {}, 0
    for name in names:
        k, n = shapes[name]
        views[name] = flat[offset:offset + k * n].view(k, n)
        offset += k * n
    assert client.dequantize_into_tensors(views) is views
    for name in names:
        expected = client.dequantize(name, dtype="bf16", as_torch=True)
        assert torch.equal(views[name].view(torch.int16), expected.view(torch.int16)), name


def test_storage_python_objects_are_preserved():
    """The region cache keys its finalizers on storage objects: torch must hand out one object
    per storage (else it watches the tensor; tensors.RegionCache.region_for)."""
    t = torch.empty(8)
    s = t.untyped_storage()
    assert t.untyped_storage() is s
    assert t[2:].untyped_storage() is s


def test_the_orientation_probe_finds_nk_results(client):
    assert dequantd.Client(client.target)._orientation_support() == (True, "")


# --- the loader ----------------------------------------------------------------------------

PROMPT = [[1, 504, 3458, 282, 4477, 314, 253, 2012, 30, 198, 42, 9000]]


@pytest.fixture(scope="module")
def converted(server, tmp_path_factory):
    pytest.importorskip("transformers")
    out = str(tmp_path_factory.mktemp("bf16"))
    dequantd.convert(server, out, dtype="bf16")
    return out


def test_the_loader_gives_the_logits_of_from_pretrained_bit_for_bit(server, converted):
    import transformers
    import dequantd.torch as dtorch

    reference = transformers.AutoModelForCausalLM.from_pretrained(
        converted, dtype=torch.bfloat16, local_files_only=True).eval()
    with dequantd.Client(server) as c:
        model = dtorch.load_model(c, device="cpu", dtype=torch.bfloat16)
    report = model.dequantd_load_report
    # This server writes (N, K): every layer straight into views of one buffer, one call.
    assert (report.layers, report.others, report.transposed) == (210, 62, False)
    assert report.dequantize_calls == 1
    assert report.in_place == 272 == len(list(model.named_parameters()))  # no copies made
    assert report.layer_bytes == sum(l.in_features * l.out_features for l in
                                     dequantd.Client(server).list().layers) * 2
    assert not model.training
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied
    ids = torch.tensor(PROMPT)
    with torch.no_grad():
        got = model(ids).logits
        want = reference(ids).logits
    assert got.dtype == torch.bfloat16 and got.shape == (1, len(PROMPT[0]), 49152)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    # Every parameter too, by name.
    ref = dict(reference.named_parameters())
    for name, p in model.named_parameters():
        assert torch.equal(p.view(torch.int16), ref[name].view(torch.int16)), name


def test_against_a_server_without_nk_the_loader_transposes_on_the_device(server, converted,
                                                                          monkeypatch):
    """The fallback for servers that predate orientations: (K, N) staging batches, a transpose
    on the tensor's device; the same parameters bit for bit."""
    import transformers
    import dequantd.torch as dtorch

    monkeypatch.setattr(dtorch, "STAGING_BYTES", 16 << 20)  # several batches
    with dequantd.Client(server) as c:
        c._orientation = (False, "pretend: an older server")
        model = dtorch.load_model(c, device="cpu")
    report = model.dequantd_load_report
    assert report.transposed and report.dequantize_calls > 1
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        converted, dtype=torch.bfloat16, local_files_only=True)
    ref = dict(reference.named_parameters())
    for name, p in model.named_parameters():
        assert torch.equal(p.view(torch.int16), ref[name].view(torch.int16)), name


def test_a_gpt_oss_model_loads_with_its_experts_from_the_kernel(tmp_path):
    """A gpt-oss (MXFP4) model: each MoE projection is transformers' GptOssExperts parameter
    [E, K, N] named as the layer (no ".weight"), written by the kernel in its format's own (E, K,
    N) orientation into the model's memory, equal bit for bit to transformers' own dequantization
    of the same blocks (the case's expected tensors, made by convert_moe_packed_tensors); the
    router, attention (with its sinks), norms and embeddings come through ReadTensor; the logits
    equal those of from_pretrained of the converted bf16 checkpoint bit for bit."""
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "GptOssConfig"):
        pytest.skip("this transformers has no gpt-oss")
    import dequantd.torch as dtorch
    import gpt_oss_model

    model_dir = tmp_path / "model"
    expected = gpt_oss_model.make(str(model_dir))
    proc, target = start_server(str(tmp_path), model_dir=str(model_dir))
    try:
        with dequantd.Client(target) as c:
            model = dtorch.load_model(c, device="cpu", dtype=torch.bfloat16)
        out = tmp_path / "bf16"
        dequantd.convert(target, str(out), dtype="bf16")
    finally:
        stop_server(proc)
    report = model.dequantd_load_report
    # Two layers (the experts' projections), one call in their own orientation, no transpose.
    assert (report.layers, report.dequantize_calls, report.transposed) == (2, 1, False)
    assert report.in_place == len(list(model.named_parameters()))
    got = dict(model.named_parameters())
    for proj, shape in gpt_oss_model.PROJECTIONS:
        p = got[gpt_oss_model.EXPERTS + proj]
        assert tuple(p.shape) == shape and p.dtype == torch.bfloat16, proj
        assert p.detach().contiguous().view(torch.uint8).numpy().tobytes() == expected[proj], proj
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        str(out), dtype=torch.bfloat16, local_files_only=True).eval()
    ref = dict(reference.named_parameters())
    for name, p in got.items():
        assert torch.equal(p.view(torch.int16), ref[name].view(torch.int16)), name
    ids = torch.tensor([[1, 7, 42, 99, 3, 64]])
    with torch.no_grad():
        logits, want = model(ids).logits, reference(ids).logits
    assert logits.shape == (1, 6, 128)
    assert torch.equal(logits.view(torch.int16), want.view(torch.int16))


def test_the_fp16_loader_matches_from_pretrained_of_an_fp16_conversion(server, tmp_path):
    transformers = pytest.importorskip("transformers")
    import dequantd.torch as dtorch

    dequantd.convert(server, str(tmp_path), dtype="fp16")
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), dtype=torch.float16, local_files_only=True).eval()
    model = dtorch.load_model(server, device="cpu", dtype=torch.float16)  # a target string
    ids = torch.tensor(PROMPT)
    with torch.no_grad():
        got, want = model(ids).logits, reference(ids).logits
    assert got.dtype == torch.float16
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_a_server_killed_during_a_load_raises_and_returns_no_model(tmp_path, monkeypatch):
    """The server is killed after the layers are in, at the fifth ReadTensor (of 62)."""
    pytest.importorskip("transformers")
    import dequantd.torch as dtorch

    proc, target = start_server(str(tmp_path))
    monkeypatch.setattr(dtorch, "READ_STREAMS", 1)  # one read after another: a fixed order
    reads = []
    try:
        with dequantd.Client(target) as c:
            real = c.read_tensor

            def dying(*args, **kwargs):
                reads.append(1)
                if len(reads) == 5:
                    proc.kill()
                    proc.wait()
                return real(*args, **kwargs)

            monkeypatch.setattr(c, "read_tensor", dying)
            result = None
            with pytest.raises(dequantd.DequantdError) as e:
                result = dtorch.load_model(c, device="cpu")
            assert result is None
            assert e.value.code == grpc.StatusCode.UNAVAILABLE
            assert e.value.message.startswith("load_model: ")
            # The failed read ends the load: with one stream no read is started after it.
            assert len(reads) == 5
    finally:
        if proc.poll() is None:
            stop_server(proc)


def test_the_loader_refuses_a_bad_dtype_and_device(client):
    import dequantd.torch as dtorch

    with pytest.raises(TypeError, match=r"^dtype must be torch.float16, torch.bfloat16 or "
                                        r"torch.float32, not torch.int8$"):
        dtorch.load_model(client, device="cpu", dtype=torch.int8)
    with pytest.raises(ValueError, match=r"^device must be a CUDA device or cpu, not meta$"):
        dtorch.load_model(client, device="meta")


def test_the_server_config_has_no_quantization_config(client):
    pytest.importorskip("transformers")
    import dequantd.torch as dtorch

    config = dtorch.server_config(client)
    assert config.model_type == "llama"
    assert not hasattr(config, "quantization_config")
    assert (config.hidden_size, config.num_hidden_layers, config.tie_word_embeddings) == (
        576, 30, True)
    assert os.path.isdir(MODEL)


# --- the CUDA region cache's bookkeeping, with a fake driver and server (no GPU here) -------

class FakeServer:
    def __init__(self):
        self.registered, self.unregistered = [], []

    def register_cuda_shared_memory(self, name, handle, device, size, offset=0):
        assert len(handle) == 64 and offset == 0
        self.registered.append((name, device, size))

    def unregister_cuda_shared_memory(self, name, timeout=None):
        self.unregistered.append(name)
        return 1


def fake_target(tensor, base, buffer_id, size=1 << 20, name="x"):
    allocation = dt._cuda.Allocation(base=base, size=size, device=0, buffer_id=buffer_id,
                                     ipc_capable=True, context=0)
    return dt._Target(name, tensor, "bf16", tensor.numel() * 2, tuple(tensor.shape),
                      allocation=allocation, offset=0)


def test_one_registration_per_allocation_released_with_its_last_storage(monkeypatch):
    import gc
    monkeypatch.setattr(dt._cuda, "ipc_handle", lambda allocation: bytes(64))
    server = FakeServer()
    cache = dt.RegionCache(server)
    a, b = torch.empty(4), torch.empty(4)
    name = cache.region_for(fake_target(a, 0x1000, 7))
    assert cache.region_for(fake_target(b, 0x1000, 7)) == name  # same allocation: cached
    assert server.registered == [(name, 0, 1 << 20)] and cache.names() == [name]
    del a
    gc.collect()
    assert server.unregistered == []  # b's storage still uses it
    del b
    gc.collect()
    assert server.unregistered == [name] and cache.names() == []


def test_a_new_allocation_at_a_cached_address_is_registered_anew(monkeypatch):
    monkeypatch.setattr(dt._cuda, "ipc_handle", lambda allocation: bytes(64))
    server = FakeServer()
    cache = dt.RegionCache(server)
    keep = [torch.empty(4), torch.empty(4)]
    old = cache.region_for(fake_target(keep[0], 0x1000, 7))
    new = cache.region_for(fake_target(keep[1], 0x1000, 8))  # freed and allocated again
    assert new != old
    assert server.unregistered == [old] and [r[0] for r in server.registered] == [old, new]
    cache.forget([new])  # the server lost it (restart): no Unregister sent
    assert server.unregistered == [old] and cache.names() == []
    again = cache.region_for(fake_target(keep[1], 0x1000, 8))
    cache.close()
    assert server.unregistered == [old, again]


def test_back_to_back_tensors_of_one_allocation_make_one_call():
    flat = torch.empty(64, dtype=torch.bfloat16)
    t = [fake_target(flat[i * 16:(i + 1) * 16], 0x1000, 1, name=f"l{i}") for i in range(4)]
    for i, target in enumerate(t):
        target.offset, target.nbytes = i * 32, 32
    t[3].offset = 160  # a gap before the last
    other = fake_target(flat[:16], 0x9000, 2, name="o")
    runs = dt._runs([t[2], other, t[0], t[3], t[1]])
    assert [[x.name for x in run] for run in runs] == [["l0", "l1", "l2"], ["l3"], ["o"]]


def test_targets_already_in_memory_order_make_the_runs_the_sort_makes():
    """The checks give views of one buffer one allocation object, in the loader's order: _runs
    then skips its sort (_in_memory_order) and splits the same runs as after one."""
    flat = torch.empty(64, dtype=torch.bfloat16)
    first = fake_target(flat[:16], 0x1000, 1, name="l0")
    t = [first] + [fake_target(flat[i * 16:(i + 1) * 16], 0x1000, 1, name=f"l{i}")
                   for i in range(1, 4)]
    for i, target in enumerate(t):
        target.allocation, target.offset, target.nbytes = first.allocation, i * 32, 32
    t[2].dtype = "fp16"  # another dtype: a run of its own
    t[3].offset = 160  # a gap before the last
    assert dt._in_memory_order(t)
    assert [[x.name for x in run] for run in dt._runs(t)] == [["l0", "l1"], ["l2"], ["l3"]]
    shuffled = [t[3], t[0], t[2], t[1]]
    assert not dt._in_memory_order(shuffled)
    assert [[x.name for x in run] for run in dt._runs(shuffled)] == [["l0", "l1"], ["l2"], ["l3"]]


def test_a_run_is_split_below_the_servers_output_limit(monkeypatch):
    monkeypatch.setattr(dt, "MAX_CALL_BYTES", 64)
    flat = torch.empty(64, dtype=torch.bfloat16)
    t = [fake_target(flat[i * 16:(i + 1) * 16], 0x1000, 1, name=f"l{i}") for i in range(4)]
    for i, target in enumerate(t):
        target.offset, target.nbytes = i * 32, 32
    assert [[x.name for x in run] for run in dt._runs(t)] == [["l0", "l1"], ["l2", "l3"]]


class FakeRegionServer(FakeServer):
    """A client stand-in for tensors.run's region path: it records the calls and, once
    `restart()`ed, has lost every region (NOT_FOUND naming it, as the server says)."""

    def __init__(self):
        super().__init__()
        self.held, self.calls = set(), []
        self.cache = dt.RegionCache(self)

    def _regions_cache(self):
        return self.cache

    def register_cuda_shared_memory(self, name, handle, device, size, offset=0):
        super().register_cuda_shared_memory(name, handle, device, size, offset)
        self.held.add(name)

    def restart(self):
        self.held.clear()

    def shared_memory_status(self):
        return dequantd.SharedMemoryStatus(regions=[dequantd.RegionInfo(
            n, "device", "", 0, 0, 1, False, "", 0, 0.0) for n in sorted(self.held)],
            mode="cuda", max_regions=64, max_bytes=1 << 40, idle_release_seconds=0)

    # What the fake server's summary says: 32 bytes per layer unless a test changes it.
    bytes_per_layer = 32

    def _region_layers_summary(self, region, names, offset, dtype, orientation,
                               expected_bytes=0):
        if region not in self.held:
            raise dequantd.DequantdError(grpc.StatusCode.NOT_FOUND, f'output_region.name: no '
                                         f'region "{region}" is registered')
        assert names is not None and expected_bytes > 0  # these tests' runs are not the listing
        self.calls.append((region, list(names), offset))
        return dequantd.RegionSummary(len(names), self.bytes_per_layer * len(names), region,
                                      offset, dtype, "KN", "cuda", "k")

    def _region_call_into(self, region, layer, offset, dtype, orientation, expected_bytes=0):
        assert expected_bytes > 0
        self.calls.append((region, [layer], offset))
        return dequantd.RegionHeader("", (4, 4), dtype, 32, region, offset, "cuda", "k")


def test_after_a_server_restart_the_region_is_registered_again_and_the_call_retried(
        monkeypatch):
    monkeypatch.setattr(dt._cuda, "ipc_handle", lambda allocation: bytes(64))
    fake = FakeRegionServer()
    flat = torch.empty(32, dtype=torch.bfloat16)
    targets = [fake_target(flat[i * 16:(i + 1) * 16].view(4, 4), 0x1000, 1, name=f"l{i}")
               for i in range(2)]
    for i, t in enumerate(targets):
        t.offset, t.nbytes, t.shape = 32 * i, 32, (4, 4)
    dt.run(fake, targets, "KN")
    first = fake.cache.names()
    fake.restart()
    dt.run(fake, targets, "KN")
    second = fake.cache.names()
    assert len(first) == len(second) == 1 and first != second
    assert [r[0] for r in fake.registered] == first + second
    assert fake.unregistered == []  # the lost region is forgotten, not unregistered
    assert fake.calls == [(first[0], ["l0", "l1"], 0), (second[0], ["l0", "l1"], 0)]


def test_a_summary_that_does_not_match_the_placements_is_data_loss(monkeypatch):
    """A run of tensors is one call whose reply is the summary alone (issue 23): the placements
    were computed before the call, and a summary whose bytes disagree is DATA_LOSS."""
    monkeypatch.setattr(dt._cuda, "ipc_handle", lambda allocation: bytes(64))
    fake = FakeRegionServer()
    fake.bytes_per_layer = 16  # the tensors take 32 bytes each
    flat = torch.empty(32, dtype=torch.bfloat16)
    targets = [fake_target(flat[i * 16:(i + 1) * 16].view(4, 4), 0x1000, 1, name=f"l{i}")
               for i in range(2)]
    for i, t in enumerate(targets):
        t.offset, t.nbytes, t.shape = 32 * i, 32, (4, 4)
    with pytest.raises(dequantd.DequantdError) as e:
        dt.run(fake, targets, "KN")
    assert e.value.code == grpc.StatusCode.DATA_LOSS
    assert e.value.message == "l0..l1: the server's summary says 32 bytes, expected 64"


def test_check_summary_names_every_disagreement():
    flat = torch.empty(32, dtype=torch.bfloat16)
    run_ = [fake_target(flat[i * 16:(i + 1) * 16], 0x1000, 1, name=f"l{i}") for i in range(2)]
    for i, t in enumerate(run_):
        t.offset, t.nbytes = 64 + 32 * i, 32
    good = dequantd.RegionSummary(2, 64, "r", 64, "bf16", "NK", "cuda", "k")
    dt.check_summary(good, run_, "r", pb.ORIENTATION_NK)  # no error
    bad = dataclasses.replace(good, layer_count=3, region_offset=0, dtype="fp16",
                              orientation="KN")
    with pytest.raises(dequantd.DequantdError) as e:
        dt.check_summary(bad, run_, "r", pb.ORIENTATION_NK)
    assert e.value.code == grpc.StatusCode.DATA_LOSS
    assert e.value.message == ("l0..l1: the server's summary says 3 layers, expected 2; region "
                               "'r' at 0, expected 'r' at 64; dtype fp16, expected bf16; "
                               "orientation KN, expected NK")


def test_a_single_tensor_header_that_does_not_match_is_data_loss(monkeypatch):
    monkeypatch.setattr(dt._cuda, "ipc_handle", lambda allocation: bytes(64))
    fake = FakeRegionServer()
    flat = torch.empty(32, dtype=torch.bfloat16)
    target = fake_target(flat.view(4, 8), 0x1000, 1, name="l0")
    target.offset, target.nbytes, target.shape = 0, 64, (4, 8)  # the server will say (4, 4)
    with pytest.raises(dequantd.DequantdError) as e:
        dt.run(fake, [target], "KN")
    assert e.value.code == grpc.StatusCode.DATA_LOSS
    assert e.value.message == ("l0: the server wrote (4, 4) (32 bytes) at offset 0, expected "
                               "(4, 8) (64 bytes) at 0")
