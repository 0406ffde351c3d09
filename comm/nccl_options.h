// The NcclOptions a Runtime gives the NCCL plugin (comm/runtime.cpp): the deadline, the compute
// stream, the flight recorder with its dump (on a failure and on SIGUSR1, through comm's request
// counter, which the plugin cannot link) and device timing. A function of its own so that CPU
// builds test what crosses the plugin's entry point (tests/unit/comm/gpu_plugins_test.cpp).
#pragma once

#include "comm/flight_recorder.h"
#include "comm/nccl/nccl_communicator.h"
#include "comm/runtime.h"

namespace dtrain {

// `log`: the recorder of NCCL's collectives, or null (nothing recorded, nothing dumped). The
// dump writes DIR/flight_recorder_rank<R>_nccl.json and returns its path, or "not written: why".
NcclOptions runtime_nccl_options(const RuntimeOptions& options, Stream* compute, FlightRecorder* log, int rank,
                                 int size);

}  // namespace dtrain
