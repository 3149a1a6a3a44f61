# dequantd_warnings(target): warnings as errors for the target's own sources.
# -Wpedantic stays off CUDA sources (nvcc's generated code trips it). -Wno-restrict: GCC 12 at -O3
# reports false positives inside std::string's operator+ (GCC bug 105329).
function(dequantd_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror -Wpedantic -Wno-restrict>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Werror --Werror=all-warnings>)
endfunction()
