// MnistDataset: loading and checking the IDX pair of one split, and the table lookup get().
#include "data/mnist.h"

#include <cmath>
#include <filesystem>

#include <fmt/format.h>

#include "core/error.h"
#include "data/idx_reader.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;

// The .gz file when present, else the raw one; throws naming both when neither exists.
std::string find_file(const std::string& dir, const std::string& stem) {
  fs::path gz = fs::path(dir) / (stem + ".gz");
  fs::path raw = fs::path(dir) / stem;
  std::error_code ec;
  if (fs::exists(gz, ec)) return gz.string();
  if (fs::exists(raw, ec)) return raw.string();
  throw Error(fmt::format("{}: missing {}.gz (or uncompressed {})", dir, stem, stem));
}

}  // namespace

std::string MnistDataset::file_stem(Split split, bool images) {
  const char* prefix = split == Split::kTrain ? "train" : "t10k";
  return fmt::format("{}-{}-ubyte", prefix, images ? "images-idx3" : "labels-idx1");
}

std::unique_ptr<MnistDataset> MnistDataset::load(const std::string& dir, Split split, Normalize norm,
                                                 int64_t limit) {
  if (limit < 0) throw Error(fmt::format("MNIST sample limit must be >= 0, got {}", limit));
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw Error(fmt::format(
        "{}: dataset directory not found (install Fashion-MNIST with `apt-get install dataset-fashion-mnist`, "
        "which puts it in /usr/share/datasets/fashion-mnist)",
        dir));
  std::string image_path = find_file(dir, file_stem(split, true));
  std::string label_path = find_file(dir, file_stem(split, false));

  IdxArray images = read_idx(image_path);
  IdxArray labels = read_idx(label_path);
  if (images.dims.size() != 3)
    throw Error(fmt::format("{}: expected a 3-d image array [count, rows, cols], got {} dimensions", image_path,
                            images.dims.size()));
  if (labels.dims.size() != 1)
    throw Error(fmt::format("{}: expected a 1-d label array, got {} dimensions", label_path, labels.dims.size()));
  if (images.dims[0] != labels.dims[0])
    throw Error(fmt::format("{}: {} images, but {} has {} labels", image_path, images.dims[0], label_path,
                            labels.dims[0]));
  for (size_t i = 0; i < labels.data.size(); ++i) {
    if (labels.data[i] >= kNumClasses)
      throw Error(fmt::format("{}: label {} of sample {} is out of range [0, {})", label_path, labels.data[i], i,
                              kNumClasses));
  }

  const int64_t rows = images.dims[1], cols = images.dims[2];
  if (limit > 0 && limit < images.dims[0]) {
    images.data.resize(static_cast<size_t>(limit * rows * cols));
    images.data.shrink_to_fit();
    labels.data.resize(static_cast<size_t>(limit));
  }
  return std::make_unique<MnistDataset>(std::move(images.data), std::move(labels.data), rows, cols, norm);
}

MnistDataset::MnistDataset(std::vector<uint8_t> images, std::vector<uint8_t> labels, int64_t rows, int64_t cols,
                           Normalize norm)
    : images_(std::move(images)), labels_(std::move(labels)), rows_(rows), cols_(cols), norm_(norm) {
  if (rows <= 0 || cols <= 0) throw Error(fmt::format("MNIST images must be non-empty, got {}x{}", rows, cols));
  if (images_.size() != labels_.size() * static_cast<size_t>(rows * cols))
    throw Error(fmt::format("MNIST data: {} image bytes for {} labels of {}x{} images", images_.size(),
                            labels_.size(), rows, cols));
  for (size_t i = 0; i < labels_.size(); ++i) {
    if (labels_[i] >= kNumClasses)
      throw Error(fmt::format("MNIST data: label {} of sample {} is out of range [0, {})", labels_[i], i,
                              kNumClasses));
  }
  if (!std::isfinite(norm.mean) || !std::isfinite(norm.std) || norm.std == 0.0f)
    throw Error(fmt::format("MNIST normalisation needs a finite mean and non-zero std, got mean {} std {}", norm.mean,
                            norm.std));
}

const uint8_t* MnistDataset::pixels(int64_t index) const {
  DTRAIN_CHECK(index >= 0 && index < size(), "sample {} of {}", index, size());
  return images_.data() + index * rows_ * cols_;
}

int32_t MnistDataset::label(int64_t index) const {
  DTRAIN_CHECK(index >= 0 && index < size(), "sample {} of {}", index, size());
  return labels_[static_cast<size_t>(index)];
}

int32_t MnistDataset::get(int64_t index, float* out) const {
  const uint8_t* src = pixels(index);
  const int64_t n = rows_ * cols_;
  // Computed per pixel rather than looked up in a 256-entry table: the same floats, but the
  // loop vectorises (a lookup is a gather), and it runs beside training on shared cores.
  const float mean = norm_.mean, std = norm_.std;
  for (int64_t i = 0; i < n; ++i) out[i] = (static_cast<float>(src[i]) / 255.0f - mean) / std;
  return labels_[static_cast<size_t>(index)];
}

}  // namespace dtrain
