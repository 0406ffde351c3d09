// The rank supervisors' messages survive encoding (tabs and line ends inside fields included),
// strangers' lines are rejected, and lines are split from a byte stream however it arrives.
#include "launcher/channel_protocol.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace dtrain::launcher {
namespace {

std::string without_newline(std::string line) {
  EXPECT_EQ(line.back(), '\n');
  line.pop_back();
  return line;
}

TEST(ChannelProtocol, HelloRoundTrip) {
  const Hello hello{"abc-1", 7, "node\tB", 4242};
  const auto m = decode_message(without_newline(encode_hello(hello)));
  ASSERT_TRUE(m);
  EXPECT_EQ(m->kind, ChannelMessage::Kind::kHello);
  EXPECT_EQ(m->hello, (Hello{"abc-1", 7, "node B", 4242}));
}

TEST(ChannelProtocol, ExitRoundTripKeepsTheLastLine) {
  RankExit e{-1, "", RankExit::How::kSignaled, 9, true, "error:\tdisk\r\nfull"};
  const auto m = decode_message(without_newline(encode_exit(e)));
  ASSERT_TRUE(m);
  EXPECT_EQ(m->kind, ChannelMessage::Kind::kExit);
  EXPECT_EQ(m->exit.how, RankExit::How::kSignaled);
  EXPECT_EQ(m->exit.code, 9);
  EXPECT_TRUE(m->exit.stopped);
  EXPECT_EQ(m->exit.last_line, "error: disk  full");
  const auto exited = decode_message(without_newline(encode_exit({-1, "", RankExit::How::kExited, 3, false, ""})));
  ASSERT_TRUE(exited);
  EXPECT_EQ(exited->exit.how, RankExit::How::kExited);
  EXPECT_EQ(exited->exit.code, 3);
  EXPECT_FALSE(exited->exit.stopped);
}

TEST(ChannelProtocol, Training) {
  const auto m = decode_message(without_newline(encode_training()));
  ASSERT_TRUE(m);
  EXPECT_EQ(m->kind, ChannelMessage::Kind::kTraining);
}

TEST(ChannelProtocol, StopRoundTrip) {
  const auto m = decode_message(without_newline(encode_stop(15)));
  ASSERT_TRUE(m);
  EXPECT_EQ(m->kind, ChannelMessage::Kind::kStop);
  EXPECT_EQ(m->signal, 15);
}

TEST(ChannelProtocol, StrangersAreRejected) {
  for (std::string_view line : {"", "GET / HTTP/1.1", "hello\tt\tx\th\t1", "hello\tt\t-1\th\t1", "hello\tt\t1\th",
                                "exit\tcrashed\t1\t0\t", "exit\texited\t1\t2\t", "training\textra",
                                "stop", "stop\t0", "stop\tTERM", "stop\t15\t1"})
    EXPECT_FALSE(decode_message(line)) << line;
}

TEST(LineSplitter, LinesAcrossChunks) {
  LineSplitter s;
  EXPECT_THAT(s.feed("hel"), ::testing::IsEmpty());
  EXPECT_THAT(s.feed("lo\ntrain"), ::testing::ElementsAre("hello"));
  EXPECT_THAT(s.feed("ing\n\nx"), ::testing::ElementsAre("training", ""));
}

TEST(LineSplitter, AnEndlessLineIsCutNotKept) {
  LineSplitter s;
  const auto lines = s.feed(std::string(LineSplitter::kMaxLineBytes * 3, 'x') + "\nnext\n");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].size(), LineSplitter::kMaxLineBytes);
  EXPECT_EQ(lines[1], "next");
}

TEST(ChannelProtocol, Addresses) {
  EXPECT_THAT(parse_addresses("10.0.0.1:4711,127.0.0.1:80"),
              ::testing::ElementsAre(TcpAddress{"10.0.0.1", 4711}, TcpAddress{"127.0.0.1", 80}));
  EXPECT_THAT(parse_addresses("nope,:1,1.2.3.4:0,1.2.3.4:70000,5.6.7.8:9"), ::testing::ElementsAre(TcpAddress{"5.6.7.8", 9}));
  EXPECT_THAT(parse_addresses(""), ::testing::IsEmpty());
}

}  // namespace
}  // namespace dtrain::launcher
