# cmake -P: warnings are errors only in CI, for the C++ compiler and for nvcc alike
# (cmake/warnings.cmake). Runs without a CUDA toolkit.
include(${CMAKE_CURRENT_LIST_DIR}/../../cmake/warnings.cmake)

function(expect what actual expected)
  if(NOT "${actual}" STREQUAL "${expected}")
    message(FATAL_ERROR "${what}: got '${actual}', expected '${expected}'")
  endif()
endfunction()

unset(ENV{CI})
dtrain_warning_flags(cxx cuda)
expect("C++ flags outside CI" "${cxx}" "-Wall;-Wextra")
expect("nvcc flags outside CI" "${cuda}" "")

set(ENV{CI} 1)
dtrain_warning_flags(cxx cuda)
expect("C++ flags in CI" "${cxx}" "-Wall;-Wextra;-Werror")
expect("nvcc flags in CI" "${cuda}" "-Werror=all-warnings")
message(STATUS "warnings are errors only in CI (C++ and nvcc)")
