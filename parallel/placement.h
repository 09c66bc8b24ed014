// Where the ranks of a job run. Each rank's host name is gathered once at start-up; from them,
// what the layout's groups span: a tensor-parallel group across nodes puts two all-reduces per
// layer on the network, so the launcher says which groups cross nodes (and warns about that
// one), and the watchdog names the host of every peer it waited for.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "parallel/communicator.h"
#include "parallel/topology.h"

namespace nf::parallel {

// This process's host name (gethostname), "(unknown)" if it cannot be read.
std::string ThisHostName();

// The host name of every rank of `world`, in rank order. Collective over `world`.
absl::StatusOr<std::vector<std::string>> GatherHostNames(Communicator& world);

// Whether some group of `kind` of the layout (`topology`'s sizes) has members on more than one
// of `hosts` (indexed by world rank).
bool GroupsSpanNodes(const Topology& topology, GroupKind kind, absl::Span<const std::string> hosts);

// One line (no newline) for the launcher's header, e.g.
//   placement: 4 ranks on 2 nodes (n0: ranks 0-1; n1: ranks 2-3); within a node: tp;
//   across nodes: pp, dp
// (groups of size 1 left out; nodes in order of their lowest rank).
std::string DescribePlacement(const Topology& topology, absl::Span<const std::string> hosts);

}  // namespace nf::parallel
