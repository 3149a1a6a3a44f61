# The autotuner's CUDA measuring side (kernels/cuda/autotune_cuda.h), added to dequantd_kernels
# when DEQUANTD_HAVE_CUDA. Included from kernels/CMakeLists.txt.
target_sources(dequantd_kernels PRIVATE ${CMAKE_CURRENT_LIST_DIR}/autotune_cuda.cu)
