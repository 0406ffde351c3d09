// Rank exits: their one-line description, the choice of cause, and the last stderr line.
#include "launcher/rank_exit.h"

#include <string.h>

#include <algorithm>
#include <array>

#include <fmt/format.h>

namespace dtrain::launcher {

namespace {

// Control characters (tabs, escapes) become spaces: the line is shown inside another line.
std::string printable(std::string_view text) {
  std::string out(text);
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  }
  const size_t begin = out.find_first_not_of(' ');
  if (begin == std::string::npos) return "";
  return out.substr(begin, out.find_last_not_of(' ') - begin + 1);
}

// Lower is more likely the cause (see choose_cause).
int blame_class(const RankExit& e) {
  if (e.stopped) return 3;
  switch (e.how) {
    case RankExit::How::kSignaled: return 0;
    case RankExit::How::kLost: return 1;
    case RankExit::How::kExited: return 2;
  }
  return 3;
}

}  // namespace

bool is_failure(const RankExit& e) { return e.how != RankExit::How::kExited || e.code != 0; }

int exit_status(const RankExit& e) {
  switch (e.how) {
    case RankExit::How::kExited: return e.code;
    case RankExit::How::kSignaled: return 128 + e.code;
    case RankExit::How::kLost: return 1;
  }
  return 1;
}

std::string signal_name(int signal) {
  const char* abbrev = sigabbrev_np(signal);  // "KILL"; nullptr for numbers without a name
  return abbrev ? fmt::format("SIG{}", abbrev) : fmt::format("signal {}", signal);
}

std::string describe_rank_exit(const RankExit& e) {
  std::string what;
  switch (e.how) {
    case RankExit::How::kExited: what = fmt::format("exited with status {}", e.code); break;
    case RankExit::How::kSignaled: what = fmt::format("was killed by signal {} ({})", e.code, signal_name(e.code)); break;
    case RankExit::How::kLost:
      what = "ended without an exit status (its rank supervisor was killed; the rank went with it)";
      break;
  }
  std::string line = fmt::format("rank {} on {} {}", e.rank, e.host.empty() ? "an unknown host" : e.host, what);
  if (e.stopped) line += " after the job was told to stop";
  if (const std::string last = printable(e.last_line); !last.empty())
    line += fmt::format("; its last line on stderr: {}", last);
  return line;
}

size_t choose_cause(const std::vector<RankExit>& failures) {
  size_t best = 0;
  for (size_t i = 1; i < failures.size(); ++i) {
    if (blame_class(failures[i]) < blame_class(failures[best])) best = i;
  }
  return best;
}

std::string format_ranks(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string text;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    text += text.empty() ? "" : ", ";
    text += j == i ? fmt::format("{}", ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]);
    i = j + 1;
  }
  return text;
}

void LastLine::feed(std::string_view bytes) {
  for (char c : bytes) {
    // "\r\n" ends a line; a lone '\r' redraws it in place (a progress line): what follows replaces it.
    if (after_cr_ && c != '\n') {
      current_.clear();
      truncated_ = false;
    }
    after_cr_ = c == '\r';
    if (after_cr_) continue;
    if (c == '\n') {
      if (std::string line = printable(current_); !line.empty()) last_ = std::move(line);
      current_.clear();
      truncated_ = false;
    } else if (current_.size() < kMaxLineBytes) {
      current_ += c;
    } else if (!truncated_) {
      current_ += "...";
      truncated_ = true;
    }
  }
}

std::string LastLine::line() const {
  std::string partial = printable(current_);
  return partial.empty() ? last_ : partial;
}

}  // namespace dtrain::launcher
