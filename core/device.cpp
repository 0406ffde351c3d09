#include "core/device.h"

#include <fmt/format.h>

namespace dtrain {

std::string Device::str() const { return is_cpu() ? "cpu" : fmt::format("cuda:{}", index); }

}  // namespace dtrain
