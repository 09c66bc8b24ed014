#include "monitoring/metrics_server.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "monitoring/socket_address.h"

namespace nf::monitoring {
namespace {

using Clock = std::chrono::steady_clock;

// After accept() fails for want of descriptors or memory, the listening socket is left alone
// this long rather than retried in a busy loop that would take a core from training.
constexpr std::chrono::milliseconds kAcceptBackoff{100};

struct Connection {
  int fd;
  Clock::time_point deadline;  // accept time + kRequestDeadline, for the request and the answer
  std::string request = {};    // what the client has sent so far
  std::string response = {};   // empty until the request is complete
  size_t sent = 0;             // bytes of `response` written
};

bool WaitsForRequest(const Connection& c) { return c.response.empty(); }

// When a connection waiting for its request may give its slot to a newcomer.
Clock::time_point EvictableFrom(const Connection& c) {
  return c.deadline - MetricsServer::kRequestDeadline + MetricsServer::kEvictionGrace;
}

bool Evictable(const Connection& c, Clock::time_point now) {
  return WaitsForRequest(c) && EvictableFrom(c) <= now;
}

std::string Response(absl::string_view status, absl::string_view content_type,
                     const std::string& body) {
  return absl::StrCat("HTTP/1.0 ", status, "\r\nContent-Type: ", content_type,
                      "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n", body);
}

std::string Answer(absl::string_view request, const std::function<std::string()>& render) {
  // "GET /metrics HTTP/1.1" (a query string, as some scrapers add, is allowed).
  if (absl::StartsWith(request, "GET /metrics ") || absl::StartsWith(request, "GET /metrics?")) {
    return Response("200 OK", "text/plain; version=0.0.4; charset=utf-8", render());
  }
  return Response("404 Not Found", "text/plain", "only /metrics is served\n");
}

// Reads what the client has sent, or writes what its socket takes of the answer; false once the
// connection is done with (the answer written, the client gone, or an error).
bool Advance(Connection& c, const std::function<std::string()>& render) {
  if (WaitsForRequest(c)) {
    char buffer[4096];
    const ssize_t n = ::recv(c.fd, buffer, sizeof(buffer), 0);
    if (n <= 0) return n < 0 && errno == EAGAIN;
    c.request.append(buffer, static_cast<size_t>(n));
    // The request's headers end with an empty line, within the first kMaxRequestBytes.
    const absl::string_view head =
        absl::string_view(c.request).substr(0, MetricsServer::kMaxRequestBytes);
    if (absl::StrContains(head, "\r\n\r\n") || absl::StrContains(head, "\n\n")) {
      c.response = Answer(c.request, render);
    } else if (c.request.size() > MetricsServer::kMaxRequestBytes) {
      c.response = Response(
          "431 Request Header Fields Too Large", "text/plain",
          absl::StrCat("requests are limited to ", MetricsServer::kMaxRequestBytes, " bytes\n"));
    } else {
      return true;  // more to come
    }
  }
  const ssize_t n =
      ::send(c.fd, c.response.data() + c.sent, c.response.size() - c.sent, MSG_NOSIGNAL);
  if (n < 0) return errno == EAGAIN;
  c.sent += static_cast<size_t>(n);
  return c.sent < c.response.size();
}

// Takes the next connection from the backlog. When every slot is taken, it replaces the
// connection that has waited longest for its request, if that one is evictable; otherwise the
// newcomer stays in the backlog. False when accept() failed for want of descriptors or memory.
bool Accept(int listen_fd, std::vector<Connection>& connections, Clock::time_point now) {
  auto evicted = connections.end();
  if (connections.size() == MetricsServer::kMaxConnections) {
    evicted = std::find_if(connections.begin(), connections.end(),
                           [now](const Connection& c) { return Evictable(c, now); });
    if (evicted == connections.end()) return true;
  }
  const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd < 0) return errno != EMFILE && errno != ENFILE && errno != ENOBUFS && errno != ENOMEM;
  if (evicted != connections.end()) {
    ::close(evicted->fd);
    connections.erase(evicted);
  }
  connections.push_back({.fd = fd, .deadline = Clock::now() + MetricsServer::kRequestDeadline});
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& address, int port, std::function<std::string()> render) {
  const std::string where = HostAndPort(address, port);
  const std::optional<SocketAddress> socket_address = ParseSocketAddress(address, port);
  if (!socket_address) {
    return absl::InvalidArgumentError(
        absl::StrCat("monitoring: ", where, " is not an IPv4 or IPv6 address and port"));
  }
  // Non-blocking: a client that resets between poll() and accept() must not stall the loop.
  const int fd = ::socket(socket_address->family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  const int reuse = 1;
  // IPv6 sockets take IPv4 connections too (as IPv4-mapped addresses), whatever the host's
  // net.ipv6.bindv6only says: "::" then serves IPv4 scrapers as "0.0.0.0" does, besides IPv6
  // ones, and an IPv4-mapped address ("::ffff:127.0.0.1") can be bound at all.
  const int v6_only = 0;
  if (fd < 0 || ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &reuse, sizeof(reuse)) != 0 ||
      (socket_address->family == AF_INET6 &&
       ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6_only, sizeof(v6_only)) != 0) ||
      ::bind(fd, socket_address->get(), socket_address->length) != 0 ||
      ::listen(fd, SOMAXCONN) != 0) {
    const std::string reason = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return absl::UnavailableError(absl::StrCat("monitoring: cannot serve metrics on ", where, " (",
                                               reason,
                                               "); is another run using it? set "
                                               "monitoring.port_base elsewhere"));
  }
  int wake[2];
  if (::pipe2(wake, O_CLOEXEC) != 0) {
    ::close(fd);
    return absl::InternalError(absl::StrCat("monitoring: pipe: ", std::strerror(errno)));
  }
  std::unique_ptr<MetricsServer> server(
      new MetricsServer(fd, wake[0], wake[1], port, std::move(render)));
  server->thread_ = std::thread([s = server.get()] { s->Serve(); });
  return server;
}

MetricsServer::MetricsServer(int listen_fd, int wake_read, int wake_write, int port,
                             std::function<std::string()> render)
    : listen_fd_(listen_fd),
      wake_read_(wake_read),
      wake_write_(wake_write),
      port_(port),
      render_(std::move(render)) {}

MetricsServer::~MetricsServer() {
  const char stop = 0;
  (void)!::write(wake_write_, &stop, 1);
  if (thread_.joinable()) thread_.join();
  ::close(listen_fd_);
  ::close(wake_read_);
  ::close(wake_write_);
}

void MetricsServer::Serve() {
  // In accept order, which is also deadline order.
  std::vector<Connection> connections;
  std::vector<pollfd> fds;
  Clock::time_point accept_paused_until;  // after accept() ran out of descriptors or memory
  while (true) {
    const Clock::time_point now = Clock::now();
    // A silent, slow or non-reading client holds its slot until its deadline, no longer.
    std::erase_if(connections, [now](const Connection& c) {
      if (c.deadline > now) return false;
      ::close(c.fd);
      return true;
    });
    // The oldest connection still waiting for its request: the next to give its slot up.
    const auto oldest_waiting =
        std::find_if(connections.begin(), connections.end(), WaitsForRequest);
    const bool full = connections.size() == kMaxConnections;
    const bool room =
        !full || (oldest_waiting != connections.end() && Evictable(*oldest_waiting, now));
    const bool accepting = room && now >= accept_paused_until;
    // fds[0]: the wake pipe, fds[1]: the listening socket, fds[2 + i]: connections[i].
    fds.assign(
        {{wake_read_, POLLIN, 0}, {listen_fd_, static_cast<short>(accepting ? POLLIN : 0), 0}});
    for (const Connection& c : connections) {
      fds.push_back({c.fd, static_cast<short>(WaitsForRequest(c) ? POLLIN : POLLOUT), 0});
    }
    // Sleep until a socket is ready, the oldest connection's deadline, or the end of a pause.
    int timeout_ms = -1;
    const auto wake_by = [&](Clock::time_point t) {
      const int ms =
          static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(t - now).count());
      timeout_ms = timeout_ms < 0 ? ms : std::min(timeout_ms, ms);
    };
    if (!connections.empty()) wake_by(connections.front().deadline);
    if (room && !accepting) wake_by(accept_paused_until);
    if (full && !room && oldest_waiting != connections.end()) {
      wake_by(EvictableFrom(*oldest_waiting));
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[0].revents != 0) break;  // the destructor asked to stop
    for (size_t i = 0; i < connections.size(); ++i) {
      if (fds[2 + i].revents != 0 && !Advance(connections[i], render_)) {
        ::close(connections[i].fd);
        connections[i].fd = -1;
      }
    }
    std::erase_if(connections, [](const Connection& c) { return c.fd < 0; });
    if ((fds[1].revents & POLLIN) != 0 && !Accept(listen_fd_, connections, Clock::now())) {
      accept_paused_until = Clock::now() + kAcceptBackoff;
    }
  }
  for (const Connection& c : connections) ::close(c.fd);
}

}  // namespace nf::monitoring
