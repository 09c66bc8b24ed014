#include "parallel/placement.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"

namespace nf::parallel {
namespace {

// Host names longer than this are cut (Linux allows 64 bytes).
constexpr int64_t kHostNameBytes = 256;

// "0-3", "0, 2", "0-1, 4-5": ascending ranks as runs.
std::string RankRuns(const std::vector<int>& ranks) {
  std::vector<std::string> runs;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    runs.push_back(j == i ? absl::StrCat(ranks[i]) : absl::StrCat(ranks[i], "-", ranks[j]));
    i = j + 1;
  }
  return absl::StrJoin(runs, ", ");
}

}  // namespace

std::string ThisHostName() {
  char name[kHostNameBytes] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "(unknown)";
  return name;
}

absl::StatusOr<std::vector<std::string>> GatherHostNames(Communicator& world) {
  NF_ASSIGN_OR_RETURN(const Tensor mine, Tensor::HostZeros(DType::kU8, {kHostNameBytes}));
  NF_ASSIGN_OR_RETURN(const Tensor all,
                      Tensor::HostZeros(DType::kU8, {world.size() * kHostNameBytes}));
  const std::string name = ThisHostName();
  std::memcpy(mine.data<uint8_t>(), name.data(), std::min<size_t>(name.size(), kHostNameBytes - 1));
  NF_RETURN_IF_ERROR(world.AllGather(mine, all));
  std::vector<std::string> hosts;
  for (int r = 0; r < world.size(); ++r) {
    const char* at = reinterpret_cast<const char*>(all.data<uint8_t>() + r * kHostNameBytes);
    hosts.emplace_back(at, strnlen(at, kHostNameBytes));
  }
  return hosts;
}

bool GroupsSpanNodes(const Topology& topology, GroupKind kind,
                     absl::Span<const std::string> hosts) {
  const ParallelSizes sizes = {.tp = topology.tp(), .pp = topology.pp(), .dp = topology.dp()};
  for (int rank = 0; rank < topology.world_size(); ++rank) {
    const absl::StatusOr<Topology> view = Topology::Create(topology.world_size(), rank, sizes);
    if (!view.ok()) continue;  // cannot happen: `topology` was made with these sizes
    for (const int member : view->group(kind)) {
      if (hosts[member] != hosts[rank]) return true;
    }
  }
  return false;
}

std::string DescribePlacement(const Topology& topology, absl::Span<const std::string> hosts) {
  std::vector<std::string> nodes;  // in order of their lowest rank
  std::vector<std::vector<int>> ranks_of;
  for (int rank = 0; rank < static_cast<int>(hosts.size()); ++rank) {
    const auto it = std::find(nodes.begin(), nodes.end(), hosts[rank]);
    if (it == nodes.end()) {
      nodes.push_back(hosts[rank]);
      ranks_of.push_back({rank});
    } else {
      ranks_of[it - nodes.begin()].push_back(rank);
    }
  }
  std::vector<std::string> per_node;
  for (size_t i = 0; i < nodes.size(); ++i) {
    per_node.push_back(absl::StrCat(nodes[i], ": ranks ", RankRuns(ranks_of[i])));
  }
  std::string line =
      absl::StrCat("placement: ", hosts.size(), " ranks on ", nodes.size(),
                   nodes.size() == 1 ? " node (" : " nodes (", absl::StrJoin(per_node, "; "), ")");
  if (nodes.size() == 1) return line;
  std::vector<std::string> within, across;
  const std::pair<GroupKind, int> kinds[] = {{GroupKind::kTensor, topology.tp()},
                                             {GroupKind::kPipeline, topology.pp()},
                                             {GroupKind::kData, topology.dp()}};
  for (const auto& [kind, size] : kinds) {
    if (size == 1) continue;
    (GroupsSpanNodes(topology, kind, hosts) ? across : within)
        .push_back(std::string(GroupKindName(kind)));
  }
  if (!within.empty()) absl::StrAppend(&line, "; within a node: ", absl::StrJoin(within, ", "));
  if (!across.empty()) absl::StrAppend(&line, "; across nodes: ", absl::StrJoin(across, ", "));
  return line;
}

}  // namespace nf::parallel
