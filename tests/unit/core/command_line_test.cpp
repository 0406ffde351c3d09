// The flag parsing the command lines share: one usage line for each kind of mistake, and --help.
#include "core/command_line.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace dtrain {
namespace {

cxxopts::Options sample_options() {
  cxxopts::Options o("prog", "A sample command.");
  o.add_options()("epochs", "Epochs", cxxopts::value<int64_t>()->default_value("1"))(
      "lr", "Learning rate", cxxopts::value<float>()->default_value("0.1"))("h,help", "Print help");
  return o;
}

std::string usage_error(const std::vector<std::string>& args, const std::string& hint = "") {
  cxxopts::Options o = sample_options();
  try {
    parse_flags(o, args, hint);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "no error";
}

TEST(ParseFlags, ReadsValuesAndHelp) {
  cxxopts::Options o = sample_options();
  const ParsedFlags f = parse_flags(o, {"--epochs", "3", "--lr=0.5"});
  EXPECT_FALSE(f.help);
  EXPECT_EQ(f.result["epochs"].as<int64_t>(), 3);
  EXPECT_FLOAT_EQ(f.result["lr"].as<float>(), 0.5f);
  const ParsedFlags h = parse_flags(o, {"--help"});
  EXPECT_TRUE(h.help);
  EXPECT_NE(h.help_text.find("--epochs"), std::string::npos);
}

TEST(ParseFlags, EachMistakeIsOneUsageLineNamingTheFlag) {
  EXPECT_EQ(usage_error({"--epochs", "1.5"}), "--epochs: expected a whole number, got '1.5'");
  EXPECT_EQ(usage_error({"--lr=abc"}), "--lr: expected a number, got 'abc'");
  EXPECT_NE(usage_error({"--nope"}).find("nope"), std::string::npos);
  EXPECT_EQ(usage_error({"stray"}), "unexpected argument 'stray'");
  EXPECT_EQ(usage_error({"stray"}, " (the program to run goes after --)"),
            "unexpected argument 'stray' (the program to run goes after --)");
}

}  // namespace
}  // namespace dtrain
