// MnistDataset: the MNIST family (MNIST, Fashion-MNIST, and IDX data a user brings) from its
// four IDX files, kept as uint8 in memory and turned into normalised floats by a vectorised
// loop on each get(). Images are [n, rows, cols] or, with channels, [n, channels, rows, cols];
// the classes are the labels the training data has (max label + 1, unless told), not a fixed 10.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace dtrain {

enum class Split { kTrain, kTest };

// Pixel x in [0, 255] becomes (x / 255 - mean) / std.
struct Normalize {
  float mean = 0.0f;
  float std = 1.0f;
};

// out[i] = (src[i] / 255 - mean) / std for i < n: the one rule for byte pixels of every format, so
// that the same bytes make the same floats whichever file held them.
void normalize_pixels(const uint8_t* src, float* out, int64_t n, float mean, float std);

class MnistDataset : public Dataset {
 public:
  // Loads {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] from `dir` (the .gz file wins
  // when both exist). limit > 0 keeps only the first `limit` samples (all when fewer exist);
  // the classes are counted over the whole label file, so a limit never changes them.
  // num_classes > 0: that many classes, every label below it; 0: max label + 1, and for the
  // training split a label far above the others is an error (Note [A label far outside the
  // others] in mnist.cpp). Throws dtrain::Error naming the directory or file and the problem.
  static std::unique_ptr<MnistDataset> load(const std::string& dir, Split split, Normalize norm = {},
                                            int64_t limit = 0, int num_classes = 0);

  // From memory: `images` holds labels.size() samples of shape_numel(sample_shape) bytes each,
  // sample_shape being {channels, rows, cols}. num_classes 0: max label + 1; otherwise every
  // label must be below it.
  MnistDataset(std::vector<uint8_t> images, std::vector<uint8_t> labels, Shape sample_shape, Normalize norm = {},
               int num_classes = 0);
  // One channel of rows x cols.
  MnistDataset(std::vector<uint8_t> images, std::vector<uint8_t> labels, int64_t rows, int64_t cols,
               Normalize norm = {});

  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }
  Shape sample_shape() const override { return sample_shape_; }
  int num_classes() const override { return num_classes_; }
  int32_t get(int64_t index, float* out) const override;
  void prefetch(int64_t index) const override;

  int64_t channels() const { return sample_shape_[0]; }
  int64_t rows() const { return sample_shape_[1]; }
  int64_t cols() const { return sample_shape_[2]; }
  const Normalize& normalize() const { return norm_; }
  // The raw bytes of sample `index` (channels * rows * cols of them) and its label.
  const uint8_t* pixels(int64_t index) const;
  int32_t label(int64_t index) const;

  // "train-images-idx3-ubyte" and friends, without the .gz suffix.
  static std::string file_stem(Split split, bool images);

 private:
  std::vector<uint8_t> images_;
  std::vector<uint8_t> labels_;
  Shape sample_shape_;
  int64_t sample_bytes_ = 0;
  int num_classes_ = 0;
  Normalize norm_;
};

struct MnistSplits {
  std::unique_ptr<MnistDataset> train;
  std::unique_ptr<MnistDataset> test;
};

// Loads both splits of `dir` in parallel (a thread each: decompressing the images is most of
// start-up) and checks that they agree: the test images have the train images' shape, and every
// test label is one of the train labels' classes (the test split takes the train split's
// num_classes). Limits and num_classes as in MnistDataset::load. Throws dtrain::Error, one line
// naming the files; when both splits fail, the train split's error.
MnistSplits load_mnist_splits(const std::string& dir, Normalize norm = {}, int64_t train_limit = 0,
                              int64_t test_limit = 0, int num_classes = 0);

}  // namespace dtrain
