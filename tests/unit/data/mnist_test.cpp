// MnistDataset: loading a split the test writes (gzip and raw), normalisation, the checks that
// name the bad file, and, where the package is installed, the real Fashion-MNIST.
#include "data/mnist.h"

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "data/idx_reader.h"
#include "temp_dir.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;

constexpr int64_t kRows = 4, kCols = 3;

std::vector<uint8_t> image_bytes(int64_t n) {
  std::vector<uint8_t> v(static_cast<size_t>(n * kRows * kCols));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>((i * 53 + 7) % 256);
  v[0] = 0;
  v[1] = 255;
  return v;
}

std::vector<uint8_t> label_bytes(int64_t n) {
  std::vector<uint8_t> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>((i * 7) % 10);
  return v;
}

// Writes a split of n images and `labels` labels into `dir`.
void write_split(const TempDir& dir, const std::string& prefix, int64_t n, bool gzip, int64_t labels = -1) {
  if (labels < 0) labels = n;
  std::string ext = gzip ? ".gz" : "";
  write_idx(dir.file(prefix + "-images-idx3-ubyte" + ext), std::vector<int64_t>{n, kRows, kCols}, image_bytes(n), gzip);
  write_idx(dir.file(prefix + "-labels-idx1-ubyte" + ext), std::vector<int64_t>{labels}, label_bytes(labels), gzip);
}

std::string load_error(const std::string& dir, Split split) {
  try {
    MnistDataset::load(dir, split);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string splits_error(const std::string& dir) {
  try {
    load_mnist_splits(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Mnist, LoadsGzipAndRawSplits) {
  TempDir dir;
  write_split(dir, "train", 20, true);
  write_split(dir, "t10k", 6, false);
  for (Split split : {Split::kTrain, Split::kTest}) {
    auto ds = MnistDataset::load(dir.path().string(), split);
    const int64_t n = split == Split::kTrain ? 20 : 6;
    ASSERT_EQ(ds->size(), n);
    EXPECT_EQ(ds->sample_shape(), (Shape{1, kRows, kCols}));
    EXPECT_EQ(ds->num_classes(), n == 20 ? 10 : 9);  // max label + 1: the 6 test labels stop at 8
    std::vector<uint8_t> images = image_bytes(n), labels = label_bytes(n);
    std::vector<float> out(kRows * kCols);
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(ds->get(i, out.data()), labels[static_cast<size_t>(i)]);
      for (int64_t p = 0; p < kRows * kCols; ++p)
        ASSERT_FLOAT_EQ(out[static_cast<size_t>(p)], images[static_cast<size_t>(i * kRows * kCols + p)] / 255.0f);
    }
    std::vector<float> first(kRows * kCols);
    ds->get(0, first.data());
    EXPECT_EQ(first[0], 0.0f);
    EXPECT_EQ(first[1], 1.0f);
  }
}

TEST(Mnist, NormalisesWithMeanAndStd) {
  TempDir dir;
  write_split(dir, "train", 3, true);
  auto ds = MnistDataset::load(dir.path().string(), Split::kTrain, Normalize{0.2860f, 0.3530f});
  std::vector<uint8_t> images = image_bytes(3);
  std::vector<float> out(kRows * kCols);
  ds->get(2, out.data());
  for (int64_t p = 0; p < kRows * kCols; ++p) {
    float x = images[static_cast<size_t>(2 * kRows * kCols + p)] / 255.0f;
    EXPECT_NEAR(out[static_cast<size_t>(p)], (x - 0.2860f) / 0.3530f, 1e-6f);
  }
}

TEST(Mnist, LimitKeepsTheFirstSamples) {
  TempDir dir;
  write_split(dir, "train", 20, true);
  auto ds = MnistDataset::load(dir.path().string(), Split::kTrain, {}, 5);
  ASSERT_EQ(ds->size(), 5);
  auto all = MnistDataset::load(dir.path().string(), Split::kTrain);
  for (int64_t i = 0; i < 5; ++i) {
    EXPECT_EQ(ds->label(i), all->label(i));
    EXPECT_EQ(std::vector<uint8_t>(ds->pixels(i), ds->pixels(i) + kRows * kCols),
              std::vector<uint8_t>(all->pixels(i), all->pixels(i) + kRows * kCols));
  }
  EXPECT_EQ(MnistDataset::load(dir.path().string(), Split::kTrain, {}, 1000)->size(), 20);
}

TEST(Mnist, MismatchedCountsNameBothFiles) {
  TempDir dir;
  write_split(dir, "train", 10, true, 9);
  EXPECT_THAT(load_error(dir.path().string(), Split::kTrain),
              HasSubstr("train-images-idx3-ubyte.gz: 10 images, but " + dir.file("train-labels-idx1-ubyte.gz") +
                        " has 9 labels"));
}

// Data a user brings has as many classes as its training labels name, not a fixed 10.
TEST(Mnist, ClassesComeFromTheTrainingLabels) {
  TempDir dir;
  write_split(dir, "train", 4, false);
  write_split(dir, "t10k", 3, false);
  // Classes 0 and 4 to 6 have no sample: 3 empty below 7, 4 with samples, so 7 is not "far" (see
  // LabelFarAboveTheOthersIsAnErrorUnlessTheClassesAreGiven).
  write_idx(dir.file("train-labels-idx1-ubyte"), std::vector<int64_t>{4}, std::vector<uint8_t>{1, 2, 7, 3}, false);
  write_idx(dir.file("t10k-labels-idx1-ubyte"), std::vector<int64_t>{3}, std::vector<uint8_t>{0, 1, 3}, false);
  EXPECT_EQ(MnistDataset::load(dir.path().string(), Split::kTrain)->num_classes(), 8);
  EXPECT_EQ(MnistDataset::load(dir.path().string(), Split::kTrain, {}, 2)->num_classes(), 8);  // a limit keeps them
  MnistSplits splits = load_mnist_splits(dir.path().string());
  EXPECT_EQ(splits.train->num_classes(), 8);
  EXPECT_EQ(splits.test->num_classes(), 8);  // the train split's, though its own labels stop at 3
  write_idx(dir.file("train-labels-idx1-ubyte"), std::vector<int64_t>{4}, std::vector<uint8_t>{0, 1, 1, 0}, false);
  EXPECT_EQ(MnistDataset::load(dir.path().string(), Split::kTrain)->num_classes(), 2);
}

// Issue 19 item 6: a label far above the others (more empty classes between it and the next label
// than classes with samples) would silently build a model of that many classes.
TEST(Mnist, LabelFarAboveTheOthersIsAnErrorUnlessTheClassesAreGiven) {
  TempDir dir;
  write_split(dir, "train", 4, false);
  write_split(dir, "t10k", 3, false);
  write_idx(dir.file("train-labels-idx1-ubyte"), std::vector<int64_t>{4}, std::vector<uint8_t>{1, 2, 12, 3}, false);
  const std::string far = dir.file("train-labels-idx1-ubyte") +
                          ": label 12 of sample 2 is far outside the other labels (1 to 3): it would make 13 classes, "
                          "8 of them empty between it and the rest; give the class count if it is meant";
  EXPECT_EQ(load_error(dir.path().string(), Split::kTrain), far);
  EXPECT_EQ(splits_error(dir.path().string()), far);
  // Told the class count, the labels need only be below it.
  EXPECT_EQ(MnistDataset::load(dir.path().string(), Split::kTrain, {}, 0, 13)->num_classes(), 13);
  MnistSplits given = load_mnist_splits(dir.path().string(), {}, 0, 0, 20);
  EXPECT_EQ(given.train->num_classes(), 20);
  EXPECT_EQ(given.test->num_classes(), 20);
  try {
    load_mnist_splits(dir.path().string(), {}, 0, 0, 12);
    ADD_FAILURE() << "label 12 accepted among 12 classes";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), dir.file("train-labels-idx1-ubyte") +
                                         ": label 12 of sample 2 is not one of the 12 classes asked for (0 to 11)");
  }
  // Where the gap is no larger than the classes in use, it stands (4 empty below 8, 4 used).
  write_idx(dir.file("train-labels-idx1-ubyte"), std::vector<int64_t>{4}, std::vector<uint8_t>{1, 2, 8, 3}, false);
  EXPECT_EQ(load_mnist_splits(dir.path().string()).train->num_classes(), 9);
  // A single label value, or none far from the rest: as before.
  write_idx(dir.file("train-labels-idx1-ubyte"), std::vector<int64_t>{4}, std::vector<uint8_t>{5, 5, 5, 5}, false);
  EXPECT_EQ(MnistDataset::load(dir.path().string(), Split::kTrain)->num_classes(), 6);
}

TEST(Mnist, TestLabelOutsideTheTrainClassesNamesBothFiles) {
  TempDir dir;
  write_split(dir, "train", 4, false);  // labels 0, 7, 4, 1: 8 classes
  write_split(dir, "t10k", 3, true);
  write_idx(dir.file("t10k-labels-idx1-ubyte.gz"), std::vector<int64_t>{3}, std::vector<uint8_t>{1, 8, 3}, true);
  EXPECT_EQ(splits_error(dir.path().string()),
            dir.file("t10k-labels-idx1-ubyte.gz") + ": label 8 of sample 1 is not one of the 8 classes of " +
                dir.file("train-labels-idx1-ubyte") + " (labels 0 to 7)");
}

TEST(Mnist, WrongShapesNameFile) {
  TempDir dir;
  write_split(dir, "train", 4, true);
  write_idx(dir.file("train-images-idx3-ubyte.gz"), std::vector<int64_t>{4, 12}, image_bytes(4), true);
  EXPECT_THAT(load_error(dir.path().string(), Split::kTrain),
              HasSubstr("train-images-idx3-ubyte.gz: expected a 3-d image array [count, rows, cols] or a 4-d one "
                        "[count, channels, rows, cols], got 2 dimensions"));
}

// An image file with a channel dimension, [n, c, h, w], gives samples of shape {c, h, w}.
TEST(Mnist, ChannelDimensionIsAccepted) {
  TempDir dir;
  const int64_t n = 5, channels = 3;
  std::vector<uint8_t> pixels(static_cast<size_t>(n * channels * kRows * kCols));
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 11 % 256);
  write_idx(dir.file("train-images-idx3-ubyte"), std::vector<int64_t>{n, channels, kRows, kCols}, pixels, false);
  write_idx(dir.file("train-labels-idx1-ubyte"), std::vector<int64_t>{n}, label_bytes(n), false);
  auto ds = MnistDataset::load(dir.path().string(), Split::kTrain);
  EXPECT_EQ(ds->sample_shape(), (Shape{channels, kRows, kCols}));
  EXPECT_EQ(ds->channels(), channels);
  std::vector<float> out(static_cast<size_t>(channels * kRows * kCols));
  EXPECT_EQ(ds->get(4, out.data()), label_bytes(n)[4]);
  for (size_t p = 0; p < out.size(); ++p) ASSERT_FLOAT_EQ(out[p], pixels[4 * out.size() + p] / 255.0f) << p;
}

TEST(Mnist, SplitsLoadTogetherAsTheyLoadAlone) {
  TempDir dir;
  write_split(dir, "train", 20, true);
  write_split(dir, "t10k", 6, false);
  MnistSplits splits = load_mnist_splits(dir.path().string(), Normalize{0.5f, 0.25f}, 7, 0);
  auto train = MnistDataset::load(dir.path().string(), Split::kTrain, Normalize{0.5f, 0.25f}, 7);
  auto test = MnistDataset::load(dir.path().string(), Split::kTest, Normalize{0.5f, 0.25f});
  for (auto [together, alone] : {std::pair{splits.train.get(), train.get()}, std::pair{splits.test.get(), test.get()}}) {
    ASSERT_EQ(together->size(), alone->size());
    EXPECT_EQ(together->sample_shape(), alone->sample_shape());
    for (int64_t i = 0; i < alone->size(); ++i) {
      std::vector<float> a(kRows * kCols), b(kRows * kCols);
      EXPECT_EQ(together->get(i, a.data()), alone->get(i, b.data()));
      EXPECT_EQ(a, b);
    }
  }
  EXPECT_EQ(splits.train->size(), 7);
  EXPECT_EQ(splits.test->num_classes(), 10);
}

// Test images of another shape than the train images (the 14x56, 1x784, 784x1, which
// were accepted silently) fail at load, naming both files.
TEST(Mnist, TestImageShapeMustMatchTrainNamingBothFiles) {
  TempDir dir;
  write_split(dir, "train", 4, false);
  write_split(dir, "t10k", 2, true);
  const std::string test_images = dir.file("t10k-images-idx3-ubyte.gz");
  for (const std::vector<int64_t>& dims : std::vector<std::vector<int64_t>>{
           {2, 2, 6}, {2, 1, 12}, {2, 12, 1}, {2, 2, 2, 3}, {2, 12, 1, 1}}) {
    write_idx(test_images, dims, image_bytes(2), true);
    Shape sample = dims.size() == 3 ? Shape{1, dims[1], dims[2]} : Shape{dims[1], dims[2], dims[3]};
    EXPECT_EQ(splits_error(dir.path().string()),
              test_images + ": images of shape " + shape_str(sample) + ", but " + dir.file("train-images-idx3-ubyte") +
                  " has images of shape [1, 4, 3]");
  }
  write_idx(test_images, std::vector<int64_t>{2, 1, kRows, kCols}, image_bytes(2), true);  // the same shape, 4-d
  EXPECT_EQ(splits_error(dir.path().string()), "");
}

TEST(Mnist, SplitErrorsNameTheirFileTrainFirst) {
  TempDir dir;
  write_split(dir, "train", 4, false);
  write_split(dir, "t10k", 2, false);
  write_bytes(dir.file("t10k-labels-idx1-ubyte"), std::vector<uint8_t>{1, 2, 3}, false);
  EXPECT_THAT(splits_error(dir.path().string()),
              HasSubstr(dir.file("t10k-labels-idx1-ubyte") + ": truncated: expected 4 bytes of IDX header, got 3"));
  std::filesystem::remove(dir.file("train-images-idx3-ubyte"));
  EXPECT_THAT(splits_error(dir.path().string()), HasSubstr("missing train-images-idx3-ubyte.gz"));
  EXPECT_THAT(splits_error(dir.file("nowhere")), HasSubstr("dataset directory not found"));
  EXPECT_THROW(load_mnist_splits(dir.path().string(), {}, -1, 0), Error);
}

TEST(Mnist, TruncatedImageFileNamesIt) {
  TempDir dir;
  write_split(dir, "t10k", 4, true);
  std::vector<uint8_t> bytes = {0, 0, 0x08, 3, 0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0, 3, 1, 2, 3};
  write_bytes(dir.file("t10k-images-idx3-ubyte.gz"), bytes, true);
  EXPECT_THAT(load_error(dir.path().string(), Split::kTest),
              HasSubstr("t10k-images-idx3-ubyte.gz: truncated: expected 48 bytes of image data, got 3"));
}

TEST(Mnist, MissingDirectoryHintsAtPackage) {
  TempDir dir;
  std::string missing = dir.file("no-such-dir");
  std::string msg = load_error(missing, Split::kTrain);
  EXPECT_THAT(msg, HasSubstr(missing + ": dataset directory not found"));
  EXPECT_THAT(msg, HasSubstr("apt-get install dataset-fashion-mnist"));
}

TEST(Mnist, MissingFileNamesIt) {
  TempDir dir;
  write_split(dir, "train", 4, true);
  std::filesystem::remove(dir.file("train-labels-idx1-ubyte.gz"));
  EXPECT_THAT(load_error(dir.path().string(), Split::kTrain), HasSubstr("missing train-labels-idx1-ubyte.gz"));
  EXPECT_THAT(load_error(dir.path().string(), Split::kTest), HasSubstr("missing t10k-images-idx3-ubyte.gz"));
}

TEST(Mnist, RejectsBadNormalizeAndLimit) {
  TempDir dir;
  write_split(dir, "train", 4, true);
  EXPECT_THROW(MnistDataset::load(dir.path().string(), Split::kTrain, Normalize{0.5f, 0.0f}), Error);
  EXPECT_THROW(MnistDataset::load(dir.path().string(), Split::kTrain, {}, -1), Error);
}

TEST(Mnist, RealFashionMnistTrainSet) {
  const std::string dir = DTRAIN_FMNIST_DIR;
  if (!std::filesystem::is_directory(dir))
    GTEST_SKIP() << dir << " not present (apt-get install dataset-fashion-mnist)";
  auto ds = MnistDataset::load(dir, Split::kTrain);
  ASSERT_EQ(ds->size(), 60000);
  EXPECT_EQ(ds->sample_shape(), (Shape{1, 28, 28}));
  std::set<int32_t> classes;
  std::vector<float> out(28 * 28);
  float lo = 1.0f, hi = 0.0f;
  for (int64_t i = 0; i < ds->size(); ++i) {
    classes.insert(ds->get(i, out.data()));
    for (float v : out) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  }
  EXPECT_EQ(classes.size(), 10u);
  EXPECT_EQ(*classes.begin(), 0);
  EXPECT_EQ(*classes.rbegin(), 9);
  EXPECT_EQ(lo, 0.0f);
  EXPECT_EQ(hi, 1.0f);
  EXPECT_EQ(MnistDataset::load(dir, Split::kTest)->size(), 10000);
  MnistSplits splits = load_mnist_splits(dir);
  EXPECT_EQ(splits.train->size(), 60000);
  EXPECT_EQ(splits.test->size(), 10000);
  EXPECT_EQ(splits.train->num_classes(), 10);
  EXPECT_EQ(splits.test->num_classes(), 10);
}

}  // namespace
}  // namespace dtrain
