// NumPy data: .npy headers of versions 1 to 3, .npz archives stored and deflated (written here by
// hand, as numpy writes them), NpyDataset's shapes, dtypes and normalisation, and one line naming
// the file and the field for every malformed case the README lists.
#include "data/npy.h"

#include <zlib.h>

#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "data/labels.h"
#include "data/npy_dataset.h"
#include "error_of.h"
#include "temp_dir.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;
using testing::error_of;
using testing::TempDir;

void put(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

template <class T>
std::vector<uint8_t> raw(const std::vector<T>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// A .npy file with `dict` as its header verbatim (padded as numpy pads), format `version`.
std::vector<uint8_t> npy_with_header(std::string dict, const std::vector<uint8_t>& data, int version = 1) {
  const size_t prefix = version == 1 ? 10 : 12;
  dict.append((prefix + dict.size() + 1 + 63) / 64 * 64 - prefix - dict.size() - 1, ' ');
  dict += '\n';
  std::vector<uint8_t> out = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<uint8_t>(version), 0};
  const auto n = static_cast<uint32_t>(dict.size());
  for (size_t i = 0; i < prefix - 8; ++i) out.push_back(static_cast<uint8_t>(n >> (8 * i)));
  out.insert(out.end(), dict.begin(), dict.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

void le(std::vector<uint8_t>& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

struct Member {
  std::string name;
  std::vector<uint8_t> bytes;
};

// A zip archive of `members` as np.savez (stored) or np.savez_compressed (deflated) writes one,
// with `pad` bytes of extra field in each local header (so members start unaligned).
std::vector<uint8_t> zip_of(const std::vector<Member>& members, bool deflated, size_t pad = 3) {
  std::vector<uint8_t> out, cd;
  for (const Member& m : members) {
    std::vector<uint8_t> body = m.bytes;
    if (deflated) {
      z_stream z{};
      deflateInit2(&z, 6, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY);
      body.resize(deflateBound(&z, m.bytes.size()));
      z.next_in = const_cast<Bytef*>(m.bytes.data());
      z.avail_in = static_cast<uInt>(m.bytes.size());
      z.next_out = body.data();
      z.avail_out = static_cast<uInt>(body.size());
      deflate(&z, Z_FINISH);
      body.resize(z.total_out);
      deflateEnd(&z);
    }
    const uint32_t crc = static_cast<uint32_t>(crc32(0, m.bytes.data(), static_cast<uInt>(m.bytes.size())));
    // The fields the local header and the central directory share: flags, method, time, CRC,
    // sizes, name length.
    const auto shared = [&](std::vector<uint8_t>& v) {
      for (auto [value, bytes] : {std::pair<uint64_t, int>{0, 2}, {deflated ? 8 : 0, 2}, {0, 4}, {crc, 4},
                                  {body.size(), 4}, {m.bytes.size(), 4}, {m.name.size(), 2}})
        le(v, value, bytes);
    };
    const size_t offset = out.size();
    le(out, 0x04034b50, 4);
    le(out, 20, 2);  // version needed
    shared(out);
    le(out, pad, 2);  // extra field length
    out.insert(out.end(), m.name.begin(), m.name.end());
    out.insert(out.end(), pad, 0);
    out.insert(out.end(), body.begin(), body.end());
    le(cd, 0x02014b50, 4);
    le(cd, 20, 2);  // version made by
    le(cd, 20, 2);  // version needed
    shared(cd);
    for (int bytes : {2, 2, 2, 2, 4}) le(cd, 0, bytes);  // extra, comment, disk, internal, external
    le(cd, offset, 4);
    cd.insert(cd.end(), m.name.begin(), m.name.end());
  }
  const size_t cd_offset = out.size();
  out.insert(out.end(), cd.begin(), cd.end());
  le(out, 0x06054b50, 4);
  le(out, 0, 4);
  le(out, members.size(), 2);
  le(out, members.size(), 2);
  le(out, cd.size(), 4);
  le(out, cd_offset, 4);
  le(out, 0, 2);
  return out;
}

constexpr int64_t kN = 6, kH = 2, kW = 3;

std::vector<uint8_t> pixels(int64_t n = kN) {
  std::vector<uint8_t> v(static_cast<size_t>(n * kH * kW));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>((i * 53 + 7) % 256);
  return v;
}

std::vector<int64_t> labels(int64_t n = kN) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>(i % 3);
  return v;
}

// DIR/{train,test}_{x,y}.npy: uint8 x [N, H, W] and int64 y.
void write_npy_split(const TempDir& dir, const std::string& split, int64_t n = kN) {
  put(dir.file(split + "_x.npy"), npy_bytes("|u1", {n, kH, kW}, pixels(n)));
  put(dir.file(split + "_y.npy"), npy_bytes("<i8", {n}, raw(labels(n))));
}

std::string load_error(const TempDir& dir, int num_classes = 0) {
  auto [message, kind] = error_of([&] { load_npy_splits(dir.path().string(), {}, 0, 0, num_classes); });
  EXPECT_EQ(kind, ErrorKind::kData) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  return message;
}

std::string open_error(const std::vector<uint8_t>& bytes) {
  TempDir dir;
  put(dir.file("a.npy"), bytes);
  auto [message, kind] = error_of([&] { open_npy(dir.file("a.npy")); });
  EXPECT_EQ(kind, ErrorKind::kData) << message;
  EXPECT_THAT(message, HasSubstr(dir.file("a.npy") + ": "));
  return message.substr(dir.file("a.npy").size() + 2);
}

TEST(Npy, FormatVersions1To3ReadAlike) {
  const std::vector<float> v = {1.5f, -2.f, 3.25f, 0.f, 7.f, 8.f};
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  for (int version : {1, 2, 3}) {
    TempDir dir;
    put(dir.file("a.npy"), npy_with_header(dict, raw(v), version));
    const NpyArray a = open_npy(dir.file("a.npy"));
    EXPECT_EQ(a.type(), NpyType::kF32);
    EXPECT_EQ(a.shape(), (std::vector<int64_t>{2, 3}));
    std::vector<float> got(6);
    std::memcpy(got.data(), a.data(), 24);
    EXPECT_EQ(got, v) << "version " << version;
  }
  EXPECT_EQ(open_error(npy_with_header(dict, raw(v), 4)), ".npy format version 4.0 is not supported (1.0, 2.0 or 3.0)");
}

TEST(Npy, HeadersAsWrittenByHandOrOldNumpy) {
  TempDir dir;
  // Keys in another order, double quotes, no trailing comma, a 1-tuple, Python 2's long.
  put(dir.file("a.npy"),
      npy_with_header("{\"shape\": (4L,), \"fortran_order\": False, \"descr\": \"|u1\"}", {1, 2, 3, 4}));
  const NpyArray a = open_npy(dir.file("a.npy"));
  EXPECT_EQ(a.shape(), std::vector<int64_t>{4});
  EXPECT_EQ(a.type(), NpyType::kU8);
  put(dir.file("s.npy"), npy_with_header("{'descr': '<i4', 'fortran_order': False, 'shape': ()}", raw(std::vector<int32_t>{9})));
  EXPECT_EQ(open_npy(dir.file("s.npy")).numel(), 1);
}

TEST(Npy, BadMagic) {
  std::vector<uint8_t> b = npy_bytes("|u1", {2}, std::vector<uint8_t>{1, 2});
  b[1] = 'X';
  EXPECT_EQ(open_error(b), "not a .npy file (bad magic: expected \\x93NUMPY)");
  EXPECT_EQ(open_error({}), "not a .npy file (bad magic: expected \\x93NUMPY)");
  b[1] = 'N';
  b.resize(9);  // the magic intact, the file cut in the header length
  EXPECT_EQ(open_error(b), "truncated: 9 bytes, shorter than a .npy header's prefix");
}

TEST(Npy, HeaderThatIsNotADictLiteral) {
  const std::vector<uint8_t> d = {1, 2};
  EXPECT_THAT(open_error(npy_with_header("descr=<u1 shape=2", d)), HasSubstr("header is not a dict literal: expected '{'"));
  EXPECT_THAT(open_error(npy_with_header("{'descr': '|u1', 'fortran_order': False, 'shape': (2,)", d)),
              HasSubstr("header is not a dict literal: expected ',' or '}'"));
  EXPECT_THAT(open_error(npy_with_header("{'descr': '|u1', 'fortran_order': False, 'shape': (2, x)}", d)),
              HasSubstr("header is not a dict literal: expected a non-negative integer"));
  EXPECT_THAT(open_error(npy_with_header("{'descr': '|u1', 'shape': (2,)}", d)), HasSubstr("header has no field 'fortran_order'"));
  EXPECT_THAT(open_error(npy_with_header("{'descr': '|u1', 'fortran_order': False, 'shape': (2,), 'x': 1}", d)),
              HasSubstr("header has an unexpected field 'x'"));
  EXPECT_THAT(open_error(npy_with_header("{'descr': '|u1', 'fortran_order': 0, 'shape': (2,)}", d)),
              HasSubstr("header field 'fortran_order' is not True or False"));
  EXPECT_THAT(open_error(npy_with_header("{'descr': '|u1', 'fortran_order': False, 'shape': [2]}", d)),
              HasSubstr("header field 'shape' is not a tuple of integers"));
  std::vector<uint8_t> long_header = npy_bytes("|u1", {2}, d);
  long_header[8] = 0xff;
  long_header[9] = 0xff;
  EXPECT_THAT(open_error(long_header), HasSubstr("header length 65535 runs past the end of the file"));
}

TEST(Npy, UnsupportedDtypes) {
  const std::vector<uint8_t> d(16);
  const auto with_descr = [&](const std::string& descr) {
    return open_error(npy_with_header("{'descr': " + descr + ", 'fortran_order': False, 'shape': (2,)}", d));
  };
  EXPECT_EQ(with_descr("'|O'"), "header field 'descr' is '|O': an object array (pickled Python objects) is not "
                                "supported; save a numeric array");
  EXPECT_THAT(with_descr("'<c16'"), HasSubstr("header field 'descr' is '<c16': not a supported dtype"));
  EXPECT_THAT(with_descr("'<U8'"), HasSubstr("header field 'descr' is '<U8': not a supported dtype"));
  EXPECT_THAT(with_descr("'>f8'"), HasSubstr("header field 'descr' is '>f8': big-endian data is not supported"));
  EXPECT_THAT(with_descr("[('a', '<f8')]"), HasSubstr("header field 'descr' is [('a', '<f8')]: structured dtypes"));
}

TEST(Npy, FortranOrderRefused) {
  EXPECT_THAT(open_error(npy_with_header("{'descr': '|u1', 'fortran_order': True, 'shape': (2, 2)}", {1, 2, 3, 4})),
              HasSubstr("header field 'fortran_order' is True: only C-order arrays are supported"));
}

TEST(Npy, ShapeThatDisagreesWithTheFileSize) {
  EXPECT_EQ(open_error(npy_bytes("<f4", {2, 3}, std::vector<uint8_t>(20))),
            "header field 'shape' (2, 3) of float32 makes 24 bytes, but 20 bytes follow the header");
  EXPECT_EQ(open_error(npy_bytes("|u1", {3}, std::vector<uint8_t>(4))),
            "header field 'shape' (3,) of uint8 makes 3 bytes, but 4 bytes follow the header");
  EXPECT_THAT(open_error(npy_bytes("<f8", {1 << 30, 1 << 30}, {})), HasSubstr("is implausibly large"));
}

TEST(Npy, NotARegularFile) {
  TempDir dir;
  EXPECT_THAT(error_of([&] { open_npy(dir.path().string()); }).first, HasSubstr(": not a regular file"));
  EXPECT_THAT(error_of([&] { open_npy(dir.file("none.npy")); }).first, HasSubstr(": cannot open: No such file"));
}

TEST(Npz, StoredAndDeflatedMembersReadAlike) {
  const std::vector<uint8_t> x = npy_bytes("<f4", {2, 2}, raw(std::vector<float>{1.f, 2.f, 3.f, 4.f}));
  const std::vector<uint8_t> y = npy_bytes("<i8", {2}, raw(std::vector<int64_t>{1, 0}));
  for (bool deflate : {false, true}) {
    TempDir dir;
    put(dir.file("a.npz"), zip_of({{"y.npy", y}, {"x.npy", x}}, deflate));
    const std::vector<NpyArray> a = open_npz(dir.file("a.npz"), {"x", "y"});
    ASSERT_EQ(a.size(), 2u);
    EXPECT_EQ(a[0].name(), dir.file("a.npz") + ": x");
    EXPECT_EQ(a[0].shape(), (std::vector<int64_t>{2, 2}));
    float v[4];
    std::memcpy(v, a[0].data(), sizeof v);
    EXPECT_EQ(v[3], 4.f);
    int64_t l[2];
    std::memcpy(l, a[1].data(), sizeof l);
    EXPECT_EQ(l[0], 1);
    EXPECT_EQ(l[1], 0);
  }
}

TEST(Npz, MalformedArchives) {
  TempDir dir;
  const std::string p = dir.file("a.npz");
  const auto err = [&](const std::vector<uint8_t>& bytes, const std::vector<std::string>& names = {"x"}) {
    put(p, bytes);
    auto [message, kind] = error_of([&] { open_npz(p, names); });
    EXPECT_EQ(kind, ErrorKind::kData) << message;
    return message;
  };
  const std::vector<uint8_t> x = npy_bytes("|u1", {2}, std::vector<uint8_t>{1, 2});
  EXPECT_EQ(err({1, 2, 3}), p + ": not a .npz (zip) archive: too short");
  EXPECT_EQ(err(std::vector<uint8_t>(100, 7)), p + ": not a .npz (zip) archive: no end-of-central-directory record");
  EXPECT_EQ(err(zip_of({{"a.npy", x}, {"b.npy", x}}, false)),
            p + ": no array 'x' (the archive holds: a, b; save with np.savez(path, x=..., y=...))");
  std::vector<uint8_t> bad_crc = zip_of({{"x.npy", x}}, false, 0);
  bad_crc[30 + 5 + x.size() - 1] ^= 1;  // the member's last byte
  EXPECT_THAT(err(bad_crc), HasSubstr(p + ": x: damaged archive: CRC-32"));
  std::vector<uint8_t> method = zip_of({{"x.npy", x}}, false, 0);
  method[8] = 12;  // bzip2, in the local header
  const size_t cd = 30 + 5 + x.size();
  method[cd + 10] = 12;  // and in the central directory
  EXPECT_THAT(err(method), HasSubstr(p + ": x: compression method 12 is not supported"));
  std::vector<uint8_t> inner = zip_of({{"x.npy", npy_bytes("|u1", {3}, std::vector<uint8_t>{1, 2})}}, true);
  EXPECT_EQ(err(inner), p + ": x: header field 'shape' (3,) of uint8 makes 3 bytes, but 2 bytes follow the header");
}

// Random damage to good files (a byte set to a random value, 1 to 4 times; or the file cut short):
// every outcome is an array or one Error line, never a crash or a read outside the file (the
// ASan build checks the latter).
TEST(Npz, DamagedFilesAreOneLineOrRead) {
  TempDir dir;
  const std::vector<uint8_t> x = npy_bytes("|u1", {4, 3}, pixels(2));
  const std::vector<uint8_t> y = npy_bytes("<i8", {4}, raw(labels(4)));
  const std::vector<std::vector<uint8_t>> good = {x, zip_of({{"x.npy", x}, {"y.npy", y}}, false),
                                                  zip_of({{"x.npy", x}, {"y.npy", y}}, true)};
  uint32_t state = 12345;
  const auto next = [&] { return state = state * 1664525u + 1013904223u; };
  int errors = 0;
  for (int round = 0; round < 3000; ++round) {
    const size_t which = round % 3;
    std::vector<uint8_t> bytes = good[which];
    if (next() % 8 == 0) {
      bytes.resize(next() % bytes.size());
    } else {
      for (uint32_t k = 0, n = 1 + next() % 4; k < n; ++k) bytes[next() % bytes.size()] = static_cast<uint8_t>(next());
    }
    const std::string path = dir.file(which == 0 ? "a.npy" : "a.npz");
    put(path, bytes);
    try {
      if (which == 0)
        open_npy(path);
      else
        open_npz(path, {"x", "y"});
    } catch (const Error& e) {
      ++errors;
      EXPECT_EQ(e.kind(), ErrorKind::kData) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).rfind(path, 0), 0u) << e.what();
    }
  }
  EXPECT_GT(errors, 1000);  // most damage is noticed (the rest hit pixels or padding)
}

TEST(NpyDataset, ShapesFromTheArrays) {
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{kN, kH * kW}, std::vector<int64_t>{kN, kH, kW}, std::vector<int64_t>{kN, 1, kH, kW}}) {
    TempDir dir;
    for (const std::string split : {"train", "test"}) {
      put(dir.file(split + "_x.npy"), npy_bytes("|u1", shape, pixels()));
      put(dir.file(split + "_y.npy"), npy_bytes("<i8", {kN}, raw(labels())));
    }
    const DatasetSplits s = load_npy_splits(dir.path().string());
    const Shape want = shape.size() == 2 ? Shape{kH * kW} : Shape{1, kH, kW};
    EXPECT_EQ(s.train->sample_shape(), want);
    EXPECT_EQ(s.train->num_classes(), 3);
    EXPECT_EQ(s.test->size(), kN);
  }
}

TEST(NpyDataset, BytesScaleAsIdxPixelsAndFloatsStayAsTheyAre) {
  TempDir dir, floats;
  write_npy_split(dir, "train");
  write_npy_split(dir, "test");
  const Normalize norm{0.25f, 0.5f};
  const DatasetSplits s = load_npy_splits(dir.path().string(), norm);
  const std::vector<uint8_t> px = pixels();
  std::vector<float> got(kH * kW), want(kH * kW);
  EXPECT_EQ(s.train->get(4, got.data()), 1);
  normalize_pixels(px.data() + 4 * kH * kW, want.data(), kH * kW, norm.mean, norm.std);
  EXPECT_EQ(got, want);
  std::vector<float> fx(static_cast<size_t>(kN * kH * kW));
  for (size_t i = 0; i < fx.size(); ++i) fx[i] = static_cast<float>(i) * 0.37f - 1.f;
  for (const std::string split : {"train", "test"}) {
    put(floats.file(split + "_x.npy"), npy_bytes("<f4", {kN, kH, kW}, raw(fx)));
    put(floats.file(split + "_y.npy"), npy_bytes("|u1", {kN}, std::vector<uint8_t>{0, 1, 2, 3, 4, 5}));
  }
  const DatasetSplits f = load_npy_splits(floats.path().string(), {}, 3);
  EXPECT_EQ(f.train->size(), 3);
  EXPECT_EQ(f.train->num_classes(), 6);
  EXPECT_EQ(f.train->get(2, got.data()), 2);
  EXPECT_EQ(got, std::vector<float>(fx.begin() + 2 * kH * kW, fx.begin() + 3 * kH * kW));
}

TEST(NpyDataset, AnArchiveServesAsWellAsTwoFiles) {
  TempDir dir;
  const std::vector<uint8_t> x = npy_bytes("|u1", {kN, kH, kW}, pixels());
  const std::vector<uint8_t> y = npy_bytes("<i4", {kN}, raw(std::vector<int32_t>{2, 1, 0, 2, 1, 0}));
  put(dir.file("train.npz"), zip_of({{"x.npy", x}, {"y.npy", y}}, false));
  put(dir.file("test.npz"), zip_of({{"x.npy", x}, {"y.npy", y}}, true));
  const DatasetSplits s = load_npy_splits(dir.path().string());
  std::vector<float> a(kH * kW), b(kH * kW);
  EXPECT_EQ(s.train->get(1, a.data()), 1);
  EXPECT_EQ(s.test->get(1, b.data()), 1);
  EXPECT_EQ(a, b);
  write_npy_split(dir, "train");
  EXPECT_EQ(load_error(dir), dir.path().string() + ": both train.npz and train_x.npy hold the train split: keep one");
}

TEST(NpyDataset, LabelsOutOfRange) {
  TempDir dir;
  write_npy_split(dir, "train");
  write_npy_split(dir, "test");
  put(dir.file("train_y.npy"), npy_bytes("<i8", {kN}, raw(std::vector<int64_t>{0, 1, -1, 2, 0, 1})));
  EXPECT_EQ(load_error(dir), dir.file("train_y.npy") + ": label -1 of sample 2 is out of range (labels are 0 to classes - 1)");
  put(dir.file("train_y.npy"), npy_bytes("<u8", {kN}, raw(std::vector<uint64_t>{0, 1, 2, 0, 1, ~uint64_t{0}})));
  EXPECT_THAT(load_error(dir), HasSubstr(": label 18446744073709551615 of sample 5 is out of range"));
  put(dir.file("train_y.npy"), npy_bytes("<i8", {kN}, raw(std::vector<int64_t>{0, 1, 2, 0, 1, 2})));
  EXPECT_EQ(load_error(dir, 2), dir.file("train_y.npy") + ": label 2 of sample 2 is not one of the 2 classes asked for (0 to 1)");
  put(dir.file("train_y.npy"), npy_bytes("<i8", {kN}, raw(std::vector<int64_t>{0, 1, 900, 0, 1, 1})));
  EXPECT_THAT(load_error(dir), HasSubstr(": label 900 of sample 2 is far outside the other labels (0 to 1)"));
  put(dir.file("train_y.npy"), npy_bytes("<i8", {kN}, raw(std::vector<int64_t>{0, 1, 1, 0, 1, 1})));
  EXPECT_EQ(load_error(dir), dir.file("test_y.npy") + ": label 2 of sample 2 is not one of the 2 classes of " +
                                 dir.file("train_y.npy") + " (labels 0 to 1)");
}

TEST(NpyDataset, XAndYOfDifferentLengths) {
  TempDir dir;
  write_npy_split(dir, "train");
  write_npy_split(dir, "test");
  put(dir.file("test_y.npy"), npy_bytes("<i8", {kN - 1}, raw(labels(kN - 1))));
  EXPECT_EQ(load_error(dir), dir.file("test_x.npy") + ": 6 samples, but " + dir.file("test_y.npy") + " has 5 labels");
}

TEST(NpyDataset, ArraysOfTheWrongKind) {
  TempDir dir;
  write_npy_split(dir, "train");
  write_npy_split(dir, "test");
  put(dir.file("train_x.npy"), npy_bytes("<f8", {kN, kH, kW}, std::vector<uint8_t>(8 * kN * kH * kW)));
  EXPECT_EQ(load_error(dir), dir.file("train_x.npy") + ": dtype float64 is not supported for x: uint8 (scaled by "
                                                       "1/255) or float32 (convert with x.astype(np.float32))");
  put(dir.file("train_x.npy"), npy_bytes("|u1", {kN * kH * kW}, pixels()));
  EXPECT_EQ(load_error(dir), dir.file("train_x.npy") + ": shape [36]: x must be [N, C, H, W], [N, H, W] or [N, D]");
  write_npy_split(dir, "train");
  put(dir.file("train_y.npy"), npy_bytes("<f4", {kN}, std::vector<uint8_t>(4 * kN)));
  EXPECT_THAT(load_error(dir), HasSubstr("train_y.npy: dtype float32 is not supported for y: integer class labels"));
  put(dir.file("train_y.npy"), npy_bytes("<i8", {kN, 1}, raw(labels())));
  EXPECT_THAT(load_error(dir), HasSubstr("train_y.npy: shape [6, 1]: y must be [N], one integer label per sample"));
  write_npy_split(dir, "train");
  put(dir.file("test_x.npy"), npy_bytes("|u1", {kN, kW, kH}, pixels()));
  EXPECT_EQ(load_error(dir), dir.file("test_x.npy") + ": samples of shape [1, 3, 2], but " + dir.file("train_x.npy") +
                                 " has samples of shape [1, 2, 3]");
  std::filesystem::remove(dir.file("test_y.npy"));
  EXPECT_THAT(load_error(dir), HasSubstr(": missing test_y.npy (NumPy data: test.npz with arrays x and y, or "));
}

// A NaN or an infinity in float32 x is bad data at load, naming the file and the sample, not a
// diverged loss steps into training.
TEST(NpyDataset, NonFiniteFloatsInX) {
  TempDir dir;
  write_npy_split(dir, "train");
  write_npy_split(dir, "test");
  std::vector<float> fx(static_cast<size_t>(kN * kH * kW), 0.5f);
  fx[4 * kH * kW + 1] = std::numeric_limits<float>::quiet_NaN();
  put(dir.file("train_x.npy"), npy_bytes("<f4", {kN, kH, kW}, raw(fx)));
  put(dir.file("test_x.npy"), npy_bytes("<f4", {kN, kH, kW}, raw(std::vector<float>(fx.size(), 0.5f))));
  EXPECT_EQ(load_error(dir), dir.file("train_x.npy") + ": sample 4 holds nan (element 1 of the sample): x must be finite");
  fx[4 * kH * kW + 1] = 0.f;
  fx[kN * kH * kW - 1] = -std::numeric_limits<float>::infinity();
  const std::vector<uint8_t> x = npy_bytes("<f4", {kN, kH, kW}, raw(fx));
  const std::vector<uint8_t> y = npy_bytes("<i8", {kN}, raw(labels()));
  std::filesystem::remove(dir.file("train_x.npy"));
  std::filesystem::remove(dir.file("train_y.npy"));
  put(dir.file("train.npz"), zip_of({{"x.npy", x}, {"y.npy", y}}, false));  // x unaligned in the archive
  EXPECT_EQ(load_error(dir), dir.file("train.npz") + ": x: sample 5 holds -inf (element 5 of the sample): x must be finite");
}

// NumPy labels reach INT32_MAX (IDX labels are bytes): the class count is formed in 64 bits and
// bounded by what a model may have, instead of overflowing or building a billion-wide layer.
TEST(Labels, ALabelPastTheClassBoundIsOneLine) {
  const std::vector<int32_t> huge{0, 2147483647};
  EXPECT_THAT(error_of([&] { training_classes(huge, "y.npy", 0); }).first,
              HasSubstr("y.npy: label 2147483647 of sample 1"));
  const std::vector<int32_t> wide{1000000000, 1000000001};
  EXPECT_THAT(error_of([&] { training_classes(wide, "y.npy", 0); }).first,
              HasSubstr("more than a model may have (1000000)"));
  const std::vector<int32_t> alone{2147483647};
  EXPECT_THAT(error_of([&] { training_classes(alone, "y.npy", 0); }).first,
              HasSubstr("would make 2147483648 classes"));
  const std::vector<int32_t> fine{0, 999999};
  EXPECT_THAT(error_of([&] { training_classes(fine, "y.npy", 0); }).first,
              HasSubstr("far outside"));
  const std::vector<int32_t> last{999998, 999999};
  EXPECT_EQ(training_classes(last, "y.npy", 0), 1000000);
}

}  // namespace
}  // namespace dtrain
