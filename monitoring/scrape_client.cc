#include "monitoring/scrape_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace nf::monitoring {

absl::StatusOr<std::string> FetchPage(const std::string& address, int port,
                                      const std::string& path) {
  sockaddr_in socket_address{};
  socket_address.sin_family = AF_INET;
  socket_address.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, address.c_str(), &socket_address.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(address, " is not an IPv4 address"));
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&socket_address), sizeof(socket_address)) != 0) {
    const std::string reason = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot connect to ", address, ":", port, ": ", reason));
  }
  const std::string request = absl::StrCat("GET ", path, " HTTP/1.0\r\n\r\n");
  // HTTP/1.0: the server answers and closes; the response is everything until then.
  std::string response;
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
      static_cast<ssize_t>(request.size())) {
    char buffer[16384];
    for (ssize_t n; (n = ::read(fd, buffer, sizeof(buffer))) > 0;) response.append(buffer, n);
  }
  ::close(fd);
  return response;
}

}  // namespace nf::monitoring
