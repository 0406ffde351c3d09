// The rank supervisor: what mpirun starts on every node in place of the program, as
// `dtrain-launch --rank-supervisor -- PROGRAM ARGS...`. It connects back to dtrain-launch (the
// address and the job's token are in its environment), starts the program as its child, passes
// the program's stderr through while keeping its last line, relays the program's "reached
// training" report (comm/launch_channel.h) and, when the program ends, reports how: exit status
// or signal, whether it had been told to stop, and that last line. Signals from mpirun are passed
// on to the program, and so is the signal dtrain-launch sends over the connection when it is
// interrupted (it reaches ranks on every node, and mpirun, which stops passing output on once it
// is signalled itself, stays out of it); if mpirun or dtrain-launch goes away, the program is
// stopped (SIGTERM, then SIGKILL after a second), and if the supervisor itself is killed, the
// program dies with it.
// Started without dtrain-launch's environment, it simply runs the program.
#pragma once

#include <string>
#include <vector>

namespace dtrain::launcher {

// Runs `program` supervised; returns the exit status for the supervisor's own exit: the
// program's status, or 128 + the signal that killed it.
int run_rank_supervisor(const std::vector<std::string>& program);

}  // namespace dtrain::launcher
