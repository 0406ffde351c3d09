// safetensors: round trip of every dtype, the header PyTorch's loader expects, and rejection of
// every kind of malformed header with one line naming the file and the problem.
#include "checkpoint/safetensors.h"

#include <cstring>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../data/temp_dir.h"
#include "checkpoint/durable_file.h"
#include "core/error.h"

namespace dtrain::safetensors {
namespace {

using dtrain::testing::TempDir;

HostTensor bytes_tensor(std::string name, Dtype dtype, Shape shape, uint8_t seed) {
  const size_t n = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  std::shared_ptr<std::byte> data(new std::byte[n ? n : 1], std::default_delete<std::byte[]>());
  for (size_t i = 0; i < n; ++i) data.get()[i] = static_cast<std::byte>(seed + 7 * i);
  return {std::move(name), dtype, std::move(shape), std::move(data), n};
}

std::vector<HostTensor> every_dtype() {
  std::vector<HostTensor> t;
  t.push_back(bytes_tensor("a.u8", Dtype::kU8, {5}, 1));  // odd size first by name: alignment matters
  t.push_back(bytes_tensor("b.f32", Dtype::kF32, {2, 3}, 2));
  t.push_back(bytes_tensor("c.i32", Dtype::kI32, {4}, 3));
  t.push_back(bytes_tensor("d.i64", Dtype::kI64, {}, 4));
  t.push_back(bytes_tensor("e.bf16", Dtype::kBF16, {3, 1}, 5));
  t.push_back(bytes_tensor("f.f16", Dtype::kF16, {7}, 6));
  t.push_back(bytes_tensor("g.f64", Dtype::kF64, {2}, 7));
  t.push_back(bytes_tensor("h.empty", Dtype::kF32, {0, 4}, 8));
  t.push_back(bytes_tensor("i.bool", Dtype::kBool, {3}, 9));
  return t;
}

const Metadata kMetadata = {{"format", "pt"}, {"note", "h\xc3\xa9llo \"quoted\""}};

std::string read_bytes(const std::string& path) {
  checkpoint::FileBytes f = checkpoint::read_whole_file(path);
  return std::string(reinterpret_cast<const char*>(f.data.get()), f.size);
}

TEST(Safetensors, RoundTripsEveryDtypeShapeAndMetadata) {
  TempDir dir;
  const auto tensors = every_dtype();
  write_file(dir.file("t.safetensors"), refs(tensors), kMetadata);
  File file = read_file(dir.file("t.safetensors"));
  EXPECT_EQ(file.metadata(), kMetadata);
  ASSERT_EQ(file.header().tensors.size(), tensors.size());
  for (const HostTensor& t : tensors) {
    const TensorInfo& info = file.at(t.name);
    EXPECT_EQ(info.dtype, t.dtype) << t.name;
    EXPECT_EQ(info.shape, t.shape) << t.name;
    auto got = file.bytes(info);
    ASSERT_EQ(got.size(), t.nbytes) << t.name;
    EXPECT_EQ(std::memcmp(got.data(), t.data.get(), t.nbytes), 0) << t.name;
  }
  // What another rank rebuilds from rank 0's broadcast bytes is the same file.
  auto copy = std::make_unique<std::byte[]>(file.file_bytes().size());
  std::memcpy(copy.get(), file.file_bytes().data(), file.file_bytes().size());
  File rebuilt(std::move(copy), file.file_bytes().size(), "broadcast");
  EXPECT_EQ(rebuilt.metadata(), kMetadata);
  EXPECT_EQ(rebuilt.header().tensors.size(), tensors.size());
  EXPECT_EQ(file.i64_scalar("d.i64"), [&] {
    int64_t v;
    std::memcpy(&v, tensors[3].data.get(), 8);
    return v;
  }());
}

TEST(Safetensors, CoreTensorsRoundTripThroughCopyTo) {
  TempDir dir;
  Tensor w = Tensor::from_vector(std::vector<float>{1.5f, -2.f, 3.25f, 0.f, 1e-30f, -0.f}, {2, 3});
  write_file(dir.file("w.safetensors"), refs(std::vector<HostTensor>{host_copy("w", w)}));
  File file = read_file(dir.file("w.safetensors"));
  Tensor back = file.to_tensor("w");
  EXPECT_EQ(std::memcmp(back.raw(), w.raw(), w.nbytes()), 0);
  Tensor wrong = Tensor::zeros({3, 2});
  EXPECT_THROW(file.copy_to("w", wrong), Error);
}

// Every core dtype has a safetensors dtype and back (a U8 tensor, such as a mask, too).
TEST(Safetensors, EveryCoreDtypeMapsBothWays) {
  for (DType d : {DType::kF32, DType::kI32, DType::kBF16, DType::kF16, DType::kU8, DType::kI64}) {
    EXPECT_EQ(to_core(from_core(d)), d) << dtrain::dtype_name(d);
    EXPECT_EQ(dtype_size(from_core(d)), dtrain::dtype_size(d)) << dtrain::dtype_name(d);
  }
}

TEST(Safetensors, HeaderIsWhatPyTorchLoadersExpect) {
  // 8-byte little-endian length; JSON with sorted keys, space-padded so the data starts 8-aligned;
  // offsets tiling the data buffer exactly; each tensor aligned to its element size.
  TempDir dir;
  write_file(dir.file("t.safetensors"), refs(every_dtype()), kMetadata);
  const std::string raw = read_bytes(dir.file("t.safetensors"));
  ASSERT_GE(raw.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<uint8_t>(raw[i]);
  ASSERT_LE(8 + n, raw.size());
  EXPECT_EQ((8 + n) % 8, 0u) << "data must start 8-aligned";
  const std::string header = raw.substr(8, n);
  const size_t json_end = header.find_last_not_of(' ') + 1;
  EXPECT_EQ(header[json_end - 1], '}');
  EXPECT_LT(n - json_end, 8u) << "padding is at most 7 spaces";
  auto doc = nlohmann::ordered_json::parse(header);  // keeps the file's key order
  std::vector<std::string> keys;
  for (const auto& [k, v] : doc.items()) keys.push_back(k);
  EXPECT_TRUE(std::is_sorted(keys.begin(), keys.end()));
  const uint64_t data_bytes = raw.size() - 8 - n;
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const auto& [k, v] : doc.items()) {
    if (k == "__metadata__") continue;
    const auto begin = v["data_offsets"][0].get<uint64_t>(), end = v["data_offsets"][1].get<uint64_t>();
    spans.emplace_back(begin, end);
    EXPECT_EQ(begin % dtype_size(*parse_dtype(v["dtype"].get<std::string>())), 0u) << k << " is misaligned";
  }
  std::sort(spans.begin(), spans.end());
  uint64_t covered = 0;
  for (auto [begin, end] : spans) {
    EXPECT_EQ(begin, covered);
    covered = end;
  }
  EXPECT_EQ(covered, data_bytes) << "offsets must cover the data buffer exactly";
}

std::string file_bytes(const std::string& header, uint64_t data_bytes, std::optional<uint64_t> length = {}) {
  const uint64_t n = length.value_or(header.size());
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + header + std::string(data_bytes, '\x5a');
}

std::string parse_error(const std::string& bytes) {
  auto buffer = std::make_unique<std::byte[]>(bytes.size() + 1);
  std::memcpy(buffer.get(), bytes.data(), bytes.size());
  try {
    File f(std::move(buffer), bytes.size(), "bad.safetensors");
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(Safetensors, RejectsEachMalformedHeaderWithOneLine) {
  const std::string f32_3 = R"("dtype":"F32","shape":[3])";
  struct Case {
    const char* what;
    std::string bytes;
    const char* expect;
  } cases[] = {
      {"shorter than the length", std::string(5, '\0'), "too short"},
      {"length beyond the file", file_bytes("{}", 0, 1000), "exceeds the 2 bytes after it"},
      {"length absurd", file_bytes("{}", 0, uint64_t{1} << 62), "exceeds the limit"},
      {"not JSON", file_bytes(R"({"a": )", 0), "not valid JSON"},
      {"not an object", file_bytes("[1]", 0), "does not start with '{'"},
      {"bad UTF-8", file_bytes("{\"\xff\":{}}", 0), "not valid JSON"},
      {"unknown dtype", file_bytes(R"({"a":{"dtype":"F8","shape":[3],"data_offsets":[0,3]}})", 3), "unknown dtype 'F8'"},
      {"size vs offsets", file_bytes(R"({"a":{)" + f32_3 + R"(,"data_offsets":[0,8]}})", 8), "needs 12 bytes"},
      {"shape overflow",
       file_bytes(R"({"a":{"dtype":"F32","shape":[4611686018427387904,8],"data_offsets":[0,8]}})", 8),
       "more than 2^64"},
      {"negative dimension", file_bytes(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
       "not a list of sizes"},
      {"offsets out of range", file_bytes(R"({"a":{)" + f32_3 + R"(,"data_offsets":[4,16]}})", 8), "beyond the 8-byte"},
      {"begin after end", file_bytes(R"({"a":{)" + f32_3 + R"(,"data_offsets":[12,0]}})", 12), "begin after end"},
      {"overlapping",
       file_bytes(R"({"a":{)" + f32_3 + R"(,"data_offsets":[0,12]},"b":{)" + f32_3 + R"(,"data_offsets":[8,20]}})", 20),
       "'a' and 'b' overlap"},
      {"gap", file_bytes(R"({"a":{)" + f32_3 + R"(,"data_offsets":[4,16]}})", 16), "bytes [0, 4) of the data buffer"},
      {"trailing bytes", file_bytes(R"({"a":{)" + f32_3 + R"(,"data_offsets":[0,12]}})", 20), "8 trailing bytes"},
      {"duplicate names",
       file_bytes(R"({"a":{)" + f32_3 + R"(,"data_offsets":[0,12]},"a":{)" + f32_3 + R"(,"data_offsets":[12,24]}})", 24),
       "key 'a' twice"},
      {"metadata value", file_bytes(R"({"__metadata__":{"k":1}})", 0), "value of 'k' is not a string"},
      {"unknown field", file_bytes(R"({"a":{)" + f32_3 + R"(,"data_offsets":[0,12],"x":1}})", 12), "unknown field 'x'"},
      {"no offsets", file_bytes(R"({"a":{)" + f32_3 + R"(}})", 12), "no data_offsets"},
  };
  for (const Case& c : cases) {
    const std::string msg = parse_error(c.bytes);
    EXPECT_TRUE(msg.starts_with("bad.safetensors: ")) << c.what << ": " << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.what << ": " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << c.what << ": " << msg;
  }
}

TEST(Safetensors, ReadErrorsNameTheFile) {
  TempDir dir;
  try {
    read_file(dir.file("absent.safetensors"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "cannot open " + dir.file("absent.safetensors") + ": No such file or directory");
  }
}

TEST(Safetensors, LoadNamedNamesTheFirstMismatch) {
  TempDir dir;
  Tensor w = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}), b = Tensor::zeros({2});
  write_file(dir.file("m.safetensors"), refs(std::vector<HostTensor>{host_copy("0.weight", w), host_copy("0.bias", b)}));
  File file = read_file(dir.file("m.safetensors"));
  Tensor w2 = Tensor::zeros({2, 3}), b2 = Tensor::zeros({2});
  load_named(file, std::vector<NamedTarget>{{"0.weight", &w2}, {"0.bias", &b2}});
  EXPECT_EQ(w2.to_vector(), w.to_vector());
  auto error = [&](std::vector<NamedTarget> targets) {
    try {
      load_named(file, targets);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  Tensor wide = Tensor::zeros({2, 4});
  EXPECT_EQ(error({{"0.weight", &wide}, {"0.bias", &b2}}),
            dir.file("m.safetensors") + ": tensor '0.weight' is F32 [2, 3], expected F32 [2, 4]");
  EXPECT_EQ(error({{"0.weight", &w2}, {"1.bias", &b2}}),
            dir.file("m.safetensors") + ": no tensor '1.bias' (expected F32 [2])");
  EXPECT_EQ(error({{"0.weight", &w2}}), dir.file("m.safetensors") + ": unexpected tensor '0.bias' (F32 [2])");
}

TEST(Safetensors, WriterRejectsDuplicateNamesAndWrongSizes) {
  TempDir dir;
  std::vector<HostTensor> dup;
  dup.push_back(bytes_tensor("a", Dtype::kF32, {1}, 0));
  dup.push_back(bytes_tensor("a", Dtype::kF32, {1}, 0));
  EXPECT_THROW(write_file(dir.file("d.safetensors"), refs(dup)), Error);
  HostTensor short_one = bytes_tensor("s", Dtype::kF32, {2}, 0);
  short_one.nbytes = 4;
  EXPECT_THROW(write_file(dir.file("s.safetensors"), refs(std::vector<HostTensor>{short_one})), Error);
  EXPECT_FALSE(std::filesystem::exists(dir.file("d.safetensors")));
}

}  // namespace
}  // namespace dtrain::safetensors
