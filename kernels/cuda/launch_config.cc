// The generic CUDA entry points of dequant_cuda.h: variant names, and the dispatch of every
// launch-configuration query and launch to the format's kernels (its registry row). Host code.
#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "kernels/cuda/dequant_cuda.h"
#include "kernels/cuda/format_kernels.h"
#include "kernels/format_registry.h"

namespace dequantd::cuda {
namespace {

constexpr std::array<std::string_view, 4> kVariantNames = {"v1_per_element", "v2_per_word",
                                                           "v3_per_word_block", "v4_vec16"};

absl::string_view View(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// The format's kernels, or nullptr when it has none or none of variant `v`.
const FormatKernels* KernelsFor(Format format, KernelVariant v) {
  const FormatKernels* k = FormatRowOf(format).cuda;
  if (k == nullptr) return nullptr;
  for (KernelVariant offered : k->variants)
    if (offered == v) return k;
  return nullptr;
}

}  // namespace

std::string_view VariantName(KernelVariant v) {
  const int i = static_cast<int>(v) - 1;
  return i >= 0 && i < static_cast<int>(kVariantNames.size()) ? kVariantNames[i] : "unknown";
}

bool ParseVariant(std::string_view name, KernelVariant* out) {
  for (int i = 0; i < static_cast<int>(kVariantNames.size()); ++i) {
    const std::string short_name = absl::StrCat("v", i + 1);
    if (name == kVariantNames[i] || name == short_name) {
      *out = static_cast<KernelVariant>(i + 1);
      return true;
    }
  }
  return false;
}

std::vector<KernelVariant> AllVariants() {
  return {KernelVariant::kV1PerElement, KernelVariant::kV2PerWord, KernelVariant::kV3PerWordBlock,
          KernelVariant::kV4Vec16};
}

std::vector<KernelVariant> VariantsOf(Format format) {
  const FormatKernels* k = FormatRowOf(format).cuda;
  if (k == nullptr) return {};
  return std::vector<KernelVariant>(k->variants.begin(), k->variants.end());
}

LaunchConfig DefaultConfig(KernelVariant v, const QuantShape& shape, DType out_dtype) {
  const FormatKernels* k = KernelsFor(shape.format, v);
  return k == nullptr ? LaunchConfig{} : k->default_config(v, shape, out_dtype);
}

std::vector<LaunchConfig> CandidateConfigs(KernelVariant v, const QuantShape& shape,
                                           DType out_dtype) {
  const FormatKernels* k = KernelsFor(shape.format, v);
  if (k == nullptr) return {LaunchConfig{}};
  return k->candidate_configs(v, shape, out_dtype);
}

bool IsTunable(KernelVariant v, const QuantShape& shape, DType out_dtype) {
  const FormatKernels* k = KernelsFor(shape.format, v);
  return k != nullptr && k->is_tunable(v, shape, out_dtype);
}

absl::Status CanImplement(KernelVariant v, const LaunchConfig& config, const QuantShape& shape,
                          DType out_dtype) {
  if (absl::Status st = ValidateShape(shape, out_dtype); !st.ok()) return st;
  const FormatKernels* k = KernelsFor(shape.format, v);
  if (VariantName(v) == "unknown") {
    return absl::InvalidArgumentError(absl::StrCat("unknown kernel variant ", static_cast<int>(v)));
  }
  if (k == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("kernel variant ", View(VariantName(v)),
                                                   " is not implemented for format ",
                                                   View(FormatName(shape.format))));
  }
  return k->can_implement(v, config, shape, out_dtype);
}

absl::Status LaunchDequantize(KernelVariant v, const LaunchConfig& config, const QuantView& in,
                              DType out_dtype, void* out, cudaStream_t stream) {
  if (absl::Status st = CanImplement(v, config, in.shape, out_dtype); !st.ok()) return st;
  return KernelsFor(in.shape.format, v)->launch(v, config, in, out_dtype, out, stream);
}

absl::Status ConfigAmong(absl::Span<const LaunchConfig> configs, const LaunchConfig& config,
                         std::string_view what) {
  for (const LaunchConfig& c : configs) {
    if (c == config) return absl::OkStatus();
  }
  std::vector<std::string> names;
  for (const LaunchConfig& c : configs) names.push_back(c.ToString());
  return absl::InvalidArgumentError(absl::StrCat(
      View(what), ", one of ", absl::StrJoin(names, " | "), ": got ", config.ToString()));
}

}  // namespace dequantd::cuda
