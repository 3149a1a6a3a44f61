# dequantd_warnings(target): warnings as errors for the target's own sources.
# -Wpedantic stays off CUDA sources (nvcc's generated code trips it).
function(dequantd_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror -Wpedantic>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Werror --Werror=all-warnings>)
endfunction()
