# Warnings and sanitizers applied to every target of ours through strata_options.
function(strata_apply_warnings target)
  target_compile_options(${target} INTERFACE
    $<$<COMPILE_LANGUAGE:C,CXX>:-Wall -Wextra -Wno-missing-field-initializers>)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(${target} INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Wshadow=local>)
  endif()
  # Implicit narrowing (64-bit sizes to int, integers to float, double to float) is where an
  # offset or a count silently wraps on a large model or context: C++ sources say each
  # conversion they mean with a cast. Signedness alone is left out (Clang's -Wconversion
  # includes it, GCC's does not for C++): sizes and indices mix int and size_t throughout,
  # and those conversions do not lose magnitude at the sizes the range checks allow.
  target_compile_options(${target} INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-Wconversion -Wno-sign-conversion>)
  if(STRATA_WERROR)
    target_compile_options(${target} INTERFACE $<$<COMPILE_LANGUAGE:C,CXX>:-Werror>)
  endif()
  if(STRATA_SANITIZE)
    target_compile_options(${target} INTERFACE
      -fsanitize=${STRATA_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
    target_link_options(${target} INTERFACE -fsanitize=${STRATA_SANITIZE})
  endif()
endfunction()
