// BatchStager: moves host batches to the training device one step ahead of their use. On CUDA,
// stage() copies the batch into one of two pinned host buffers and queues its host-to-device
// copy on a copy stream of its own, into one of two device buffers; take() makes the compute
// stream wait for that copy. The trainer stages batch b+1 right after taking batch b, so the
// copy runs while step b computes. On CPU nothing moves: take() returns the batch's tensors.
// StagedBatches walks an epoch with that order built in.
#pragma once

#include <array>
#include <cstddef>
#include <memory>

#include "core/stream.h"
#include "core/tensor.h"
#include "data/data_loader.h"

namespace dtrain {

class BatchStager {
 public:
  explicit BatchStager(Device device);
  ~BatchStager();  // waits for copies in flight (their buffers are freed)
  BatchStager(const BatchStager&) = delete;
  BatchStager& operator=(const BatchStager&) = delete;

  // Starts moving `host` (images F32, or I32 token ids, and I32 labels, contiguous on the host)
  // to the device.
  // At most one batch may be staged and not yet taken (checked). On CUDA the batch is copied
  // out before this returns, so the caller may recycle it at once; on CPU it is kept by
  // reference and must stay valid until the step that uses it is done (see copies()).
  void stage(const Batch& host);

  // The staged batch on the device; compute-stream work queued from now on runs after its
  // copy. The tensors must be used (their work queued) before the next take(): their device
  // buffer is refilled only after the compute work queued before that take() has finished.
  void take(Tensor& images, Tensor& labels);

  // True when stage() copies the batch (CUDA). False on CPU, where take() hands back the host
  // batch's own tensors, so a DataLoader must not recycle that batch before its step is done.
  bool copies() const { return device_.is_cuda(); }
  Device device() const { return device_; }

 private:
  struct PinnedFree {
    void operator()(std::byte* ptr) const;
  };
  struct Slot {
    std::unique_ptr<std::byte, PinnedFree> pinned;  // images, then labels at label_offset
    size_t pinned_bytes = 0;
    Tensor images, labels;              // device buffers, flat, with room for the largest batch
    Tensor image_view, label_view;      // the staged batch's shapes over them
    std::shared_ptr<Event> copied;      // on the copy stream: the copy out of `pinned` is done
    std::shared_ptr<Event> consumed;    // on the compute stream: the step that read it is done
  };

  void stage_cuda(const Batch& host);

  Device device_;
  std::unique_ptr<Stream> copy_stream_;  // CUDA only
  std::array<Slot, 2> slots_;
  int next_ = 0;         // slot the next stage() fills
  int staged_ = -1;      // slot staged and not yet taken
  int taken_ = -1;       // slot handed out by the last take()
  bool pending_ = false;  // a batch is staged and not yet taken
  Tensor cpu_images_, cpu_labels_;  // CPU: the staged batch itself
};

// The batches of a loader's epoch on the stager's device, in order. On CUDA the next batch is
// staged as soon as the current one is taken, so its copy overlaps the current step. On CPU the
// current batch is the loader's own buffer, which the loader recycles when asked for the next
// one, so the next batch is fetched only when next() is called after the step.
class StagedBatches {
 public:
  StagedBatches(DataLoader& loader, BatchStager& stager);
  // Moves to the next batch; false when the epoch is done.
  bool next();
  const Tensor& images() const { return images_; }
  const Tensor& labels() const { return labels_; }

 private:
  bool fetch_and_stage();

  DataLoader& loader_;
  BatchStager& stager_;
  const bool prefetch_;
  bool more_;
  bool started_ = false;
  Batch batch_;
  Tensor images_, labels_;
};

}  // namespace dtrain
