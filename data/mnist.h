// MnistDataset: the MNIST family (MNIST, Fashion-MNIST) from its four IDX files, kept as
// uint8 in memory and turned into normalised floats by a vectorised loop on each get().
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

class MnistDataset : public Dataset {
 public:
  static constexpr int kNumClasses = 10;

  // Loads {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] from `dir` (the .gz file wins
  // when both exist). limit > 0 keeps only the first `limit` samples (all when fewer exist).
  // Throws dtrain::Error naming the directory or file and the problem.
  static std::unique_ptr<MnistDataset> load(const std::string& dir, Split split, Normalize norm = {},
                                            int64_t limit = 0);

  // From memory: `images` holds labels.size() images of rows x cols bytes, row-major;
  // every label must be < kNumClasses.
  MnistDataset(std::vector<uint8_t> images, std::vector<uint8_t> labels, int64_t rows, int64_t cols,
               Normalize norm = {});

  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }
  Shape sample_shape() const override { return {1, rows_, cols_}; }
  int num_classes() const override { return kNumClasses; }
  int32_t get(int64_t index, float* out) const override;
  void prefetch(int64_t index) const override;

  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  const Normalize& normalize() const { return norm_; }
  // The raw bytes of sample `index` (rows * cols of them) and its label.
  const uint8_t* pixels(int64_t index) const;
  int32_t label(int64_t index) const;

  // "train-images-idx3-ubyte" and friends, without the .gz suffix.
  static std::string file_stem(Split split, bool images);

 private:
  std::vector<uint8_t> images_;
  std::vector<uint8_t> labels_;
  int64_t rows_ = 0;
  int64_t cols_ = 0;
  Normalize norm_;
};

}  // namespace dtrain
