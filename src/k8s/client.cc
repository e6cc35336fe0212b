#include "src/k8s/client.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "src/common/status_macros.h"

namespace sbx::k8s {

// The client's Prometheus metrics. Each labelled series is made once (Family::Add builds
// a label map and, for histograms, the bucket vector, and locks the family) and found
// again through maps looked up by string_view under a reader lock, so a request costs
// no allocation here once its series exist.
class ClientMetrics {
 public:
  explicit ClientMetrics(std::shared_ptr<prometheus::Registry> registry)
      : registry_(registry ? std::move(registry) : std::make_shared<prometheus::Registry>()),
        requests_(prometheus::BuildCounter()
                      .Name("sbx_k8s_requests_total")
                      .Help("Kubernetes API requests by verb, resource and HTTP code "
                            "(\"error\" when no answer came)")
                      .Register(*registry_)),
        latency_(prometheus::BuildHistogram()
                     .Name("sbx_k8s_request_duration_seconds")
                     .Help("Kubernetes API request latency (until the whole answer is in; "
                           "for watches, until the headers are in)")
                     .Register(*registry_)),
        restarts_(prometheus::BuildCounter()
                      .Name("sbx_k8s_watch_restarts_total")
                      .Help("Watch streams opened again, by resource and reason")
                      .Register(*registry_)) {}

  void Request(const std::string& verb, const std::string& resource, const std::string& code,
               absl::Duration took) {
    Series& series = Of(verb, resource);
    series.latency->Observe(absl::ToDoubleSeconds(took));
    prometheus::Counter* counter = nullptr;
    {
      absl::ReaderMutexLock lock(&mu_);
      auto it = series.codes.find(code);
      if (it != series.codes.end()) counter = it->second;
    }
    if (counter == nullptr) {
      absl::MutexLock lock(&mu_);
      prometheus::Counter*& slot = series.codes[code];
      if (slot == nullptr) {
        slot = &requests_.Add({{"verb", verb}, {"resource", resource}, {"code", code}});
      }
      counter = slot;
    }
    counter->Increment();
  }
  void Restart(const std::string& resource, const std::string& reason) {
    restarts_.Add({{"resource", resource}, {"reason", reason}}).Increment();
  }

 private:
  // The series of one verb and resource: its latency, and its request count per code.
  struct Series {
    prometheus::Histogram* latency = nullptr;
    absl::flat_hash_map<std::string, prometheus::Counter*> codes;
  };

  Series& Of(const std::string& verb, const std::string& resource) ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::ReaderMutexLock lock(&mu_);
      if (auto v = series_.find(verb); v != series_.end()) {
        if (auto r = v->second.find(resource); r != v->second.end()) return *r->second;
      }
    }
    absl::MutexLock lock(&mu_);
    std::unique_ptr<Series>& slot = series_[verb][resource];
    if (slot == nullptr) {
      slot = std::make_unique<Series>();
      slot->latency = &latency_.Add(
          {{"verb", verb}, {"resource", resource}},
          prometheus::Histogram::BucketBoundaries{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                  0.1, 0.25, 0.5, 1, 2.5, 5, 10});
    }
    return *slot;
  }

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& latency_;
  prometheus::Family<prometheus::Counter>& restarts_;
  absl::Mutex mu_;
  // verb -> resource -> series; a Series never moves once made (held by pointer).
  absl::flat_hash_map<std::string, absl::flat_hash_map<std::string, std::unique_ptr<Series>>>
      series_ ABSL_GUARDED_BY(mu_);
};

namespace {

// A write addressed to one object must name it: with an empty name the path is the
// collection's, and a DELETE there is a deletecollection.
absl::Status NeedName(const char* verb, const Resource& r, const std::string& name) {
  if (!name.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(verb, " ", r.resource, ": no object name (an empty one would address every ",
                   r.resource, " of the namespace)"));
}

std::string ResourceLabel(const Resource& r, const std::string& subresource) {
  return subresource.empty() ? r.resource : absl::StrCat(r.resource, "/", subresource);
}

std::string Describe(const std::string& verb, const Resource& r, const std::string& ns,
                     const std::string& name) {
  std::string out = absl::StrCat(verb, " ", r.resource);
  if (!name.empty()) absl::StrAppend(&out, " \"", name, "\"");
  if (r.namespaced && !ns.empty()) absl::StrAppend(&out, " in namespace \"", ns, "\"");
  return out;
}

std::string Query(const std::vector<std::pair<std::string, std::string>>& params) {
  std::string out;
  for (const auto& [key, value] : params) {
    if (value.empty()) continue;
    absl::StrAppend(&out, out.empty() ? "?" : "&", key, "=", QueryEscape(value));
  }
  return out;
}

const char* PatchContentType(PatchType type) {
  switch (type) {
    case PatchType::kMerge:
      return "application/merge-patch+json";
    case PatchType::kJson:
      return "application/json-patch+json";
    case PatchType::kStrategicMerge:
      return "application/strategic-merge-patch+json";
  }
  return "application/merge-patch+json";
}

absl::Status WithCode(absl::StatusCode code, const std::string& message) {
  return absl::Status(code, message);
}

absl::StatusCode CodeFor(int http_status, const std::string& reason) {
  switch (http_status) {
    case 400:
    case 415:
    case 422:
      return absl::StatusCode::kInvalidArgument;
    case 401:
      return absl::StatusCode::kUnauthenticated;
    case 403:
      return absl::StatusCode::kPermissionDenied;
    case 404:
      return absl::StatusCode::kNotFound;
    case 405:
      return absl::StatusCode::kUnimplemented;
    case 409:
      return reason == "AlreadyExists" ? absl::StatusCode::kAlreadyExists
                                       : absl::StatusCode::kAborted;
    case 410:
      return absl::StatusCode::kOutOfRange;
    case 429:
      return absl::StatusCode::kResourceExhausted;
    case 504:
      return absl::StatusCode::kDeadlineExceeded;
    default:
      break;
  }
  if (http_status >= 500) return absl::StatusCode::kUnavailable;
  return absl::StatusCode::kUnknown;
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("token file \"", path, "\" cannot be read"));
  std::stringstream data;
  data << in.rdbuf();
  return std::string(absl::StripAsciiWhitespace(data.str()));
}

int64_t MtimeNs(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

class StreamWatch final : public Watch {
 public:
  StreamWatch(std::unique_ptr<HttpStream> stream, std::string what)
      : stream_(std::move(stream)), what_(std::move(what)) {}

  absl::StatusOr<bool> Next(WatchEvent* event) override {
    std::string line;
    while (true) {
      ASSIGN_OR_RETURN(bool more, stream_->ReadLine(&line));
      if (!more) return false;
      if (!absl::StripAsciiWhitespace(line).empty()) break;
    }
    Json parsed = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded() || !parsed.is_object() || !parsed.contains("type")) {
      return absl::UnavailableError(
          absl::StrCat(what_, ": malformed watch event: ", line.substr(0, 200)));
    }
    const std::string type = parsed["type"].is_string() ? parsed["type"].get<std::string>() : "";
    if (type == "ERROR") {
      const Json& status = parsed["object"];
      int code = status.value("code", 500);
      std::string message = status.value("message", std::string("watch error"));
      std::string reason = status.value("reason", std::string());
      return WithCode(CodeFor(code, reason),
                      absl::StrCat(what_, ": ", code, " ", reason, ": ", message));
    }
    if (type == "ADDED") {
      event->type = WatchEvent::Type::kAdded;
    } else if (type == "MODIFIED") {
      event->type = WatchEvent::Type::kModified;
    } else if (type == "DELETED") {
      event->type = WatchEvent::Type::kDeleted;
    } else if (type == "BOOKMARK") {
      event->type = WatchEvent::Type::kBookmark;
    } else {
      return absl::UnavailableError(
          absl::StrCat(what_, ": unknown watch event type \"", type, "\""));
    }
    event->object = std::move(parsed["object"]);
    return true;
  }

  void Cancel() override { stream_->Cancel(); }

 private:
  std::unique_ptr<HttpStream> stream_;
  std::string what_;
};

}  // namespace

std::string QueryEscape(std::string_view value) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(value.size());
  for (unsigned char c : value) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

absl::Status StatusFromResponse(const std::string& what, int http_status, const std::string& body) {
  std::string reason;
  std::string message;
  Json parsed = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_discarded() && parsed.is_object()) {
    if (parsed["reason"].is_string()) reason = parsed["reason"].get<std::string>();
    if (parsed["message"].is_string()) message = parsed["message"].get<std::string>();
  }
  if (message.empty()) message = body.substr(0, 300);
  return WithCode(CodeFor(http_status, reason),
                  absl::StrCat(what, ": ", http_status, reason.empty() ? "" : " ", reason,
                               message.empty() ? "" : ": ", message));
}

absl::Status ClientOptions::Validate() const {
  if (qps < 0) return absl::InvalidArgumentError(absl::StrCat("k8s qps ", qps, " is negative"));
  if (qps > 0 && burst < 1) {
    return absl::InvalidArgumentError(absl::StrCat("k8s burst ", burst, " must be at least 1"));
  }
  if (request_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "k8s request timeout ", absl::FormatDuration(request_timeout), " must be positive"));
  }
  if (max_retries < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("k8s max_retries ", max_retries, " is negative"));
  }
  if (transport != "socket" && transport != "cpprest") {
    return absl::InvalidArgumentError(
        absl::StrCat("k8s HTTP transport \"", transport, "\" is not socket or cpprest"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Client>> Client::Create(const ClusterConfig& cluster,
                                                       const ClientOptions& options) {
  TransportOptions transport;
  transport.server = cluster.server;
  transport.ca_pem = cluster.ca_pem;
  transport.insecure_skip_tls_verify = cluster.insecure_skip_tls_verify;
  transport.client_cert_pem = cluster.client_cert_pem;
  transport.client_key_pem = cluster.client_key_pem;
  RETURN_IF_ERROR(options.Validate());
  ASSIGN_OR_RETURN(std::unique_ptr<HttpTransport> http, options.transport == "cpprest"
                                                            ? NewCpprestTransport(transport)
                                                            : NewSocketTransport(transport));
  return Create(cluster, options, std::move(http));
}

absl::StatusOr<std::unique_ptr<Client>> Client::Create(const ClusterConfig& cluster,
                                                       const ClientOptions& options,
                                                       std::unique_ptr<HttpTransport> transport) {
  RETURN_IF_ERROR(options.Validate());
  if (cluster.server.empty()) return absl::InvalidArgumentError("k8s server is empty");
  if (!cluster.token_file.empty()) {
    // A token file that cannot be read at start is a configuration error.
    RETURN_IF_ERROR(ReadTokenFile(cluster.token_file).status());
  }
  return std::unique_ptr<Client>(new Client(cluster, options, std::move(transport)));
}

Client::Client(ClusterConfig cluster, ClientOptions options,
               std::unique_ptr<HttpTransport> transport)
    : cluster_(std::move(cluster)),
      options_(std::move(options)),
      transport_(std::move(transport)),
      metrics_(std::make_unique<ClientMetrics>(options_.registry)),
      limiter_(options_.qps, options_.burst) {
  absl::MutexLock lock(&token_mu_);
  token_ = cluster_.token;
}

Client::~Client() = default;

void Client::RecordWatchRestart(const Resource& r, const std::string& reason) {
  metrics_->Restart(r.resource, reason);
}

void Client::Authorize(HttpRequest* request, bool force_reload) {
  std::string token;
  if (!cluster_.token_file.empty()) {
    bool check = false;
    {
      absl::MutexLock lock(&token_mu_);
      const absl::Time now = absl::Now();
      if (force_reload || now - token_checked_ >= options_.token_recheck) {
        token_checked_ = now;
        check = true;
      }
    }
    if (check) {
      // The file is read outside the lock; a stale token at worst costs one 401 + retry.
      const int64_t mtime = MtimeNs(cluster_.token_file);
      bool changed;
      {
        absl::MutexLock lock(&token_mu_);
        changed = force_reload || mtime != token_mtime_ns_;
      }
      if (changed) {
        absl::StatusOr<std::string> fresh = ReadTokenFile(cluster_.token_file);
        if (fresh.ok()) {
          absl::MutexLock lock(&token_mu_);
          token_ = *std::move(fresh);
          token_mtime_ns_ = mtime;
        }
      }
    }
  }
  {
    absl::MutexLock lock(&token_mu_);
    token = token_;
  }
  if (!token.empty()) request->headers.emplace_back("Authorization", "Bearer " + token);
}

absl::Duration Client::Backoff(int attempt) {
  absl::Duration cap = options_.retry_initial_backoff * (int64_t{1} << std::min(attempt, 20));
  cap = std::min(cap, options_.retry_max_backoff);
  absl::MutexLock lock(&rng_mu_);
  return cap * absl::Uniform(rng_, 0.0, 1.0);
}

std::string Client::Path(const Resource& r, const std::string& ns, const std::string& name,
                         const std::string& subresource) const {
  std::string path = r.Prefix();
  if (r.namespaced && !ns.empty()) absl::StrAppend(&path, "/namespaces/", QueryEscape(ns));
  absl::StrAppend(&path, "/", r.resource);
  if (!name.empty()) absl::StrAppend(&path, "/", QueryEscape(name));
  if (!subresource.empty()) absl::StrAppend(&path, "/", subresource);
  return path;
}

absl::StatusOr<HttpResponse> Client::Do(Call call) {
  const std::string resource = ResourceLabel(*call.resource, call.subresource);
  call.request.timeout = options_.request_timeout;
  call.request.headers.emplace_back("Accept", "application/json");
  call.request.headers.emplace_back("User-Agent", options_.user_agent);
  bool reloaded_token = false;
  // The Lease is how a replica comes to lead: its writes (the elector's, guarded by the
  // Lease's own resourceVersion) are not fenced.
  const bool write = (call.verb == "create" || call.verb == "update" || call.verb == "patch" ||
                      call.verb == "delete") &&
                     call.resource != &kLeases;
  for (int attempt = 0;; ++attempt) {
    const absl::Duration wait = limiter_.Reserve(absl::Now());
    if (wait > absl::ZeroDuration()) absl::SleepFor(wait);
    HttpRequest request = call.request;
    if (write) {
      if (const WriteFence* fence = fence_.load(std::memory_order_acquire); fence != nullptr) {
        absl::StatusOr<absl::Duration> window = fence->WriteWindow();
        if (!window.ok() || *window <= absl::ZeroDuration()) {
          metrics_->Request(call.verb, resource, "fenced", absl::ZeroDuration());
          return absl::FailedPreconditionError(absl::StrCat(
              call.what, ": not sent: ",
              window.ok() ? "this replica's write window has closed" : window.status().message()));
        }
        request.timeout = std::min(request.timeout, *window);
      }
    }
    Authorize(&request, /*force_reload=*/false);
    const absl::Time start = absl::Now();
    absl::StatusOr<HttpResponse> response = transport_->Send(request);
    metrics_->Request(call.verb, resource, response.ok() ? absl::StrCat(response->status) : "error",
                      absl::Now() - start);
    const bool may_retry = attempt < options_.max_retries;
    if (!response.ok()) {
      const bool transient =
          absl::IsUnavailable(response.status()) || absl::IsDeadlineExceeded(response.status());
      if (transient && call.retry_unanswered && may_retry) {
        absl::SleepFor(Backoff(attempt));
        continue;
      }
      return WithCode(response.status().code(),
                      absl::StrCat(call.what, ": ", response.status().message()));
    }
    const int code = response->status;
    if (code == 401 && !cluster_.token_file.empty() && !reloaded_token) {
      // The token may have been rotated since it was last read.
      reloaded_token = true;
      HttpRequest probe;
      Authorize(&probe, /*force_reload=*/true);
      continue;
    }
    if ((code == 429 || (code >= 500 && call.retry_unanswered)) && may_retry) {
      absl::Duration delay = Backoff(attempt);
      int64_t seconds = 0;
      if (absl::SimpleAtoi(response->Header("retry-after"), &seconds) && seconds >= 0) {
        delay = std::min(absl::Seconds(seconds), options_.max_retry_after);
      }
      absl::SleepFor(delay);
      continue;
    }
    return response;
  }
}

absl::StatusOr<HttpResponse> Client::DoOk(Call call) {
  std::string what = call.what;
  ASSIGN_OR_RETURN(HttpResponse response, Do(std::move(call)));
  if (response.status < 200 || response.status >= 300) {
    return StatusFromResponse(what, response.status, response.body);
  }
  return response;
}

absl::StatusOr<Json> Client::DoJson(Call call) {
  std::string what = call.what;
  ASSIGN_OR_RETURN(HttpResponse response, DoOk(std::move(call)));
  Json parsed = Json::parse(response.body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) {
    return absl::UnavailableError(
        absl::StrCat(what, ": the answer is not JSON: ", response.body.substr(0, 200)));
  }
  return parsed;
}

absl::StatusOr<Json> Client::Get(const Resource& r, const std::string& ns, const std::string& name,
                                 const std::string& subresource) {
  Call call{"get", &r, subresource, Describe("get", r, ns, name), {}};
  call.request.path = Path(r, ns, name, subresource);
  return DoJson(std::move(call));
}

absl::StatusOr<ListResult> Client::List(const Resource& r, const std::string& ns,
                                        const ListOptions& options) {
  Call call{"list", &r, "", Describe("list", r, ns, ""), {}};
  call.request.path =
      Path(r, ns, "", "") + Query({{"labelSelector", options.label_selector},
                                   {"fieldSelector", options.field_selector},
                                   {"limit", options.limit > 0 ? absl::StrCat(options.limit) : ""},
                                   {"continue", options.continue_token},
                                   {"resourceVersion", options.resource_version}});
  ASSIGN_OR_RETURN(Json list, DoJson(std::move(call)));
  ListResult result;
  if (list.contains("items") && list["items"].is_array()) {
    result.items.reserve(list["items"].size());
    for (Json& item : list["items"]) {
      // Items of a list carry no apiVersion/kind; fill them in as client-go does.
      if (!item.contains("apiVersion")) item["apiVersion"] = r.ApiVersion();
      if (!item.contains("kind")) item["kind"] = r.kind;
      result.items.push_back(std::move(item));
    }
  }
  const Json& meta = list.contains("metadata") ? list["metadata"] : Json::object();
  result.resource_version = meta.value("resourceVersion", std::string());
  result.continue_token = meta.value("continue", std::string());
  if (meta.contains("remainingItemCount") && meta["remainingItemCount"].is_number_integer()) {
    result.remaining_item_count = meta["remainingItemCount"].get<int64_t>();
  }
  return result;
}

absl::StatusOr<std::vector<Json>> Client::ListAll(const Resource& r, const std::string& ns,
                                                  const ListOptions& options,
                                                  std::string* resource_version) {
  std::vector<Json> all;
  ListOptions page = options;
  while (true) {
    ASSIGN_OR_RETURN(ListResult result, List(r, ns, page));
    for (Json& item : result.items) all.push_back(std::move(item));
    // The first page's version is the list's snapshot; later pages share it.
    if (page.continue_token.empty() && resource_version != nullptr) {
      *resource_version = result.resource_version;
    }
    if (result.continue_token.empty()) return all;
    page.continue_token = result.continue_token;
    page.resource_version.clear();
  }
}

absl::StatusOr<Json> Client::Create(const Resource& r, const std::string& ns, const Json& object) {
  absl::StatusOr<Call> call = CreateCall(r, ns, object);
  if (!call.ok()) return call.status();
  return DoJson(*std::move(call));
}

absl::Status Client::CreateNoResult(const Resource& r, const std::string& ns, const Json& object) {
  absl::StatusOr<Call> call = CreateCall(r, ns, object);
  if (!call.ok()) return call.status();
  return DoOk(*std::move(call)).status();
}

absl::StatusOr<Client::Call> Client::CreateCall(const Resource& r, const std::string& ns,
                                                const Json& object) {
  if (!object.is_object())
    return absl::InvalidArgumentError("k8s create: object is not a JSON map");
  Json body = object;
  if (!body.contains("apiVersion")) body["apiVersion"] = r.ApiVersion();
  if (!body.contains("kind")) body["kind"] = r.kind;
  const Json meta = body.value("metadata", Json::object());
  const std::string name = meta.value("name", std::string());
  const std::string generate = meta.value("generateName", std::string());
  if (name.empty() && generate.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("k8s create ", r.resource,
                                                   ": metadata.name and metadata.generateName are "
                                                   "both empty"));
  }
  Call call{"create", &r, "", Describe("create", r, ns, name.empty() ? generate + "*" : name), {}};
  call.request.method = "POST";
  call.request.path = Path(r, ns, "", "");
  call.request.headers.emplace_back("Content-Type", "application/json");
  call.request.body = body.dump();
  call.retry_unanswered = !name.empty();
  return call;
}

absl::StatusOr<Json> Client::Put(const Resource& r, const std::string& ns, const Json& object,
                                 const std::string& subresource) {
  const std::string name =
      object.is_object() ? object.value("metadata", Json::object()).value("name", std::string())
                         : std::string();
  const std::string target = subresource.empty() ? r.resource : r.resource + "/" + subresource;
  if (name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("k8s update ", target, ": no metadata.name"));
  }
  Call call{"update",
            &r,
            subresource,
            Describe(subresource.empty() ? "update" : "update " + subresource + " of", r, ns, name),
            {}};
  call.request.method = "PUT";
  call.request.path = Path(r, ns, name, subresource);
  call.request.headers.emplace_back("Content-Type", "application/json");
  call.request.body = object.dump();
  return DoJson(std::move(call));
}

absl::StatusOr<Json> Client::Update(const Resource& r, const std::string& ns, const Json& object) {
  return Put(r, ns, object, "");
}

absl::StatusOr<Json> Client::UpdateStatus(const Resource& r, const std::string& ns,
                                          const Json& object) {
  return Put(r, ns, object, "status");
}

absl::StatusOr<Json> Client::Patch(const Resource& r, const std::string& ns,
                                   const std::string& name, PatchType type, const Json& patch,
                                   const std::string& subresource) {
  RETURN_IF_ERROR(NeedName("patch", r, name));
  return DoJson(PatchCall(r, ns, name, type, patch, subresource));
}

absl::Status Client::PatchNoResult(const Resource& r, const std::string& ns,
                                   const std::string& name, PatchType type, const Json& patch,
                                   const std::string& subresource) {
  RETURN_IF_ERROR(NeedName("patch", r, name));
  return DoOk(PatchCall(r, ns, name, type, patch, subresource)).status();
}

Client::Call Client::PatchCall(const Resource& r, const std::string& ns, const std::string& name,
                               PatchType type, const Json& patch, const std::string& subresource) {
  Call call{"patch",
            &r,
            subresource,
            Describe(subresource.empty() ? "patch" : "patch " + subresource + " of", r, ns, name),
            {}};
  call.request.method = "PATCH";
  call.request.path = Path(r, ns, name, subresource);
  call.request.headers.emplace_back("Content-Type", PatchContentType(type));
  call.request.body = patch.dump();
  // A JSON patch may add to a list; repeating one that was applied but not answered would
  // apply it twice. Merge patches set values and are safe to repeat.
  call.retry_unanswered = type != PatchType::kJson;
  return call;
}

absl::Status Client::Delete(const Resource& r, const std::string& ns, const std::string& name,
                            const DeleteOptions& options) {
  RETURN_IF_ERROR(NeedName("delete", r, name));
  Json body = {{"kind", "DeleteOptions"}, {"apiVersion", "v1"}};
  if (!options.propagation_policy.empty()) body["propagationPolicy"] = options.propagation_policy;
  if (options.precondition_uid) body["preconditions"]["uid"] = *options.precondition_uid;
  if (options.precondition_resource_version) {
    body["preconditions"]["resourceVersion"] = *options.precondition_resource_version;
  }
  if (options.grace_period_seconds) body["gracePeriodSeconds"] = *options.grace_period_seconds;
  Call call{"delete", &r, "", Describe("delete", r, ns, name), {}};
  call.request.method = "DELETE";
  call.request.path = Path(r, ns, name, "");
  call.request.headers.emplace_back("Content-Type", "application/json");
  call.request.body = body.dump();
  return DoJson(std::move(call)).status();
}

absl::StatusOr<int64_t> Client::GetScale(const Resource& r, const std::string& ns,
                                         const std::string& name) {
  ASSIGN_OR_RETURN(Json scale, Get(r, ns, name, "scale"));
  const Json spec = scale.value("spec", Json::object());
  return spec.value("replicas", int64_t{0});
}

absl::StatusOr<Json> Client::SetScale(const Resource& r, const std::string& ns,
                                      const std::string& name, int64_t replicas) {
  return Patch(r, ns, name, PatchType::kMerge, Json{{"spec", {{"replicas", replicas}}}}, "scale");
}

absl::StatusOr<std::unique_ptr<Watch>> Client::StartWatch(const Resource& r, const std::string& ns,
                                                          const WatchOptions& options) {
  const std::string what = Describe("watch", r, ns, "");
  HttpRequest request;
  request.path = Path(r, ns, "", "") +
                 Query({{"watch", "true"},
                        {"allowWatchBookmarks", options.allow_bookmarks ? "true" : ""},
                        {"timeoutSeconds",
                         absl::StrCat(std::max<int64_t>(1, absl::ToInt64Seconds(options.timeout)))},
                        {"labelSelector", options.label_selector},
                        {"fieldSelector", options.field_selector},
                        {"resourceVersion", options.resource_version}});
  request.timeout = options_.request_timeout;
  // Bookmarks and the server-side timeout both bound the silence on a healthy stream.
  request.idle_timeout = options.timeout + absl::Seconds(30);
  request.headers.emplace_back("Accept", "application/json");
  request.headers.emplace_back("User-Agent", options_.user_agent);
  const absl::Duration wait = limiter_.Reserve(absl::Now());
  if (wait > absl::ZeroDuration()) absl::SleepFor(wait);
  Authorize(&request, /*force_reload=*/false);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<HttpStream>> stream = transport_->OpenStream(request);
  metrics_->Request("watch", r.resource, stream.ok() ? absl::StrCat((*stream)->status()) : "error",
                    absl::Now() - start);
  if (!stream.ok()) {
    return WithCode(stream.status().code(), absl::StrCat(what, ": ", stream.status().message()));
  }
  if ((*stream)->status() != 200) {
    const int code = (*stream)->status();
    absl::StatusOr<std::string> body = (*stream)->ReadAll();
    if (code == 401 && !cluster_.token_file.empty()) {
      HttpRequest probe;
      Authorize(&probe, /*force_reload=*/true);
    }
    return StatusFromResponse(what, code, body.ok() ? *body : std::string());
  }
  return std::unique_ptr<Watch>(std::make_unique<StreamWatch>(*std::move(stream), what));
}

}  // namespace sbx::k8s
