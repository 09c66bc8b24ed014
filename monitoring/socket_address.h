// An IPv4 or IPv6 address and a port as a socket address, for MetricsServer and the scrape
// client: the same literal forms monitoring.bind_address accepts (inet_pton's; no host names).
#pragma once

#include <sys/socket.h>

#include <optional>
#include <string>

namespace nf::monitoring {

struct SocketAddress {
  sockaddr_storage storage;  // a sockaddr_in or a sockaddr_in6
  socklen_t length;          // sizeof the one it is
  int family;                // AF_INET or AF_INET6

  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
};

// `address` (e.g. "0.0.0.0", "127.0.0.1", "::", "::1") and `port` (1 to 65535); nullopt when
// either is not one.
std::optional<SocketAddress> ParseSocketAddress(const std::string& address, int port);

// "address:port", the address in brackets when it is IPv6 ("[::1]:9600"), for messages.
std::string HostAndPort(const std::string& address, int port);

}  // namespace nf::monitoring
