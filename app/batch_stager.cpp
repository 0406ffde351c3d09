// BatchStager (see batch_stager.h): the CPU pass-through and the CUDA double buffering.
#include "app/batch_stager.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/gpu_backend.h"

namespace dtrain {

namespace {

constexpr size_t kLabelAlignment = 256;  // labels start on their own aligned line in the pinned buffer

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

void BatchStager::PinnedFree::operator()(std::byte* ptr) const {
  if (ptr) gpu_backend().free_pinned(ptr);  // only CUDA stagers allocate, so the backend is open
}

BatchStager::BatchStager(Device device) : device_(device) {
  if (device_.is_cuda()) copy_stream_ = make_stream(device_);
}

BatchStager::~BatchStager() {
  if (!copy_stream_) return;
  try {
    copy_stream_->synchronize();  // no copy may still write a buffer that is about to be freed
  } catch (const std::exception&) {
    // A failed copy already surfaced (or will) through the compute stream; destructors must not throw.
  }
}

void BatchStager::stage(const Batch& host) {
  DTRAIN_CHECK(!pending_, "BatchStager: stage() called again before the staged batch was taken");
  DTRAIN_CHECK(host.images.defined() && host.labels.defined() &&
                   (host.images.dtype() == DType::kF32 || host.images.dtype() == DType::kI32) &&
                   host.labels.dtype() == DType::kI32 && host.images.device().is_cpu() &&
                   host.labels.device().is_cpu(),
               "BatchStager: a batch is F32 images (or I32 tokens) and I32 labels on the host");
  if (device_.is_cpu()) {
    cpu_images_ = host.images;
    cpu_labels_ = host.labels;
  } else {
    stage_cuda(host);
  }
  pending_ = true;
}

void BatchStager::take(Tensor& images, Tensor& labels) {
  DTRAIN_CHECK(pending_, "BatchStager: take() without a staged batch");
  pending_ = false;
  if (device_.is_cpu()) {
    images = std::move(cpu_images_);
    labels = std::move(cpu_labels_);
    cpu_images_ = {};
    cpu_labels_ = {};
    return;
  }
  Stream& compute = compute_stream(device_);
  // Everything that reads the previously taken batch (its step) is queued by now: once this
  // event completes, its device buffer may be refilled.
  if (taken_ >= 0) slots_[static_cast<size_t>(taken_)].consumed = compute.record();
  Slot& s = slots_[static_cast<size_t>(staged_)];
  compute.wait(*s.copied);
  images = s.image_view;
  labels = s.label_view;
  taken_ = staged_;
  staged_ = -1;
}

void BatchStager::stage_cuda(const Batch& host) {
  const int index = next_;
  next_ ^= 1;
  Slot& s = slots_[static_cast<size_t>(index)];
  const size_t image_bytes = host.images.nbytes(), label_bytes = host.labels.nbytes();
  const size_t label_offset = round_up(image_bytes, kLabelAlignment);

  // The pinned buffer is free once the copy out of it (two batches ago) has finished.
  if (s.copied) s.copied->synchronize();
  if (s.pinned_bytes < label_offset + label_bytes) {
    s.pinned.reset();
    s.pinned_bytes = 0;
    s.pinned.reset(static_cast<std::byte*>(gpu_backend().alloc_pinned(label_offset + label_bytes)));
    s.pinned_bytes = label_offset + label_bytes;
  }
  if (s.images.numel() < host.images.numel() || s.labels.numel() < host.labels.numel() ||
      (s.images.defined() && s.images.dtype() != host.images.dtype())) {
    // The caching allocator orders reuse for the compute stream only: a block it hands out may
    // still be read by queued compute work, and this buffer is written on the copy stream. So
    // the device goes idle first; this happens on the first batch (and when batches grow).
    compute_stream(device_).synchronize();
    s.images = Tensor::empty({std::max(s.images.numel(), host.images.numel())}, device_, host.images.dtype());
    s.labels = Tensor::empty({std::max(s.labels.numel(), host.labels.numel())}, device_, DType::kI32);
  }

  std::memcpy(s.pinned.get(), host.images.raw(), image_bytes);
  std::memcpy(s.pinned.get() + label_offset, host.labels.raw(), label_bytes);
  // The device buffer is free once the step that read it (two batches ago) has finished.
  if (s.consumed) copy_stream_->wait(*s.consumed);
  gpu_backend().copy_async(s.images.raw(), true, s.pinned.get(), false, image_bytes, *copy_stream_);
  gpu_backend().copy_async(s.labels.raw(), true, s.pinned.get() + label_offset, false, label_bytes, *copy_stream_);
  s.copied = copy_stream_->record();
  s.image_view = s.images.slice(0, host.images.shape());
  s.label_view = s.labels.slice(0, host.labels.shape());
  staged_ = index;
}

StagedBatches::StagedBatches(DataLoader& loader, BatchStager& stager)
    : loader_(loader), stager_(stager), prefetch_(stager.copies()) {
  more_ = fetch_and_stage();
}

bool StagedBatches::fetch_and_stage() {
  if (!loader_.next(batch_)) return false;
  stager_.stage(batch_);
  return true;
}

bool StagedBatches::next() {
  if (started_ && !prefetch_) more_ = fetch_and_stage();  // the previous step is done with its buffer
  started_ = true;
  if (!more_) return false;
  stager_.take(images_, labels_);
  if (prefetch_) more_ = fetch_and_stage();  // batch b+1's copy overlaps step b
  return true;
}

}  // namespace dtrain
