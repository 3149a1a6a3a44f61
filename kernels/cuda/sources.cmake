# CUDA sources of dequantd_kernels; include()d from kernels/CMakeLists.txt when nvcc exists.
target_sources(dequantd_kernels PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/launch_config.cc  # generic entry points: dispatch to the format's kernels
  ${CMAKE_CURRENT_LIST_DIR}/dequant_cuda.cu ${CMAKE_CURRENT_LIST_DIR}/awq_launch_config.cc  # AWQ
  ${CMAKE_CURRENT_LIST_DIR}/gptq_cuda.cu  # GPTQ: decoder, kernels, launcher, FormatKernels
  ${CMAKE_CURRENT_LIST_DIR}/compressed_tensors_cuda.cu  # compressed-tensors: the same parts
  ${CMAKE_CURRENT_LIST_DIR}/fp8_block_cuda.cu  # FP8 block-scaled: the same four
  ${CMAKE_CURRENT_LIST_DIR}/compressed_tensors_fp8_cuda.cu  # compressed-tensors FP8: the same
  ${CMAKE_CURRENT_LIST_DIR}/mxfp4_cuda.cu  # MXFP4 (gpt-oss): the same
  ${CMAKE_CURRENT_LIST_DIR}/grouped_dequant.cu)
# awq_format.h's __host__ __device__ helpers use constexpr std::array in static_asserts.
target_compile_options(dequantd_kernels PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr>)
