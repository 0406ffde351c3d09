#include "ddp/bucket_plan.h"

#include <numeric>

#include <fmt/format.h>

namespace dtrain {

std::vector<std::vector<size_t>> compute_bucket_plan(const std::vector<size_t>& param_bytes,
                                                     size_t first_bucket_bytes, size_t bucket_cap_bytes) {
  return compute_bucket_plan(param_bytes, reverse_parameter_order(param_bytes.size()), first_bucket_bytes,
                             bucket_cap_bytes);
}

std::vector<std::vector<size_t>> compute_bucket_plan(const std::vector<size_t>& param_bytes,
                                                     const std::vector<size_t>& ready_order,
                                                     size_t first_bucket_bytes, size_t bucket_cap_bytes) {
  std::vector<std::vector<size_t>> plan;
  std::vector<size_t> open;
  size_t open_bytes = 0;
  for (size_t i : ready_order) {
    open.push_back(i);
    open_bytes += param_bytes.at(i);
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

std::vector<size_t> reverse_parameter_order(size_t n) {
  std::vector<size_t> order(n);
  std::iota(order.rbegin(), order.rend(), size_t{0});
  return order;
}

std::string check_ready_order(const std::vector<size_t>& order, size_t n) {
  if (order.size() != n) return fmt::format("{} parameter indices for a model of {} parameters", order.size(), n);
  std::vector<bool> seen(n, false);
  for (size_t i : order) {
    if (i >= n) return fmt::format("parameter index {} is out of range (the model has {})", i, n);
    if (seen[i]) return fmt::format("parameter index {} appears twice", i);
    seen[i] = true;
  }
  return "";
}

std::string describe_plan(const std::vector<std::vector<size_t>>& plan, const std::vector<size_t>& param_bytes) {
  std::vector<std::string> sizes;
  for (const auto& bucket : plan) {
    size_t bytes = 0;
    for (size_t p : bucket) bytes += param_bytes.at(p);
    sizes.push_back(bytes >= (1u << 20) ? fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20))
                                        : fmt::format("{:.1f} KiB", static_cast<double>(bytes) / 1024));
  }
  return fmt::format("{} bucket{}: {}", plan.size(), plan.size() == 1 ? "" : "s", fmt::join(sizes, ", "));
}

}  // namespace dtrain
