// The classes a data set's labels make, and the checks every image format's labels pass (IDX and
// NumPy alike): how many classes the training labels name, and test labels inside them.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace dtrain {

// The most classes a model may have: as many as a weights file may record (app/architecture.cpp).
inline constexpr int64_t kMaxLabelClasses = 1'000'000;

// The classes of a model trained on `labels` (each >= 0), read from `path`: num_classes when > 0,
// every label below it; else the largest label + 1 (0 for no labels), refusing a label far
// outside the others (Note [A label far outside the others]) and a count above kMaxLabelClasses.
// Throws Error, one line naming path.
int training_classes(std::span<const int32_t> labels, const std::string& path, int num_classes);

// Every test label (of `path`) below `classes`, the classes of `train_path`'s labels.
void check_test_labels(std::span<const int32_t> labels, const std::string& path, int classes,
                       const std::string& train_path);

}  // namespace dtrain
