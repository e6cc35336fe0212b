// kube-emulator: a Kubernetes API server emulator for sbx tests and benchmarks.
// Usage: kube-emulator [--listen HOST:PORT] [--tls_cert_file F --tls_key_file F]
//   [--token_file F] [--latency_ms N] [--error_rate CODE=FRACTION]...
//   [--retry_after_seconds N] [--qps_limit N] [--watch_drop_rate F]
//   [--bookmark_interval_ms N] [--watch_history N] [--pod_ready_delay_ms N] [--pod_ip IP]
//   [--nodes N] [--seed N] [--service_address NAMESPACE/NAME=HOST:PORT]...
//   [--conversion_webhook_timeout_ms 30000] [--max_held_requests 1000]
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "tests/kube_emulator/emulator.h"
#include "tests/kube_emulator/http_server.h"

namespace {

[[noreturn]] void Die(const std::string& message) {
  std::cerr << "kube-emulator: " << message << "\n";
  std::exit(2);
}

template <typename T>
T ParseNumber(const std::string& flag, const std::string& value) {
  T out{};
  bool ok;
  if constexpr (std::is_floating_point_v<T>) {
    ok = absl::SimpleAtod(value, &out);
  } else {
    ok = absl::SimpleAtoi(value, &out);
  }
  if (!ok) Die(absl::StrCat("--", flag, " wants a number, got \"", value, "\""));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  kube_emulator::EmulatorOptions options;
  std::string listen = "127.0.0.1:0";
  std::string cert_file, key_file;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cerr << "see the header of tests/kube_emulator/main.cc\n";
      return 0;
    }
    if (arg.rfind("--", 0) != 0) Die(absl::StrCat("unexpected argument \"", arg, "\""));
    std::string name = arg.substr(2);
    std::string value;
    size_t eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else {
      if (i + 1 >= argc) Die(absl::StrCat("--", name, " needs a value"));
      value = argv[++i];
    }
    if (name == "listen") {
      listen = value;
    } else if (name == "tls_cert_file") {
      cert_file = value;
    } else if (name == "tls_key_file") {
      key_file = value;
    } else if (name == "token_file") {
      options.token_file = value;
    } else if (name == "latency_ms") {
      options.latency_ms = ParseNumber<int>(name, value);
    } else if (name == "error_rate") {
      size_t e = value.find('=');
      if (e == std::string::npos) Die("--error_rate wants CODE=FRACTION, got \"" + value + "\"");
      options.error_rates[ParseNumber<int>(name, value.substr(0, e))] =
          ParseNumber<double>(name, value.substr(e + 1));
    } else if (name == "retry_after_seconds") {
      options.retry_after_seconds = ParseNumber<int>(name, value);
    } else if (name == "qps_limit") {
      options.qps_limit = ParseNumber<int>(name, value);
    } else if (name == "watch_drop_rate") {
      options.watch_drop_rate = ParseNumber<double>(name, value);
    } else if (name == "bookmark_interval_ms") {
      options.bookmark_interval_ms = ParseNumber<int>(name, value);
    } else if (name == "watch_history") {
      options.watch_history = ParseNumber<int64_t>(name, value);
    } else if (name == "pod_ready_delay_ms") {
      options.pod_ready_delay_ms = ParseNumber<int>(name, value);
    } else if (name == "pod_ip") {
      options.pod_ip = value;
    } else if (name == "nodes") {
      options.nodes = ParseNumber<int>(name, value);
    } else if (name == "seed") {
      options.seed = ParseNumber<uint64_t>(name, value);
    } else if (name == "service_address") {
      size_t e = value.find('=');
      if (e == std::string::npos) {
        Die("--service_address wants NAMESPACE/NAME=HOST:PORT, got \"" + value + "\"");
      }
      options.service_addresses[value.substr(0, e)] = value.substr(e + 1);
    } else if (name == "conversion_webhook_timeout_ms") {
      options.conversion_webhook_timeout_ms = ParseNumber<int>(name, value);
    } else if (name == "max_held_requests") {
      options.max_held_requests = ParseNumber<int>(name, value);
    } else {
      Die(absl::StrCat("unknown flag --", name));
    }
  }
  if (absl::Status s = options.Validate(); !s.ok()) Die(std::string(s.message()));
  size_t colon = listen.rfind(':');
  if (colon == std::string::npos) Die("--listen wants HOST:PORT, got \"" + listen + "\"");
  std::string host = listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  int port = ParseNumber<int>("listen", listen.substr(colon + 1));

  signal(SIGPIPE, SIG_IGN);
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);  // threads inherit the mask

  // Leaked on purpose: connection threads are detached and run until exit.
  auto* emulator = new kube_emulator::Emulator(options);
  auto* server = new kube_emulator::HttpServer(
      [emulator](const kube_emulator::HttpRequest& req, kube_emulator::HttpResponder& resp) {
        emulator->Handle(req, resp);
      });
  if (absl::Status s = server->Start(host, port, cert_file, key_file); !s.ok()) {
    Die(std::string(s.message()));
  }
  std::string shown_host = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  std::printf("kube-emulator: serving on %s://%s:%d\n", server->tls() ? "https" : "http",
              shown_host.c_str(), server->port());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&signals, &sig);
  std::cerr << "kube-emulator: signal " << sig << ", exiting\n";
  std::fflush(stderr);
  _exit(0);
}
