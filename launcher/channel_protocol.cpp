// Encoding and decoding of the rank supervisors' messages.
#include "launcher/channel_protocol.h"

#include <charconv>
#include <vector>

#include <fmt/format.h>

namespace dtrain::launcher {

namespace {

std::string field(std::string_view text) {
  std::string out(text);
  for (char& c : out) {
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  }
  return out;
}

std::vector<std::string_view> split_tabs(std::string_view line, size_t max_fields) {
  std::vector<std::string_view> fields;
  while (fields.size() + 1 < max_fields) {
    const size_t tab = line.find('\t');
    if (tab == std::string_view::npos) break;
    fields.push_back(line.substr(0, tab));
    line.remove_prefix(tab + 1);
  }
  fields.push_back(line);  // the last field keeps any further tabs
  return fields;
}

template <typename T>
bool parse_number(std::string_view text, T& value) {
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  return !text.empty() && ec == std::errc() && ptr == text.data() + text.size();
}

}  // namespace

std::string encode_hello(const Hello& h) {
  return fmt::format("hello\t{}\t{}\t{}\t{}\n", field(h.token), h.rank, field(h.host), h.pid);
}

std::string encode_training() { return "training\n"; }

std::string encode_exit(const RankExit& e) {
  const char* how = e.how == RankExit::How::kSignaled ? "signaled" : "exited";
  return fmt::format("exit\t{}\t{}\t{}\t{}\n", how, e.code, e.stopped ? 1 : 0, field(e.last_line));
}

std::string encode_stop(int signal) { return fmt::format("stop\t{}\n", signal); }

std::optional<ChannelMessage> decode_message(std::string_view line) {
  const std::vector<std::string_view> f = split_tabs(line, 5);
  ChannelMessage m;
  if (f[0] == "training" && f.size() == 1) {
    m.kind = ChannelMessage::Kind::kTraining;
    return m;
  }
  if (f[0] == "hello" && f.size() == 5) {
    m.kind = ChannelMessage::Kind::kHello;
    m.hello.token = std::string(f[1]);
    m.hello.host = std::string(f[3]);
    if (!parse_number(f[2], m.hello.rank) || m.hello.rank < 0 || !parse_number(f[4], m.hello.pid)) return std::nullopt;
    return m;
  }
  if (f[0] == "exit" && f.size() == 5) {
    m.kind = ChannelMessage::Kind::kExit;
    if (f[1] == "signaled") {
      m.exit.how = RankExit::How::kSignaled;
    } else if (f[1] != "exited") {
      return std::nullopt;
    }
    if (!parse_number(f[2], m.exit.code) || (f[3] != "0" && f[3] != "1")) return std::nullopt;
    m.exit.stopped = f[3] == "1";
    m.exit.last_line = std::string(f[4]);
    return m;
  }
  if (f[0] == "stop" && f.size() == 2) {
    m.kind = ChannelMessage::Kind::kStop;
    if (!parse_number(f[1], m.signal) || m.signal <= 0) return std::nullopt;
    return m;
  }
  return std::nullopt;
}

std::vector<TcpAddress> parse_addresses(std::string_view list) {
  std::vector<TcpAddress> addresses;
  while (!list.empty()) {
    const size_t comma = list.find(',');
    const std::string_view item = list.substr(0, comma);
    const size_t colon = item.rfind(':');
    TcpAddress a;
    if (colon != std::string_view::npos && colon > 0 && parse_number(item.substr(colon + 1), a.port) && a.port > 0 &&
        a.port < 65536) {
      a.ipv4 = std::string(item.substr(0, colon));
      addresses.push_back(std::move(a));
    }
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return addresses;
}

}  // namespace dtrain::launcher

namespace dtrain::launcher {

std::vector<std::string> LineSplitter::feed(std::string_view bytes) {
  std::vector<std::string> lines;
  for (char c : bytes) {
    if (c == '\n') {
      if (!dropping_) lines.push_back(std::move(partial_));
      partial_.clear();
      dropping_ = false;
    } else if (dropping_) {
      continue;
    } else if (partial_.size() < kMaxLineBytes) {
      partial_ += c;
    } else {
      lines.push_back(std::move(partial_));  // cut here; drop the rest of this line
      partial_.clear();
      dropping_ = true;
    }
  }
  return lines;
}

}  // namespace dtrain::launcher
