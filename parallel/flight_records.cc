#include "parallel/flight_records.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/dtype.h"
#include "core/json_value.h"
#include "core/status.h"
#include "parallel/flight_dumps.h"

namespace nf::parallel {
namespace {

// More spans than StallClock keeps, or groups than a process registers (each communicator it
// creates, a few per training), is not a record a rank wrote.
constexpr int64_t kMaxStalls = 1024;
constexpr int64_t kMaxGroups = 1024;

absl::Status Bad(absl::string_view where, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
}

std::string Utc(int64_t ns) {
  return absl::FormatTime("%Y-%m-%d %H:%M:%E3S UTC", absl::FromUnixNanos(ns), absl::UTCTimeZone());
}

const JsonValue* Member(const JsonValue& object, const char* key) {
  auto it = object.members.find(key);
  return it == object.members.end() ? nullptr : &it->second;
}

// An integer literal (a JSON number that int64 holds exactly: not 1e300, not 2.5).
absl::StatusOr<int64_t> Integer(const JsonValue* v, absl::string_view name,
                                absl::string_view where) {
  int64_t value = 0;
  if (v == nullptr || v->kind != JsonValue::Kind::kNumber || !absl::SimpleAtoi(v->text, &value)) {
    return Bad(where, absl::StrCat(name, " is not an integer"));
  }
  return value;
}

// `key` of `object`, an integer in [lo, hi].
absl::StatusOr<int64_t> IntIn(const JsonValue& object, const char* key, int64_t lo, int64_t hi,
                              absl::string_view where) {
  NF_ASSIGN_OR_RETURN(const int64_t value,
                      Integer(Member(object, key), absl::StrCat("'", key, "'"), where));
  if (value < lo || value > hi) {
    return Bad(where, absl::StrCat("'", key, "' is ", value, ", outside [", lo, ", ", hi, "]"));
  }
  return value;
}

// A wall-clock time (ns since 1970; 0 where the format means "not reached"): not negative, and
// not after `latest` (the reader's clock plus kFlightClockSkew).
absl::StatusOr<int64_t> Time(const JsonValue& object, const char* key, int64_t latest,
                             absl::string_view where) {
  NF_ASSIGN_OR_RETURN(const int64_t value,
                      Integer(Member(object, key), absl::StrCat("'", key, "'"), where));
  if (value < 0) return Bad(where, absl::StrCat("'", key, "' is ", value, ", before 1970"));
  if (value > latest) {
    return Bad(where, absl::StrCat("'", key, "' is ", Utc(value), ", after this machine's clock (",
                                   Utc(latest - absl::ToInt64Nanoseconds(kFlightClockSkew)),
                                   ") by more than ", absl::FormatDuration(kFlightClockSkew),
                                   " (the record was edited, or its node's clock is wrong)"));
  }
  return value;
}

absl::StatusOr<std::string> Text(const JsonValue& object, const char* key,
                                 absl::string_view where) {
  const JsonValue* v = Member(object, key);
  if (v == nullptr || v->kind != JsonValue::Kind::kString) {
    return Bad(where, absl::StrCat("'", key, "' is not a string"));
  }
  return v->text;
}

// `key` of `object`, an array of at most `most` items.
absl::StatusOr<const std::vector<JsonValue>*> Array(const JsonValue& object, const char* key,
                                                    int64_t most, absl::string_view where) {
  const JsonValue* v = Member(object, key);
  if (v == nullptr || v->kind != JsonValue::Kind::kArray) {
    return Bad(where, absl::StrCat("'", key, "' is not an array"));
  }
  if (static_cast<int64_t>(v->items.size()) > most) {
    return Bad(where,
               absl::StrCat("'", key, "' has ", v->items.size(), " items, more than ", most));
  }
  return &v->items;
}

template <size_t N>
void CopyName(absl::string_view from, char (&to)[N]) {
  const size_t n = std::min(from.size(), N - 1);
  std::memcpy(to, from.data(), n);
  to[n] = '\0';
}

absl::StatusOr<CommOp> ParseOp(absl::string_view name, absl::string_view where) {
  for (int i = 0; i < static_cast<int>(CommOp::kCount); ++i) {
    if (CommOpName(static_cast<CommOp>(i)) == name) return static_cast<CommOp>(i);
  }
  return Bad(where, absl::StrCat("unknown operation '", name, "'"));
}

absl::StatusOr<FlightState> ParseState(absl::string_view name, absl::string_view where) {
  for (FlightState s : {FlightState::kIssued, FlightState::kWaiting, FlightState::kCompleted}) {
    if (FlightStateName(s) == name) return s;
  }
  return Bad(where, absl::StrCat("unknown state '", name, "'"));
}

// The limits an entry's values are checked against: the record's world, the reader's clock.
struct Bounds {
  int world_size = 0;
  int64_t latest_ns = 0;
};

absl::StatusOr<FlightEntry> ParseEntry(const JsonValue& line, const Bounds& b,
                                       absl::string_view where) {
  constexpr int64_t kMax = INT64_MAX;
  FlightEntry e;
  NF_ASSIGN_OR_RETURN(const int64_t id, IntIn(line, "id", 0, kMax, where));
  e.id = static_cast<uint64_t>(id);
  NF_ASSIGN_OR_RETURN(const std::string group, Text(line, "group", where));
  NF_ASSIGN_OR_RETURN(const std::string backend, Text(line, "backend", where));
  CopyName(group, e.group);
  CopyName(backend, e.backend);
  NF_ASSIGN_OR_RETURN(e.seq, IntIn(line, "seq", 0, kMax, where));
  NF_ASSIGN_OR_RETURN(const std::string op, Text(line, "op", where));
  NF_ASSIGN_OR_RETURN(e.op, ParseOp(op, where));
  // A transfer names its peer; a broadcast its root; any other collective -1.
  const bool transfer = e.op == CommOp::kSend || e.op == CommOp::kRecv;
  NF_ASSIGN_OR_RETURN(const int64_t peer,
                      IntIn(line, "peer", transfer ? 0 : -1, b.world_size - 1, where));
  e.peer = static_cast<int>(peer);
  NF_ASSIGN_OR_RETURN(e.bytes, IntIn(line, "bytes", 0, kMax, where));
  NF_ASSIGN_OR_RETURN(const std::string dtype, Text(line, "dtype", where));
  absl::StatusOr<DType> parsed = ParseDType(dtype);
  if (!parsed.ok()) return Bad(where, parsed.status().message());
  e.dtype = *parsed;
  NF_ASSIGN_OR_RETURN(e.step, IntIn(line, "step", -1, kMax, where));
  NF_ASSIGN_OR_RETURN(const std::string state, Text(line, "state", where));
  NF_ASSIGN_OR_RETURN(e.state, ParseState(state, where));
  NF_ASSIGN_OR_RETURN(e.issued_ns, Time(line, "issued_ns", b.latest_ns, where));
  NF_ASSIGN_OR_RETURN(e.waiting_ns, Time(line, "waiting_ns", b.latest_ns, where));
  NF_ASSIGN_OR_RETURN(e.completed_ns, Time(line, "completed_ns", b.latest_ns, where));
  return e;
}

absl::StatusOr<FlightGroup> ParseGroup(const JsonValue& g, int world_size,
                                       absl::string_view where) {
  FlightGroup group;
  NF_ASSIGN_OR_RETURN(group.group, Text(g, "group", where));
  NF_ASSIGN_OR_RETURN(group.backend, Text(g, "backend", where));
  NF_ASSIGN_OR_RETURN(const std::vector<JsonValue>* ranks, Array(g, "ranks", world_size, where));
  const std::string what = absl::StrCat("a rank of group '", group.group, "'");
  for (const JsonValue& r : *ranks) {
    NF_ASSIGN_OR_RETURN(const int64_t rank, Integer(&r, what, where));
    if (rank < 0 || rank >= world_size) {
      return Bad(where, absl::StrCat(what, " is ", rank, ", outside [0, ", world_size - 1, "]"));
    }
    group.world_ranks.push_back(static_cast<int>(rank));
  }
  std::vector<int> sorted = group.world_ranks;
  std::sort(sorted.begin(), sorted.end());
  if (const auto twice = std::adjacent_find(sorted.begin(), sorted.end()); twice != sorted.end()) {
    return Bad(where, absl::StrCat(what, " is ", *twice, " twice"));
  }
  return group;
}

absl::Status ParseHeader(const JsonValue& header, int64_t latest_ns, absl::string_view where,
                         FlightRecord& record) {
  NF_ASSIGN_OR_RETURN(const int64_t size,
                      IntIn(header, "world_size", 1, kMaxFlightWorldSize, where));
  NF_ASSIGN_OR_RETURN(const int64_t rank, IntIn(header, "rank", 0, size - 1, where));
  record.world_size = static_cast<int>(size);
  record.rank = static_cast<int>(rank);
  // Absent in the records of builds before it was written: an unnamed launch.
  if (Member(header, "run_started_ns") != nullptr) {
    NF_ASSIGN_OR_RETURN(record.run_started_ns, Time(header, "run_started_ns", latest_ns, where));
  }
  NF_ASSIGN_OR_RETURN(record.label, Text(header, "label", where));
  NF_ASSIGN_OR_RETURN(record.host, Text(header, "host", where));
  NF_ASSIGN_OR_RETURN(record.reason, Text(header, "reason", where));
  NF_ASSIGN_OR_RETURN(record.time_ns, Time(header, "time_ns", latest_ns, where));
  NF_ASSIGN_OR_RETURN(record.step, IntIn(header, "step", -1, INT64_MAX, where));
  if (Member(header, "stalls") != nullptr) {
    NF_ASSIGN_OR_RETURN(const std::vector<JsonValue>* stalls,
                        Array(header, "stalls", kMaxStalls, where));
    for (const JsonValue& stall : *stalls) {
      ProcessStall parsed;
      NF_ASSIGN_OR_RETURN(parsed.start_ns, Time(stall, "start_ns", latest_ns, where));
      NF_ASSIGN_OR_RETURN(parsed.end_ns, Time(stall, "end_ns", latest_ns, where));
      if (parsed.end_ns < parsed.start_ns) return Bad(where, "a stall ends before it starts");
      record.stalls.push_back(parsed);
    }
  }
  NF_ASSIGN_OR_RETURN(const std::vector<JsonValue>* groups,
                      Array(header, "groups", kMaxGroups, where));
  for (const JsonValue& g : *groups) {
    NF_ASSIGN_OR_RETURN(FlightGroup group, ParseGroup(g, record.world_size, where));
    record.groups.push_back(std::move(group));
  }
  return absl::OkStatus();
}

// "[0, 1, 2]", or its first ranks and the count for a long group.
std::string RankList(const std::vector<int>& ranks) {
  constexpr size_t kShown = 8;
  if (ranks.size() <= kShown) return absl::StrCat("[", absl::StrJoin(ranks, ", "), "]");
  return absl::StrCat("[", absl::StrJoin(ranks.begin(), ranks.begin() + kShown, ", "), ", ... (",
                      ranks.size(), " ranks)]");
}

std::string Launch(int64_t run_started_ns) {
  return run_started_ns == 0 ? "an unnamed launch"
                             : absl::StrCat("the launch of ", Utc(run_started_ns));
}

// `a` and `b` are of different runs: which, and what to do.
absl::Status DifferentRuns(const FlightRecord& a, const FlightRecord& b) {
  std::vector<std::string> differences;
  if (a.world_size != b.world_size) {
    differences.push_back(absl::StrCat("'world_size' ", a.world_size, " against ", b.world_size));
  }
  if (a.run_started_ns != b.run_started_ns) {
    differences.push_back(absl::StrCat("'run_started_ns': ", Launch(a.run_started_ns), " against ",
                                       Launch(b.run_started_ns)));
  }
  const FlightRecord& older = a.time_ns <= b.time_ns ? a : b;
  return absl::FailedPreconditionError(absl::StrCat(
      a.file, " and ", b.file, " are records of different runs (", absl::StrJoin(differences, "; "),
      "): nf-flight reads one run's records; move the other run's (", older.file,
      " is the older) out of the directory"));
}

}  // namespace

std::map<std::string, const FlightGroup*> CurrentGroups(const FlightRecord& record) {
  std::map<std::string, const FlightGroup*> current;
  for (const FlightGroup& g : record.groups) current[absl::StrCat(g.group, "/", g.backend)] = &g;
  return current;
}

absl::StatusOr<FlightRecord> ParseFlightRecord(absl::string_view text, absl::string_view where,
                                               int64_t now_ns) {
  const int64_t latest_ns = now_ns + absl::ToInt64Nanoseconds(kFlightClockSkew);
  FlightRecord record;
  record.file = std::string(where);
  int64_t number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    ++number;
    const std::string at = absl::StrCat(where, ":", number);
    // Before any parsing: the tree of a JSON line takes many times its bytes.
    const int64_t most = number == 1 ? kMaxFlightHeaderBytes : kMaxFlightEntryBytes;
    if (static_cast<int64_t>(line.size()) > most) {
      return Bad(at, absl::StrCat("a line of ", line.size(), " bytes, more than ", most));
    }
    absl::StatusOr<JsonValue> value = ParseJson(line);
    if (!value.ok()) return Bad(at, value.status().message());
    if (value->kind != JsonValue::Kind::kObject) return Bad(at, "not a JSON object");
    if (number == 1) {
      NF_RETURN_IF_ERROR(ParseHeader(*value, latest_ns, at, record));
      continue;
    }
    NF_ASSIGN_OR_RETURN(
        FlightEntry entry,
        ParseEntry(*value, {.world_size = record.world_size, .latest_ns = latest_ns}, at));
    record.entries.push_back(entry);
  }
  if (number == 0) return Bad(where, "empty");
  return record;
}

absl::StatusOr<std::vector<FlightRecord>> MergeFlightRecords(std::vector<FlightRecord> records) {
  std::sort(records.begin(), records.end(),
            [](const FlightRecord& a, const FlightRecord& b) { return a.rank < b.rank; });
  for (size_t i = 1; i < records.size(); ++i) {
    const FlightRecord& a = records[0];
    const FlightRecord& b = records[i];
    if (a.world_size != b.world_size || a.run_started_ns != b.run_started_ns) {
      return DifferentRuns(a, b);
    }
    if (records[i - 1].rank == b.rank) {
      return absl::FailedPreconditionError(
          absl::StrCat(records[i - 1].file, " and ", b.file, " are both rank ", b.rank,
                       "'s record: keep the one of the run to analyse"));
    }
  }
  // Every member of a group has that group's members (an MPI communicator's are the same on each
  // of its ranks): the first record that lists a group for a rank claims it, and another record
  // listing other members for that rank there is of another run, or damaged. Each distinct group
  // is walked once, so the check is linear in what the records list.
  struct Claim {
    const std::vector<int>* ranks;
    const FlightRecord* by;
  };
  std::set<std::pair<std::string, std::vector<int>>> seen;
  std::map<std::pair<std::string, int>, Claim> claims;  // (group/backend, rank) -> members
  for (const FlightRecord& r : records) {
    for (const auto& [key, current] : CurrentGroups(r)) {
      const FlightGroup& g = *current;
      if (!seen.insert({key, g.world_ranks}).second) continue;
      for (const int member : g.world_ranks) {
        const auto [it, first] = claims.insert({{key, member}, {&g.world_ranks, &r}});
        if (first) continue;
        return absl::FailedPreconditionError(absl::StrCat(
            it->second.by->file, " lists group ", key, " of rank ", member, " as ranks ",
            RankList(*it->second.ranks), ", ", r.file, " as ranks ", RankList(g.world_ranks),
            ": records of different runs, or damaged ones; keep one run's records"));
      }
    }
  }
  return records;
}

namespace {

// `records` without those of an earlier launch of the same world (their files go to `earlier`):
// the newest run_started_ns among the world sizes present, each of which MergeFlightRecords
// then sees once. Records of several world sizes are left for it to refuse.
std::vector<FlightRecord> NewestLaunch(std::vector<FlightRecord> records,
                                       std::vector<std::string>* earlier) {
  if (records.empty()) return records;
  for (const FlightRecord& r : records) {
    if (r.world_size != records[0].world_size) return records;
  }
  int64_t newest = 0;
  for (const FlightRecord& r : records) newest = std::max(newest, r.run_started_ns);
  std::vector<FlightRecord> kept;
  for (FlightRecord& r : records) {
    if (r.run_started_ns == newest) {
      kept.push_back(std::move(r));
    } else if (earlier != nullptr) {
      earlier->push_back(r.file);
    }
  }
  return kept;
}

// The rank a file name says, for rank_NNNNN.jsonl as flight_dumps.h names it; -1 for any other
// name (REQUEST, the writers' temporaries, a user's notes).
int RankOfName(const std::string& name) {
  constexpr absl::string_view kPrefix = "rank_", kSuffix = ".jsonl";
  if (!absl::StartsWith(name, kPrefix) || !absl::EndsWith(name, kSuffix)) return -1;
  const absl::string_view digits =
      absl::string_view(name).substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  int rank = -1;
  if (digits.size() < 5 || !std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(digits, &rank) || FlightRecordPath("", rank).filename() != name) {
    return -1;
  }
  return rank;
}

// The bytes of `path`: a regular file of at most kMaxFlightRecordBytes (not a FIFO that blocks,
// a device that never ends or a huge file), read without trusting its size not to change.
absl::StatusOr<std::string> ReadRecordFile(const std::filesystem::path& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot open ", path.string(), ": ", std::strerror(errno)));
  }
  struct stat info = {};
  std::string text;
  absl::Status status = absl::OkStatus();
  if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    status = absl::InvalidArgumentError(absl::StrCat(path.string(), " is not a regular file"));
  } else if (info.st_size > kMaxFlightRecordBytes) {
    status = absl::InvalidArgumentError(absl::StrCat(path.string(), " has ", info.st_size,
                                                     " bytes, more than a record's ",
                                                     kMaxFlightRecordBytes));
  } else {
    text.resize(static_cast<size_t>(info.st_size) + 1);  // one more: a file that grew shows it
    size_t have = 0;
    while (have < text.size()) {
      const ssize_t got = read(fd, text.data() + have, text.size() - have);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) break;
      have += static_cast<size_t>(got);
    }
    if (have == text.size()) {
      status = absl::UnavailableError(
          absl::StrCat(path.string(), " grew while it was read: is its rank still writing?"));
    }
    text.resize(have);
  }
  close(fd);
  if (!status.ok()) return status;
  return text;
}

}  // namespace

absl::StatusOr<std::vector<FlightRecord>> ReadFlightRecords(const std::filesystem::path& dir,
                                                            std::vector<std::string>* earlier) {
  const int64_t now_ns = WallClockNanos();
  const std::string advice =
      absl::StrCat("move the file out of ", dir.string(), " to analyse the other records");
  std::vector<FlightRecord> records;
  std::error_code error;
  // The members that throw are not used: increment(error), not ++.
  std::filesystem::directory_iterator it(dir, error), end;
  for (; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    const int rank = RankOfName(name);
    if (rank < 0) continue;
    if (records.size() >= static_cast<size_t>(kMaxFlightWorldSize)) {
      return absl::FailedPreconditionError(absl::StrCat(
          dir.string(), " holds more than ", kMaxFlightWorldSize, " records, more ranks than a ",
          "record may have: keep one run's records there"));
    }
    absl::StatusOr<std::string> text = ReadRecordFile(it->path());
    if (absl::IsInvalidArgument(text.status())) {
      return absl::InvalidArgumentError(absl::StrCat(text.status().message(), "; ", advice));
    }
    if (!text.ok()) return text.status();
    absl::StatusOr<FlightRecord> record = ParseFlightRecord(*text, it->path().string(), now_ns);
    if (!record.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(record.status().message(), "; ", advice));
    }
    if (record->rank != rank) {
      return absl::InvalidArgumentError(absl::StrCat(it->path().string(), ":1: 'rank' is ",
                                                     record->rank, ", not the file name's ", rank,
                                                     "; ", advice));
    }
    records.push_back(*std::move(record));
  }
  if (error) {
    return absl::NotFoundError(
        absl::StrCat("cannot read ", dir.string(), ": ", error.message(),
                     " (is it RUN/flight of a run whose ranks dumped their records?)"));
  }
  if (records.empty()) {
    return absl::NotFoundError(absl::StrCat("no rank_*.jsonl in ", dir.string(),
                                            ": no rank has dumped its flight record"));
  }
  return MergeFlightRecords(NewestLaunch(std::move(records), earlier));
}

}  // namespace nf::parallel
