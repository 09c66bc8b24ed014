// A minimal HTTP server for Prometheus scrapes: `GET /metrics` answers with the text that
// `render` returns (Prometheus text format 0.0.4), every other request with 404.
//
// No client can hold up another. One thread runs a poll() loop over the listening socket, a
// self-pipe for shutdown and up to kMaxConnections non-blocking connections, reading requests
// and writing answers piecemeal as each socket allows. Each connection has one deadline,
// kRequestDeadline after it was accepted, for sending its request and reading the whole answer:
// a client that trickles bytes, sends nothing or does not read is closed then, whatever it is
// still doing. A request longer than kMaxRequestBytes gets 431. When every slot is taken, a new
// connection takes the slot of the one that has waited longest for its request (never one whose
// answer is being written, nor one accepted less than kEvictionGrace ago), so a flood of idle
// connections cannot lock a scraper out: the grace is the time a scraper's request has to arrive
// after its connection is accepted (one network round trip, or a loaded scraper's wake-up; with
// none, a flood of reconnecting idle clients evicted 53 of 60 scrapes whose request came 20 ms
// after the connection). It also caps the churn at kMaxConnections per grace, so a scraper
// behind N idle clients in the listen backlog (SOMAXCONN) waits N x grace / kMaxConnections.
// `render` runs on this thread once a request is complete.
//
// Why not prometheus-cpp's pull exposer: its HTTP server, Debian's civetweb 1.15, creates its
// threads with 100 KiB stacks (pthread_attr_setstacksize(102400), seen under gdb), and glibc
// refuses such a thread with EINVAL when the static TLS of the loaded libraries does not fit
// in it. A CUDA build of nf-launch loads OpenBLAS (60 KiB of TLS) and cuBLASLt (92 KiB), so
// the exposer fails there with "Cannot create threads: error 0" (errno is not set) while the
// same call works in a program without them (readelf -lW LIB | grep TLS shows the sizes). This
// server's one thread has the default stack, no dependency beyond POSIX sockets, and is small
// enough to read in one sitting.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace nf::monitoring {

class MetricsServer {
 public:
  static constexpr int kMaxConnections = 64;
  static constexpr std::chrono::milliseconds kRequestDeadline{2000};
  static constexpr std::chrono::milliseconds kEvictionGrace{100};
  static constexpr size_t kMaxRequestBytes = 8192;

  // Listens on address:port, IPv4 or IPv6 (e.g. "0.0.0.0", "127.0.0.1", "::", "::1"; "::" takes
  // IPv4 connections too); the error names the address and the reason (a port in use, an address
  // not on this host).
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& address, int port,
                                                              std::function<std::string()> render);
  ~MetricsServer();  // stops serving and closes every connection, answers in progress included
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const { return port_; }

 private:
  MetricsServer(int listen_fd, int wake_read, int wake_write, int port,
                std::function<std::string()> render);
  void Serve();

  const int listen_fd_, wake_read_, wake_write_, port_;
  const std::function<std::string()> render_;
  std::thread thread_;
};

}  // namespace nf::monitoring
