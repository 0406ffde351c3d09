// The `dtrain` binary as a user meets it: wrong flags exit 2 with one line on stderr, a corrupt
// data file exits non-zero with one line naming the file, --help exits 0.
#include <algorithm>
#include <array>
#include <cstdio>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <cstdlib>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "data/npy.h"

namespace {

struct CliRun {
  int status;
  std::string output;  // stdout + stderr
  std::string errors;  // stderr alone
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// This build's dtrain, or DTRAIN_CLI_BINARY (e.g. an older build, to see a test fail there).
std::string dtrain_binary() {
  const char* other = std::getenv("DTRAIN_CLI_BINARY");
  return other && *other ? other : std::string(DTRAIN_BINARY_DIR) + "/app/dtrain";
}

// `prefix` goes before the binary: a command that runs it (timeout, setpriv).
CliRun run_dtrain(const std::string& args, const std::string& prefix = "") {
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);  // CI runs as root; Open MPI refuses root without these
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  // A file of this process's own: CTest runs the other DtrainCli cases (other processes) at once.
  static int calls = 0;
  const std::string err_path = (std::filesystem::temp_directory_path() /
                                ("dtrain_cli_stderr." + std::to_string(getpid()) + "." + std::to_string(++calls)))
                                   .string();
  // stderr goes to the output stream too (as a terminal shows both) and, through tee, to a file.
  const std::string cmd = "{ " + prefix + dtrain_binary() + " " + args + " 2>&1 1>&3 | tee " + err_path + "; } 3>&1 2>&1";
  CliRun r{-1, "", ""};
  FILE* pipe = popen(("bash -c 'set -o pipefail; " + cmd + "'").c_str(), "r");
  if (!pipe) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  int status = pclose(pipe);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.errors = read_file(err_path);
  std::filesystem::remove(err_path);
  return r;
}

std::string as_text(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }

int lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

TEST(DtrainCli, WrongFlagsExitTwoWithOneLine) {
  for (const char* args : {"train --batch-size 0", "train --lr -1", "train --model resnet", "train --data /nonexistent",
                           "train --bogus", "frobnicate", "train --batch-size 4611686018427387905",
                           "train --hidden 4611686018427387904", "train --class-weights 1,-1",
                           "train --class-weights 0,0", "train --class-weights 1,,2", "train --class-weights 1,x"}) {
    CliRun r = run_dtrain(args);
    EXPECT_EQ(r.status, 2) << args << ": " << r.output;
    EXPECT_EQ(lines(r.output), 1) << args << ": " << r.output;
    EXPECT_EQ(r.output.rfind("dtrain: error: ", 0), 0u) << r.output;
  }
}

// The count of --class-weights is known to be wrong only once the data says how many classes it
// has: still one usage line (exit 2), before any training.
TEST(DtrainCli, ClassWeightsOfAnotherCountThanTheClassesAreOneLine) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("dtrain_cli_weights." + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::vector<uint8_t> x(6 * 4), y = {0, 1, 2, 0, 1, 2};
  for (const char* split : {"train", "test"}) {
    std::ofstream(dir / (std::string(split) + "_x.npy"), std::ios::binary) << as_text(dtrain::npy_bytes("|u1", {6, 4}, x));
    std::ofstream(dir / (std::string(split) + "_y.npy"), std::ios::binary) << as_text(dtrain::npy_bytes("|u1", {6}, y));
  }
  CliRun r = run_dtrain("train --device cpu --data " + dir.string() + " --class-weights 1,2");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_EQ(r.output, "dtrain: error: --class-weights: 2 weights for the 3 classes of the training data (one weight "
                      "per class)\n");
  r = run_dtrain("train --device cpu --data " + dir.string() + " --class-weights 1,2,0.5 --quiet");
  EXPECT_EQ(r.status, 0) << r.output;
  fs::remove_all(dir);
}

TEST(DtrainCli, HelpExitsZero) {
  CliRun r = run_dtrain("train --help");
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.output.find("--bucket-cap-mb"), std::string::npos);
}

TEST(DtrainCli, CorruptDataFileIsOneLineNamingTheFile) {
  namespace fs = std::filesystem;
  // Its own directory: another build's suite may run this test at the same time.
  const fs::path dir = fs::temp_directory_path() / ("dtrain_cli_corrupt." + std::to_string(getpid()));
  fs::create_directories(dir);
  for (const char* name : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                           "t10k-labels-idx1-ubyte"}) {
    std::ofstream f(dir / name, std::ios::binary);
    f << "not an idx file";
  }
  CliRun r = run_dtrain("train --device cpu --data " + dir.string());
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.status, -1) << "crashed: " << r.output;
  // One line in all, on stderr, naming the file: nothing printed before the failure.
  EXPECT_EQ(lines(r.output), 1) << r.output;
  EXPECT_EQ(lines(r.errors), 1) << r.errors;
  EXPECT_EQ(r.errors.rfind("dtrain: error: ", 0), 0u) << r.errors;
  EXPECT_NE(r.errors.find("train-images-idx3-ubyte"), std::string::npos) << r.errors;
  fs::remove_all(dir);
}

}  // namespace

// Issue 19, "Inputs are checked before they cost anything" (items 6, 8, 9, 10, 11, 12, 13): each
// case fails on the code before the fix (set DTRAIN_CLI_BINARY to an old build to see it).
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <vector>

#include <zlib.h>

#include "app/architecture.h"
#include "checkpoint/safetensors.h"
#include "core/exit_status.h"
#include "data/idx_reader.h"

namespace {

namespace fs = std::filesystem;

// A fresh directory of this process's own, removed afterwards.
struct ScratchDir {
  fs::path path;
  explicit ScratchDir(const std::string& name)
      : path(fs::temp_directory_path() / ("dtrain_cli_" + name + "." + std::to_string(getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::permissions(path, fs::perms::owner_all, ec);
    fs::remove_all(path, ec);
  }
  std::string str() const { return path.string(); }
};

// A small data set of 28x28 images: `train_labels` for training, ten test samples (labels 0-9).
void write_data_set(const fs::path& dir, const std::vector<uint8_t>& train_labels) {
  auto images = [](size_t n) { return std::vector<uint8_t>(n * 28 * 28, 100); };
  std::vector<uint8_t> test_labels = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  const std::vector<int64_t> train_dims = {static_cast<int64_t>(train_labels.size()), 28, 28};
  const std::vector<int64_t> test_dims = {10, 28, 28};
  dtrain::write_idx((dir / "train-images-idx3-ubyte").string(), train_dims, images(train_labels.size()), false);
  dtrain::write_idx((dir / "train-labels-idx1-ubyte").string(), std::vector<int64_t>{train_dims[0]}, train_labels, false);
  dtrain::write_idx((dir / "t10k-images-idx3-ubyte").string(), test_dims, images(10), false);
  dtrain::write_idx((dir / "t10k-labels-idx1-ubyte").string(), std::vector<int64_t>{10}, test_labels, false);
}

std::vector<uint8_t> ten_classes(size_t n) {
  std::vector<uint8_t> labels(n);
  for (size_t i = 0; i < n; ++i) labels[i] = static_cast<uint8_t>(i % 10);
  return labels;
}

const std::string kQuick = " --device cpu --threads 1 --epochs 1 --log-interval 1000 ";

// The largest resident set of any child this process has waited for, in MB.
long children_max_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_CHILDREN, &u);
  return u.ru_maxrss / 1024;
}

// Item 13: a float flag's value is the whole text, and a non-finite one is called that.
TEST(DtrainCli, FloatFlagsAreParsedStrictly) {
  // --log-interval 0 would be refused too, later: the first error must be the float's.
  CliRun r = run_dtrain("train --lr 0.5abc --log-interval 0");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_EQ(r.output, "dtrain: error: --lr: expected a number, got '0.5abc'\n");
  r = run_dtrain("train --lr nan --log-interval 0");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_EQ(r.output, "dtrain: error: --lr: expected a finite number, got 'nan'\n");
}

// Item 6: one label far above the others (200 among 0..9) is an error naming the file, the
// sample, the label and the others' range, unless --classes says how many classes there are.
TEST(DtrainCli, LabelFarOutsideTheOthersIsAnErrorUnlessClassesSaysSo) {
  ScratchDir dir("far_label");
  std::vector<uint8_t> labels = ten_classes(20);
  labels[13] = 200;
  write_data_set(dir.path, labels);
  CliRun r = run_dtrain("train --data " + dir.str() + kQuick);
  EXPECT_EQ(r.status, dtrain::kExitBadData) << r.output;
  EXPECT_EQ(lines(r.output), 1) << r.output;
  EXPECT_NE(r.errors.find("dtrain: error: " + (dir.path / "train-labels-idx1-ubyte").string() +
                          ": label 200 of sample 13 is far outside the other labels (0 to 9)"),
            std::string::npos)
      << r.errors;
  r = run_dtrain("train --data " + dir.str() + kQuick + "--classes 201");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("Linear(256, 201)"), std::string::npos) << r.output;
  r = run_dtrain("train --data " + dir.str() + kQuick + "--classes 12");
  EXPECT_EQ(r.status, dtrain::kExitBadData) << r.output;
  EXPECT_NE(r.errors.find("label 200 of sample 13 is not one of the 12 classes asked for (0 to 11)"), std::string::npos)
      << r.errors;
}

// Item 8: a FIFO among the data files is refused at once (it used to block in open forever).
TEST(DtrainCli, DataFileThatIsAFifoIsRefusedNotWaitedOn) {
  ScratchDir dir("fifo");
  write_data_set(dir.path, ten_classes(20));
  const fs::path fifo = dir.path / "train-images-idx3-ubyte";
  fs::remove(fifo);
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  const auto t0 = std::chrono::steady_clock::now();
  CliRun r = run_dtrain("train --data " + dir.str() + kQuick, "timeout -s KILL 20 ");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(seconds, 15) << "waited on the FIFO: " << r.output;
  EXPECT_EQ(r.status, dtrain::kExitBadData) << r.output;
  EXPECT_EQ(r.errors, "dtrain: error: " + fifo.string() + ": not a regular file (a FIFO)\n");
}

// Item 10: a 4 MB gzip whose header declares 784 GB fails at once, naming both figures (it used
// to inflate gigabytes first).
TEST(DtrainCli, GzipThatDeclaresMoreThanItCanHoldFailsAtOnce) {
  ScratchDir dir("bomb");
  write_data_set(dir.path, ten_classes(20));
  fs::remove(dir.path / "train-images-idx3-ubyte");
  // 4000 gzip members of 1 MiB of zeros each (~4 GB inflated from ~4 MB), the first one starting
  // with a header for 1,000,000,000 images of 28x28: 784 GB.
  std::vector<uint8_t> zeros(1 << 20, 0);
  const uint8_t header[] = {0, 0, 8, 3, 0x3b, 0x9a, 0xca, 0x00, 0, 0, 0, 28, 0, 0, 0, 28};
  std::copy(std::begin(header), std::end(header), zeros.begin());
  const std::string first = (dir.path / "first.gz").string();
  dtrain::write_bytes(first, zeros, true);
  std::fill(zeros.begin(), zeros.begin() + 16, 0);
  const std::string rest = (dir.path / "rest.gz").string();
  dtrain::write_bytes(rest, zeros, true);
  {
    std::ofstream out(dir.path / "train-images-idx3-ubyte.gz", std::ios::binary);
    out << read_file(first);
    const std::string member = read_file(rest);
    for (int i = 1; i < 4000; ++i) out << member;
  }
  const auto t0 = std::chrono::steady_clock::now();
  CliRun r = run_dtrain("train --data " + dir.str() + kQuick, "timeout -s KILL 120 ");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.status, dtrain::kExitBadData) << r.output;
  EXPECT_EQ(lines(r.output), 1) << r.output;
  EXPECT_NE(r.errors.find("train-images-idx3-ubyte.gz: the IDX header declares 784000000000 bytes of image data, "
                          "more than this "),
            std::string::npos)
      << r.errors;
  EXPECT_LT(seconds, 5);
  EXPECT_LT(children_max_rss_mb(), 1000) << "inflated before checking";
}

// Item 11: a data folder this user may not read says "permission denied", not "missing". Run as
// an unprivileged user (root reads anything).
TEST(DtrainCli, UnreadableDataFolderSaysPermissionDenied) {
  if (geteuid() != 0 || std::system("setpriv --reuid=65534 --regid=65534 --clear-groups true 2>/dev/null") != 0)
    GTEST_SKIP() << "needs root and setpriv to run dtrain as an unprivileged user";
  ScratchDir dir("unreadable");
  const fs::path data = dir.path / "data";
  fs::create_directories(data);
  write_data_set(data, ten_classes(20));
  fs::permissions(dir.path, fs::perms::all);  // nobody reaches the data folder's own mode
  const std::string train = "train --data " + data.string() + kQuick;
  const std::string nobody = "setpriv --reuid=65534 --regid=65534 --clear-groups ";
  if (run_dtrain("--help", nobody).status != 0) GTEST_SKIP() << "nobody cannot run this build's binary";
  fs::permissions(data, fs::perms::none);
  CliRun r = run_dtrain(train, nobody);
  fs::permissions(data, fs::perms::all);
  fs::permissions(data / "train-images-idx3-ubyte", fs::perms::none);
  CliRun file = run_dtrain(train, nobody);
  fs::permissions(data / "train-images-idx3-ubyte", fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_EQ(r.status, dtrain::kExitBadData) << r.output;
  EXPECT_EQ(lines(r.output), 1) << r.output;
  EXPECT_NE(r.errors.find((data / "train-images-idx3-ubyte.gz").string() + ": permission denied"), std::string::npos)
      << r.errors;
  EXPECT_EQ(file.status, dtrain::kExitBadData) << file.output;
  EXPECT_EQ(file.errors, "dtrain: error: " + (data / "train-images-idx3-ubyte").string() + ": permission denied\n");
}

// Item 12: every output path is checked at start, before data is loaded or a step taken (an
// unwritable checkpoint folder or trace used to fail only after training).
TEST(DtrainCli, UnwritableOutputPathsFailAtStart) {
  ScratchDir dir("outputs");
  write_data_set(dir.path, ten_classes(20));
  const fs::path file = dir.path / "a-file";
  std::ofstream(file) << "x";
  const std::string run = "train --data " + dir.str() + kQuick;
  for (const auto& [flag, path] : std::vector<std::pair<std::string, std::string>>{
           {"--checkpoint-dir", (file / "checkpoints").string()},
           {"--trace", (file / "trace.json").string()},
           {"--flight-recorder-dir", (dir.path / "no-such-folder").string()}}) {
    CliRun r = run_dtrain(run + flag + " " + path);
    EXPECT_EQ(r.status, dtrain::kExitOutput) << flag << ": " << r.output;
    EXPECT_EQ(lines(r.output), 1) << flag << ": " << r.output;  // nothing trained, nothing logged
    EXPECT_EQ(r.errors.rfind("dtrain: error: " + flag + ": " + path + ": cannot write there: ", 0), 0u) << r.errors;
  }
  // A folder that is missing is made (and then used).
  CliRun r = run_dtrain(run + "--checkpoint-dir " + (dir.path / "new" / "checkpoints").string());
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(fs::exists(dir.path / "new" / "checkpoints" / "latest")) << r.output;
}

// Item 9: weights whose metadata claims a model far larger than their tensors are refused before
// the model is built, naming the tensor and both shapes (dtrain eval used to build it first).
TEST(DtrainCli, EvalChecksTheTensorsAgainstTheMetadataBeforeBuilding) {
  ScratchDir dir("eval_shapes");
  write_data_set(dir.path, ten_classes(20));
  dtrain::Architecture arch;
  arch.model.hidden = {256};
  arch.input_shape = {1, 28, 28};
  arch.classes = 10;
  dtrain::safetensors::Metadata metadata = dtrain::architecture_metadata(arch);
  metadata["dtrain.hidden"] = "300000";  // 235 M parameters: 2.8 GB to build with its gradients
  std::vector<std::vector<float>> values;
  values.reserve(4);  // the refs borrow their bytes
  std::vector<dtrain::safetensors::TensorRef> refs;
  for (const auto& [name, shape] : std::vector<std::pair<std::string, dtrain::Shape>>{
           {"1.weight", {256, 784}}, {"1.bias", {256}}, {"3.weight", {10, 256}}, {"3.bias", {10}}}) {
    values.emplace_back(static_cast<size_t>(dtrain::shape_numel(shape)), 0.f);
    refs.push_back({name, dtrain::safetensors::Dtype::kF32, shape, std::as_bytes(std::span(values.back()))});
  }
  const std::string weights = (dir.path / "w.safetensors").string();
  dtrain::safetensors::write_file(weights, refs, metadata);
  CliRun r = run_dtrain("eval --device cpu --threads 1 --weights " + weights + " --data " + dir.str());
  EXPECT_EQ(r.status, dtrain::kExitCheckpoint) << r.output;
  EXPECT_EQ(r.errors, "dtrain: error: " + weights +
                          ": tensor '1.weight' has shape [256, 784], but the architecture (mlp 784-300000-10) needs "
                          "[300000, 784]\n");
  EXPECT_LT(children_max_rss_mb(), 1000) << "the model was built before its shapes were checked";
}

}  // namespace
