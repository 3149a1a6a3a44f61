// The per-method access table (see method_roles.h).
#include "server/auth/method_roles.h"

#include "absl/strings/match.h"

namespace dequantd::auth {
namespace {

struct MethodAccess {
  absl::string_view path;
  Access access;
};

// reader: reads the model and computes on it. admin: also holds the device for long (Benchmark)
// or makes the server write into client memory (the shared-memory region RPCs of issue 9). A
// reader's Dequantize may name a region an admin registered: registering is what needs trust.
constexpr MethodAccess kMethods[] = {
    {"/dequant.v1.DequantService/ListTensors", Access::kReader},
    {"/dequant.v1.DequantService/GetServerInfo", Access::kReader},
    {"/dequant.v1.DequantService/Dequantize", Access::kReader},
    {"/dequant.v1.DequantService/DequantizeLayers", Access::kReader},
    {"/dequant.v1.DequantService/ReadTensor", Access::kReader},
    {"/dequant.v1.DequantService/Benchmark", Access::kAdmin},
    {"/dequant.v1.DequantService/RegisterSystemSharedMemory", Access::kAdmin},
    {"/dequant.v1.DequantService/UnregisterSystemSharedMemory", Access::kAdmin},
    {"/dequant.v1.DequantService/RegisterCudaSharedMemory", Access::kAdmin},
    {"/dequant.v1.DequantService/UnregisterCudaSharedMemory", Access::kAdmin},
    {"/dequant.v1.DequantService/SharedMemoryStatus", Access::kAdmin},
    // Reflection describes the API (the schema is public in proto/); it needs a reader token so
    // that an unauthenticated peer cannot enumerate the service (docs/security.md).
    {"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", Access::kReader},
    {"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", Access::kReader},
    {"/grpc.health.v1.Health/Check", Access::kOpen},
    {"/grpc.health.v1.Health/Watch", Access::kOpen},
};

}  // namespace

std::optional<Access> RequiredAccess(absl::string_view method_path) {
  for (const MethodAccess& m : kMethods) {
    if (m.path == method_path) return m.access;
  }
  return std::nullopt;
}

bool Allows(Role role, Access access) {
  switch (access) {
    case Access::kOpen:
    case Access::kReader:
      return true;
    case Access::kAdmin:
      return role == Role::kAdmin;
  }
  return false;
}

bool IsHealthMethod(absl::string_view method_path) {
  return absl::StartsWith(method_path, "/grpc.health.v1.Health/");
}

}  // namespace dequantd::auth
