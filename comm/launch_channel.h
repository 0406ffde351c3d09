// The launch channel: how a rank started by dtrain-launch tells the launcher that it has
// reached training, so that dtrain-launch can bound start-up (MPI wire-up, data loading, the
// first broadcast) without bounding training itself. dtrain-launch runs every rank under a small
// supervisor that hands the program one inherited socket (a socketpair), named by an environment
// variable; the program writes one line into it. Without dtrain-launch there is none and nothing
// happens.
// This header has no MPI and no dtrain dependency: the launcher includes it for the names.
#pragma once

#include <string_view>

namespace dtrain {

// The inherited socket's file descriptor, in decimal (set by dtrain-launch's rank supervisor).
inline constexpr const char* kLaunchChannelFdEnv = "DTRAIN_LAUNCH_CHANNEL_FD";
// What a rank writes into it when it reaches training.
inline constexpr std::string_view kReachedTrainingLine = "reached-training\n";

// Tells dtrain-launch that this rank has reached training. Call it once every rank has started
// (after dtrain::init and the set-up collectives, before the first step); later calls do
// nothing, and so does every call in a process that dtrain-launch did not start. Never throws,
// never blocks (a few bytes into an empty socket buffer).
void report_reached_training();

}  // namespace dtrain
