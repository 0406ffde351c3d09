# `cmake --install`: the dtrain libraries, their public headers, the two programs, and a CMake
# package so that a project of its own can `find_package(dtrain)` and link dtrain::ddp and
# friends (examples/custom_model/ is one). Headers go to include/dtrain/<layer>/; both include/
# and include/dtrain/ are on the targets' include path, so users write <dtrain/ddp/...> and
# dtrain's own headers keep their "core/..." includes.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(DTRAIN_LIBRARIES dtrain_core dtrain_comm dtrain_model dtrain_data dtrain_checkpoint dtrain_ddp dtrain_pipeline
  dtrain_train)
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

# The public API: what a program of its own includes, and every header those include. The rest
# (a backend's insides such as comm/work_queue.h, the CPU's GEMM and kernels, the files of an
# atomic write) is not installed, so it can change without breaking a user's build (abseil's
# public/internal split). A header added here must include only headers listed here: the
# install test (tests/install/custom_model_test.sh) checks that every installed header's
# includes are installed and that the internal ones are absent.
set(DTRAIN_PUBLIC_HEADERS
  core/device.h core/device_select.h core/error.h core/exit_status.h core/kernels.h core/launch.h core/memory.h core/ops.h
  core/stream.h core/tensor.h core/thread_policy.h
  comm/allreduce_algorithm.h comm/collective_log.h comm/communicator.h comm/exchange.h comm/flight_recorder.h
  comm/runtime.h comm/self_communicator.h
  model/activation.h model/amp.h model/conv.h model/fingerprint.h model/flat_store.h model/grad_scaler.h model/init.h
  model/kernels.h model/linear.h
  model/loss.h model/lr_schedule.h model/models.h model/module.h model/optimizer.h model/sequential.h
  data/data_loader.h data/dataset.h data/distributed_sampler.h data/idx_reader.h data/mnist.h
  ddp/bucket_cap_tuner.h ddp/bucket_plan.h ddp/comm_hook.h ddp/distributed_data_parallel.h ddp/grad_bucket.h
  ddp/join.h ddp/loss_scaling.h ddp/reducer.h ddp/zero_plan.h
  pipeline/grid.h pipeline/partition.h pipeline/pipeline_stage.h pipeline/schedule.h
  checkpoint/checkpoint_layout.h checkpoint/checkpoint_reader.h checkpoint/checkpoint_writer.h checkpoint/finite.h
  checkpoint/host_buffer_pool.h checkpoint/optimizer_shards.h checkpoint/safetensors.h checkpoint/training_state.h
  train/checkpointer.h train/optimizer_transfer.h train/root_broadcast.h)
foreach(header IN LISTS DTRAIN_PUBLIC_HEADERS)
  cmake_path(GET header PARENT_PATH layer)
  install(FILES ${header} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/dtrain/${layer})
endforeach()
install(FILES ${PROJECT_BINARY_DIR}/generated/core/version.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/dtrain/core)

install(EXPORT dtrainTargets NAMESPACE dtrain:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dtrain)
configure_package_config_file(cmake/dtrainConfig.cmake.in ${PROJECT_BINARY_DIR}/dtrainConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dtrain)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/dtrainConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/dtrainConfig.cmake ${PROJECT_BINARY_DIR}/dtrainConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dtrain)
