// The cpprestsdk adapter: the only file of sbx that sees cpprest, pplx or boost types.
// Every cpprest exception is caught here and becomes an absl::Status.
//
// cpprest's configured timeout bounds each read, not a whole request, so a request's
// deadline is enforced here by waiting on its task and cancelling it when the deadline
// passes. Each stream gets its own http_client (hence its own connection): cancelling it
// closes that connection and nothing else.

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <utility>

#include <cpprest/http_client.h>
#include <pplx/threadpool.h>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "src/k8s/http.h"
#include "src/k8s/http_lines.h"

namespace sbx::k8s {
namespace {

using web::http::client::http_client;

constexpr size_t kCpprestThreads = 4;
using web::http::client::http_client_config;

std::chrono::milliseconds ToChrono(absl::Duration d) {
  return std::chrono::milliseconds(std::max<int64_t>(1, absl::ToInt64Milliseconds(d)));
}

absl::Status FromException(const std::string& what_for, std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const pplx::task_canceled&) {
    return absl::CancelledError(absl::StrCat(what_for, ": cancelled"));
  } catch (const web::http::http_exception& e) {
    if (e.error_code() == std::errc::timed_out) {
      return absl::DeadlineExceededError(absl::StrCat(what_for, ": timed out: ", e.what()));
    }
    if (e.error_code() == std::errc::operation_canceled) {
      return absl::CancelledError(absl::StrCat(what_for, ": cancelled: ", e.what()));
    }
    return absl::UnavailableError(absl::StrCat(what_for, ": ", e.what()));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(what_for, ": ", e.what()));
  } catch (...) {
    return absl::UnavailableError(absl::StrCat(what_for, ": unknown error"));
  }
}

std::vector<std::pair<std::string, std::string>> HeadersOf(const web::http::http_response& r) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [name, value] : r.headers()) {
    out.emplace_back(absl::AsciiStrToLower(name), value);
  }
  return out;
}

web::http::http_request ToCpprest(const HttpRequest& request) {
  web::http::http_request req(request.method);
  req.set_request_uri(web::uri(request.path));
  std::string content_type;
  for (const auto& [name, value] : request.headers) {
    if (absl::AsciiStrToLower(name) == "content-type") {
      content_type = value;
    } else {
      req.headers().add(name, value);
    }
  }
  if (!request.body.empty() || !content_type.empty()) {
    req.set_body(request.body, content_type.empty() ? "application/json" : content_type);
  }
  return req;
}

// The result of one in-flight request, filled by a pplx continuation and awaited with a
// deadline by the calling thread. Shared, because the continuation may run after the
// caller gave up.
template <typename T>
struct Pending {
  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::StatusOr<T> result ABSL_GUARDED_BY(mu) = absl::UnknownError("pending");

  void Set(absl::StatusOr<T> value) {
    absl::MutexLock lock(&mu);
    result = std::move(value);
    done = true;
  }
  // Sets the result from a finished task (its value, or its exception as a Status).
  void Complete(pplx::task<T> done, const std::string& what_for) {
    try {
      Set(done.get());
    } catch (...) {
      Set(FromException(what_for, std::current_exception()));
    }
  }
  // Waits until done or the deadline; false when the deadline passed first.
  bool Await(absl::Time deadline, absl::StatusOr<T>* out) {
    absl::MutexLock lock(&mu);
    if (!mu.AwaitWithDeadline(absl::Condition(&done), deadline)) return false;
    *out = std::move(result);
    return true;
  }
};

class CpprestStream final : public HttpStream {
 public:
  CpprestStream(std::unique_ptr<http_client> client,
                std::shared_ptr<pplx::cancellation_token_source> cts,
                web::http::http_response response, std::string what_for)
      : client_(std::move(client)),
        cts_(std::move(cts)),
        response_(std::move(response)),
        body_(response_.body()),
        what_for_(std::move(what_for)) {}

  ~CpprestStream() override { Cancel(); }

  int status() const override { return response_.status_code(); }

  absl::StatusOr<bool> ReadLine(std::string* line) override {
    while (true) {
      if (cancelled_.load(std::memory_order_acquire)) {
        return absl::CancelledError(absl::StrCat(what_for_, ": cancelled"));
      }
      if (lines_.TakeLine(line)) return true;
      if (eof_) return lines_.TakeRest(line);
      absl::Status filled = Fill();
      if (!filled.ok()) return filled;
    }
  }

  absl::StatusOr<std::string> ReadAll() override {
    std::string all;
    std::string line;
    while (true) {
      absl::StatusOr<bool> more = ReadLine(&line);
      if (!more.ok()) return more.status();
      if (!*more) return all;
      if (!all.empty()) all.push_back('\n');
      all += line;
    }
  }

  // Reads what has arrived (waiting for at least one byte) onto the line splitter. cpprest
  // reads a line byte by byte through a task each; reading what is available in one call is
  // what makes a busy watch cheap.
  absl::Status Fill() {
    std::string& pending = *lines_.buffer();
    try {
      auto buffer = body_.streambuf();
      const size_t available = buffer.in_avail();
      const size_t want = available > 0 ? std::min<size_t>(available, size_t{1} << 18) : 1;
      const size_t old_size = pending.size();
      pending.resize(old_size + want);
      const size_t n =
          buffer.getn(reinterpret_cast<uint8_t*>(pending.data() + old_size), want).get();
      pending.resize(old_size + n);
      if (n == 0) eof_ = true;
    } catch (...) {
      if (cancelled_.load(std::memory_order_acquire)) {
        return absl::CancelledError(absl::StrCat(what_for_, ": cancelled"));
      }
      return FromException(what_for_, std::current_exception());
    }
    return absl::OkStatus();
  }

  void Cancel() override {
    // Read by ReadLine to tell a cancellation from a broken connection; release pairs
    // with its acquire so the reader sees the flag set before the connection closes.
    if (cancelled_.exchange(true, std::memory_order_acq_rel)) return;
    cts_->cancel();
    try {
      // Closing the body's buffer wakes a read blocked on it even when cancelling the
      // token no longer reaches the connection (the headers are already in).
      response_.body().streambuf().close(std::ios_base::in).wait();
    } catch (...) {
    }
  }

 private:
  std::unique_ptr<http_client> client_;
  std::shared_ptr<pplx::cancellation_token_source> cts_;
  web::http::http_response response_;
  concurrency::streams::istream body_;
  std::string what_for_;
  // Bytes read from the body and not yet returned as lines.
  LineSplitter lines_;
  bool eof_ = false;
  // Set once by Cancel (any thread), read by ReadLine (the reader's thread).
  std::atomic<bool> cancelled_{false};
};

class CpprestTransport final : public HttpTransport {
 public:
  explicit CpprestTransport(TransportOptions options) : options_(std::move(options)) {}

  absl::Status Init() {
    try {
      web::uri uri(options_.server);
      if (uri.scheme() != "http" && uri.scheme() != "https") {
        return absl::InvalidArgumentError(
            absl::StrCat("k8s server \"", options_.server, "\": scheme must be http or https"));
      }
      if (uri.host().empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("k8s server \"", options_.server, "\": no host"));
      }
      // Fail at start, not at the first connection, when a PEM does not load.
      boost::asio::ssl::context probe(boost::asio::ssl::context::tls_client);
      ConfigureTls(probe);
      requests_ = std::make_unique<http_client>(uri, Config(absl::Seconds(60)));
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("k8s server \"", options_.server, "\": ", e.what()));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<HttpResponse> Send(const HttpRequest& request) override {
    std::string what_for = absl::StrCat(request.method, " ", options_.server, request.path);
    auto pending = std::make_shared<Pending<HttpResponse>>();
    pplx::cancellation_token_source cts;
    try {
      requests_->request(ToCpprest(request), cts.get_token())
          .then([](web::http::http_response response) {
            return response.extract_string(true).then([response](std::string body) {
              HttpResponse out;
              out.status = response.status_code();
              out.body = std::move(body);
              out.headers = HeadersOf(response);
              return out;
            });
          })
          .then([pending, what_for](pplx::task<HttpResponse> done) {
            pending->Complete(done, what_for);
          });
    } catch (...) {
      return FromException(what_for, std::current_exception());
    }
    absl::StatusOr<HttpResponse> result;
    if (!pending->Await(absl::Now() + request.timeout, &result)) {
      cts.cancel();
      return absl::DeadlineExceededError(
          absl::StrCat(what_for, ": no response within ", absl::FormatDuration(request.timeout)));
    }
    return result;
  }

  absl::StatusOr<std::unique_ptr<HttpStream>> OpenStream(const HttpRequest& request) override {
    std::string what_for = absl::StrCat(request.method, " ", options_.server, request.path);
    auto pending = std::make_shared<Pending<web::http::http_response>>();
    auto cts = std::make_shared<pplx::cancellation_token_source>();
    std::unique_ptr<http_client> client;
    try {
      client =
          std::make_unique<http_client>(web::uri(options_.server), Config(request.idle_timeout));
      client->request(ToCpprest(request), cts->get_token())
          .then([pending, what_for](pplx::task<web::http::http_response> done) {
            pending->Complete(done, what_for);
          });
    } catch (...) {
      return FromException(what_for, std::current_exception());
    }
    absl::StatusOr<web::http::http_response> response;
    if (!pending->Await(absl::Now() + request.timeout, &response)) {
      cts->cancel();
      return absl::DeadlineExceededError(
          absl::StrCat(what_for, ": no headers within ", absl::FormatDuration(request.timeout)));
    }
    if (!response.ok()) return response.status();
    return std::unique_ptr<HttpStream>(std::make_unique<CpprestStream>(
        std::move(client), std::move(cts), *std::move(response), std::move(what_for)));
  }

 private:
  void ConfigureTls(boost::asio::ssl::context& ctx) const {
    if (!options_.ca_pem.empty()) {
      ctx.add_certificate_authority(
          boost::asio::buffer(options_.ca_pem.data(), options_.ca_pem.size()));
    }
    if (!options_.client_cert_pem.empty()) {
      ctx.use_certificate_chain(
          boost::asio::buffer(options_.client_cert_pem.data(), options_.client_cert_pem.size()));
      ctx.use_private_key(
          boost::asio::buffer(options_.client_key_pem.data(), options_.client_key_pem.size()),
          boost::asio::ssl::context::pem);
    }
  }

  http_client_config Config(absl::Duration read_timeout) const {
    http_client_config config;
    config.set_timeout(ToChrono(read_timeout));
    config.set_validate_certificates(!options_.insecure_skip_tls_verify);
    config.set_ssl_context_callback([this](boost::asio::ssl::context& ctx) { ConfigureTls(ctx); });
    return config;
  }

  const TransportOptions options_;
  // The pooled keep-alive connections for requests (not streams).
  std::unique_ptr<http_client> requests_;
};

}  // namespace

std::string HttpResponse::Header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (key == name) return value;
  }
  return "";
}

absl::StatusOr<std::unique_ptr<HttpTransport>> NewCpprestTransport(
    const TransportOptions& options) {
  // cpprest's shared thread pool runs every I/O completion and task continuation; its
  // default of 40 threads on a 2-core machine mostly trades places. A few suffice (the
  // calling threads block on their own requests, not on pool threads). It can be sized
  // only before its first use, hence once per process.
  static std::once_flag pool_once;
  std::call_once(pool_once, [] {
    try {
      crossplat::threadpool::initialize_with_threads(kCpprestThreads);
    } catch (...) {
      // Already started by someone else in this process: keep its size.
    }
  });
  if (options.client_cert_pem.empty() != options.client_key_pem.empty()) {
    return absl::InvalidArgumentError(
        "k8s client certificate and key must be given together (one of them is missing)");
  }
  auto transport = std::make_unique<CpprestTransport>(options);
  absl::Status status = transport->Init();
  if (!status.ok()) return status;
  return std::unique_ptr<HttpTransport>(std::move(transport));
}

}  // namespace sbx::k8s
