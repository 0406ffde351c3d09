// What a rank supervisor (dtrain-launch --rank-supervisor, one per rank) tells dtrain-launch over
// its TCP connection: one text line per message, fields separated by tabs.
//   hello    TOKEN RANK HOST PID   first, once: who this is (TOKEN: the job attempt's secret)
//   training                       the rank reached training (comm/launch_channel.h)
//   exit     HOW CODE STOPPED LINE the program ended (HOW: exited|signaled, STOPPED: 0|1)
// and what dtrain-launch tells a rank supervisor (it closes the connection when it no longer
// listens):
//   stop     SIGNAL                pass SIGNAL (its number) to the program: the job is to end
// Pure: encoding and decoding only.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/rank_exit.h"

namespace dtrain::launcher {

// The environment through which dtrain-launch tells each rank supervisor where it listens.
inline constexpr const char* kLaunchAddressesEnv = "DTRAIN_LAUNCH_ADDRESSES";  // "10.0.0.1:4711,10.1.0.1:4711"
inline constexpr const char* kLaunchTokenEnv = "DTRAIN_LAUNCH_TOKEN";

struct Hello {
  std::string token;
  int rank = -1;
  std::string host;
  long pid = 0;
  friend bool operator==(const Hello&, const Hello&) = default;
};

struct ChannelMessage {
  enum class Kind { kHello, kTraining, kExit, kStop };
  Kind kind = Kind::kTraining;
  Hello hello;    // kHello
  RankExit exit;  // kExit: how, code, stopped, last_line (rank and host come from the hello)
  int signal = 0;  // kStop
};

// Each returns one line, ending in '\n'. Tabs and line ends inside host names and the stderr
// line become spaces.
std::string encode_hello(const Hello& hello);
std::string encode_training();
std::string encode_exit(const RankExit& exit);
std::string encode_stop(int signal);

// One line without its '\n'; nullopt when it is not a message (a stray connection).
std::optional<ChannelMessage> decode_message(std::string_view line);

// "10.0.0.1:4711,127.0.0.1:4711" -> ({"10.0.0.1", 4711}, ...); malformed items are skipped.
struct TcpAddress {
  std::string ipv4;
  int port = 0;
  friend bool operator==(const TcpAddress&, const TcpAddress&) = default;
};
std::vector<TcpAddress> parse_addresses(std::string_view list);

}  // namespace dtrain::launcher

namespace dtrain::launcher {

// Bytes from a stream socket in, complete lines (without '\n') out. A line longer than
// kMaxLineBytes is cut (the rest until its '\n' is dropped), so a stray peer cannot grow it.
class LineSplitter {
 public:
  static constexpr size_t kMaxLineBytes = 4096;
  std::vector<std::string> feed(std::string_view bytes);

 private:
  std::string partial_;
  bool dropping_ = false;
};

}  // namespace dtrain::launcher
