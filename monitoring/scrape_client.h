// Fetches a page from a metrics server over HTTP/1.0, as one Prometheus scrape does: for the
// metrics-cost benchmark and the tests of monitoring/ (Prometheus itself is the client in
// production).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace nf::monitoring {

// The whole response (status line, headers and body) to `GET path` from address:port (IPv4 or
// IPv6, e.g. "127.0.0.1" or "::1"); Unavailable naming address:port when nothing accepts the
// connection, DeadlineExceeded when connecting, asking and reading the answer to its end take
// longer than `timeout` together.
absl::StatusOr<std::string> FetchPage(const std::string& address, int port, const std::string& path,
                                      absl::Duration timeout = absl::InfiniteDuration());

// The same for a request sent exactly as given (tests send malformed and oversized ones).
absl::StatusOr<std::string> Exchange(const std::string& address, int port,
                                     const std::string& request, absl::Duration timeout);

}  // namespace nf::monitoring
