// The flag parsing every dtrain command line shares (dtrain train, eval and bench allreduce,
// dtrain-launch): cxxopts' parse, its errors as one usage line naming the flag, arguments no flag
// takes, and --help. Each command defines its own flags and reads its own values. Internal to
// the programs: not part of the library's API.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

// GCC 12 warns (-Wrestrict, a false positive of its string inlining) inside cxxopts' integer parsing
// wherever a command's integer flags are instantiated; with -Werror (CI) that stops the build.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wrestrict"
#include <cxxopts.hpp>
#pragma GCC diagnostic pop

namespace dtrain {

struct ParsedFlags {
  cxxopts::ParseResult result;
  bool help = false;      // --help was given: print help_text and stop
  std::string help_text;  // options.help(), when help
};

// Parses `args` (without the program's name) with `options`, which defines "help". Throws
// UsageError, one line: an unknown flag, a flag without its value, a value that is not of the
// flag's type (`--epochs: expected a whole number, got '1.5'`), or an argument no flag takes
// (`unexpected argument 'x'`, then `unmatched_hint` when given, e.g. " (the program to run goes
// after --)").
ParsedFlags parse_flags(cxxopts::Options& options, const std::vector<std::string>& args,
                        const std::string& unmatched_hint = "");

// A size in bytes: "8", "4K", "256M", "1G" (powers of 1024), from 1 to `max_bytes`. Throws
// UsageError "<flag>: expected a size from 1 to <max text> bytes like 8, 64K or 256M, got '<text>'".
int64_t parse_bytes(const std::string& flag, const std::string& text, int64_t max_bytes, const std::string& max_text);

}  // namespace dtrain
