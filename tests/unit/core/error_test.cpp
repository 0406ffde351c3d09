// Errors: file names relative to the source tree whatever its folder, the kind an error carries
// and classify_errors, and the exit status of each kind (core/exit_status.h).
#include "core/error.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "core/exit_status.h"

namespace dtrain {
namespace {

std::string check_failed_message(const std::string& file) {
  try {
    check_failed(file.c_str(), 42, "x > 0", "x is -1");
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// app/ was once missing from a list of known folders, so its errors named absolute paths
// (/work/...): every folder of the tree, present or future, is trimmed alike.
TEST(CheckFailed, NamesFilesRelativeToTheSourceTree) {
  const std::string root = DTRAIN_PROJECT_SOURCE_DIR;
  for (const char* file : {"app/trainer.cpp", "core/tensor.cpp", "pipeline/schedule.cpp", "launcher/main.cpp"}) {
    const std::string message = check_failed_message(root + "/" + file);
    EXPECT_EQ(message, std::string(file) + ":42: x > 0 failed: x is -1");
    EXPECT_EQ(message.find(root), std::string::npos) << message;
  }
  // A file outside the tree (a program built against the installed library) keeps its path.
  EXPECT_EQ(check_failed_message("/elsewhere/main.cpp"), "/elsewhere/main.cpp:42: x > 0 failed: x is -1");
}

TEST(CheckFailed, TheMacroNamesThisFile) {
  try {
    DTRAIN_CHECK(1 + 1 == 3, "arithmetic");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("tests/unit/core/error_test.cpp:", 0), 0u) << e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kFailure);
  }
}

TEST(ErrorKind, UsageErrorsAreUsageAndOthersAsThrown) {
  EXPECT_EQ(UsageError("--lr: expected a number").kind(), ErrorKind::kUsage);
  EXPECT_EQ(Error("a peer went away").kind(), ErrorKind::kFailure);
  EXPECT_EQ(Error("data/x: truncated", ErrorKind::kData).kind(), ErrorKind::kData);
}

// A failed MPI/NCCL/CUDA call inside a checkpoint's restore is a peer's or the device's fault, not
// the files': it stays kFailure (exit 1, retried), whatever the caller says its callee is about.
TEST(ErrorKind, ClassifyErrorsLeavesFailedLibraryCallsAlone) {
  try {
    classify_errors(ErrorKind::kCheckpoint, []() -> int {
      library_call_failed("comm/mpi_communicator.cpp", 80, "MPI_Bcast", "MPI_ERR_PROC_FAILED");
    });
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kFailure);
    EXPECT_TRUE(e.is_library_call_failure());
  }
}

// The caller's kind for its callee's unclassified errors; an error with a kind keeps it; the
// exception keeps its type.
TEST(ErrorKind, ClassifyErrorsFillsInOnlyTheUnclassified) {
  try {
    classify_errors(ErrorKind::kCheckpoint, []() -> int { throw UsageError("--resume: bad"); });
  } catch (const UsageError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
  }
  try {
    classify_errors(ErrorKind::kCheckpoint, [] { throw Error("ck/step-5/state.json: not valid JSON"); });
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCheckpoint);
    EXPECT_STREQ(e.what(), "ck/step-5/state.json: not valid JSON");
  }
  EXPECT_EQ(classify_errors(ErrorKind::kData, [] { return 7; }), 7);
}

// One status per kind, and none that a shell, timeout(1), CTest's skip or a signal gives.
TEST(ExitStatus, OnePerKindAndNoneTaken) {
  std::set<int> seen;
  for (ErrorKind kind : {ErrorKind::kFailure, ErrorKind::kUsage, ErrorKind::kData, ErrorKind::kCheckpoint,
                         ErrorKind::kResources, ErrorKind::kOutput}) {
    const int status = exit_status(kind);
    EXPECT_TRUE(seen.insert(status).second) << status;
    EXPECT_TRUE(status >= 1 && status < 124 && status != 77) << status;
    EXPECT_EQ(permanent_failure_name(status).empty(), kind == ErrorKind::kFailure) << status;
  }
  EXPECT_EQ(exit_status(ErrorKind::kFailure), 1);
  EXPECT_EQ(exit_status(ErrorKind::kUsage), 2);
  EXPECT_EQ(exit_status(ErrorKind::kData), 65);
  EXPECT_EQ(exit_status(ErrorKind::kCheckpoint), 66);
  EXPECT_EQ(exit_status(ErrorKind::kResources), 71);
  EXPECT_EQ(exit_status(ErrorKind::kOutput), 73);
  EXPECT_EQ(exit_status(ErrorKind::kDiverged), 3);
  EXPECT_FALSE(permanent_failure_name(kExitDiverged).empty());
  for (int status : {0, 1, 124, 126, 127, 130, 137, 143}) EXPECT_EQ(permanent_failure_name(status), "") << status;
}

}  // namespace
}  // namespace dtrain
