#include "monitoring/socket_address.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstdint>

#include "absl/strings/str_cat.h"

namespace nf::monitoring {

std::optional<SocketAddress> ParseSocketAddress(const std::string& address, int port) {
  if (port <= 0 || port > 65535) return std::nullopt;
  SocketAddress result{};
  auto* v4 = reinterpret_cast<sockaddr_in*>(&result.storage);
  if (inet_pton(AF_INET, address.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    result.length = sizeof(sockaddr_in);
    result.family = AF_INET;
    return result;
  }
  result = {};
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&result.storage);
  if (inet_pton(AF_INET6, address.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    result.length = sizeof(sockaddr_in6);
    result.family = AF_INET6;
    return result;
  }
  return std::nullopt;
}

std::string HostAndPort(const std::string& address, int port) {
  in6_addr v6;
  if (inet_pton(AF_INET6, address.c_str(), &v6) == 1) return absl::StrCat("[", address, "]:", port);
  return absl::StrCat(address, ":", port);
}

}  // namespace nf::monitoring
