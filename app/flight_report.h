// `dtrain flight-report DIR`: reads the flight-recorder dumps every rank wrote (on a timeout, an
// error or SIGUSR1; comm/flight_recorder.h) and says in a few lines where the job stopped: the
// first collective that not every rank completed, which ranks are behind or missing, and what
// each other rank was waiting in. Ranks that disagree on a collective (another kind or size at
// the same sequence number) are named first: that, not a slow rank, is then the cause.
#pragma once

#include <string>
#include <vector>

namespace dtrain {

// The report for these dumps (the JSON texts of flight_recorder_rank<R>.json). Pure.
std::string flight_report(const std::vector<std::string>& dumps);

// Reads DIR/flight_recorder_rank*.json and prints flight_report(); returns the exit status (1
// when DIR has no dump).
int run_flight_report(const std::string& dir);

}  // namespace dtrain
