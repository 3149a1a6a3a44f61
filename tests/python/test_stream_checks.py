"""The client's checks on what a server streams, against an in-process Python gRPC server that
misbehaves on purpose (a real dequantd never does): gaps, overlaps, bytes past the end, data
before the header, a missing header, a header whose size does not match its shape; and region
replies that are not one message of headers naming the region and the requested layers, and
summary replies (issue 23) that do not name the region, offset and count asked for."""

from concurrent import futures

import grpc
import numpy as np
import pytest

import dequantd
from dequantd._proto import dequant_pb2 as pb
from dequantd._proto import dequant_pb2_grpc as pb_grpc

HEADER = pb.DequantizeHeader(shape=[2, 8], dtype=pb.DTYPE_FP16, total_bytes=32, backend="fake")
DATA = np.arange(16, dtype=np.float16).tobytes()

# Dequantize responses per layer name.
STREAMS = {
    "good": [pb.DequantizeResponse(header=HEADER), pb.DequantizeResponse(offset=0, data=DATA[:16]),
             pb.DequantizeResponse(offset=16, data=DATA[16:])],
    "gap": [pb.DequantizeResponse(header=HEADER, offset=0, data=DATA[:8]),
            pb.DequantizeResponse(offset=16, data=DATA[16:])],
    "overlap": [pb.DequantizeResponse(header=HEADER, offset=0, data=DATA[:16]),
                pb.DequantizeResponse(offset=8, data=DATA[8:24])],
    "past_end": [pb.DequantizeResponse(header=HEADER, offset=0, data=DATA + b"xx")],
    "short": [pb.DequantizeResponse(header=HEADER, offset=0, data=DATA[:30])],
    "no_header": [pb.DequantizeResponse(offset=0, data=DATA)],
    "empty": [],
    "bad_total": [pb.DequantizeResponse(header=pb.DequantizeHeader(
        shape=[2, 8], dtype=pb.DTYPE_FP16, total_bytes=30))],
}



def _layer_header(region, tensor="a"):
    return pb.DequantizeHeader(shape=[2, 8], dtype=pb.DTYPE_FP16, total_bytes=32, tensor=tensor,
                               region=region, region_offset=0, backend="fake")


# DequantizeLayers replies into a region, per region name (the request asks for layer "a").
REGION_REPLIES = {
    "good": [pb.DequantizeResponse(layer_headers=[_layer_header("good")])],
    "two_messages": [pb.DequantizeResponse(layer_headers=[_layer_header("two_messages")]),
                     pb.DequantizeResponse(layer_headers=[_layer_header("two_messages")])],
    "with_data": [pb.DequantizeResponse(layer_headers=[_layer_header("with_data")], data=DATA)],
    "none": [],
    "other_region": [pb.DequantizeResponse(layer_headers=[_layer_header("elsewhere")])],
    "other_layer": [pb.DequantizeResponse(layer_headers=[_layer_header("other_layer", "b")])],
    "header_only": [pb.DequantizeResponse(header=_layer_header("header_only"))],
}


def _summary(region, count=2, offset=16):
    return pb.DequantizeResponse(region_summary=pb.RegionSummary(
        layer_count=count, total_bytes=64, region=region, region_offset=offset,
        dtype=pb.DTYPE_FP16, orientation=pb.ORIENTATION_KN, backend="fake", kernel="k"))


def _placed(region, tensor, offset):
    h = _layer_header(region, tensor)
    h.region_offset = offset
    return h


# Replies to reply="summary" calls for layers ["a", "b"] at offset 16 (issue 23), by region.
REGION_REPLIES.update({
    "summary": [_summary("summary")],
    # A server before region_reply ignores it and sends every header: summed by the client.
    "older_server": [pb.DequantizeResponse(layer_headers=[_placed("older_server", "a", 16),
                                                          _placed("older_server", "b", 48)])],
    "older_server_gap": [pb.DequantizeResponse(layer_headers=[
        _placed("older_server_gap", "a", 16), _placed("older_server_gap", "b", 64)])],
    "summary_other_region": [_summary("elsewhere")],
    "summary_other_offset": [_summary("summary_other_offset", offset=0)],
    "summary_other_count": [_summary("summary_other_count", count=3)],
    "summary_two_messages": [_summary("summary_two_messages"), _summary("summary_two_messages")],
    "summary_and_headers": [pb.DequantizeResponse(
        region_summary=_summary("summary_and_headers").region_summary,
        layer_headers=[_layer_header("summary_and_headers")])],
})


class Fake(pb_grpc.DequantServiceServicer):
    def __init__(self):
        self.region_replies = []  # region_reply of every DequantizeLayers request

    def Dequantize(self, request, context):
        yield from STREAMS[request.tensor]

    def DequantizeLayers(self, request, context):
        self.region_replies.append(request.region_reply)
        yield from REGION_REPLIES[request.output_region.name]


@pytest.fixture(scope="module")
def fake():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = Fake()
    pb_grpc.add_DequantServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    with dequantd.Client(f"127.0.0.1:{port}") as client:
        client.servicer = servicer
        yield client
    server.stop(0)


def test_good_stream(fake):
    w = fake.dequantize("good")
    assert w.dtype == np.float16 and w.shape == (2, 8)
    assert np.array_equal(w.ravel(), np.arange(16, dtype=np.float16))


@pytest.mark.parametrize("name", ["gap", "overlap", "past_end", "short", "no_header", "empty",
                                  "bad_total"])
def test_bad_stream_is_data_loss(fake, name):
    with pytest.raises(dequantd.DequantdError) as e:
        fake.dequantize(name)
    assert e.value.code == grpc.StatusCode.DATA_LOSS, e.value.message


def test_good_region_reply(fake):
    (h,) = fake.dequantize_layers_into("good", ["a"])
    assert (h.tensor, h.shape, h.dtype, h.total_bytes, h.region) == ("a", (2, 8), "fp16", 32,
                                                                     "good")


@pytest.mark.parametrize("region", ["two_messages", "with_data", "none", "other_region",
                                    "other_layer", "header_only"])
def test_bad_region_reply_is_data_loss(fake, region):
    with pytest.raises(dequantd.DequantdError) as e:
        fake.dequantize_layers_into(region, ["a"])
    assert e.value.code == grpc.StatusCode.DATA_LOSS, e.value.message


def test_unimplemented_method_maps_too(fake):
    with pytest.raises(dequantd.DequantdError) as e:
        fake.info()
    assert e.value.code == grpc.StatusCode.UNIMPLEMENTED


def test_a_summary_reply_is_asked_for_and_returned(fake):
    summary = fake.dequantize_layers_into("summary", ["a", "b"], offset=16, reply="summary")
    assert summary == dequantd.RegionSummary(layer_count=2, total_bytes=64, region="summary",
                                             region_offset=16, dtype="fp16", orientation="KN",
                                             backend="fake", kernel="k")
    assert fake.servicer.region_replies[-1] == pb.REGION_REPLY_SUMMARY
    fake.dequantize_layers_into("good", ["a"])
    assert fake.servicer.region_replies[-1] == pb.REGION_REPLY_UNSPECIFIED  # the default: headers


def test_an_older_servers_headers_are_summed(fake):
    summary = fake.dequantize_layers_into("older_server", ["a", "b"], offset=16, reply="summary")
    assert (summary.layer_count, summary.total_bytes, summary.region, summary.region_offset,
            summary.dtype) == (2, 64, "older_server", 16, "fp16")


@pytest.mark.parametrize("region", ["older_server_gap", "summary_other_region",
                                    "summary_other_offset", "summary_other_count",
                                    "summary_two_messages", "summary_and_headers"])
def test_a_bad_summary_reply_is_data_loss(fake, region):
    with pytest.raises(dequantd.DequantdError) as e:
        fake.dequantize_layers_into(region, ["a", "b"], offset=16, reply="summary")
    assert e.value.code == grpc.StatusCode.DATA_LOSS, e.value.message


def test_an_unknown_reply_is_refused_before_any_call(fake):
    calls = len(fake.servicer.region_replies)
    with pytest.raises(ValueError, match="reply must be 'headers' or 'summary'"):
        fake.dequantize_layers_into("summary", ["a"], reply="counts")
    assert len(fake.servicer.region_replies) == calls
