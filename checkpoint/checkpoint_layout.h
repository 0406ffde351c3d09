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
//   With ZeRO each rank owns a slice of the optimizer state and no rank holds it all
//   (OptimizerState::Entry::is_slice, model/optimizer.h).
//   - state.json's "optimizer_shards" is 1 when every rank exports the same whole tensors
//     (replicas): rank 0 writes optimizer.safetensors, exactly as before shards existed. When
//     the ranks' exports differ or hold slices (ZeRO; the ranks agree on it, agree_sharded), at
//     n ranks it is n and the step directory holds optimizer-rank<r>-of-<n>.safetensors for
//     r < n (and no optimizer.safetensors), each listed in state.json with its size and CRC.
//   - A shard file keeps PyTorch's names; a slice is stored 1-D, and the file's __metadata__
//     records, per name, "<name>": "<offset>,<numel>,[<full shape>]" ("70,35,[5,7]": element
//     offset into the flattened tensor, the slice's length, the full shape), so the pieces are
//     self-describing (a whole tensor a rank owns is the piece "0,<numel>,[<shape>]", stored
//     in its shape); "optimizer" is the optimizer's name as in optimizer.safetensors. A step
//     count (0-d I64) is in the file of every rank that holds a piece of its parameter, and the
//     copies must agree. One piece per name per file (a rank's part of the flat store meets a
//     tensor in one range).
//   - Saving: still only rank 0 writes (no shared filesystem, train/root_broadcast.h). During
//     Checkpointer::write(), collective then, rank r sends its manifest (names, sizes) and its
//     bytes to rank 0 in chunks of at most CheckpointerOptions::transfer_chunk_bytes (16 MiB by
//     default), and rank 0 streams them into the shard file in the save's temporary directory:
//     no rank holds more than its slice plus one chunk (pytorch#68181), and none takes a host
//     copy of its slice; the snapshot keeps views of the slices until write(). The shards are
//     written while training waits; the model and state.json then go in the background as
//     before, and the directory is published as any save (temporary directory, fsync, rename).
//     The Communicator has no point-to-point send, so a chunk travels as a broadcast from its
//     owner (the other ranks drop it): bounded memory, (ranks - 1) times the traffic.
//   - Loading at any world size m, with or without ZeRO (train/optimizer_transfer.h): each rank
//     says which pieces it wants (ZeRO: its slices in the new layout; without: every tensor
//     whole); rank 0 opens the files (OptimizerFiles: size and CRC-32 checked reading in chunks,
//     headers parsed, never a whole file in memory), checks that each tensor's pieces cover it
//     exactly once (a gap, an overlap or metadata that does not parse is one line naming the
//     file and the tensor, a checkpoint error), and for each wanted range reads (pread) the
//     overlapping parts of whichever files hold them and sends them in chunks. An unsharded file
//     is the special case of one file holding [0, numel) of everything.
//   - Under ZeRO the slices follow the buckets (Note [ZeRO shards]), so the order of a resume
//     is: read state.json, apply the bucket layout it saved (the optimizer holds no state yet,
//     so re-laying the flat store moves nothing between ranks), then ask for this rank's
//     pieces of that layout (Optimizer::owned_parts -> wanted_pieces) and import them
//     (restore_newest/restore_from with a PiecesFor, app/checkpointing.cpp). Applying the
//     layout after the import would have to move imported state between ranks: refused. The
//     world size and --zero are not in the resume config: either may change on resume. Each
//     rank imports other pieces, so the ranks share their import outcome and all fail with the
//     first rank's line (restore() in train/checkpointer.cpp).
//   Measured (mpi_sharded_checkpoint_test's DISABLED_PeakMemoryOfASaveAndALoad, a 192 MiB state,
//   CPU, this 2-core machine under load): each rank's peak RSS grew by 16.2-16.5 MiB (one chunk)
//   during the save, then by the slice it loaded plus the chunk (np 2: +112 MiB for a 96 MiB
//   slice; np 3: +80 MiB for 64 MiB), on rank 0 as on the others.
//   - `dtrain checkpoint consolidate DIR` writes the whole state as one file with the bytes an
//     unsharded save of the same state has, tensor by tensor (consolidate(), optimizer_shards.h).
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
