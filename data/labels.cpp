// The label rules of data/labels.h.
#include "data/labels.h"

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"

namespace dtrain {

// Note [A label far outside the others]
// The classes are max label + 1, so one corrupt label (200 among 0..9) would silently build a
// 201-class model. The largest label is "far" when more classes lie empty between it and the
// next largest label than there are classes with samples (200 above 0..9: 190 empty, 10 used);
// gaps that small are real data sets' (a class missing here and there). A caller that means it
// says how many classes there are (num_classes > 0), and then every label must be below that.
int training_classes(std::span<const int32_t> labels, const std::string& path, int num_classes) {
  if (num_classes > 0) {
    for (size_t i = 0; i < labels.size(); ++i)
      if (labels[i] >= num_classes)
        throw Error(fmt::format("{}: label {} of sample {} is not one of the {} classes asked for (0 to {})", path,
                                labels[i], i, num_classes, num_classes - 1));
    return num_classes;
  }
  if (labels.empty()) return 0;
  std::vector<int32_t> used(labels.begin(), labels.end());
  std::sort(used.begin(), used.end());
  used.erase(std::unique(used.begin(), used.end()), used.end());
  const int largest = used.back();
  // NumPy labels reach INT32_MAX (IDX labels are bytes): the count in 64 bits, and bounded.
  if (int64_t{largest} + 1 > kMaxLabelClasses) {
    const size_t at = static_cast<size_t>(std::find(labels.begin(), labels.end(), largest) - labels.begin());
    throw Error(fmt::format("{}: label {} of sample {} would make {} classes, more than a model may have ({})", path,
                            largest, at, int64_t{largest} + 1, kMaxLabelClasses));
  }
  if (used.size() == 1) return largest + 1;
  const int next = used[used.size() - 2];  // the largest label below it
  const int64_t empty = int64_t{largest} - next - 1;
  const auto present = static_cast<int64_t>(used.size());
  if (empty <= present) return largest + 1;
  const size_t sample = static_cast<size_t>(std::find(labels.begin(), labels.end(), largest) - labels.begin());
  throw Error(fmt::format("{}: label {} of sample {} is far outside the other labels ({} to {}): it would make {} "
                          "classes, {} of them empty between it and the rest; give the class count if it is meant",
                          path, largest, sample, used.front(), next, int64_t{largest} + 1, empty));
}

void check_test_labels(std::span<const int32_t> labels, const std::string& path, int classes,
                       const std::string& train_path) {
  for (size_t i = 0; i < labels.size(); ++i)
    if (labels[i] >= classes)
      throw Error(fmt::format("{}: label {} of sample {} is not one of the {} classes of {} (labels 0 to {})", path,
                              labels[i], i, classes, train_path, classes - 1));
}

}  // namespace dtrain
