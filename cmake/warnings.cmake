# Warning flags for every target. Warnings are errors only in CI (CI set in the environment when
# CMake configures): another compiler or CUDA version on a user's machine adds warnings dtrain's
# CI never saw, and those must not break the user's build. Included by the top CMakeLists.txt
# and by tests/cmake/warnings_test.cmake.
function(dtrain_warning_flags cxx_var cuda_var)
  set(_cxx -Wall -Wextra)
  set(_cuda "")
  if(DEFINED ENV{CI})
    list(APPEND _cxx -Werror)
    # nvcc's own warnings (its front end: e.g. a declared-but-unused variable in device code).
    set(_cuda -Werror=all-warnings)
  endif()
  set(${cxx_var} ${_cxx} PARENT_SCOPE)
  set(${cuda_var} ${_cuda} PARENT_SCOPE)
endfunction()
