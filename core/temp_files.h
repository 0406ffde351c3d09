// Temporary files of atomic writes (write "<path>.tmp<pid>", flush, rename over <path>) and the
// clean-up of those a killed writer left behind. A leftover is removed only when the process its
// name carries is gone, so a live writer's temporary is never touched.
//
// The pid is checked on this host. Every file written this way has one writer per job (rank 0,
// or a per-rank name), so a live writer on another host sharing the directory means two jobs
// share it; their files would overwrite each other's anyway.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>

namespace dtrain {

// "<path>.tmp<pid of this process>".
std::string temporary_path(const std::string& path);

// The pid in `name` when it is a temporary of a file named `target` ("<target>.tmp<pid>").
std::optional<pid_t> temporary_owner(std::string_view name, std::string_view target);

// Whether `pid` is a process on this host (this one included; one of another user counts).
bool process_alive(pid_t pid);

// Removes the temporaries of `path` beside it whose writer is no longer alive (best effort);
// returns how many it removed.
int remove_stale_temporaries(const std::string& path);

}  // namespace dtrain
