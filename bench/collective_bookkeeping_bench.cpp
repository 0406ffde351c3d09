// What the watchdog machinery adds to one training step on the CPU path, measured directly: the
// step's label, one bucket's label, flight-recorder enqueue/started/completed, the progress
// board's started/completed and the shared-memory all-reduce's board check (read + compare), as
// the 2-rank MLP step issues them (one gradient bucket). Run under mpirun -np 2 (the board is a
// node-shared window); prints nanoseconds per step, best of 5 rounds.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include <fmt/format.h>

#include "comm/collective_watchdog.h"
#include "comm/flight_recorder.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  {
    auto board = dtrain::ProgressBoard::create(MPI_COMM_WORLD);
    dtrain::FlightRecorder recorder(2000);
    const int kind = dtrain::ProgressBoard::kind_code("allreduce");
    constexpr int kSteps = 200000;
    double best = 1e9;
    size_t sink = 0;
    for (int round = 0; round < 5; ++round) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int step = 0; step < kSteps; ++step) {
        dtrain::set_collective_context(fmt::format("epoch {} step {}", 1, step + 1));
        int64_t seq = 0;
        {
          dtrain::ScopedCollectiveDetail detail(fmt::format("bucket {}", 0));
          seq = recorder.enqueue("allreduce", dtrain::DType::kF32, 203530);
        }
        recorder.started(seq);
        if (board) {
          board->started(seq, kind, 203530, dtrain::DType::kF32);
          sink += dtrain::different_collective_text(board->read(), board->local_rank()).size();
          board->completed(seq);
        }
        recorder.finished(seq, true);
      }
      best = std::min(best, std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / kSteps);
    }
    if (rank == 0)
      std::printf("watchdog bookkeeping: %.0f ns per step (one bucket; best of 5 x %d)%s\n", best, kSteps,
                  sink ? " [unexpected mismatch]" : "");
    MPI_Barrier(MPI_COMM_WORLD);
    if (board) board->release();
  }
  MPI_Finalize();
  return 0;
}
