# `cmake --install`: the dtrain libraries, their headers, the two programs, and a CMake package
# so that a project of its own can `find_package(dtrain)` and link dtrain::ddp and friends
# (examples/custom_model/ is one). Headers go to include/dtrain/<layer>/; both include/ and
# include/dtrain/ are on the targets' include path, so users write <dtrain/ddp/...> and dtrain's
# own headers keep their "core/..." includes.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(DTRAIN_LIBRARIES dtrain_core dtrain_comm dtrain_model dtrain_data dtrain_checkpoint dtrain_ddp)
foreach(lib IN LISTS DTRAIN_LIBRARIES)
  string(REPLACE "dtrain_" "" short ${lib})
  set_target_properties(${lib} PROPERTIES EXPORT_NAME ${short})
endforeach()
target_include_directories(dtrain_core PUBLIC
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/dtrain>)

# Installed programs and libraries find each other: bin/ -> ../lib, lib/ -> itself.
set_target_properties(${DTRAIN_LIBRARIES} dtrain dtrain-launch PROPERTIES
  INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR};$ORIGIN")

install(TARGETS ${DTRAIN_LIBRARIES} EXPORT dtrainTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} ${CMAKE_INSTALL_INCLUDEDIR}/dtrain)
install(TARGETS dtrain dtrain-launch RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(TARGET dtrain_cuda)
  # Plugins opened at run time from beside libdtrain_core (Note [GPU plugins without a cycle]);
  # nothing links them.
  set_target_properties(dtrain_cuda dtrain_nccl PROPERTIES INSTALL_RPATH "$ORIGIN")
  install(TARGETS dtrain_cuda dtrain_nccl LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()

install(DIRECTORY core comm model data ddp checkpoint
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/dtrain
  FILES_MATCHING PATTERN "*.h"
  PATTERN "cuda" EXCLUDE PATTERN "nccl" EXCLUDE)
install(FILES ${PROJECT_BINARY_DIR}/generated/core/version.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/dtrain/core)

install(EXPORT dtrainTargets NAMESPACE dtrain:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dtrain)
configure_package_config_file(cmake/dtrainConfig.cmake.in ${PROJECT_BINARY_DIR}/dtrainConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dtrain)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/dtrainConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/dtrainConfig.cmake ${PROJECT_BINARY_DIR}/dtrainConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dtrain)
