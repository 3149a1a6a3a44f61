// compressed-tensors float-quantized FP8's row functions: shapes from stored tensors, tensor specs
// and shape checks (see compressed_tensors_fp8.h; the layout is compressed_tensors_fp8_format.h).
#include "kernels/compressed_tensors_fp8.h"

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/compressed_tensors_fp8_format.h"
#include "kernels/dequant.h"
#include "kernels/format_checks.h"

namespace dequantd::compressed_tensors_fp8 {
namespace {

constexpr DType kScaleDTypes[] = {DType::kF32, DType::kBF16, DType::kF16};

std::string Dims(absl::Span<const int64_t> dims) {
  std::string out = "(";
  for (size_t i = 0; i < dims.size(); ++i) absl::StrAppend(&out, i == 0 ? "" : ", ", dims[i]);
  return out + ")";
}

// True when `dims` hold one element: every dim 1 (no product formed: fuzzed dims may overflow it).
bool OneElement(absl::Span<const int64_t> dims) {
  for (int64_t d : dims)
    if (d != 1) return false;
  return true;
}

// The strategy read off weight_scale's dims when no config says it (dequantctl): "" when the dims
// fit none that needs no declaration.
std::string StrategyFromScale(absl::Span<const int64_t> scale, int64_t N, int64_t K) {
  if (scale.size() <= 2 && OneElement(scale)) return "tensor";
  if (scale.size() == 2 && scale[0] == N && scale[1] == 1) return "channel";
  if (scale.size() == 2 && scale[0] == N && scale[1] > 0 && K % scale[1] == 0) return "group";
  return "";
}

}  // namespace

bool ShapeFromStored(absl::Span<const StoredTensor> tensors, const StoredTensorOptions& options,
                     QuantShape* shape, StoredTensorProblem* problem) {
  const StoredTensor& weight = tensors[kWeight];
  const StoredTensor& scale = tensors[kWeightScale];
  for (int r : {kWeight, kWeightScale})
    if (!tensors[r].present) return StoredProblem(problem, r, "presence", "is missing");
  if (!CheckStoredDims(weight, kWeight, 2, problem)) return false;
  if (weight.dtype != "F8_E4M3") {
    return StoredProblem(problem, kWeight, "dtype",
                         absl::StrCat("is ", AbslView(weight.dtype),
                                      ", want F8_E4M3 (float-quantized FP8 weights)"));
  }
  *shape = QuantShape{};
  shape->format = Format::kCompressedTensorsFp8;
  shape->orientation = Orientation::kNK;
  shape->bits = 8;
  if (!StoredScaleDType(scale, kWeightScale, kScaleDTypes, &shape->scale_dtype, problem)) {
    return false;
  }
  const int64_t N = weight.shape[0];
  const int64_t K = weight.shape[1];
  if (N <= 0 || K <= 0 || N > kMaxOutputElements || K > kMaxOutputElements) {
    return StoredProblem(problem, kWeight, "shape",
                         absl::StrCat("is ", Dims(weight.shape), ", want positive dims of at most ",
                                      kMaxOutputElements));
  }
  shape->N = N;
  shape->K = K;
  const QuantizationConfig* config = options.config;
  std::string strategy = config != nullptr ? config->strategy : "";
  const std::string declared = strategy.empty() ? "read off weight_scale" : "declared";
  if (strategy.empty()) strategy = StrategyFromScale(scale.shape, N, K);
  const std::string of_weight = absl::StrCat(" (strategy '", strategy, "' ", declared,
                                             ", weight (N, K) = (", N, ", ", K, "))");
  if (strategy == "tensor") {
    shape->scale_block_rows = N;
    shape->group_size = K;
    if (scale.shape.size() > 2 || !OneElement(scale.shape)) {
      return StoredProblem(problem, kWeightScale, "shape",
                           absl::StrCat("is ", Dims(scale.shape),
                                        ", want (1) (or () or (1, 1)): one scale", of_weight));
    }
    return true;
  }
  if (strategy.empty()) {
    return StoredProblem(
        problem, kWeightScale, "shape",
        absl::StrCat("is ", Dims(scale.shape), ", which is no tensor (1), channel (N, 1) = (", N,
                     ", 1) or group (N, K/G) grid for weight (N, K) = (", N, ", ", K,
                     "); a block grid needs the checkpoint's config (block_structure)"));
  }
  int64_t rows = 1;
  int64_t cols = K;
  if (strategy == "group") {
    cols = config != nullptr ? config->group_size : K / scale.shape[1];  // (N, g): inferred
    if (cols <= 0 || K % cols != 0) {
      return StoredProblem(problem, kWeightScale, "shape",
                           absl::StrCat("is ", Dims(scale.shape), ": group_size ", cols,
                                        " does not cut K = ", K, " into whole groups", of_weight));
    }
  } else if (strategy == "block") {
    rows = config != nullptr ? config->block_rows : 0;
    cols = config != nullptr ? config->group_size : 0;
    if (rows <= 0 || cols <= 0 || rows > kMaxOutputElements || cols > kMaxOutputElements) {
      // compressed_tensors::FromConfig refuses these first
      return StoredProblem(problem, kWeightScale, "shape",
                           "has no declared block_structure (strategy 'block')");
    }
  } else if (strategy != "channel") {  // FromConfig admits only these four
    return StoredProblem(
        problem, kWeightScale, "shape",
        absl::StrCat("cannot be checked: strategy '", strategy, "' is not served"));
  }
  shape->scale_block_rows = rows;
  shape->group_size = cols;
  const int64_t want_rows = GridDim(N, rows);
  const int64_t want_cols = GridDim(K, cols);
  if (scale.shape.size() != 2 || scale.shape[0] != want_rows || scale.shape[1] != want_cols) {
    const char* formula = strategy == "channel" ? "(N, 1)"
                          : strategy == "group" ? "(N, K/G)"
                                                : "(ceil(N/R), ceil(K/C))";
    const std::string block =
        strategy == "block"   ? absl::StrCat(", block_structure [R, C] = [", rows, ", ", cols, "]")
        : strategy == "group" ? absl::StrCat(", group_size ", cols)
                              : "";
    return StoredProblem(problem, kWeightScale, "shape",
                         absl::StrCat("is ", Dims(scale.shape), ", want ", formula, " = (",
                                      want_rows, ", ", want_cols, ")", block, of_weight));
  }
  return true;
}

TensorSpec TensorSpecOf(const QuantShape& shape, int role) {
  if (role == kWeight) return {kRoleNames[kWeight], DType::kF8E4M3, shape.N, shape.K};
  return {kRoleNames[kWeightScale], shape.scale_dtype, GridDim(shape.N, RowsPerScale(shape)),
          GridDim(shape.K, shape.group_size)};
}

absl::Status ValidateShape(const QuantShape& shape) {
  if (shape.format_flags != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "format_flags must be 0 for compressed_tensors_fp8, got ", shape.format_flags));
  }
  if (shape.N <= 0 || shape.N > kMaxOutputElements) {
    return absl::InvalidArgumentError(absl::StrCat("N must be positive, got ", shape.N));
  }
  if (shape.K > kMaxOutputElements) {
    return absl::InvalidArgumentError(
        absl::StrCat("K must be at most ", kMaxOutputElements, ", got ", shape.K));
  }
  if (shape.group_size <= 0 || shape.group_size > kMaxOutputElements) {
    return absl::InvalidArgumentError(
        absl::StrCat("group_size (columns per weight_scale block) must be in [1, ",
                     kMaxOutputElements, "], got ", shape.group_size));
  }
  if (shape.scale_block_rows < 0 || shape.scale_block_rows > kMaxOutputElements) {
    return absl::InvalidArgumentError(
        absl::StrCat("scale_block_rows (rows per weight_scale block) must be in [0, ",
                     kMaxOutputElements, "] (0 reads as 1), got ", shape.scale_block_rows));
  }
  return ValidateScaleDType(shape, kScaleDTypes, "weight_scale");
}

}  // namespace dequantd::compressed_tensors_fp8
