// Warnings any rank may print, prefixed with who it is, so that a line in a job's merged output
// says which rank of which layout saw the problem:
//
//   normformer: warning: rank 5 (tp=1, dp=0, pp=1): the checkpoint of step 400 is still being
//   written when step 500's is due; training waits for it (a slow file system? ...)
//
// (one line in reality). Each warning is one write to stderr, so lines from different ranks do
// not interleave mid-line. Errors that end a run are reported by nf-launch itself, with the
// same prefix.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace nf::parallel {

// The line WarnFromRank prints (with its newline); RankLabel() (watchdog.h) names the rank.
std::string RankWarning(absl::string_view message);
void WarnFromRank(absl::string_view message);

}  // namespace nf::parallel
