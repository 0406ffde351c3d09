// NpyDataset: image (or feature) classification data from NumPy files, memory-mapped:
// DIR/{train,test}_{x,y}.npy, or DIR/{train,test}.npz holding arrays x and y. x is [N, C, H, W],
// [N, H, W] (one channel) or [N, D] (features, for the MLP); uint8 (scaled by 1/255, as IDX
// pixels) or float32 (as it is); then (v - mean) / std when a normalisation is given. y is [N]
// integer labels of any width (int8 to uint64), each in [0, classes).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/mnist.h"
#include "data/npy.h"

namespace dtrain {

class NpyDataset : public Dataset {
 public:
  // `x` as described above, `labels` already checked (one per sample of x, at least `size`);
  // the first `size` samples. Throws Error when x's dtype or shape is not one of the above.
  NpyDataset(NpyArray x, std::vector<int32_t> labels, int64_t size, Normalize norm, int num_classes);

  int64_t size() const override { return size_; }
  Shape sample_shape() const override { return sample_shape_; }
  int num_classes() const override { return num_classes_; }
  int32_t get(int64_t index, float* out) const override;
  void prefetch(int64_t index) const override;

 private:
  NpyArray x_;
  std::vector<int32_t> labels_;
  int64_t size_ = 0;
  Shape sample_shape_;
  int64_t sample_numel_ = 0;
  size_t sample_bytes_ = 0;
  Normalize norm_;
  int num_classes_ = 0;
};

// The sample shape of an x array ([N, C, H, W] -> {C, H, W}, [N, H, W] -> {1, H, W}, [N, D] ->
// {D}) after checking its dtype (uint8 or float32); throws Error (kData) naming the array.
Shape npy_sample_shape(const NpyArray& x);

// The labels of y ([N] integers), each checked >= 0 and within int32; throws Error (kData)
// naming the array and the first bad sample.
std::vector<int32_t> npy_labels(const NpyArray& y);

struct DatasetSplits {
  std::unique_ptr<Dataset> train;
  std::unique_ptr<Dataset> test;
};

// Opens both splits of `dir` (each DIR/<split>.npz or DIR/<split>_{x,y}.npy, not both) and checks
// them as load_mnist_splits does: x and y of one length, the test samples of the training
// samples' shape, every test label one of the training labels' classes. Limits and num_classes as
// there. Throws Error (kData), one line naming the file and the field.
DatasetSplits load_npy_splits(const std::string& dir, Normalize norm = {}, int64_t train_limit = 0,
                              int64_t test_limit = 0, int num_classes = 0);

// The test split of `dir` alone (for `dtrain eval`): its classes are its largest label + 1.
std::unique_ptr<Dataset> load_npy_test_split(const std::string& dir, Normalize norm = {}, int64_t limit = 0);

// True when `dir` holds NumPy training data (train.npz or train_x.npy): data format detection.
bool has_npy_data(const std::string& dir);
// True when `dir` holds a NumPy test split (test.npz or test_x.npy): what `dtrain eval` reads.
bool has_npy_test_data(const std::string& dir);

}  // namespace dtrain
