#include "monitoring/metrics_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace nf::monitoring {
namespace {

constexpr int kRequestTimeoutMs = 2000;  // a client that sends nothing is dropped
constexpr size_t kMaxRequestBytes = 8192;

// Writes all of `data`, giving up on a client that stopped reading.
void WriteAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;
    sent += static_cast<size_t>(n);
  }
}

std::string Response(absl::string_view status, absl::string_view content_type,
                     const std::string& body) {
  return absl::StrCat("HTTP/1.0 ", status, "\r\nContent-Type: ", content_type,
                      "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n", body);
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& address, int port, std::function<std::string()> render) {
  const std::string where = absl::StrCat(address, ":", port);
  sockaddr_in socket_address{};
  socket_address.sin_family = AF_INET;
  socket_address.sin_port = htons(static_cast<uint16_t>(port));
  if (port <= 0 || port > 65535 ||
      inet_pton(AF_INET, address.c_str(), &socket_address.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("monitoring: ", where, " is not an IPv4 address and port"));
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int reuse = 1;
  if (fd < 0 || ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &reuse, sizeof(reuse)) != 0 ||
      ::bind(fd, reinterpret_cast<sockaddr*>(&socket_address), sizeof(socket_address)) != 0 ||
      ::listen(fd, 16) != 0) {
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
  pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_read_, POLLIN, 0}};
  while (true) {
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;  // the destructor asked to stop
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int connection = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (connection < 0) continue;
    Answer(connection);
    ::close(connection);
  }
}

void MetricsServer::Answer(int connection) const {
  std::string request;
  char buffer[1024];
  pollfd fd = {connection, POLLIN, 0};
  while (!absl::StrContains(request, "\r\n\r\n") && !absl::StrContains(request, "\n\n") &&
         request.size() < kMaxRequestBytes) {
    if (::poll(&fd, 1, kRequestTimeoutMs) <= 0) return;
    const ssize_t n = ::recv(connection, buffer, sizeof(buffer), 0);
    if (n <= 0) return;
    request.append(buffer, static_cast<size_t>(n));
  }
  // "GET /metrics HTTP/1.1" (a query string, as some scrapers add, is allowed).
  if (absl::StartsWith(request, "GET /metrics ") || absl::StartsWith(request, "GET /metrics?")) {
    WriteAll(connection, Response("200 OK", "text/plain; version=0.0.4; charset=utf-8", render_()));
  } else {
    WriteAll(connection, Response("404 Not Found", "text/plain", "only /metrics is served\n"));
  }
}

}  // namespace nf::monitoring
