// MnistDataset: loading and checking the IDX pair of one split, and get(), which normalises.
#include "data/mnist.h"

#include <cmath>
#include <filesystem>

#include <fmt/format.h>

#include "core/error.h"
#include "data/idx_reader.h"

namespace dtrain {

namespace {

// The loader runs beside training on shared cores (every rank has one), so this loop is built
// for AVX-512, AVX2 and plain x86-64 and the best is picked at load time: IEEE division is exact
// at any vector width, so every clone gives the same floats. Computed per pixel rather than
// looked up in a 256-entry table, since a lookup is a gather and does not vectorise.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void normalize_pixels(const uint8_t* src, float* out, int64_t n, float mean, float std) {
  if (mean == 0.f && std == 1.f) {  // the default: x - 0 and x / 1 are exact, so skip them
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(src[i]) / 255.0f;
    return;
  }
  for (int64_t i = 0; i < n; ++i) out[i] = (static_cast<float>(src[i]) / 255.0f - mean) / std;
}

namespace fs = std::filesystem;

// Throws "<where>: label L of sample I is out of range [0, 10)" for the first bad label.
void check_labels(const std::vector<uint8_t>& labels, const std::string& where) {
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] >= MnistDataset::kNumClasses)
      throw Error(fmt::format("{}: label {} of sample {} is out of range [0, {})", where, labels[i], i,
                              MnistDataset::kNumClasses));
  }
}

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
  check_labels(labels.data, label_path);

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
  check_labels(labels_, "MNIST data");
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

void MnistDataset::prefetch(int64_t index) const {
  if (index < 0 || index >= size()) return;
  const char* p = reinterpret_cast<const char*>(images_.data() + index * rows_ * cols_);
  for (int64_t off = 0; off < rows_ * cols_; off += 64) __builtin_prefetch(p + off);
}

int32_t MnistDataset::get(int64_t index, float* out) const {
  normalize_pixels(pixels(index), out, rows_ * cols_, norm_.mean, norm_.std);
  return labels_[static_cast<size_t>(index)];
}

}  // namespace dtrain
