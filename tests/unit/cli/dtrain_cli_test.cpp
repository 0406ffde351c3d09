// The `dtrain` binary as a user meets it: wrong flags exit 2 with one line on stderr, a corrupt
// data file exits non-zero with one line naming the file, --help exits 0.
#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

namespace {

struct CliRun {
  int status;
  std::string output;  // stdout + stderr
};

CliRun run_dtrain(const std::string& args) {
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);  // CI runs as root; Open MPI refuses root without these
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  const std::string cmd = std::string(DTRAIN_BINARY_DIR) + "/examples/dtrain " + args + " 2>&1";
  CliRun r{-1, ""};
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  int status = pclose(pipe);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
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
  const fs::path dir = fs::temp_directory_path() / "dtrain_cli_corrupt";
  fs::create_directories(dir);
  for (const char* name : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                           "t10k-labels-idx1-ubyte"}) {
    std::ofstream f(dir / name, std::ios::binary);
    f << "not an idx file";
  }
  CliRun r = run_dtrain("train --device cpu --data " + dir.string());
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.status, -1) << "crashed: " << r.output;
  EXPECT_NE(r.output.find("train-images-idx3-ubyte"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

}  // namespace
