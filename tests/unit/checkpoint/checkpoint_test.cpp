// Checkpoints on disk: round trip, keep-K, a crash at any byte of a save, the background writer,
// every kind of damaged checkpoint (one line, directory unchanged), a folder without `latest`,
// the directory lock, a read-only directory and a full disk (in a private mount namespace,
// skipped where that is not possible).
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <map>
#include <thread>

#include <gtest/gtest.h>

#include "../data/temp_dir.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/directory_lock.h"
#include "checkpoint/durable_file.h"
#include "core/error.h"
#include "core/poison.h"
#include "synthetic.h"

namespace dtrain::checkpoint {
namespace {

namespace fs = std::filesystem;
using dtrain::testing::synthetic_mismatch;
using dtrain::testing::synthetic_snapshot;
using dtrain::testing::TempDir;

fs::path save(const fs::path& dir, int64_t step, int keep = 2) {
  CheckpointSnapshot s = synthetic_snapshot(step);
  return write_checkpoint({.dir = dir, .keep = keep, .fault_after_bytes = std::nullopt}, s);
}

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Every entry under `dir` with its content: equal fingerprints mean nothing was changed.
std::map<std::string, std::string> fingerprint(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    out[fs::relative(e.path(), dir).string()] = e.is_directory() ? "<dir>" : slurp(e.path());
  return out;
}

std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

void expect_synthetic(const LoadedCheckpoint& c, int64_t step) {
  EXPECT_EQ(c.state.global_step, step);
  EXPECT_EQ(synthetic_mismatch(c, step), "");
}

TEST(Checkpoint, WritesTheLayoutAndReadsItBack) {
  TempDir tmp;
  const fs::path dir = tmp.path() / "ckpt";  // created by the writer
  EXPECT_EQ(find_latest(dir), std::nullopt);
  EXPECT_EQ(save(dir, 30), dir / "step-30");
  EXPECT_EQ(entries(dir), (std::vector<std::string>{"latest", "step-30"}));
  EXPECT_EQ(entries(dir / "step-30"), (std::vector<std::string>{"model.safetensors", "optimizer.safetensors", "state.json"}));
  EXPECT_EQ(slurp(dir / "latest"), "step-30\n");
  EXPECT_EQ(find_latest(dir), dir / "step-30");
  for (const fs::path& where : {dir, dir / "step-30"}) {
    LoadedCheckpoint c = read_checkpoint(where);
    EXPECT_EQ(c.path, dir / "step-30");
    expect_synthetic(c, 30);
    const CheckpointSnapshot want = synthetic_snapshot(30);
    EXPECT_EQ(c.state.epoch, want.state.epoch);
    EXPECT_EQ(c.state.step_in_epoch, want.state.step_in_epoch);
    EXPECT_EQ(c.state.sample_in_epoch, want.state.sample_in_epoch);
    EXPECT_EQ(c.state.samples_seen, want.state.samples_seen);
    EXPECT_EQ(c.state.world_size, want.state.world_size);
    EXPECT_EQ(c.state.seed, want.state.seed);
    EXPECT_EQ(c.state.rng, want.state.rng);
    EXPECT_EQ(c.state.lr, want.state.lr);
    EXPECT_EQ(c.state.config, want.state.config);
    EXPECT_EQ(c.state.dtrain_version, dtrain_version());
    EXPECT_EQ(c.model.metadata(), want.model_metadata);
    EXPECT_EQ(c.optimizer.metadata(), want.optimizer_metadata);
    EXPECT_EQ(c.state.files.at("model.safetensors").bytes, fs::file_size(dir / "step-30" / "model.safetensors"));
  }
}

TEST(Checkpoint, NothingToResumeOnlyWhenThereIsNoLatest) {
  TempDir tmp;
  EXPECT_EQ(find_latest(tmp.path() / "absent"), std::nullopt);
  EXPECT_EQ(find_latest(tmp.path()), std::nullopt);
  std::ofstream(tmp.file("plain-file")) << "x";
  try {
    find_latest(tmp.path() / "plain-file");  // not "nothing saved": an error
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "cannot read " + tmp.file("plain-file") + "/latest: Not a directory");
  }
}

TEST(Checkpoint, KeepsTheNewestKAfterANewerOneIsComplete) {
  TempDir tmp;
  for (int64_t step : {10, 20, 30}) save(tmp.path(), step, 2);
  EXPECT_EQ(entries(tmp.path()), (std::vector<std::string>{"latest", "step-20", "step-30"}));
  expect_synthetic(read_checkpoint(tmp.path() / "step-20"), 20);
  save(tmp.path(), 40, 1);
  EXPECT_EQ(entries(tmp.path()), (std::vector<std::string>{"latest", "step-40"}));
  expect_synthetic(read_checkpoint(tmp.path()), 40);
}

TEST(Checkpoint, SavingAStepAgainReplacesItWhole) {
  TempDir tmp;
  save(tmp.path(), 10);
  save(tmp.path(), 20);
  CheckpointSnapshot again = synthetic_snapshot(20);
  again.state.samples_seen = 999;
  write_checkpoint({.dir = tmp.path(), .keep = 2, .fault_after_bytes = std::nullopt}, again);
  EXPECT_EQ(entries(tmp.path()), (std::vector<std::string>{"latest", "step-10", "step-20"}));
  EXPECT_EQ(read_checkpoint(tmp.path()).state.samples_seen, 999);
}

TEST(Checkpoint, FailedSaveLeavesNoStepDirectoryAndOldCheckpointsIntact) {
  TempDir tmp;
  save(tmp.path(), 10);
  const auto before = fingerprint(tmp.path());
  CheckpointSnapshot bad = synthetic_snapshot(20);
  bad.optimizer.push_back(bad.optimizer.front());  // a repeated name: the optimizer file fails mid-save
  try {
    write_checkpoint({.dir = tmp.path(), .keep = 1, .fault_after_bytes = std::nullopt}, bad);
    FAIL() << "the save should fail";
  } catch (const Error& e) {
    EXPECT_TRUE(std::string(e.what()).starts_with("checkpoint " + (tmp.path() / "step-20").string() + " not saved: "))
        << e.what();
  }
  EXPECT_EQ(fingerprint(tmp.path()), before);
}

// Note [A poisoned step is never saved]: once a watchdog marked a collective of this process as
// failed, no save becomes visible: no step folder, `latest` unchanged, one line saying why.
TEST(Checkpoint, NothingIsSavedOnceACollectiveOfTheProcessFailed) {
  TempDir tmp;
  save(tmp.path(), 10);
  const auto before = fingerprint(tmp.path());
  poison_process("NCCL allreduce #42 timed out after 600.0s");
  const std::string expected = "checkpoint " + (tmp.path() / "step-20").string() +
                               " not saved: a collective of this process failed, so its state may be wrong: NCCL "
                               "allreduce #42 timed out after 600.0s";
  try {
    save(tmp.path(), 20);
    ADD_FAILURE() << "the save should be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.what(), expected);
  }
  EXPECT_EQ(fingerprint(tmp.path()), before);
  // The background writer alike (the first reason is kept).
  poison_process("a later reason");
  {
    CheckpointWriter writer({.dir = tmp.path(), .keep = 2, .fault_after_bytes = std::nullopt});
    writer.save_async(synthetic_snapshot(20));
    try {
      writer.wait();
      ADD_FAILURE() << "the background save should be refused";
    } catch (const Error& e) {
      EXPECT_EQ(e.what(), expected);
    }
  }
  EXPECT_EQ(fingerprint(tmp.path()), before);
  clear_process_poison_for_tests();
  save(tmp.path(), 20);
  expect_synthetic(read_checkpoint(tmp.path()), 20);
}

// The check and the rename are one step under the mark's lock: a watchdog marking the process
// while a rename runs waits for it, and after the mark no rename runs.
TEST(Checkpoint, AMarkRacingAPublishWaitsForItAndStopsTheNext) {
  std::atomic<bool> renaming{false};
  std::thread watchdog;
  EXPECT_TRUE(publish_unless_poisoned([&] {
    renaming = true;
    watchdog = std::thread([] { poison_process("MPI allreduce #7 timed out"); });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(process_poison(), "") << "marked while a rename was running";
  }));
  watchdog.join();
  EXPECT_TRUE(renaming);
  EXPECT_EQ(process_poison(), "MPI allreduce #7 timed out");
  EXPECT_FALSE(publish_unless_poisoned([] { ADD_FAILURE() << "published after the mark"; }));
  clear_process_poison_for_tests();
}

// Bytes of one save of synthetic_snapshot(step): step directory files, then `latest`.
std::pair<uint64_t, uint64_t> save_sizes(int64_t step) {
  TempDir tmp;
  save(tmp.path(), step);
  uint64_t files = 0;
  for (const auto& e : fs::directory_iterator(tmp.path() / step_dir_name(step))) files += fs::file_size(e.path());
  return {files, files + latest_content(step).size()};
}

// Forks a child that saves step 20 into `dir` and is killed by the fault injection after
// `bytes` bytes (set through the environment, as a test harness would).
void crash_a_save(const fs::path& dir, uint64_t bytes, bool background) {
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::setenv(kFaultEnv, std::to_string(bytes).c_str(), 1);
    try {
      CheckpointWriter writer({.dir = dir, .keep = 1});
      if (background) {
        writer.save_async(synthetic_snapshot(20));
        writer.wait();
      } else {
        writer.save(synthetic_snapshot(20));
      }
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "at byte " << bytes << ": status " << status;
}

TEST(Checkpoint, CrashAtAnyByteOfASaveLeavesThePreviousCheckpointLoadable) {
  const auto [step_bytes, total] = save_sizes(20);
  std::vector<uint64_t> points = {0, 1, 7, 8, 100, step_bytes - 1, step_bytes, step_bytes + 3, total - 1};
  for (uint64_t k = 1; k < 16; ++k) points.push_back(total * k / 16);
  for (uint64_t bytes : points) {
    SCOPED_TRACE("killed after byte " + std::to_string(bytes) + " of " + std::to_string(total));
    TempDir tmp;
    save(tmp.path(), 10);
    crash_a_save(tmp.path(), bytes, /*background=*/bytes % 2 == 1);
    EXPECT_EQ(slurp(tmp.path() / "latest"), "step-10\n");
    expect_synthetic(read_checkpoint(tmp.path()), 10);
    // Killed after the rename but before `latest` was replaced: step-20 is complete, unannounced.
    const bool renamed = bytes >= step_bytes;
    EXPECT_EQ(fs::exists(tmp.path() / "step-20"), renamed);
    if (renamed) expect_synthetic(read_checkpoint(tmp.path() / "step-20"), 20);
    // The next job's lock removes what the crash left; its save succeeds; keep-2 keeps the two
    // highest.
    DirectoryLock next_job(tmp.path());
    save(tmp.path(), 30, 2);
    EXPECT_EQ(entries(tmp.path()),
              (std::vector<std::string>{"dtrain.lock", "latest", renamed ? "step-20" : "step-10", "step-30"}));
    expect_synthetic(read_checkpoint(tmp.path()), 30);
  }
}

TEST(CheckpointWriter, WritesInTheBackgroundFromAnOwnedSnapshot) {
  TempDir tmp;
  CheckpointWriter writer({.dir = tmp.path(), .keep = 2, .fault_after_bytes = std::nullopt});
  Tensor live = dtrain::testing::synthetic_tensor(10, 0, {1000});
  CheckpointSnapshot s = synthetic_snapshot(10);
  s.model[0] = safetensors::host_copy("0.weight", live);
  writer.save_async(std::move(s));
  live.zero_();  // training goes on: the snapshot is a copy
  writer.save_async(synthetic_snapshot(20));  // waits for the first
  writer.wait();
  EXPECT_FALSE(writer.in_flight());
  EXPECT_FALSE(writer.writing());
  expect_synthetic(read_checkpoint(tmp.path() / "step-10"), 10);
  expect_synthetic(read_checkpoint(tmp.path()), 20);
}

TEST(CheckpointWriter, BackgroundErrorsSurfaceOnTheNextCall) {
  TempDir tmp;
  std::ofstream(tmp.file("plain-file")) << "x";
  const fs::path dir = tmp.path() / "plain-file" / "ckpt";  // cannot be created
  CheckpointWriter writer({.dir = dir, .keep = 2, .fault_after_bytes = std::nullopt});
  writer.save_async(synthetic_snapshot(10));
  try {
    writer.wait();
    FAIL() << "wait() should throw";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "checkpoint " + (dir / "step-10").string() + " not saved: cannot create directory " +
                                         dir.string() + ": Not a directory");
  }
  writer.wait();  // reported once
  writer.save_async(synthetic_snapshot(20));
  EXPECT_THROW(writer.save_async(synthetic_snapshot(30)), Error);  // the error of step 20
}

// The one-line error read_checkpoint(dir) throws, checking that reading left `dir` unchanged.
std::string read_error(const fs::path& dir, const fs::path& what) {
  const auto before = fingerprint(dir);
  std::string msg = "(accepted)";
  try {
    read_checkpoint(what);
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  EXPECT_EQ(fingerprint(dir), before) << "reading changed " << dir;
  return msg;
}

struct Damaged : ::testing::Test {
  TempDir tmp;
  fs::path dir = tmp.path();
  fs::path step = tmp.path() / "step-20";
  void SetUp() override {
    save(dir, 10);
    save(dir, 20);
  }
  void patch(const fs::path& file, uint64_t offset, char byte) {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(offset));
    f.put(byte);
  }
};

TEST_F(Damaged, ChecksumMismatchNamesTheFile) {
  patch(step / "model.safetensors", fs::file_size(step / "model.safetensors") - 3, '\x7f');
  const std::string msg = read_error(dir, dir);
  EXPECT_TRUE(msg.starts_with((step / "model.safetensors").string() + ": CRC-32 ")) << msg;
  EXPECT_NE(msg.find("(the file is damaged)"), std::string::npos) << msg;
}

TEST_F(Damaged, TruncatedFileNamesTheFile) {
  fs::resize_file(step / "optimizer.safetensors", 100);
  EXPECT_EQ(read_error(dir, dir), (step / "optimizer.safetensors").string() + ": 100 bytes, state.json records " +
                                      std::to_string(read_checkpoint(dir / "step-10").state.files.at("optimizer.safetensors").bytes) +
                                      " (truncated or replaced)");
}

TEST_F(Damaged, MissingFileNamesTheFile) {
  fs::remove(step / "model.safetensors");
  EXPECT_EQ(read_error(dir, dir), "cannot open " + (step / "model.safetensors").string() + ": No such file or directory");
  fs::remove(step / "state.json");
  EXPECT_EQ(read_error(dir, step), (step).string() + ": neither a checkpoint (state.json missing) nor a checkpoint "
                                                     "directory (latest and step-<N> missing)");
  EXPECT_EQ(read_error(dir, dir), "cannot open " + (step / "state.json").string() + ": No such file or directory");
}

TEST_F(Damaged, UnknownFormatVersionIsNamed) {
  std::string state = slurp(step / "state.json");
  state.replace(state.find("\"format_version\": 2"), 19, "\"format_version\": 9");
  std::ofstream(step / "state.json", std::ios::trunc) << state;
  EXPECT_EQ(read_error(dir, dir),
            (step / "state.json").string() + ": format_version: 9 is not a format this dtrain reads (it reads 1 to 2)");
}

TEST_F(Damaged, AChangedCounterInStateJsonIsNamed) {
  std::string state = slurp(step / "state.json");
  const std::string from = "\"global_step\": 20", to = "\"global_step\": 21";
  ASSERT_NE(state.find(from), std::string::npos) << state;
  state.replace(state.find(from), from.size(), to);
  std::ofstream(step / "state.json", std::ios::trunc) << state;
  const std::string msg = read_error(dir, dir);
  EXPECT_TRUE(msg.starts_with((step / "state.json").string() + ": state_crc32: the document's CRC-32 is ")) << msg;
}

// --- Without `latest`: the newest complete step-<N> (issue 19, item 2) -------------------------

TEST_F(Damaged, WithoutLatestTheNewestCompleteCheckpointIsUsedAndSaidSo) {
  fs::remove(dir / "latest");
  const auto before = fingerprint(dir);
  for (const fs::path& where : {dir, dir / "step-20"}) {
    LoadedCheckpoint c = read_checkpoint(where);
    expect_synthetic(c, 20);
  }
  std::optional<LoadedCheckpoint> c = read_newest(dir);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->path, step);
  EXPECT_EQ(c->chosen_because, dir.string() + " has no latest; using " + step.string() + ", the newest complete checkpoint");
  EXPECT_EQ(fingerprint(dir), before);
}

TEST_F(Damaged, WithoutLatestADamagedNewestIsSkippedWithTheReason) {
  fs::remove(dir / "latest");
  const uintmax_t model_bytes = fs::file_size(step / "model.safetensors");
  fs::resize_file(step / "model.safetensors", 100);
  std::optional<LoadedCheckpoint> c = read_newest(dir);
  ASSERT_TRUE(c.has_value());
  expect_synthetic(*c, 10);
  EXPECT_EQ(c->chosen_because, dir.string() + " has no latest; using " + (dir / "step-10").string() +
                                   ", the newest complete checkpoint (skipped: " + (step / "model.safetensors").string() +
                                   ": 100 bytes, state.json records " +
                                   std::to_string(model_bytes) +
                                   " (truncated or replaced))");
  // A damaged state.json is skipped alike.
  fs::resize_file(step / "model.safetensors", 0);
  std::string state = slurp(dir / "step-10" / "state.json");
  state.replace(state.find("\"epoch\": "), 9, "\"epoch\": 7");
  std::ofstream(dir / "step-10" / "state.json", std::ios::trunc) << state;
  const std::string msg = read_error(dir, dir);
  EXPECT_TRUE(msg.starts_with(dir.string() + " has no latest and none of its 2 checkpoint(s) is complete: " +
                              (step / "model.safetensors").string()))
      << msg;
  EXPECT_NE(msg.find((dir / "step-10" / "state.json").string() + ": state_crc32: "), std::string::npos) << msg;
}

TEST(Checkpoint, AFolderWithNeitherLatestNorStepsHasNothingToResume) {
  TempDir tmp;
  EXPECT_FALSE(read_newest(tmp.path()).has_value());
  EXPECT_FALSE(read_newest(tmp.path() / "absent").has_value());
  fs::create_directories(tmp.path() / ".tmp-step-3-1");  // a crashed save's leftover is no checkpoint
  EXPECT_FALSE(read_newest(tmp.path()).has_value());
}

// Issue 19, item 2: a fresh run saving into a folder of newer checkpoints deleted them.
TEST(Checkpoint, SavingALowerStepKeepsTheNewerCheckpoints) {
  TempDir tmp;
  save(tmp.path(), 8);
  save(tmp.path(), 16);
  save(tmp.path(), 2, 2);
  save(tmp.path(), 4, 2);
  EXPECT_EQ(entries(tmp.path()), (std::vector<std::string>{"latest", "step-16", "step-2", "step-4", "step-8"}));
  save(tmp.path(), 6, 1);
  EXPECT_EQ(entries(tmp.path()), (std::vector<std::string>{"latest", "step-16", "step-6", "step-8"}));
}

// --- One job per directory (issue 19, item 7) ---------------------------------------------------

TEST(DirectoryLock, ASecondHolderFailsNamingTheFirst) {
  TempDir tmp;
  const fs::path dir = tmp.path() / "ckpt";  // created by the lock
  std::optional<DirectoryLock> first(std::in_place, dir);
  EXPECT_TRUE(first->held());
  const std::string record = slurp(dir / "dtrain.lock");
  EXPECT_TRUE(record.starts_with(std::to_string(::getpid()) + " ")) << record;
  try {
    DirectoryLock second(dir);  // another open file description: flock refuses it in this process too
    FAIL() << "the second lock was granted";
  } catch (const DirectoryInUse& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(msg.starts_with(dir.string() + " is in use by another dtrain job (pid " + std::to_string(::getpid()) +
                                " on "))
        << msg;
    EXPECT_NE(msg.find(", since "), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  first.reset();
  EXPECT_FALSE(fs::exists(dir / "dtrain.lock"));  // let go: the file goes with it
  DirectoryLock again(dir);
  EXPECT_TRUE(again.held());
}

TEST(DirectoryLock, DiesWithItsProcessAndTheNextHolderRemovesLeftovers) {
  TempDir tmp;
  save(tmp.path(), 10);
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    DirectoryLock held(tmp.path());
    (void)!::write(ready[1], "x", 1);
    ::pause();
    ::_exit(0);
  }
  char byte;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  // As if the holder were in the middle of a save.
  fs::create_directories(tmp.path() / ".tmp-step-20-99999");
  std::ofstream(tmp.path() / ".tmp-latest-99999") << "step-20\n";
  EXPECT_THROW(DirectoryLock{tmp.path()}, DirectoryInUse);
  // A live holder's temporaries are not touched by the job that failed to take the lock.
  EXPECT_TRUE(fs::exists(tmp.path() / ".tmp-step-20-99999"));
  ::kill(pid, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  DirectoryLock next(tmp.path());  // the killed holder's lock went with it; its file stays, reused
  EXPECT_TRUE(next.held());
  EXPECT_EQ(entries(tmp.path()), (std::vector<std::string>{"dtrain.lock", "latest", "step-10"}));
  expect_synthetic(read_checkpoint(tmp.path()), 10);
  ::close(ready[0]);
  ::close(ready[1]);
}

TEST(DirectoryLock, TheHolderRecordReadsAsAName) {
  EXPECT_EQ(lock_record(1234, "vm", "2026-11-25 09:30:01 UTC"), "1234 vm 2026-11-25 09:30:01 UTC\n");
  EXPECT_EQ(describe_holder("1234 vm 2026-11-25 09:30:01 UTC\n"), "pid 1234 on vm, since 2026-11-25 09:30:01 UTC");
  EXPECT_EQ(describe_holder("1234 vm\n"), "pid 1234 on vm");
  EXPECT_EQ(describe_holder(""), "its holder has not recorded itself yet");
  EXPECT_EQ(describe_holder("garbage"), "its holder has not recorded itself yet");
}

TEST_F(Damaged, LatestNamingNothingOrGarbageIsAnErrorNotAFreshStart) {
  fs::remove_all(step);
  EXPECT_EQ(read_error(dir, dir), (dir / "latest").string() + ": names " + step.string() + ", which does not exist");
  EXPECT_THROW(find_latest(dir), Error);
  std::ofstream(dir / "latest", std::ios::trunc) << "step-010\n";
  EXPECT_EQ(read_error(dir, dir), (dir / "latest").string() + ": expected one line 'step-<N>', got 'step-010'");
}

TEST_F(Damaged, StepDirectoryAndStateMustAgree) {
  fs::rename(dir / "step-10", dir / "step-11");
  EXPECT_EQ(read_error(dir, dir / "step-11"),
            (dir / "step-11" / "state.json").string() + ": global_step: 10, but the directory is step-11");
}

TEST_F(Damaged, ConfigMismatchNamesTheField) {
  LoadedCheckpoint c = read_checkpoint(dir);
  nlohmann::json now = dtrain::testing::synthetic_config();
  now["epochs"] = 10;  // may differ
  const std::vector<std::string> may_differ = {"epochs"};
  EXPECT_NO_THROW(check_config_matches(c, now, may_differ));
  now["model"]["hidden"] = {512};
  try {
    check_config_matches(c, now, may_differ);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              (step / "state.json").string() + ": config.model.hidden: checkpoint [256], this run [512]");
  }
}

// --- A read-only directory and a full disk, in a private mount namespace ---------------------

struct CommandResult {
  int status = -1;
  std::string output;  // stdout and stderr
};

CommandResult run_command(const std::string& command) {
  CommandResult r;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) r.output.append(buf, n);
  const int status = ::pclose(pipe);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// Empty when this process may mount a tmpfs in a new mount namespace; else why not.
std::string why_no_mount_namespace(const fs::path& probe) {
  CommandResult r = run_command("unshare -m sh -c 'mount -t tmpfs -o size=64k tmpfs \"$0\"' '" + probe.string() + "'");
  return r.status == 0 ? "" : "unshare -m with a tmpfs mount is not possible here: " + r.output;
}

const std::string kTool = DTRAIN_CHECKPOINT_TOOL;

TEST(CheckpointDisk, ReadOnlyDirectoryIsOneLineAndOldCheckpointsStay) {
  TempDir tmp;
  if (auto why = why_no_mount_namespace(tmp.path()); !why.empty()) GTEST_SKIP() << why;
  save(tmp.path(), 5);
  const auto before = fingerprint(tmp.path());
  CommandResult r = run_command("unshare -m sh -c 'mount --bind \"$0\" \"$0\" && mount -o remount,bind,ro \"$0\" && "
                                "exec \"$1\" save \"$0\" 7 1000' '" +
                                tmp.path().string() + "' '" + kTool + "'");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(r.output.starts_with("checkpoint " + (tmp.path() / "step-7").string() +
                                   " not saved: cannot create directory " + (tmp.path() / ".tmp-step-7-").string()))
      << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_NE(r.output.find(": Read-only file system\n"), std::string::npos) << r.output;
  EXPECT_EQ(fingerprint(tmp.path()), before);
  expect_synthetic(read_checkpoint(tmp.path()), 5);
}

TEST(CheckpointDisk, FullDiskIsOneLineAndLeavesNoHalfWrittenCheckpoint) {
  TempDir tmp;
  if (auto why = why_no_mount_namespace(tmp.path()); !why.empty()) GTEST_SKIP() << why;
  // In a 512 KiB tmpfs: a small checkpoint fits, a 1.6 MB one does not.
  CommandResult r = run_command(
      "unshare -m sh -c 'mount -t tmpfs -o size=512k tmpfs \"$0\" && \"$1\" save \"$0\" 1 1000 && "
      "{ \"$1\" save \"$0\" 2 200000; echo \"exit $?\"; } && \"$1\" check \"$0\" 1 1000 && ls -A \"$0\"' '" +
      tmp.path().string() + "' '" + kTool + "'");
  EXPECT_EQ(r.status, 0) << r.output;
  const std::string step2 = (tmp.path() / "step-2").string();
  const std::string expected_start = "checkpoint " + step2 + " not saved: cannot write " + (tmp.path() / ".tmp-step-2-").string();
  EXPECT_TRUE(r.output.starts_with(expected_start)) << r.output;
  const size_t first_line = r.output.find('\n');
  EXPECT_TRUE(r.output.substr(0, first_line).ends_with(": No space left on device")) << r.output;
  EXPECT_EQ(r.output.substr(first_line + 1), "exit 1\nlatest\nstep-1\n");
}

}  // namespace
}  // namespace dtrain::checkpoint
