"""dequantd: a Python client for the dequantd service (quantized weights of AWQ, GPTQ,
compressed-tensors, FP8 block and MXFP4 checkpoints dequantized to fp16/bf16/fp32 over gRPC) and
whole-model conversion to a plain Hugging Face checkpoint.

    import dequantd
    with dequantd.Client("127.0.0.1:50051") as c:
        w = c.dequantize("model.layers.0.self_attn.q_proj", dtype="bf16")  # (K, N)
    dequantd.convert("127.0.0.1:50051", "out/", dtype="bf16")

    import dequantd.torch  # torch + transformers: a ready model filled in place
    model = dequantd.torch.load_model("127.0.0.1:50051", device="cuda:0")

See README.md.
"""

from .client import (Client, LayerInfo, ModelTensors, RegionHeader, RegionInfo, RegionSummary,
                     ServerInfo, SharedMemoryStatus, TensorInfo, supports_byte_ranges)
from .convert import ConvertResult, convert, parse_size
from .credentials import resolve_token, security_options
from .errors import DequantdError

__version__ = "0.1.0"
__all__ = ["Client", "ConvertResult", "DequantdError", "LayerInfo", "ModelTensors",
           "RegionHeader", "RegionInfo", "RegionSummary", "ServerInfo", "SharedMemoryStatus",
           "TensorInfo", "convert", "parse_size", "resolve_token", "security_options", "supports_byte_ranges"]
