// The shared flag parsing (see command_line.h).
#include "core/command_line.h"

#include <cctype>
#include <cstdlib>
#include <stdexcept>

#include <fmt/format.h>

#include "core/error.h"

namespace dtrain {

namespace {

// cxxopts names a value that failed to convert ("Argument 'x' failed to parse") but not its
// flag: find the flag in `args` that carried it, as "--flag value" or "--flag=value".
std::string bad_value_message(const std::vector<std::string>& args, const std::string& what) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0) continue;
    const size_t eq = a.find('=');
    const std::string flag = a.substr(0, eq);
    const std::string value = eq != std::string::npos ? a.substr(eq + 1) : i + 1 < args.size() ? args[i + 1] : "";
    for (const std::string& quoted : {"\u2018" + value + "\u2019", "'" + value + "'"})
      if (what.find(quoted) != std::string::npos) {
        // A value that reads as a decimal failed, so the flag takes whole numbers.
        char* end = nullptr;
        std::strtod(value.c_str(), &end);
        const bool decimal = !value.empty() && end == value.c_str() + value.size();
        return fmt::format("{}: expected {}, got '{}'", flag, decimal ? "a whole number" : "a number", value);
      }
  }
  return what;
}

}  // namespace

ParsedFlags parse_flags(cxxopts::Options& options, const std::vector<std::string>& args,
                        const std::string& unmatched_hint) {
  std::vector<const char*> argv = {options.program().c_str()};
  for (const std::string& a : args) argv.push_back(a.c_str());
  ParsedFlags out;
  try {
    out.result = options.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const cxxopts::exceptions::incorrect_argument_type& e) {
    throw UsageError(bad_value_message(args, e.what()));
  } catch (const cxxopts::exceptions::exception& e) {
    throw UsageError(e.what());
  }
  if (!out.result.unmatched().empty())
    throw UsageError(fmt::format("unexpected argument '{}'{}", out.result.unmatched().front(), unmatched_hint));
  if (out.result.count("help")) {
    out.help = true;
    out.help_text = options.help();
  }
  return out;
}

int64_t parse_bytes(const std::string& flag, const std::string& text, int64_t max_bytes, const std::string& max_text) {
  size_t used = 0;
  long long v = -1;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  int shift = 0;
  if (used > 0 && used + 1 == text.size()) {
    const char unit = static_cast<char>(std::toupper(static_cast<unsigned char>(text.back())));
    shift = unit == 'K' ? 10 : unit == 'M' ? 20 : unit == 'G' ? 30 : -1;
    if (shift >= 0) ++used;
  }
  if (used == 0 || used != text.size() || v < 1 || shift < 0 || v > (max_bytes >> shift))
    throw UsageError(
        fmt::format("{}: expected a size from 1 to {} bytes like 8, 64K or 256M, got '{}'", flag, max_text, text));
  return static_cast<int64_t>(v) << shift;
}

}  // namespace dtrain
