#include "pipeline/gpt_stage.h"

namespace dtrain {

std::vector<StageRange> gpt_stage_ranges(const GptSpec& spec, int stages, const std::vector<size_t>& split) {
  const std::vector<LayerSize> layers = plan_gpt_layers(spec);
  if (!split.empty()) return partition_at(split, layers.size(), stages);
  std::vector<int64_t> counts;
  for (const LayerSize& l : layers) counts.push_back(l.parameters);
  return balanced_partition(counts, stages);
}

std::unique_ptr<Sequential> build_gpt_stage(const GptSpec& spec, Device device, uint64_t seed, StageRange range) {
  return build_gpt_layers(spec, device, seed, range.begin, range.end);
}

std::vector<LayerSize> plan_gpt_stage(const GptSpec& spec, StageRange range) {
  const std::vector<LayerSize> layers = plan_gpt_layers(spec);
  return {layers.begin() + static_cast<std::ptrdiff_t>(range.begin), layers.begin() + static_cast<std::ptrdiff_t>(range.end)};
}

}  // namespace dtrain
