// dtrain sample's pure parts: flags, the GPT a file's metadata records, and drawing a token.
#include "app/sample_command.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

#include "core/error.h"

namespace dtrain {
namespace {

std::vector<std::string> with(std::vector<std::string> extra) {
  std::vector<std::string> args = {"--weights", "w.safetensors", "--prompt", "def ", "--tokens", "5"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

TEST(SampleOptions, Defaults) {
  const SampleConfig c = parse_sample_options(with({})).config;
  EXPECT_EQ(c.weights, "w.safetensors");
  EXPECT_EQ(c.prompt, "def ");
  EXPECT_EQ(c.tokens, 5);
  EXPECT_EQ(c.sampling.temperature, 1.f);
  EXPECT_EQ(c.sampling.top_k, 0);
  EXPECT_EQ(c.sampling.seed, 0u);
}

TEST(SampleOptions, BadFlagsAreOneUsageLineNamingTheFlag) {
  auto fails_naming = [](const std::vector<std::string>& args, const std::string& flag) {
    try {
      parse_sample_options(args);
      ADD_FAILURE() << "accepted " << flag;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(flag), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  };
  fails_naming({"--prompt", "x", "--tokens", "3"}, "--weights");
  fails_naming({"--weights", "w", "--tokens", "3"}, "--prompt");
  fails_naming({"--weights", "w", "--prompt", "", "--tokens", "3"}, "--prompt");
  fails_naming({"--weights", "w", "--prompt", "x"}, "--tokens");
  fails_naming(with({"--tokens", "0"}), "--tokens");
  fails_naming(with({"--temperature", "-1"}), "--temperature");
  fails_naming(with({"--temperature", "nan"}), "--temperature");
  fails_naming(with({"--top-k", "-2"}), "--top-k");
  fails_naming(with({"--seed", "x"}), "--seed");
  fails_naming(with({"--threads", "-1"}), "--threads");
  fails_naming(with({"--bogus"}), "bogus");
}

safetensors::Metadata gpt_metadata() {
  return {{"format", "pt"},        {"dtrain.model", "gpt"}, {"dtrain.layers", "2"}, {"dtrain.heads", "2"},
          {"dtrain.embd", "32"},   {"dtrain.context", "16"}, {"dtrain.vocab", "256"}};
}

TEST(SampleSpec, ReadsTheRecordedByteLevelGpt) {
  const GptSpec s = sample_gpt_spec(gpt_metadata(), "m.safetensors");
  EXPECT_EQ(s.layers, 2);
  EXPECT_EQ(s.heads, 2);
  EXPECT_EQ(s.embd, 32);
  EXPECT_EQ(s.context, 16);
  EXPECT_EQ(s.vocab, 256);
}

TEST(SampleSpec, RefusesOtherModelsAndBadValuesNamingTheFileAndKey) {
  auto fails_with = [](const safetensors::Metadata& m, const std::string& words) {
    try {
      sample_gpt_spec(m, "m.safetensors");
      ADD_FAILURE() << "accepted, expected: " << words;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("m.safetensors"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  safetensors::Metadata m = gpt_metadata();
  m["dtrain.model"] = "mlp";
  fails_with(m, "not a GPT");
  fails_with({{"format", "pt"}}, "not a GPT");
  for (const char* bad : {"0", "-3", "2x", "", "99999999999999999999"}) {
    m = gpt_metadata();
    m["dtrain.layers"] = bad;
    fails_with(m, "dtrain.layers");
  }
  m = gpt_metadata();
  m.erase("dtrain.vocab");
  fails_with(m, "dtrain.vocab");
  m = gpt_metadata();
  m["dtrain.heads"] = "3";
  fails_with(m, "dtrain.heads");
  m = gpt_metadata();
  m["dtrain.vocab"] = "50257";
  fails_with(m, "byte-level");
}

TEST(SampleToken, GreedyIsTheLargestLogitTheLowerIdAmongEquals) {
  const std::vector<float> logits = {0.5f, 2.f, -1.f, 2.f, 1.f};
  for (uint64_t draw = 0; draw < 20; ++draw) EXPECT_EQ(sample_token(logits, {0.f, 0, draw}, draw), 1);
  // top-k 1 at any temperature is greedy too.
  EXPECT_EQ(sample_token(logits, {5.f, 1, 7}, 3), 1);
}

TEST(SampleToken, TopKNeverDrawsOutsideTheKLargest) {
  const std::vector<float> logits = {3.f, 0.f, 2.9f, 0.1f, 2.8f, 0.2f};
  std::set<int32_t> seen;
  for (uint64_t draw = 0; draw < 2000; ++draw) seen.insert(sample_token(logits, {10.f, 3, 1}, draw));
  EXPECT_EQ(seen, (std::set<int32_t>{0, 2, 4}));
}

TEST(SampleToken, FrequenciesFollowTheSoftmaxAtTheTemperature) {
  // logits log(p) / 2 at temperature 0.5 are the distribution p.
  const std::vector<double> p = {0.5, 0.3, 0.15, 0.05};
  std::vector<float> logits;
  for (double q : p) logits.push_back(static_cast<float>(std::log(q) / 2));
  std::vector<int> count(p.size());
  const int n = 40000;
  for (int i = 0; i < n; ++i) ++count[sample_token(logits, {0.5f, 0, 42}, static_cast<uint64_t>(i))];
  for (size_t t = 0; t < p.size(); ++t) EXPECT_NEAR(static_cast<double>(count[t]) / n, p[t], 0.01) << "token " << t;
}

TEST(SampleToken, TheSameSeedAndDrawGiveTheSameTokenAnotherSeedOtherTokens) {
  std::vector<float> logits(256, 0.f);  // uniform: every draw is the generator's alone
  std::vector<int32_t> a, b, c;
  for (uint64_t i = 0; i < 64; ++i) {
    a.push_back(sample_token(logits, {1.f, 0, 7}, i));
    b.push_back(sample_token(logits, {1.f, 0, 7}, i));
    c.push_back(sample_token(logits, {1.f, 0, 8}, i));
  }
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(SampleToken, NonFiniteLogitsAreAnErrorNotAToken) {
  EXPECT_THROW(sample_token(std::vector<float>{0.f, NAN, 1.f}, {1.f, 0, 0}, 0), Error);
  EXPECT_THROW(sample_token(std::vector<float>{0.f, INFINITY}, {1.f, 0, 0}, 0), Error);
  // -inf (a masked token) is fine and never drawn.
  for (uint64_t draw = 0; draw < 100; ++draw)
    EXPECT_EQ(sample_token(std::vector<float>{-INFINITY, 0.f}, {1.f, 0, 3}, draw), 1);
}

}  // namespace
}  // namespace dtrain
