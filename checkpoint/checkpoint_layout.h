// The checkpoint directory layout: file names, `step-<N>` and `latest` parsing, which old
// checkpoints to delete, and the fault-injection setting. Pure functions, tested without files.
// The lock of Note [One job per directory] is checkpoint/directory_lock.h.
//
// Note [Checkpoint layout]
//   DIR/step-<N>/model.safetensors      parameters under PyTorch state_dict names ("1.weight")
//   DIR/step-<N>/optimizer.safetensors  optimizer state ("1.weight.momentum_buffer", ...)
//   DIR/step-<N>/state.json             counters, RNG, config, a size and CRC-32 per file, and
//                                       its own CRC-32 (state_crc32, training_state.h)
//   DIR/latest                          one line "step-<N>\n": the newest complete checkpoint
//   DIR/dtrain.lock                     the job using DIR (Note [One job per directory])
// N is the global optimizer step, unpadded. A save writes DIR/.tmp-step-<N>-<pid>/, fsyncs each
// file and the directory, renames it to DIR/step-<N>, fsyncs DIR, then replaces `latest` the
// same way (temporary file, fsync, rename, fsync DIR). A process killed at any instant leaves
// `latest` naming a complete checkpoint; what it leaves behind is a `.tmp-*` entry, which no
// reader looks at and the next job on DIR removes at its start. Old checkpoints are deleted only
// after `latest` names the new one, and only those with a lower step (steps_to_delete), each
// first renamed to a `.tmp-*` name so a half-deleted one is never mistaken for a checkpoint.
//
// `latest` is a shortcut, not the only record: without it (deleted, or lost with a copy of the
// folder) a reader takes the newest step-<N> that reads back complete - state.json's own
// checksum good and every file's size and CRC-32 matching - skips damaged ones and says so. A
// folder with step-<N> directories none of which is complete is an error, never a fresh start.
//
// Note [One job per directory]
//   A job's rank 0 holds flock(LOCK_EX) on DIR/dtrain.lock ("<pid> <host> <since>") from before
//   it reads DIR until it exits; the kernel drops the lock with the process, however it dies.
//   A second job on DIR fails at start naming the holder. Only the holder removes `.tmp-*`
//   leftovers (at its start), so no job deletes another live job's temporaries. The file is
//   removed when the holder lets go; a taker checks that the file it locked is still the one
//   at that name, so a removal racing with a new job never yields two holders.
//
// Note [Sharded optimizer state]
//   With ZeRO-1 each rank owns a shard of the optimizer state and no rank holds it all. The
//   format leaves room for that without changing what exists today:
//   - state.json's "optimizer_shards" is 1 now: rank 0 writes optimizer.safetensors with every
//     parameter's state. With n shards, rank r writes optimizer-rank<r>-of-<n>.safetensors into
//     the same temporary directory (a shared filesystem, or gathered to rank 0 first), and
//     state.json lists each file with its size and CRC like any other.
//   - A shard file keeps PyTorch's names; a tensor split across ranks is stored as the rank's
//     contiguous slice of the flattened tensor, and the file's __metadata__ records, per name,
//     "<name>": "<offset>,<numel>,<full shape>" (element offset into the flattened tensor, the
//     slice's length, the full shape), so the pieces are self-describing.
//   - Loading at any world size m: read every shard's header (cheap), and for each name the new
//     owner of [a, b) copies the overlapping ranges from whichever files hold them; an
//     unsharded file is the special case of one shard holding [0, numel) of everything, and the
//     inverse (n shards into one optimizer) reassembles them. Coverage is checked as the
//     safetensors reader checks offsets: every element of every tensor exactly once.
//   kOptimizerShardsSupported below is what this reader accepts until then.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::checkpoint {

inline constexpr std::string_view kModelFile = "model.safetensors";
inline constexpr std::string_view kOptimizerFile = "optimizer.safetensors";
inline constexpr std::string_view kStateFile = "state.json";
inline constexpr std::string_view kLatestFile = "latest";
inline constexpr std::string_view kTempPrefix = ".tmp-";  // entries a save may leave behind
inline constexpr std::string_view kLockFile = "dtrain.lock";  // Note [One job per directory]
inline constexpr int kDefaultKeep = 2;
// Set to a byte count, the writer stops the process with SIGKILL after that many bytes of a
// save (all files of one save counted together): the crash tests' injection point.
inline constexpr const char* kFaultEnv = "DTRAIN_CHECKPOINT_FAULT_AFTER_BYTES";

std::string step_dir_name(int64_t step);  // "step-42"
// The step of a "step-<N>" name (N decimal, unpadded); nullopt for anything else.
std::optional<int64_t> parse_step_dir_name(std::string_view name);
// What `latest` must hold: "step-<N>" and one newline. nullopt for anything else.
std::optional<int64_t> parse_latest(std::string_view content);
std::string latest_content(int64_t step);

// The steps to delete once `newest` is complete: those below it beyond the `keep` - 1 highest
// of them. Never `newest` nor a step above it: a run resumed from an older checkpoint, or a
// fresh run in a folder of older runs' checkpoints, writes below others, and a checkpoint is
// deleted only once a newer one is complete. keep >= 1.
std::vector<int64_t> steps_to_delete(std::vector<int64_t> existing, int64_t newest, int keep);

// kFaultEnv's value: nullopt when unset or empty; throws Error when not a whole number.
std::optional<uint64_t> parse_fault_after_bytes(const char* value);

}  // namespace dtrain::checkpoint
