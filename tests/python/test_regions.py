"""Shared-memory regions from the Python client (issue 9) against a real dequantd (CPU backend,
--shared-memory=host): a host region filled by dequantd equals the streamed result bit for bit,
the one reply message carries the header (dequantize_into) or every layer's header in request
order (dequantize_layers_into) naming the region and offsets, or with reply="summary" the counts
alone (issue 23), and errors keep their status."""

import os
from multiprocessing import shared_memory

import grpc
import numpy as np
import pytest

import dequantd
from conftest import start_server, stop_server


@pytest.fixture(scope="module")
def regions(tmp_path_factory):
    proc, target = start_server(str(tmp_path_factory.mktemp("regions")),
                                extra=("--shared-memory=host",))
    with dequantd.Client(target, timeout=60) as c:
        yield c
    stop_server(proc)


@pytest.fixture()
def shm():
    """A factory of POSIX shared-memory objects (unlinked after the test)."""
    made = []

    def make(nbytes):
        s = shared_memory.SharedMemory(name=f"dequantd-py.{os.getpid()}.{len(made)}",
                                       create=True, size=nbytes)
        s.buf[:nbytes] = b"\0" * nbytes
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()
        s.unlink()


def result_bytes(client, name, dtype):
    return client.dequantize(name, dtype=dtype).tobytes()


def test_dequantize_into_a_host_region_is_bit_exact(regions, shm):
    layer = regions.list().layers[0]
    expected = result_bytes(regions, layer.name, "bf16")
    s = shm(64 + len(expected))
    assert regions.register_system_shared_memory("one", "/" + s.name, s.size) is False
    try:
        h = regions.dequantize_into("one", layer.name, offset=48, dtype="bf16")
        assert h == dequantd.RegionHeader(
            tensor="", shape=(layer.in_features, layer.out_features), dtype="bf16",
            total_bytes=len(expected), region="one", region_offset=48, backend="cpu",
            kernel=h.kernel)
        assert h.kernel.startswith("cpu")
        assert bytes(s.buf[48:48 + len(expected)]) == expected
        assert bytes(s.buf[:48]) == b"\0" * 48
    finally:
        assert regions.unregister_system_shared_memory("one") == 1


def test_dequantize_layers_into_returns_every_layer_header_in_request_order(regions, shm):
    layers = regions.list().layers
    names = [layers[1].name, layers[0].name, layers[1].name]
    expected = [result_bytes(regions, n, "fp16") for n in names]
    s = shm(16 + sum(len(e) for e in expected))
    regions.register_system_shared_memory("layers", "/" + s.name, s.size)
    try:
        headers = regions.dequantize_layers_into("layers", names, offset=16)
        assert [h.tensor for h in headers] == names
        offset = 16
        for h, e in zip(headers, expected):
            assert (h.region, h.region_offset, h.total_bytes, h.dtype) == ("layers", offset,
                                                                          len(e), "fp16")
            assert bytes(s.buf[offset:offset + len(e)]) == e
            offset += len(e)
    finally:
        regions.unregister_system_shared_memory("layers")


def test_a_summary_reply_counts_the_layers_and_the_bytes_are_where_list_says(regions, shm):
    """reply="summary" (issue 23): the placements are worked out here, before the call, from
    list() (K * N * 2 bytes each, one after another from the offset); the summary's count and
    total are their sums, and every result lies where it was computed to."""
    layers = regions.list().layers
    names = [layers[2].name, layers[0].name, layers[2].name, layers[1].name]
    sizes = {l.name: l.in_features * l.out_features * 2 for l in layers}  # bf16
    places, at = [], 32
    for n in names:
        places.append(at)
        at += sizes[n]
    total = at - 32
    s = shm(32 + total + 16)
    regions.register_system_shared_memory("summary", "/" + s.name, s.size)
    try:
        summary = regions.dequantize_layers_into("summary", names, offset=32, dtype="bf16",
                                                 reply="summary")
        assert summary == dequantd.RegionSummary(
            layer_count=4, total_bytes=total, region="summary", region_offset=32, dtype="bf16",
            orientation="KN", backend="cpu", kernel=summary.kernel)
        assert summary.kernel.startswith("cpu")
        for n, place in zip(names, places):
            assert bytes(s.buf[place:place + sizes[n]]) == result_bytes(regions, n, "bf16"), n
        assert bytes(s.buf[:32]) == b"\0" * 32
        assert bytes(s.buf[32 + total:32 + total + 16]) == b"\0" * 16
        # An empty list: a summary of nothing, without a call. (None, every layer: the C++
        # integration test, on a model of two small layers; this one's are 212 MB.)
        assert regions.dequantize_layers_into("summary", [], reply="summary").layer_count == 0
    finally:
        regions.unregister_system_shared_memory("summary")


def test_dequantize_layers_into_an_empty_list_writes_nothing(regions, shm):
    s = shm(4096)
    regions.register_system_shared_memory("empty", "/" + s.name, s.size)
    try:
        assert regions.dequantize_layers_into("empty", []) == []
        assert bytes(s.buf[:4096]) == b"\0" * 4096
    finally:
        regions.unregister_system_shared_memory("empty")


def test_region_errors_keep_their_status(regions, shm):
    layer = regions.list().layers[0]
    s = shm(4096)
    regions.register_system_shared_memory("small", "/" + s.name, s.size)
    try:
        with pytest.raises(dequantd.DequantdError) as e:
            regions.dequantize_into("small", layer.name)
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert 'region "small"' in e.value.message
        with pytest.raises(dequantd.DequantdError) as e:
            regions.dequantize_layers_into("nope", [layer.name])
        assert e.value.code == grpc.StatusCode.NOT_FOUND
        with pytest.raises(dequantd.DequantdError) as e:
            regions.register_system_shared_memory("small", "/" + s.name, s.size)
        assert e.value.code == grpc.StatusCode.ALREADY_EXISTS
        assert bytes(s.buf[:4096]) == b"\0" * 4096  # nothing written
    finally:
        regions.unregister_system_shared_memory("")


def test_shared_memory_status_lists_the_registered_regions(regions, shm):
    status = regions.shared_memory_status()
    # The server's defaults: 64 regions, 64 GiB, idle regions never released.
    assert status == dequantd.SharedMemoryStatus(regions=[], mode="host", max_regions=64,
                                                 max_bytes=64 << 30, idle_release_seconds=0)
    s = shm(8192)
    regions.register_system_shared_memory("listed", "/" + s.name, 4096, offset=4096)
    try:
        status = regions.shared_memory_status()
        assert len(status.regions) == 1
        r = status.regions[0]
        # No cudaHostRegister on the CPU backend: pinned is False; no call writes into it.
        assert (r.name, r.kind, r.key, r.device_id, r.offset, r.byte_size, r.pinned,
                r.calls_in_flight) == ("listed", "host", "/" + s.name, -1, 4096, 4096, False, 0)
        assert r.owner.startswith("ipv4:127.0.0.1:"), r.owner
        assert r.idle_seconds >= 0
    finally:
        assert regions.unregister_system_shared_memory("listed") == 1
    assert regions.shared_memory_status().regions == []


def test_region_calls_go_over_a_single_threaded_channel_of_their_own(regions, shm, monkeypatch):
    """grpcio reads "SingleThreadedUnaryStream" by its presence. The client's main channel goes
    without it (grpcio never frees a single-threaded stream cancelled before its end); the
    region calls' channel, opened at the first region call, has it (a region call's client side
    ~300 us shorter, docs/performance.md) unless the caller's options set it to 0. Other options
    go to both; calls work either way and the bytes are the streamed ones."""
    seen = []
    real = grpc.insecure_channel

    def spy(target, options=None, **kwargs):
        seen.append(dict(options or ()))
        return real(target, options=options, **kwargs)

    monkeypatch.setattr(grpc, "insecure_channel", spy)
    layer = regions.list().layers[0]
    expected = result_bytes(regions, layer.name, "bf16")
    s = shm(len(expected))
    regions.register_system_shared_memory("single", "/" + s.name, s.size)
    try:
        for options, single in (((), True), ((("SingleThreadedUnaryStream", 0),), False)):
            seen.clear()
            with dequantd.Client(regions.target, options=options) as c:
                assert len(seen) == 1 and "SingleThreadedUnaryStream" not in seen[0], seen
                streamed = dict(c.dequantize_layers([layer.name], dtype="bf16"))[layer.name]
                assert streamed.tobytes() == expected
                s.buf[:len(expected)] = b"\0" * len(expected)
                c.dequantize_into("single", layer.name, dtype="bf16")
                assert len(seen) == 2, seen  # the region channel, opened once
                c.dequantize_layers_into("single", [layer.name], dtype="bf16", reply="summary")
                assert len(seen) == 2
                assert ("SingleThreadedUnaryStream" in seen[1]) == single, seen[1]
                for channel in seen:
                    assert channel["grpc.max_receive_message_length"] == 64 << 20
                    assert channel["grpc.keepalive_permit_without_calls"] == 0
                assert bytes(s.buf[:len(expected)]) == expected
            with pytest.raises(ValueError, match="closed"):  # as every call of a closed client
                c.dequantize_into("single", layer.name, dtype="bf16")
            assert len(seen) == 2  # no channel opened anew
    finally:
        regions.unregister_system_shared_memory("single")


def _states_within(channel, seconds):
    """The connectivity states `channel` reports within `seconds`, watched without asking it to
    connect (until READY)."""
    import threading  # pylint: disable=import-outside-toplevel

    states, ready = [], threading.Event()

    def watch(state):
        states.append(state)
        if state == grpc.ChannelConnectivity.READY:
            ready.set()

    channel.subscribe(watch, try_to_connect=False)
    ready.wait(seconds)
    channel.unsubscribe(watch)
    return states


def test_the_region_channel_connects_before_the_first_region_call(regions, shm):
    """_connect_region_channel (load_model for a CUDA device, the CUDA checks) opens the region
    calls' channel and has it connect with no region call made: READY, where a channel that
    nothing asked to connect stays IDLE. It opens one channel once; the region call then uses
    it and writes the streamed bytes."""
    with dequantd.Client(regions.target) as c:
        c.info()
        assert c._region_channel is None
        c._connect_region_channel()
        channel = c._region_channel
        assert channel is not None
        assert _states_within(channel, 5.0)[-1] == grpc.ChannelConnectivity.READY
        c._connect_region_channel()
        assert c._region_channel is channel  # not opened anew
        layer = regions.list().layers[0]
        expected = result_bytes(regions, layer.name, "bf16")
        s = shm(len(expected))
        regions.register_system_shared_memory("early", "/" + s.name, s.size)
        try:
            c.dequantize_into("early", layer.name, dtype="bf16")
            assert c._region_channel is channel
            assert bytes(s.buf[:len(expected)]) == expected
        finally:
            regions.unregister_system_shared_memory("early")
    with dequantd.Client(regions.target) as c:  # the control: opened, never asked to connect
        c.info()
        with c._lock:
            idle = c._open_region_channel()
        assert set(_states_within(idle, 0.5)) == {grpc.ChannelConnectivity.IDLE}
    closed = dequantd.Client(regions.target)
    closed.close()
    closed._connect_region_channel()  # a closed client opens nothing
    assert closed._region_channel is None


def test_expected_bytes_refuses_another_total_before_writing(regions, shm):
    """expected_bytes (0: unchecked) is the caller's own total: another is FAILED_PRECONDITION
    and nothing is written, also where the results would not fit (a stale listing is named as
    such); a bad argument is refused before any call."""
    layers = regions.list().layers[:2]
    names = [layer.name for layer in layers]
    sizes = [layer.in_features * layer.out_features * 2 for layer in layers]  # bf16
    s = shm(sum(sizes))
    regions.register_system_shared_memory("expected", "/" + s.name, s.size)
    try:
        calls = (
            lambda e: regions.dequantize_into("expected", names[0], dtype="bf16",
                                              expected_bytes=e),
            lambda e: regions.dequantize_layers_into("expected", names, dtype="bf16",
                                                     expected_bytes=e),
            lambda e: regions.dequantize_layers_into("expected", names, dtype="bf16",
                                                     reply="summary", expected_bytes=e),
        )
        for call, total in zip(calls, (sizes[0], sum(sizes), sum(sizes))):
            for wrong in (total - 2, total + 16, total * 4):
                with pytest.raises(dequantd.DequantdError) as e:
                    call(wrong)
                assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION, e.value
                assert (f"output_region.expected_bytes = {wrong}, but the results are {total} "
                        "bytes") in e.value.message
                assert bytes(s.buf) == b"\0" * s.size
            for bad, error in ((-1, ValueError), (1 << 63, ValueError), (None, TypeError),
                               (1.0, TypeError), (True, TypeError)):
                with pytest.raises(error, match="expected_bytes must be"):
                    call(bad)
        regions.dequantize_layers_into("expected", names, dtype="bf16", reply="summary",
                                       expected_bytes=sum(sizes))
        assert bytes(s.buf) == b"".join(result_bytes(regions, n, "bf16") for n in names)
    finally:
        regions.unregister_system_shared_memory("expected")
