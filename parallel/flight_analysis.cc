#include "parallel/flight_analysis.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "core/dtype.h"
#include "parallel/flight_dumps.h"

namespace nf::parallel {
namespace {

// A record older than the newest by more than this did not answer the last dump request.
const absl::Duration kStale = 2 * kPeerDumpGrace;

// ---- Describing ---------------------------------------------------------------------------------

std::string GroupKey(const FlightEntry& e) { return absl::StrCat(e.group, "/", e.backend); }

bool IsTransfer(CommOp op) { return op == CommOp::kSend || op == CommOp::kRecv; }

std::string Clock(int64_t ns) {
  return absl::FormatTime("%H:%M:%E3S", absl::FromUnixNanos(ns), absl::UTCTimeZone());
}

// "all_reduce #57 (4096 B f32) on group dp/mpi" or "recv #3 from rank 1 (...) on group pp/mpi".
std::string Describe(const FlightEntry& e) {
  std::string peer;
  if (e.op == CommOp::kSend) peer = absl::StrCat(" to rank ", e.peer);
  if (e.op == CommOp::kRecv) peer = absl::StrCat(" from rank ", e.peer);
  if (e.op == CommOp::kBroadcast) peer = absl::StrCat(" from root rank ", e.peer);
  return absl::StrCat(CommOpName(e.op), " #", e.seq, peer, " (", e.bytes, " B ", DTypeName(e.dtype),
                      ") on group ", GroupKey(e));
}

// The signature collectives of one number must share on every rank.
std::string Signature(const FlightEntry& e) {
  return absl::StrCat(CommOpName(e.op), " ", e.bytes, " B ", DTypeName(e.dtype));
}

struct RankView {
  const FlightRecord* record = nullptr;  // null: no record
  bool stale = false;
  // A watchdog asked every rank for its record and this one did not answer within the grace
  // (its record came later, at the job's end: it was stopped, or could not run).
  bool unanswered = false;
  std::optional<FlightEntry> stuck;  // the oldest operation not completed
  // The longest span in which the process did not run that ended after the hang began.
  std::optional<ProcessStall> frozen;
};

double Seconds(const ProcessStall& s) { return static_cast<double>(s.end_ns - s.start_ns) / 1e9; }

// The entries of `record` on group `key`: collectives by seq, transfers by (op, peer) -> seq.
struct GroupHistory {
  std::map<int64_t, FlightEntry> collectives;
  int64_t last_collective = 0;
  std::map<std::pair<int, int>, int64_t> last_transfer;  // (op, peer) -> highest seq
};

// Every record's histories, by (rank, group key): one pass over the entries, so that a group's
// members are looked up, not rescanned, whatever the number of groups.
using Histories = std::map<std::pair<int, std::string>, GroupHistory>;

Histories HistoriesOf(const std::vector<FlightRecord>& records) {
  Histories all;
  for (const FlightRecord& r : records) {
    for (const FlightEntry& e : r.entries) {
      GroupHistory& h = all[{r.rank, GroupKey(e)}];
      if (IsTransfer(e.op)) {
        int64_t& last = h.last_transfer[{static_cast<int>(e.op), e.peer}];
        last = std::max(last, e.seq);
      } else {
        h.collectives[e.seq] = e;
        h.last_collective = std::max(h.last_collective, e.seq);
      }
    }
  }
  return all;
}

const GroupHistory& HistoryAt(const Histories& all, int rank, const std::string& key) {
  static const GroupHistory kNone;
  const auto it = all.find({rank, key});
  return it == all.end() ? kNone : it->second;
}

// Ascending, disjoint spans of ranks [first, last] as "0, 2, 5-9", touching spans joined.
std::string Spans(const std::vector<std::pair<int, int>>& spans) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < spans.size();) {
    const int first = spans[i].first;
    int last = spans[i].second;
    for (++i; i < spans.size() && spans[i].first == last + 1; ++i) last = spans[i].second;
    parts.push_back(first == last ? absl::StrCat(first) : absl::StrCat(first, "-", last));
  }
  return absl::StrJoin(parts, ", ");
}

// `text` with each control character (a newline, an escape sequence's ESC) as \xNN.
std::string ControlsShown(absl::string_view text) {
  std::string shown;
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) {
      absl::StrAppendFormat(&shown, "\\x%02x", byte);
    } else {
      shown.push_back(c);
    }
  }
  return shown;
}

// What rank `r` is doing, for "... ; it <doing>".
std::string Doing(const RankView& v) {
  if (v.record == nullptr) return "left no record";
  if (v.stuck) return absl::StrCat("waits in ", Describe(*v.stuck));
  return "is in no communication (computing, or blocked outside the communicators)";
}

}  // namespace

// ---- Public -------------------------------------------------------------------------------------

FlightFindings AnalyzeFlight(const std::vector<FlightRecord>& records) {
  FlightFindings f;
  int world = 0;
  int64_t newest = 0;
  // Groups of one name differ by rank (rank 0's dp is not rank 1's): each rank's own (its
  // latest registration of the name), and every distinct (name, members), each kept once.
  std::set<std::pair<std::string, std::vector<int>>> groups;
  std::map<int, std::map<std::string, const std::vector<int>*>> member_of;  // rank -> key
  for (const FlightRecord& r : records) {
    world = std::max(world, r.world_size);
    newest = std::max(newest, r.time_ns);
    for (const auto& [key, g] : CurrentGroups(r)) {
      const auto it = groups.insert({key, g->world_ranks}).first;
      member_of[r.rank][key] = &it->second;
    }
  }
  const Histories histories = HistoriesOf(records);
  // The first watchdog's dump, after which every live rank answers within kPeerDumpGrace.
  int64_t asked = 0;
  for (const FlightRecord& r : records) {
    if (absl::StartsWith(r.reason, "watchdog: ") && (asked == 0 || r.time_ns < asked)) {
      asked = r.time_ns;
    }
  }
  // The ranks with a record (a world may hold far more ranks than there are records).
  std::map<int, RankView> ranks;
  for (const FlightRecord& r : records) {
    RankView& v = ranks[r.rank];
    v.record = &r;
    v.stale = newest - r.time_ns > absl::ToInt64Nanoseconds(kStale);
    // The watchdog that asked waits kPeerDumpGrace before the job ends: a record written
    // later (a stopped rank continued only to be ended; it may even have timed out itself) or
    // for another reason (the job's SIGTERM) did not answer.
    const bool late = r.time_ns > asked + absl::ToInt64Nanoseconds(kPeerDumpGrace);
    const bool asked_for =
        absl::StartsWith(r.reason, "watchdog: ") || absl::StartsWith(r.reason, "requested: ");
    v.unanswered = asked != 0 && (late || !asked_for);
    // What the rank is stuck in: the operation its host waits for (MPI; the newest, as a host
    // waits for one at a time), else the oldest one not completed (NCCL's, waited for by the
    // GPU). An earlier asynchronous operation still open may only be waiting on the peer's
    // progress, which that wait blocks.
    for (const FlightEntry& e : r.entries) {
      if (e.state == FlightState::kWaiting) v.stuck = e;
    }
    for (const FlightEntry& e : r.entries) {
      if (v.stuck) break;
      if (e.state != FlightState::kCompleted) v.stuck = e;
    }
  }
  const RankView kNoRecord;
  const auto view = [&](int rank) -> const RankView& {
    const auto it = ranks.find(rank);
    return it == ranks.end() ? kNoRecord : it->second;
  };
  // The hang began when the first rank started waiting in the operation it is still in; a stall
  // ending after that kept its rank from the operations the others wait in.
  int64_t hang_began = 0;
  for (const auto& [rank, v] : ranks) {
    if (!v.stuck || v.stale) continue;
    const int64_t since = v.stuck->waiting_ns > 0 ? v.stuck->waiting_ns : v.stuck->issued_ns;
    if (hang_began == 0 || since < hang_began) hang_began = since;
  }
  for (auto& [rank, v] : ranks) {
    if (hang_began == 0) break;
    for (const ProcessStall& stall : v.record->stalls) {
      if (stall.end_ns > hang_began && (!v.frozen || Seconds(stall) > Seconds(*v.frozen))) {
        v.frozen = stall;
      }
    }
  }
  f.lines.push_back(absl::StrFormat("%d rank(s), %d record(s); the newest written %s UTC", world,
                                    records.size(), Clock(newest)));

  // Each rank: what it waits in, or that it is silent. Ranks without a record, in spans.
  std::vector<std::pair<int, int>> silent;  // spans, ascending as the ranks are walked
  const auto no_record = [&](int first, int last) {
    if (first > last) return;
    silent.push_back({first, last});
    f.lines.push_back(
        first == last
            ? absl::StrFormat(
                  "rank %d: no record: it never answered (killed, stopped, or its node is lost)",
                  first)
            : absl::StrFormat("ranks %d-%d: no record: they never answered (killed, stopped, or "
                              "their nodes are lost)",
                              first, last));
  };
  int next = 0;  // the lowest rank not yet described
  for (const auto& [rank, v] : ranks) {
    no_record(next, rank - 1);
    next = rank + 1;
    const FlightRecord& r = *v.record;
    const std::string who =
        absl::StrFormat("%s on %s (step %d)",
                        r.label.empty() ? absl::StrCat("rank ", rank) : r.label, r.host, r.step);
    if (v.stale) {
      silent.push_back({rank, rank});
      f.lines.push_back(absl::StrFormat(
          "%s: its record is from %s, older than the others': it did not answer the last "
          "request (stopped, or its node is lost)",
          who, Clock(r.time_ns)));
    } else if (v.unanswered) {
      silent.push_back({rank, rank});
      f.lines.push_back(absl::StrFormat(
          "%s did not answer the watchdog's request for records (it wrote its record only at %s, "
          "on %s): it was stopped, or could not run",
          who, Clock(r.time_ns), r.reason));
    }
    if (v.frozen) {
      f.lines.push_back(absl::StrFormat(
          "%s did not run for %.1f s, from %s to %s UTC: it was stopped (a signal, a debugger, a "
          "paused VM) or starved (no CPU, blocked in I/O)",
          who, Seconds(*v.frozen), Clock(v.frozen->start_ns), Clock(v.frozen->end_ns)));
    }
    if (v.stuck) {
      const FlightEntry& e = *v.stuck;
      const int64_t since = e.waiting_ns > 0 ? e.waiting_ns : e.issued_ns;
      f.lines.push_back(absl::StrFormat("%s waits in %s since %s (%.1f s before its record)", who,
                                        Describe(e), Clock(since),
                                        static_cast<double>(r.time_ns - since) / 1e9));
    } else if (!v.stale) {
      f.lines.push_back(absl::StrFormat("%s: no operation in flight (%s)", who, r.reason));
    }
  }
  no_record(next, world - 1);

  // The first collective the ranks of a group issued differently.
  for (const auto& [key, group_ranks] : groups) {
    std::map<int64_t, std::map<std::string, std::vector<int>>> by_seq;  // seq -> signature -> ranks
    for (int rank : group_ranks) {
      if (view(rank).record == nullptr) continue;
      for (const auto& [seq, e] : HistoryAt(histories, rank, key).collectives) {
        by_seq[seq][Signature(e)].push_back(rank);
      }
    }
    for (const auto& [seq, signatures] : by_seq) {
      if (signatures.size() < 2) continue;
      f.desynchronised = true;
      std::vector<std::string> parts;
      // The minority is the culprit; in a tie (two ranks, two collectives) every rank is.
      size_t most = 0, fewest = SIZE_MAX;
      for (const auto& [signature, rs] : signatures) {
        most = std::max(most, rs.size());
        fewest = std::min(fewest, rs.size());
      }
      for (const auto& [signature, rs] : signatures) {
        parts.push_back(absl::StrCat("ranks [", absl::StrJoin(rs, ", "), "] ", signature));
        if (rs.size() < most || fewest == most) {
          f.culprits.insert(f.culprits.end(), rs.begin(), rs.end());
        }
      }
      f.lines.push_back(
          absl::StrFormat("first divergence on group %s (ranks [%s]) at collective "
                          "#%d: %s",
                          key, absl::StrJoin(group_ranks, ", "), seq, absl::StrJoin(parts, "; ")));
      break;
    }
  }

  // Whom each waiting rank waits for.
  std::set<int> awaited;
  std::map<int, std::set<int>> waits_for;
  for (const auto& [rank, v] : ranks) {
    if (!v.stuck || v.stale) continue;
    const FlightEntry& e = *v.stuck;
    const std::string key = GroupKey(e);
    std::vector<int> others;
    if (IsTransfer(e.op)) {
      others = {e.peer};
    } else if (const auto it = member_of[rank].find(key); it != member_of[rank].end()) {
      for (int m : *it->second) {
        if (m != rank) others.push_back(m);
      }
    }
    for (int other : others) {
      const RankView& o = view(other);
      std::string why;
      if (o.record == nullptr || o.stale) {
        why = "left no recent record";
      } else if (o.unanswered) {
        why = absl::StrCat("did not answer the watchdog; its later record says it ", Doing(o));
      } else if (IsTransfer(e.op)) {
        const CommOp matching = e.op == CommOp::kRecv ? CommOp::kSend : CommOp::kRecv;
        const auto& history = HistoryAt(histories, other, key).last_transfer;
        const auto it = history.find({static_cast<int>(matching), rank});
        const int64_t last = it == history.end() ? 0 : it->second;
        if (last >= e.seq) continue;  // its part is posted: the transfer itself is slow
        why = absl::StrFormat("has not %s #%d %s rank %d (its last is #%d); it %s",
                              matching == CommOp::kSend ? "sent" : "posted receive", e.seq,
                              matching == CommOp::kSend ? "to" : "from", rank, last, Doing(o));
      } else {
        const GroupHistory& history = HistoryAt(histories, other, key);
        if (history.last_collective >= e.seq) continue;  // it arrived (or diverged: above)
        why = absl::StrFormat("has not reached it (its last collective there is #%d); it %s",
                              history.last_collective, Doing(o));
      }
      waits_for[rank].insert(other);
      awaited.insert(other);
      f.lines.push_back(absl::StrFormat("rank %d's %s waits for rank %d, which %s", rank,
                                        Describe(e), other, why));
    }
  }

  // The culprits: awaited ranks that wait for nobody themselves (silent, or outside any
  // operation).
  if (!f.desynchronised) {
    for (int rank : awaited) {
      if (waits_for[rank].empty()) f.culprits.push_back(rank);
    }
  }
  // Every awaited rank waits in turn (a cycle): the schedules differ. Where the members of a
  // group of three or more issued different numbers of collectives, the strict minority is out
  // of step with the rest (two-rank groups cannot say which of the two is).
  if (!f.desynchronised && f.culprits.empty() && !awaited.empty()) {
    for (const auto& [key, group_ranks] : groups) {
      std::map<int64_t, std::vector<int>> by_count;  // collectives issued -> ranks
      for (int m : group_ranks) {
        if (view(m).record != nullptr) {
          by_count[HistoryAt(histories, m, key).last_collective].push_back(m);
        }
      }
      if (group_ranks.size() < 3 || by_count.size() < 2) continue;
      size_t most = 0;
      for (const auto& [count, rs] : by_count) most = std::max(most, rs.size());
      for (const auto& [count, rs] : by_count) {
        if (rs.size() >= most) continue;
        f.desynchronised = true;
        f.culprits.insert(f.culprits.end(), rs.begin(), rs.end());
        std::vector<int64_t> others;
        for (const auto& [other, unused] : by_count) {
          if (other != count) others.push_back(other);
        }
        for (int rank : rs) {
          const RankView& v = view(rank);
          f.lines.push_back(absl::StrFormat(
              "rank %d issued %d collectives on group %s (ranks [%s]), the others %s: it is out "
              "of step%s",
              rank, count, key, absl::StrJoin(group_ranks, ", "), absl::StrJoin(others, " or "),
              v.stuck ? absl::StrCat(" (it waits in ", Describe(*v.stuck), ")") : ""));
        }
      }
    }
    if (f.culprits.empty()) f.culprits.assign(awaited.begin(), awaited.end());
  }
  // Ranks all inside one collective wait for each other (no one is awaited, or all are); the one
  // whose process stopped running holds it (it entered, then froze).
  if (!f.desynchronised) {
    std::vector<int> frozen;
    for (const auto& [rank, v] : ranks) {
      const bool candidate = f.culprits.empty()
                                 ? v.stuck.has_value()
                                 : std::count(f.culprits.begin(), f.culprits.end(), rank) > 0;
      if (candidate && v.frozen) frozen.push_back(rank);
    }
    if (!frozen.empty()) f.culprits = frozen;
  }
  std::sort(f.culprits.begin(), f.culprits.end());
  f.culprits.erase(std::unique(f.culprits.begin(), f.culprits.end()), f.culprits.end());
  std::string verdict;
  if (f.desynchronised) {
    verdict = absl::StrFormat(
        "verdict: rank(s) [%s] issued collectives the rest of their group did not: the ranks' "
        "schedules are desynchronised",
        absl::StrJoin(f.culprits, ", "));
  } else if (!f.culprits.empty()) {
    std::vector<std::string> named;
    for (int rank : f.culprits) {
      const RankView& v = view(rank);
      std::string why;
      if (v.record == nullptr || v.stale) {
        why = " (no recent record)";
      } else if (v.unanswered) {
        why = " (did not answer)";
      } else if (v.frozen) {
        why = absl::StrFormat(" (did not run for %.1f s)", Seconds(*v.frozen));
      }
      named.push_back(absl::StrCat(rank, why));
    }
    verdict =
        absl::StrFormat("verdict: the job waits for rank(s) [%s]", absl::StrJoin(named, ", "));
  } else if (!silent.empty()) {
    verdict = absl::StrFormat("verdict: rank(s) [%s] left no record; no one waits for them",
                              Spans(silent));
  } else {
    verdict = "verdict: no rank waits for another";
  }
  f.lines.push_back(verdict);
  // A record's strings (label, host, reason, group names) are the file's: their control
  // characters are shown, not sent to the terminal, so no record forges a line of the findings.
  for (std::string& line : f.lines) line = ControlsShown(line);
  return f;
}

}  // namespace nf::parallel
