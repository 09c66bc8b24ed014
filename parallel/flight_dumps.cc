#include "parallel/flight_dumps.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/dtype.h"
#include "core/files/atomic_file.h"
#include "core/status.h"
#include "parallel/flight_recorder.h"
#include "parallel/process_stalls.h"
#include "parallel/watchdog.h"

namespace nf::parallel {
namespace {

constexpr int kFatalSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
constexpr int kNumFatal = sizeof(kFatalSignals) / sizeof(kFatalSignals[0]);
// How often the dumping thread looks for a new RUN/flight/REQUEST.
constexpr absl::Duration kRequestPoll = absl::Milliseconds(100);

// JSON string contents: quotes, backslashes and control characters escaped.
std::string Escaped(absl::string_view text) {
  std::string out;
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppendFormat(&out, "\\u%04x", c);
    } else {
      out.push_back(c);
    }
  }
  return out;
}

// The first line of dir/REQUEST ("<time_ns> <reason>"), or "" when there is none.
std::string ReadRequest(const std::filesystem::path& dir) {
  std::ifstream in(dir / "REQUEST");
  std::string line;
  std::getline(in, line);
  return line;
}

// The process's dumping: its configuration, the thread, and the pipes signal handlers write to.
struct Dumper {
  std::mutex config_mutex;
  FlightDumpConfig config;  // under config_mutex: read it through ConfigOf
  int wake[2] = {-1, -1};   // signal number bytes, to the thread
  int done[2] = {-1, -1};   // one byte per dump, to a fatal signal's handler
  struct sigaction previous[kNumFatal] = {};
  std::mutex write_mutex;  // one dump at a time
  // Set once the watchdog's dump is written: the SIGTERM of the job's end must not replace it.
  std::atomic<bool> watchdog_dumped{false};
  std::mutex request_mutex;
  std::string seen_request;  // the REQUEST line last dumped for, or written by this rank
  // Noted at each wake of the dumping thread and before each dump (which a watchdog may write
  // from another thread before the dumping thread, continued with it, wakes).
  StallClock stalls;
};

// Marks `line` handled; false when it was already.
bool FirstSeen(Dumper& d, const std::string& line) {
  std::lock_guard<std::mutex> lock(d.request_mutex);
  if (line == d.seen_request) return false;
  d.seen_request = line;
  return true;
}
std::atomic<Dumper*> dumper{nullptr};

FlightDumpConfig ConfigOf(Dumper& d) {
  std::lock_guard<std::mutex> lock(d.config_mutex);
  return d.config;
}

std::atomic<int64_t> dumps_written{0};

absl::Status Dump(Dumper& d, absl::string_view reason) {
  const FlightDumpConfig config = ConfigOf(d);
  d.stalls.NoteNow();
  std::lock_guard<std::mutex> lock(d.write_mutex);
  NF_RETURN_IF_ERROR(ReplaceFileAtomically(FlightRecordPath(config.dir, config.world_rank),
                                           FormatFlightRecord(config, reason, d.stalls.Stalls())));
  dumps_written.fetch_add(1);
  return absl::OkStatus();
}

std::string SignalReason(int signal) {
  switch (signal) {
    case SIGUSR2:
      return "SIGUSR2 (a request)";
    case SIGTERM:
      return "SIGTERM";
    default:
      return absl::StrCat("fatal signal ", signal, " (", strsignal(signal), ")");
  }
}

extern "C" void OnFatalSignal(int signal) {
  Dumper* d = dumper.load();
  if (d != nullptr) {
    const unsigned char byte = static_cast<unsigned char>(signal);
    if (write(d->wake[1], &byte, 1) == 1) {
      pollfd wait = {.fd = d->done[0], .events = POLLIN, .revents = 0};
      if (poll(&wait, 1, 2000) == 1) {
        unsigned char ack;
        if (read(d->done[0], &ack, 1) < 0) {
          // Nothing to do: the signal is handled as before either way.
        }
      }
    }
    for (int i = 0; i < kNumFatal; ++i) {
      if (kFatalSignals[i] == signal) sigaction(signal, &d->previous[i], nullptr);
    }
  }
  raise(signal);
}

extern "C" void OnDumpRequestSignal(int signal) { RequestFlightDumpFromSignal(signal); }

// The dumping thread: a byte on the wake pipe is a signal's dump; otherwise, every
// kRequestPoll, a REQUEST newer than the last one seen is a dump. Each wake is noted on the
// stall clock (process_stalls.h).
void DumpLoop(Dumper* d) {
  FirstSeen(*d, ReadRequest(ConfigOf(*d).dir));  // one left by an earlier run is not for us
  for (;;) {
    pollfd wait = {.fd = d->wake[0], .events = POLLIN, .revents = 0};
    const int ready = poll(&wait, 1, static_cast<int>(absl::ToInt64Milliseconds(kRequestPoll)));
    d->stalls.NoteNow();
    if (ready == 1) {
      unsigned char signal = 0;
      if (read(d->wake[0], &signal, 1) != 1) continue;
      const bool fatal = signal != SIGUSR2 && signal != SIGTERM;
      if (fatal || !d->watchdog_dumped.load()) Dump(*d, SignalReason(signal)).IgnoreError();
      if (fatal && write(d->done[1], &signal, 1) != 1) continue;
      continue;
    }
    const std::string request = ReadRequest(ConfigOf(*d).dir);
    if (!request.empty() && FirstSeen(*d, request)) {
      const size_t space = request.find(' ');
      Dump(*d, absl::StrCat("requested: ",
                            space == std::string::npos ? request : request.substr(space + 1)))
          .IgnoreError();
    }
  }
}

// On the watchdog's expiry: this rank's record, the others asked for theirs, and a bounded wait
// for them (a rank that is gone never answers).
void DumpEverywhere(const std::string& report) {
  Dumper* d = dumper.load();
  if (d == nullptr) return;
  const FlightDumpConfig config = ConfigOf(*d);
  Dump(*d, absl::StrCat("watchdog: ", report)).IgnoreError();
  d->watchdog_dumped.store(true);
  const int64_t asked = WallClockNanos();
  const std::string request = absl::StrCat(asked, " ", report);
  FirstSeen(*d, request);  // this rank's own dump is written
  if (!ReplaceFileAtomically(config.dir / "REQUEST", request + "\n").ok()) return;
  const absl::Time deadline = absl::Now() + kPeerDumpGrace;
  while (absl::Now() < deadline) {
    int fresh = 0;
    for (int rank = 0; rank < config.world_size; ++rank) {
      std::error_code error;
      const auto written =
          std::filesystem::last_write_time(FlightRecordPath(config.dir, rank), error);
      if (error) continue;
      const auto since_epoch = std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::file_clock::to_sys(written).time_since_epoch());
      if (since_epoch.count() >= asked || rank == config.world_rank) ++fresh;
    }
    if (fresh == config.world_size) return;
    absl::SleepFor(absl::Milliseconds(50));
  }
}

}  // namespace

std::filesystem::path FlightRecordPath(const std::filesystem::path& dir, int world_rank) {
  return dir / absl::StrFormat("rank_%05d.jsonl", world_rank);
}

std::string FormatFlightRecord(const FlightDumpConfig& config, absl::string_view reason,
                               absl::Span<const ProcessStall> stalls) {
  const FlightRecorder& recorder = FlightRecorder::Get();
  std::vector<std::string> stall_texts;
  for (const ProcessStall& s : stalls) {
    stall_texts.push_back(absl::StrFormat(R"({"start_ns":%d,"end_ns":%d})", s.start_ns, s.end_ns));
  }
  std::vector<std::string> groups;
  for (const FlightGroup& g : recorder.Groups()) {
    groups.push_back(absl::StrFormat(R"({"group":"%s","backend":"%s","ranks":[%s]})",
                                     Escaped(g.group), Escaped(g.backend),
                                     absl::StrJoin(g.world_ranks, ",")));
  }
  std::string text = absl::StrFormat(
      R"({"rank":%d,"world_size":%d,"run_started_ns":%d,"label":"%s","host":"%s","reason":"%s",)"
      R"("time_ns":%d,"step":%d,"capacity":%d,"dropped":%d,"stalls":[%s],"groups":[%s]})"
      "\n",
      config.world_rank, config.world_size, config.run_started_ns, Escaped(RankLabel()),
      Escaped(config.host), Escaped(reason), WallClockNanos(), CurrentStep(), recorder.capacity(),
      recorder.dropped(), absl::StrJoin(stall_texts, ","), absl::StrJoin(groups, ","));
  for (const FlightEntry& e : recorder.Entries()) {
    absl::StrAppendFormat(
        &text,
        R"({"id":%d,"group":"%s","backend":"%s","seq":%d,"op":"%s","peer":%d,"bytes":%d,)"
        R"("dtype":"%s","step":%d,"state":"%s","issued_ns":%d,"waiting_ns":%d,"completed_ns":%d})"
        "\n",
        e.id, Escaped(e.group), Escaped(e.backend), e.seq, CommOpName(e.op), e.peer, e.bytes,
        DTypeName(e.dtype), e.step, FlightStateName(e.state), e.issued_ns, e.waiting_ns,
        e.completed_ns);
  }
  return text;
}

absl::Status StartFlightDumps(const FlightDumpConfig& config) {
  std::error_code error;
  std::filesystem::create_directories(config.dir, error);
  if (error) {
    return absl::UnavailableError(absl::StrCat("cannot create the flight record directory ",
                                               config.dir.string(), ": ", error.message()));
  }
  if (Dumper* running = dumper.load(); running != nullptr) {
    FirstSeen(*running, ReadRequest(config.dir));
    std::lock_guard<std::mutex> lock(running->config_mutex);
    running->config = config;
    return absl::OkStatus();
  }
  auto d = std::make_unique<Dumper>();
  d->config = config;
  if (pipe2(d->wake, O_CLOEXEC) != 0 || pipe2(d->done, O_CLOEXEC) != 0) {
    return absl::InternalError("cannot make the flight recorder's pipes");
  }
  // A full pipe drops a byte rather than blocking a signal handler.
  fcntl(d->wake[1], F_SETFL, O_NONBLOCK);
  fcntl(d->done[1], F_SETFL, O_NONBLOCK);
  Dumper* raw = d.release();  // lives for the process, as the thread does
  dumper.store(raw);
  std::thread(DumpLoop, raw).detach();

  struct sigaction action = {};
  action.sa_handler = OnDumpRequestSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGUSR2, &action, nullptr);
  action.sa_handler = OnFatalSignal;
  for (int i = 0; i < kNumFatal; ++i) sigaction(kFatalSignals[i], &action, &raw->previous[i]);
  SetWatchdogExpiryHook(DumpEverywhere);
  return absl::OkStatus();
}

int64_t FlightRecordsWritten() { return dumps_written.load(); }

absl::Status DumpFlightRecord(absl::string_view reason) {
  Dumper* d = dumper.load();
  if (d == nullptr) return absl::FailedPreconditionError("flight record dumps were not started");
  return Dump(*d, reason);
}

void RequestFlightDumpFromSignal(int signal) {
  Dumper* d = dumper.load();
  if (d == nullptr) return;
  const unsigned char byte = static_cast<unsigned char>(signal);
  if (write(d->wake[1], &byte, 1) != 1) {
    // A full pipe: a dump is already on its way.
  }
}

absl::Status RequestFlightDumps(const std::filesystem::path& dir, absl::string_view reason) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  return ReplaceFileAtomically(dir / "REQUEST", absl::StrCat(WallClockNanos(), " ", reason, "\n"));
}

}  // namespace nf::parallel
