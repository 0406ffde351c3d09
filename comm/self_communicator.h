// SelfCommunicator: the world of a process started alone (no mpirun, srun or other launcher):
// one rank, collectives that complete at once (a sum or an average over one rank is the value
// itself), and no MPI at all, so a single process skips Open MPI's singleton start-up (about
// 0.75 s here). Host memory only.
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace dtrain {

class SelfCommunicator final : public Communicator {
 public:
  SelfCommunicator();
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  std::string backend() const override { return "self"; }
  Stream& stream() override { return *stream_; }

  WorkHandle allreduce_async(void* buf, int64_t count, DType dtype, ReduceOp op) override;
  WorkHandle broadcast_async(void* buf, int64_t count, DType dtype, int root) override;
  WorkHandle allgather_async(const void* send, void* recv, int64_t count_per_rank, DType dtype) override;
  // The one block of `send` is the result: a copy (none in place).
  WorkHandle reduce_scatter_async(const void* send, void* recv, int64_t count_per_rank, DType dtype,
                                  ReduceOp op) override;
  WorkHandle barrier_async() override;
  // Sends to and receives from rank 0 itself: each receive copies the send of its tag in the same
  // batch (a send or receive without its partner there could never complete: an error).
  WorkHandle batch_p2p_async(std::vector<P2pOp> ops) override;
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override;

 private:
  std::unique_ptr<Stream> stream_;
};

}  // namespace dtrain
