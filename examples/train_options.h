// Parsing of `dtrain train` flags into a TrainConfig (cxxopts). Wrong flags or values throw
// UsageError with a one-line message; the CLI prints it and exits 2.
#pragma once

#include <string>
#include <vector>

#include "ddp/trainer.h"

namespace dtrain {

struct ParsedTrain {
  TrainConfig config;
  bool help = false;
  std::string help_text;
};

// args excludes the program name and the "train" subcommand.
ParsedTrain parse_train_options(const std::vector<std::string>& args);

}  // namespace dtrain
