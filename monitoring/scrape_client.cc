#include "monitoring/scrape_client.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "monitoring/socket_address.h"

namespace nf::monitoring {
namespace {

// Waits until `fd` is ready for `events` or `deadline` passes; false on the deadline.
bool WaitFor(int fd, short events, absl::Time deadline) {
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    pollfd p = {fd, events, 0};
    // Rounded up: a poll for 0 ms before the deadline would spin.
    const int timeout_ms =
        left == absl::InfiniteDuration()
            ? -1
            : static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, INT_MAX));
    const int n = ::poll(&p, 1, timeout_ms);
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return true;  // the socket call that follows reports it
  }
}

// Connects the non-blocking socket `fd` to `address` by `deadline`: 0, or why not.
int Connect(int fd, const SocketAddress& address, absl::Time deadline) {
  if (::connect(fd, address.get(), address.length) == 0) return 0;
  if (errno != EINPROGRESS) return errno;
  if (!WaitFor(fd, POLLOUT, deadline)) return ETIMEDOUT;
  int error = 0;
  socklen_t size = sizeof(error);
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) != 0) return errno;
  return error;
}

// What went wrong with the exchange with `where`: the deadline, or the OS's reason.
absl::Status Failure(const std::string& where, absl::Time deadline, int error) {
  if (absl::Now() >= deadline) {
    return absl::DeadlineExceededError(absl::StrCat("no complete answer from ", where, " in time"));
  }
  return absl::UnavailableError(
      absl::StrCat("cannot fetch from ", where, ": ", std::strerror(error)));
}

}  // namespace

absl::StatusOr<std::string> FetchPage(const std::string& address, int port, const std::string& path,
                                      absl::Duration timeout) {
  return Exchange(address, port, absl::StrCat("GET ", path, " HTTP/1.0\r\n\r\n"), timeout);
}

absl::StatusOr<std::string> Exchange(const std::string& address, int port,
                                     const std::string& request, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  const std::string where = HostAndPort(address, port);
  const std::optional<SocketAddress> socket_address = ParseSocketAddress(address, port);
  if (!socket_address) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " is not an IPv4 or IPv6 address and port"));
  }
  // Non-blocking throughout, so that every wait is bounded by the deadline (a connect to a full
  // backlog retries its SYN for minutes).
  const int fd = ::socket(socket_address->family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return Failure(where, deadline, errno);
  if (const int error = Connect(fd, *socket_address, deadline); error != 0) {
    ::close(fd);
    return Failure(where, deadline, error);
  }
  for (size_t sent = 0; sent < request.size();) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (errno != EAGAIN || !WaitFor(fd, POLLOUT, deadline)) {
      const int error = errno;
      ::close(fd);
      return Failure(where, deadline, error);
    }
  }
  // HTTP/1.0: the server answers and closes; the response is everything until then.
  std::string response;
  char buffer[16384];
  while (true) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n == 0) break;
    if (n > 0) {
      response.append(buffer, static_cast<size_t>(n));
    } else if (errno != EAGAIN || !WaitFor(fd, POLLIN, deadline)) {
      const int error = errno;
      ::close(fd);
      return Failure(where, deadline, error);
    }
  }
  ::close(fd);
  return response;
}

}  // namespace nf::monitoring
