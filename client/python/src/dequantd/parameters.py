"""Which transformers parameter a dequantd layer fills, its shape and the orientation that writes
it without a transpose. Shared by `python -m dequantd convert` and dequantd.torch.load_model, so
a converted checkpoint and a loaded model name and lay out every layer the same way.

- A linear layer ("model.layers.0.mlp.down_proj") fills nn.Linear's "<name>.weight", (N, K) =
  (out_features, in_features): orientation "NK".
- A layer of stacked MoE experts (mxfp4, gpt-oss) fills transformers' GptOssExperts parameter
  named as the layer itself ("model.layers.0.mlp.experts.gate_up_proj", no ".weight"), [E, K, N]
  = [experts, in_features, out_features] (transformers' own dequantization transposes its
  [E, N, K] result to that): orientation "KN", the format's own, for any E (1 included).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Tuple

# Formats whose layers stack MoE experts (the server's FormatRow::stacked_experts).
STACKED_EXPERT_FORMATS = frozenset({"mxfp4"})


def stacks_experts(layer: Any) -> bool:
    """Whether `layer` (a LayerInfo) is a 3-D parameter of stacked experts."""
    return layer.format in STACKED_EXPERT_FORMATS or layer.experts > 1


@dataclasses.dataclass(frozen=True)
class LayerParameter:
    """The parameter a layer fills: its name in the model, its shape in elements and the
    orientation ("NK" or "KN") a call asks for to write that shape."""
    name: str
    shape: Tuple[int, ...]
    orientation: str


def layer_parameter(layer: Any) -> LayerParameter:
    """The parameter `layer` (a LayerInfo) fills (see the module's docstring)."""
    if stacks_experts(layer):
        return LayerParameter(layer.name, (layer.experts, layer.in_features, layer.out_features),
                              "KN")
    return LayerParameter(f"{layer.name}.weight", (layer.out_features, layer.in_features), "NK")
