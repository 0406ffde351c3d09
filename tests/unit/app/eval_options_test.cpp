// `dtrain eval`'s flags for GPT weights (app/eval_command.h): --eval-batches, --batch-size and
// --model gpt are read, and wrong values are one usage line.
#include <gtest/gtest.h>

#include "app/eval_command.h"
#include "core/error.h"

namespace dtrain {
namespace {

std::string usage_error_of(std::vector<std::string> args) {
  args.insert(args.begin(), {"--weights", "w.safetensors", "--data", "/tmp"});
  try {
    parse_eval_options(args);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(EvalOptions, GptFlagsAndDefaults) {
  const EvalConfig d = parse_eval_options({"--weights", "w", "--data", "/tmp"}).config;
  EXPECT_EQ(d.eval_batches, 0);  // every val slot
  EXPECT_FALSE(d.batch_size.has_value());
  EXPECT_FALSE(d.model_gpt);
  const EvalConfig c =
      parse_eval_options({"--weights", "w", "--data", "/tmp", "--eval-batches", "6", "--batch-size", "4", "--model", "gpt"})
          .config;
  EXPECT_EQ(c.eval_batches, 6);
  EXPECT_EQ(c.batch_size, 4);
  EXPECT_TRUE(c.model_gpt);
  EXPECT_FALSE(c.flags.model.has_value()) << "gpt is no image architecture";
  EXPECT_EQ(usage_error_of({"--eval-batches", "-1"}), "--eval-batches: must be non-negative (0: all), got -1");
  EXPECT_EQ(usage_error_of({"--batch-size", "0"}), "--batch-size: must be at least 1, got 0");
}

}  // namespace
}  // namespace dtrain
