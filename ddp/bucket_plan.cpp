#include "ddp/bucket_plan.h"

namespace dtrain {

std::vector<std::vector<size_t>> compute_bucket_plan(const std::vector<size_t>& param_bytes,
                                                     size_t first_bucket_bytes, size_t bucket_cap_bytes) {
  std::vector<std::vector<size_t>> plan;
  std::vector<size_t> open;
  size_t open_bytes = 0;
  for (size_t i = param_bytes.size(); i-- > 0;) {
    open.push_back(i);
    open_bytes += param_bytes[i];
    const size_t cap = plan.empty() ? first_bucket_bytes : bucket_cap_bytes;
    if (open_bytes >= cap) {
      plan.push_back(std::move(open));
      open.clear();
      open_bytes = 0;
    }
  }
  if (!open.empty()) plan.push_back(std::move(open));
  return plan;
}

}  // namespace dtrain
