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

#include <gtest/gtest.h>

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

CliRun run_dtrain(const std::string& args) {
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);  // CI runs as root; Open MPI refuses root without these
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  // A file of this process's own: CTest runs the other DtrainCli cases (other processes) at once.
  static int calls = 0;
  const std::string err_path = (std::filesystem::temp_directory_path() /
                                ("dtrain_cli_stderr." + std::to_string(getpid()) + "." + std::to_string(++calls)))
                                   .string();
  // stderr goes to the output stream too (as a terminal shows both) and, through tee, to a file.
  const std::string cmd = "{ " + std::string(DTRAIN_BINARY_DIR) + "/app/dtrain " + args + " 2>&1 1>&3 | tee " +
                          err_path + "; } 3>&1 2>&1";
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

int lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

TEST(DtrainCli, WrongFlagsExitTwoWithOneLine) {
  for (const char* args : {"train --batch-size 0", "train --lr -1", "train --model resnet", "train --data /nonexistent",
                           "train --bogus", "frobnicate", "train --batch-size 4611686018427387905",
                           "train --hidden 4611686018427387904"}) {
    CliRun r = run_dtrain(args);
    EXPECT_EQ(r.status, 2) << args << ": " << r.output;
    EXPECT_EQ(lines(r.output), 1) << args << ": " << r.output;
    EXPECT_EQ(r.output.rfind("dtrain: error: ", 0), 0u) << r.output;
  }
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
