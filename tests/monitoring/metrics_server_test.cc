// MetricsServer against clients that do not play along: idle and slow-loris connections, a client
// that does not read its answer, oversized requests. Each test asserts something the server that
// answered one connection at a time, with a timeout per read, could not do. Also: serving on IPv6
// addresses ("::1"; "::", which IPv4 scrapers reach too), and what is not an address.
#include "monitoring/metrics_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "monitoring/scrape_client.h"
#include "tests/assert_ok.h"

namespace nf::monitoring {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono_literals::operator""ms;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// A slow loris's request: it never reaches the empty line that ends the headers.
constexpr char kSlowRequest[] = "GET /metrics HTTP/1.0\r\nX-Slow: ";

// A page of `lines` series lines, like a rank's (about 9 KB with 300).
std::string Page(int lines) {
  std::string page;
  for (int i = 0; i < lines; ++i)
    absl::StrAppend(&page, "normformer_test{i=\"", i, "\"} ", i, "\n");
  return page;
}

// The server's whole answer to a scrape whose body is `page`.
std::string Answer200(const std::string& page) {
  return absl::StrCat(
      "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
      "Content-Length: ",
      page.size(), "\r\nConnection: close\r\n\r\n", page);
}

// A free TCP port on this machine (bound, read back, released).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t length = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  close(fd);
  return ntohs(address.sin_port);
}

// A client socket to 127.0.0.1:port, closed when it goes out of scope. The connection is made in
// the background (non-blocking connect), so a server that does not accept cannot stall the test.
// A test declares its sockets after its server: they close first, which frees a server blocked
// on them before its destructor waits for it.
class Client {
 public:
  // A small `receive_buffer` keeps an unread answer from vanishing into socket buffers.
  explicit Client(int port, int receive_buffer = 0)
      : fd_(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0)) {
    if (receive_buffer > 0) {
      setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof(receive_buffer));
    }
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  }
  ~Client() { close(fd_); }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  bool WaitConnected() {
    pollfd p = {fd_, POLLOUT, 0};
    return poll(&p, 1, 1000) == 1 && (p.revents & POLLOUT) != 0;
  }
  void Send(const std::string& data) { send(fd_, data.data(), data.size(), MSG_NOSIGNAL); }
  // Everything the server sends until it closes the connection, waiting up to `wait_ms` in all.
  std::string ReadUntilClosed(int wait_ms) {
    const Clock::time_point end = Clock::now() + std::chrono::milliseconds(wait_ms);
    std::string data;
    char buffer[4096];
    while (Clock::now() < end) {
      pollfd p = {fd_, POLLIN, 0};
      const int left = static_cast<int>(
          std::chrono::ceil<std::chrono::milliseconds>(end - Clock::now()).count());
      if (poll(&p, 1, std::max(left, 0)) != 1) break;
      const ssize_t n = recv(fd_, buffer, sizeof(buffer), MSG_DONTWAIT);
      if (n <= 0) break;
      data.append(buffer, static_cast<size_t>(n));
    }
    return data;
  }
  // True once the server has closed or reset the connection, waiting up to `wait_ms` for it (the
  // servers here send nothing to the clients that use this).
  bool ClosedByServer(int wait_ms) {
    pollfd p = {fd_, POLLIN, 0};
    if (poll(&p, 1, wait_ms) != 1) return false;
    char byte;
    const ssize_t n = recv(fd_, &byte, 1, MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN);
  }

 private:
  const int fd_;
};

// Idle connections (they send nothing) and slow lorises (one byte of kSlowRequest and then of an
// endless header every 300 ms), each reopened when the server drops it, until destroyed: one
// thread keeps that many connections pressing on the server. Idle ones come back after
// `idle_return` (50 ms: they hold the server's slots without a busy loop of reconnections; 0: a
// flood that churns every slot).
class HostileClients {
 public:
  HostileClients(int port, int idle, int slow, std::chrono::milliseconds idle_return = 50ms)
      : idle_return_(idle_return), thread_([=, this] { Run(port, idle, slow); }) {}
  ~HostileClients() {
    stop_ = true;
    thread_.join();
  }
  int drops() const { return drops_; }

 private:
  struct Hostile {
    bool slow;
    std::unique_ptr<Client> client = nullptr;  // null while waiting to reconnect
    Clock::time_point next = {};               // the next byte (slow), or the reconnection
    size_t bytes_sent = 0;
  };

  void Run(int port, int idle, int slow) {
    std::vector<Hostile> hostiles;
    for (int i = 0; i < idle + slow; ++i) hostiles.push_back({.slow = i >= idle});
    while (!stop_) {
      const Clock::time_point now = Clock::now();
      for (Hostile& h : hostiles) {
        if (h.client == nullptr && now >= h.next) {
          h.client = std::make_unique<Client>(port);
          h.bytes_sent = 0;
        } else if (h.client != nullptr && h.client->ClosedByServer(0)) {
          h.client.reset();
          h.next = now + (h.slow ? 0ms : idle_return_);
          ++drops_;
        } else if (h.client != nullptr && h.slow && now >= h.next) {
          const size_t i = h.bytes_sent++;
          h.client->Send(std::string(1, i < sizeof(kSlowRequest) - 1 ? kSlowRequest[i] : 'a'));
          h.next = now + 300ms;
        }
      }
      std::this_thread::sleep_for(10ms);
    }
  }

  const std::chrono::milliseconds idle_return_;
  std::atomic<bool> stop_{false};
  std::atomic<int> drops_{0};
  std::thread thread_;
};

std::unique_ptr<MetricsServer> StartServer(int port, const std::string& page,
                                           const std::string& address = "127.0.0.1") {
  absl::StatusOr<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start(address, port, [page] { return page; });
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(*server) : nullptr;
}

// Whether this machine has the IPv6 loopback address ::1 (the kernel lists it in
// /proc/net/if_inet6 as 32 hex digits, then the interface).
bool HasIPv6Loopback() {
  std::ifstream interfaces("/proc/net/if_inet6");
  std::string line;
  while (std::getline(interfaces, line)) {
    if (absl::StartsWith(line, "00000000000000000000000000000001 ")) return true;
  }
  return false;
}

constexpr char kNoIPv6[] =
    "this machine has no IPv6 loopback (::1 is not in /proc/net/if_inet6), so the IPv6 serving "
    "tests cannot run: that is the machine's problem, not the server's; enable IPv6 on lo "
    "(sysctl net.ipv6.conf.lo.disable_ipv6=0, or net.ipv6.conf.all.disable_ipv6=0)";

TEST(MetricsServerTest, ScrapesSucceedWhileIdleAndSlowClientsHoldConnections) {
  const int port = FreePort();
  const std::string page = Page(300);
  std::unique_ptr<MetricsServer> server = StartServer(port, page);
  ASSERT_NE(server, nullptr);
  HostileClients hostile(port, /*idle=*/100, /*slow=*/5);
  std::this_thread::sleep_for(300ms);  // every slot taken, the rest in the backlog
  // 20 scrapes 100 ms apart: over 2 s, so they also meet the drops and reconnections at the
  // hostile clients' deadlines. 1 s each is what the issue asks for (a loopback scrape takes
  // well under 1 ms; the rest is slack for a loaded 2-core machine).
  for (int i = 0; i < 20; ++i) {
    const absl::StatusOr<std::string> answer =
        FetchPage("127.0.0.1", port, "/metrics", absl::Seconds(1));
    NF_ASSERT_OK(answer) << "scrape " << i;
    EXPECT_EQ(*answer, Answer200(page)) << "scrape " << i;
    std::this_thread::sleep_for(100ms);
  }
  // The hostile clients outnumbered the slots: at least the surplus was dropped to make room.
  EXPECT_GE(hostile.drops(), 105 - MetricsServer::kMaxConnections);
}

// A flood of idle clients that reconnect as soon as they are dropped keeps every slot churning.
// A scraper whose request arrives a little after its connection is accepted (one network round
// trip, a loaded scraper; here 20 ms) used to be evicted by the newcomers before its request came:
// 53 of 60 such scrapes were closed with 0 bytes. Every one must be answered, within the 1 s the
// other scrape tests allow.
TEST(MetricsServerTest, AScraperWhoseRequestComesLateIsAnsweredUnderAFloodOfIdleClients) {
  const int port = FreePort();
  const std::string page = Page(300);
  std::unique_ptr<MetricsServer> server = StartServer(port, page);
  ASSERT_NE(server, nullptr);
  HostileClients hostile(port, /*idle=*/200, /*slow=*/0, /*idle_return=*/0ms);
  std::this_thread::sleep_for(300ms);  // every slot taken, the rest in the backlog
  constexpr int kScrapes = 20;
  int answered = 0;
  for (int i = 0; i < kScrapes; ++i) {
    Client scraper(port);
    ASSERT_TRUE(scraper.WaitConnected()) << "scrape " << i;
    std::this_thread::sleep_for(20ms);
    scraper.Send("GET /metrics HTTP/1.0\r\n\r\n");
    const std::string answer = scraper.ReadUntilClosed(1000);
    if (answer == Answer200(page)) ++answered;
    EXPECT_EQ(answer.substr(0, 15), "HTTP/1.0 200 OK")
        << "scrape " << i << ": " << answer.size() << " bytes";
  }
  EXPECT_EQ(answered, kScrapes);
  EXPECT_GE(hostile.drops(), 200 - MetricsServer::kMaxConnections);
}

TEST(MetricsServerTest, ASlowClientIsDroppedAtItsRequestDeadlineThoughItKeepsSending) {
  const int port = FreePort();
  std::unique_ptr<MetricsServer> server = StartServer(port, Page(1));
  ASSERT_NE(server, nullptr);
  Client loris(port);
  ASSERT_TRUE(loris.WaitConnected());
  const Clock::time_point start = Clock::now();
  // A byte every 300 ms: each read comes soon after the last, so only a deadline for the whole
  // request ends this.
  bool dropped = false;
  for (size_t i = 0; !dropped && Clock::now() - start < 4000ms; ++i) {
    loris.Send(std::string(1, i < sizeof(kSlowRequest) - 1 ? kSlowRequest[i] : 'a'));
    dropped = loris.ClosedByServer(300);
  }
  const Clock::duration elapsed = Clock::now() - start;
  ASSERT_TRUE(dropped) << "a client trickling its request is still connected after 4 s";
  // The deadline runs from the server's accept, which follows the connection; 200 ms below for
  // this thread being scheduled late after connecting, 1 s above for a loaded machine.
  EXPECT_GE(elapsed, MetricsServer::kRequestDeadline - 200ms);
  EXPECT_LE(elapsed, MetricsServer::kRequestDeadline + 1000ms);
}

TEST(MetricsServerTest, AClientThatDoesNotReadItsAnswerDoesNotBlockScrapes) {
  const int port = FreePort();
  const std::string page(4 << 20, '#');  // 4 MiB: far more than the socket buffers take
  std::unique_ptr<MetricsServer> server = StartServer(port, page);
  ASSERT_NE(server, nullptr);
  Client stalled(port, /*receive_buffer=*/4096);
  ASSERT_TRUE(stalled.WaitConnected());
  stalled.Send("GET /metrics HTTP/1.0\r\n\r\n");
  std::this_thread::sleep_for(100ms);  // the server has filled the socket and waits on it
  for (int i = 0; i < 5; ++i) {
    const absl::StatusOr<std::string> answer =
        FetchPage("127.0.0.1", port, "/metrics", absl::Seconds(1));
    NF_ASSERT_OK(answer) << "scrape " << i;
    EXPECT_EQ(answer->size(), Answer200(page).size()) << "scrape " << i;
  }
}

TEST(MetricsServerTest, OtherPathsAre404AndOversizedRequestsAreRefused) {
  const int port = FreePort();
  const std::string page = Page(1);
  std::unique_ptr<MetricsServer> server = StartServer(port, page);
  ASSERT_NE(server, nullptr);
  for (const char* path : {"/", "/metricsx", "/favicon.ico"}) {
    const absl::StatusOr<std::string> answer = FetchPage("127.0.0.1", port, path, absl::Seconds(1));
    NF_ASSERT_OK(answer) << path;
    EXPECT_THAT(*answer, StartsWith("HTTP/1.0 404 Not Found\r\n")) << path;
  }
  // Headers of exactly kMaxRequestBytes, the empty line included, are answered; one byte more
  // without the empty line is refused.
  const std::string head = "GET /metrics HTTP/1.0\r\nX-Padding: ";
  const std::string at_limit =
      head + std::string(MetricsServer::kMaxRequestBytes - head.size() - 4, 'a') + "\r\n\r\n";
  ASSERT_EQ(at_limit.size(), MetricsServer::kMaxRequestBytes);
  const absl::StatusOr<std::string> answered =
      Exchange("127.0.0.1", port, at_limit, absl::Seconds(1));
  NF_ASSERT_OK(answered);
  EXPECT_EQ(*answered, Answer200(page));
  const std::string over_limit =
      head + std::string(MetricsServer::kMaxRequestBytes + 1 - head.size(), 'a');
  const absl::StatusOr<std::string> refused =
      Exchange("127.0.0.1", port, over_limit, absl::Seconds(1));
  NF_ASSERT_OK(refused);
  EXPECT_THAT(*refused, StartsWith("HTTP/1.0 431 Request Header Fields Too Large\r\n"));
}

TEST(MetricsServerTest, ServesScrapesOnTheIPv6Loopback) {
  ASSERT_TRUE(HasIPv6Loopback()) << kNoIPv6;
  const int port = FreePort();
  const std::string page = Page(3);
  std::unique_ptr<MetricsServer> server = StartServer(port, page, "::1");
  ASSERT_NE(server, nullptr);
  const absl::StatusOr<std::string> answer = FetchPage("::1", port, "/metrics", absl::Seconds(1));
  NF_ASSERT_OK(answer);
  EXPECT_EQ(*answer, Answer200(page));
  // The port is taken now: a second server is refused, the IPv6 address in brackets.
  const absl::StatusOr<std::unique_ptr<MetricsServer>> second =
      MetricsServer::Start("::1", port, [] { return std::string(); });
  EXPECT_THAT(std::string(second.status().message()),
              StartsWith(absl::StrCat("monitoring: cannot serve metrics on [::1]:", port,
                                      " (Address already in use)")));
}

TEST(MetricsServerTest, TheUnspecifiedIPv6AddressServesIPv6AndIPv4Scrapers) {
  ASSERT_TRUE(HasIPv6Loopback()) << kNoIPv6;
  const int port = FreePort();
  const std::string page = Page(3);
  std::unique_ptr<MetricsServer> server = StartServer(port, page, "::");
  ASSERT_NE(server, nullptr);
  for (const char* address : {"::1", "127.0.0.1"}) {
    const absl::StatusOr<std::string> answer =
        FetchPage(address, port, "/metrics", absl::Seconds(1));
    NF_ASSERT_OK(answer) << address;
    EXPECT_EQ(*answer, Answer200(page)) << address;
  }
}

TEST(MetricsServerTest, RefusesWhatIsNotAnAddressAndPortNamingIt) {
  for (const char* address : {"localhost", "[::1]", "127.0.0.1:9600", "", "1.2.3"}) {
    const absl::StatusOr<std::unique_ptr<MetricsServer>> server =
        MetricsServer::Start(address, FreePort(), [] { return std::string(); });
    EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument) << address;
    EXPECT_THAT(std::string(server.status().message()),
                HasSubstr("is not an IPv4 or IPv6 address and port"))
        << address;
  }
  const absl::StatusOr<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start("::1", 70000, [] { return std::string(); });
  EXPECT_EQ(server.status().message(),
            "monitoring: [::1]:70000 is not an IPv4 or IPv6 address and port");
}

TEST(MetricsServerTest, DestructionWithClientsConnectedIsPrompt) {
  const int port = FreePort();
  std::unique_ptr<MetricsServer> server = StartServer(port, std::string(4 << 20, '#'));
  ASSERT_NE(server, nullptr);
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < 11; ++i) {
    clients.push_back(std::make_unique<Client>(port));
    ASSERT_TRUE(clients.back()->WaitConnected());
  }
  clients.back()->Send("GET /met");  // half a request; the others idle
  auto stalled = std::make_unique<Client>(port, /*receive_buffer=*/4096);
  ASSERT_TRUE(stalled->WaitConnected());
  stalled->Send("GET /metrics HTTP/1.0\r\n\r\n");  // an answer it does not read
  std::this_thread::sleep_for(200ms);              // all accepted, the answer under way

  std::future<void> stopped = std::async(std::launch::async, [&server] { server.reset(); });
  // Closing sockets and joining a thread takes microseconds; 500 ms is slack for a loaded
  // machine.
  const bool prompt = stopped.wait_for(500ms) == std::future_status::ready;
  if (prompt) {
    for (const std::unique_ptr<Client>& client : clients) {
      EXPECT_TRUE(client->ClosedByServer(100)) << "a connection left open after destruction";
    }
  }
  stalled.reset();  // a server still writing to it is freed, so that the test ends
  stopped.wait();
  EXPECT_TRUE(prompt) << "~MetricsServer waited for its clients";
}

}  // namespace
}  // namespace nf::monitoring
