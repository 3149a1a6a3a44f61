# dequantd_warnings(target): warnings as errors for the target's own sources.
# -Wpedantic stays off CUDA sources (nvcc's generated code trips it). GCC 12's late, inlining-based
# diagnostics (-Wrestrict, -Warray-bounds, -Wstringop-overflow/-overread) report false positives
# inside libstdc++'s string and vector at -O3 (GCC bugs 105329, 105651, 106199): they stay
# warnings, not errors; so does -Wmaybe-uninitialized on a std::string member of a defaulted
# options struct inlined into a test's SetUpTestSuite (GCC bug 107919).
function(dequantd_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror -Wpedantic
      -Wno-error=restrict -Wno-error=array-bounds -Wno-error=stringop-overflow
      -Wno-error=stringop-overread -Wno-error=maybe-uninitialized>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Werror,-Wno-error=restrict,-Wno-error=array-bounds,-Wno-error=stringop-overflow,-Wno-error=stringop-overread,-Wno-error=maybe-uninitialized
      --Werror=all-warnings>)
endfunction()
