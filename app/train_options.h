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

}  // namespace dtrain
