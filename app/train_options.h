// `dtrain train` flags (cxxopts) parsed into a TrainConfig, once: every value is checked here
// and nowhere else. A wrong flag or value throws UsageError with one line naming the flag; the
// CLI prints it and exits 2.
#pragma once

#include <string>
#include <vector>

#include "app/train_config.h"

namespace dtrain {

struct ParsedTrain {
  TrainConfig config;
  bool help = false;
  std::string help_text;
};

// args excludes the program name and the "train" subcommand.
ParsedTrain parse_train_options(const std::vector<std::string>& args);

// The training loss's class weights for a run whose data has `classes` classes (`what`: "classes of
// the training data", "token ids of the vocabulary"): c.class_weights, or a UsageError, one line,
// when their count is not `classes`. The one place the count is checked (it needs the data).
std::vector<float> check_class_weights(const TrainConfig& c, int64_t classes, const char* what);

// --device and --threads checked by the train flags' own rules, with nothing else: for the
// commands that run on a device without training data (`dtrain sample`, `dtrain bench gemm`),
// so they need no --data folder (the default one is Fashion-MNIST's).
RuntimeOptions parse_runtime_flags(const std::string& device, int threads);

}  // namespace dtrain
