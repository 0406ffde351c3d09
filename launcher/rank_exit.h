// How a rank of a dtrain-launch job ended, as its rank supervisor reported it, and the one line
// that names it: the rank, its host, the signal or exit status, and its last line on stderr.
// Also which of several failures to blame, and rank lists as people read them ("0-3, 6").
// Pure: nothing here looks at processes.
#pragma once

#include <string>
#include <vector>

namespace dtrain::launcher {

struct RankExit {
  enum class How {
    kExited,    // the program exited: `code` is its status
    kSignaled,  // a signal killed the program: `code` is the signal number
    kLost,      // its supervisor ended without saying (killed itself): nothing known
  };
  int rank = -1;
  std::string host;
  How how = How::kExited;
  int code = 0;
  // The supervisor had been told to stop the program (mpirun or dtrain-launch ending the job)
  // before it ended: a consequence of the job ending, not a cause.
  bool stopped = false;
  std::string last_line;  // the program's last non-empty line on stderr; "" when it printed none
  friend bool operator==(const RankExit&, const RankExit&) = default;
};

bool is_failure(const RankExit& e);
// What a shell would report: the exit status, or 128 + the signal; 1 for a lost rank.
int exit_status(const RankExit& e);

// "SIGKILL" (or "signal 70" for a number without a name).
std::string signal_name(int signal);

// "rank 1 on nodeB was killed by signal 9 (SIGKILL); its last line on stderr: ..."
// "rank 1 on nodeB exited with status 3; its last line on stderr: ..."
std::string describe_rank_exit(const RankExit& e);

// Which failure caused the job to fail, from the failures in the order they arrived: the first
// one that was not a consequence of the job being stopped, taking a rank killed by a signal
// before a lost one before one that exited non-zero (a rank often exits with an error because a
// peer died: the dead peer is the cause). Expects at least one failure.
size_t choose_cause(const std::vector<RankExit>& failures);

// {0, 1, 2, 3, 6} -> "0-3, 6" (sorted, duplicates dropped).
std::string format_ranks(std::vector<int> ranks);

// Keeps the last non-empty line of a byte stream (a program's stderr as it is read), at most
// kMaxLineBytes of it, without the line end; a final line without '\n' counts too.
class LastLine {
 public:
  static constexpr size_t kMaxLineBytes = 400;
  void feed(std::string_view bytes);
  std::string line() const;

 private:
  std::string current_;   // the line being read
  std::string last_;      // the last complete non-empty line
  bool truncated_ = false;  // current_ was cut at kMaxLineBytes
  bool after_cr_ = false;   // the last byte was '\r'
};

}  // namespace dtrain::launcher
