#include "tests/kube_emulator/webhook.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace kube_emulator {
namespace {

constexpr size_t kMaxResponseBytes = 64 << 20;

// Where one call goes and how it is named in errors.
struct Endpoint {
  std::string url;        // as Go prints it: https://HOST:PORT/PATH?timeout=30s
  std::string dial_host;  // what is dialled
  int dial_port = 443;
  std::string server_name;  // the name (DNS or IP) the certificate must be valid for
  std::string host_header;
  std::string target;  // PATH?timeout=...
};

bool IsIpLiteral(const std::string& host) {
  unsigned char buf[sizeof(struct in6_addr)];
  return inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

// Go's path.Join("/", p) for the request path: "/" when empty, no trailing slash.
std::string CleanPath(std::string p) {
  if (p.empty() || p[0] != '/') p = "/" + p;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

// Splits HOST:PORT ([v6]:PORT too); false when it is not that.
bool SplitHostPort(const std::string& hp, std::string* host, int* port) {
  size_t colon = hp.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  *host = hp.substr(0, colon);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  return absl::SimpleAtoi(hp.substr(colon + 1), port) && *port > 0 && *port < 65536;
}

std::string JoinHostPort(const std::string& host, int port) {
  return host.find(':') != std::string::npos ? absl::StrCat("[", host, "]:", port)
                                             : absl::StrCat(host, ":", port);
}

absl::StatusOr<Endpoint> EndpointFor(const ConversionCall& call) {
  const WebhookClientConfig& cc = call.client;
  const std::string timeout = absl::StrCat("?timeout=", absl::FormatDuration(call.timeout));
  Endpoint e;
  if (!cc.service_name.empty()) {
    e.server_name = absl::StrCat(cc.service_name, ".", cc.service_namespace, ".svc");
    e.host_header = JoinHostPort(e.server_name, cc.service_port);
    e.target = CleanPath(cc.service_path) + timeout;
    e.url = absl::StrCat("https://", e.host_header, e.target);
    if (call.service_address.empty() ||
        !SplitHostPort(call.service_address, &e.dial_host, &e.dial_port)) {
      return absl::UnavailableError(absl::StrCat(
          "Post \"", e.url, "\": service \"", cc.service_name, "\" not found (kube-emulator ",
          "reaches a service only through --service_address ", cc.service_namespace, "/",
          cc.service_name, "=HOST:PORT)"));
    }
    return e;
  }
  // clientConfig.url: https://HOST[:PORT][/PATH] (validated when the CRD was written).
  absl::string_view rest = cc.url;
  if (!absl::ConsumePrefix(&rest, "https://")) {
    return absl::UnavailableError(
        absl::StrCat("Post \"", cc.url, "\": unsupported protocol scheme"));
  }
  size_t slash = rest.find('/');
  std::string authority(rest.substr(0, slash));
  std::string path = slash == absl::string_view::npos ? "" : std::string(rest.substr(slash));
  e.host_header = authority;
  e.target = CleanPath(path) + timeout;
  e.url = absl::StrCat("https://", authority, e.target);
  if (!SplitHostPort(authority, &e.dial_host, &e.dial_port)) {
    e.dial_host = authority;
    if (e.dial_host.size() >= 2 && e.dial_host.front() == '[') {
      e.dial_host = e.dial_host.substr(1, e.dial_host.size() - 2);
    }
    e.dial_port = 443;
  }
  e.server_name = e.dial_host;
  return e;
}

std::string Timeout() {
  return "context deadline exceeded (Client.Timeout exceeded while awaiting headers)";
}

// Milliseconds left until `deadline`, at least 0.
int MillisLeft(absl::Time deadline) {
  int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
  return ms < 0 ? 0 : static_cast<int>(std::min<int64_t>(ms, 1 << 30));
}

// Connects to host:port before `deadline`; the error reads like Go's dialer's.
absl::StatusOr<int> Dial(const std::string& host, int port, absl::Time deadline) {
  struct addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  struct addrinfo* res = nullptr;
  std::string port_str = std::to_string(port);
  if (getaddrinfo(host.c_str(), port_str.c_str(), &hints, &res) != 0) {
    return absl::UnavailableError(absl::StrCat("dial tcp: lookup ", host, ": no such host"));
  }
  std::string last_error = "dial tcp: no address";
  for (struct addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    char ip[INET6_ADDRSTRLEN] = "";
    const void* addr =
        ai->ai_family == AF_INET6
            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(ai->ai_addr)->sin6_addr)
            : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(ai->ai_addr)->sin_addr);
    inet_ntop(ai->ai_family, addr, ip, sizeof(ip));
    const std::string where = absl::StrCat("dial tcp ", JoinHostPort(ip, port), ": ");
    int fd = ::socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) continue;
    int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      struct pollfd p = {fd, POLLOUT, 0};
      rc = ::poll(&p, 1, MillisLeft(deadline));
      if (rc == 0) {
        ::close(fd);
        freeaddrinfo(res);
        return absl::DeadlineExceededError(Timeout());
      }
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err == 0 ? 0 : -1;
      errno = err;
    }
    if (rc != 0) {
      last_error = absl::StrCat(where, "connect: ", strerror(errno));
      last_error = absl::AsciiStrToLower(last_error);
      ::close(fd);
      continue;
    }
    int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    freeaddrinfo(res);
    return fd;
  }
  freeaddrinfo(res);
  return absl::UnavailableError(last_error);
}

// Bounds the next blocking read or write of `fd` by `deadline`.
void SetIoTimeout(int fd, absl::Time deadline) {
  int ms = std::max(1, MillisLeft(deadline));
  struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

// The names a certificate is valid for, as Go lists them in a mismatch error.
std::string CertificateNames(X509* cert, bool ip) {
  std::vector<std::string> names;
  auto* sans =
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  for (int i = 0; sans != nullptr && i < sk_GENERAL_NAME_num(sans); ++i) {
    const GENERAL_NAME* n = sk_GENERAL_NAME_value(sans, i);
    if (!ip && n->type == GEN_DNS) {
      names.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(n->d.dNSName)),
                         static_cast<size_t>(ASN1_STRING_length(n->d.dNSName)));
    } else if (ip && n->type == GEN_IPADD) {
      const ASN1_OCTET_STRING* a = n->d.iPAddress;
      char buf[INET6_ADDRSTRLEN] = "";
      int len = ASN1_STRING_length(a);
      if (len == 4 || len == 16) {
        inet_ntop(len == 4 ? AF_INET : AF_INET6, ASN1_STRING_get0_data(a), buf, sizeof(buf));
        names.emplace_back(buf);
      }
    }
  }
  GENERAL_NAMES_free(sans);
  return absl::StrJoin(names, ", ");
}

// Keeps the server's certificate (app data of the SSL: an X509**) for the error message of
// a failed check; OpenSSL does not keep it when the handshake fails.
int KeepLeafCertificate(int ok, X509_STORE_CTX* store) {
  auto* ssl =
      static_cast<SSL*>(X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx()));
  auto* leaf = ssl != nullptr ? static_cast<X509**>(SSL_get_app_data(ssl)) : nullptr;
  X509* cert = X509_STORE_CTX_get0_cert(store);
  if (leaf != nullptr && *leaf == nullptr && cert != nullptr && X509_up_ref(cert) == 1) {
    *leaf = cert;
  }
  return ok;
}

// Go's words for a failed certificate check (crypto/x509 errors).
std::string VerifyError(SSL* ssl, X509* cert, const std::string& server_name) {
  long v = SSL_get_verify_result(ssl);
  const std::string prefix = "tls: failed to verify certificate: x509: ";
  switch (v) {
    case X509_V_ERR_HOSTNAME_MISMATCH:
    case X509_V_ERR_IP_ADDRESS_MISMATCH: {
      const bool ip = v == X509_V_ERR_IP_ADDRESS_MISMATCH;
      std::string names = cert != nullptr ? CertificateNames(cert, ip) : "";
      if (names.empty()) {
        return absl::StrCat(prefix, "certificate is not valid for any names, but wanted to match ",
                            server_name);
      }
      return absl::StrCat(prefix, "certificate is valid for ", names, ", not ", server_name);
    }
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
    case X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE:
    case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
    case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
    case X509_V_ERR_CERT_SIGNATURE_FAILURE:
      return prefix + "certificate signed by unknown authority";
    case X509_V_ERR_CERT_HAS_EXPIRED:
    case X509_V_ERR_CERT_NOT_YET_VALID:
      return prefix + "certificate has expired or is not yet valid";
    default:
      return prefix + X509_verify_cert_error_string(v);
  }
}

struct SslCtxFree {
  void operator()(SSL_CTX* c) const { SSL_CTX_free(c); }
};
struct SslFree {
  void operator()(SSL* s) const { SSL_free(s); }
};

// The trust anchors: the PEM bundle, or the system roots when it is empty.
absl::StatusOr<std::unique_ptr<SSL_CTX, SslCtxFree>> ClientContext(const std::string& ca_pem) {
  std::unique_ptr<SSL_CTX, SslCtxFree> ctx(SSL_CTX_new(TLS_client_method()));
  if (ctx == nullptr) return absl::InternalError("tls: cannot make a client context");
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  SSL_CTX_set_options(ctx.get(), SSL_OP_IGNORE_UNEXPECTED_EOF);
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, KeepLeafCertificate);
  static const unsigned char kAlpn[] = "\x08http/1.1";
  SSL_CTX_set_alpn_protos(ctx.get(), kAlpn, sizeof(kAlpn) - 1);
  if (ca_pem.empty()) {
    SSL_CTX_set_default_verify_paths(ctx.get());
    return ctx;
  }
  X509_STORE* store = SSL_CTX_get_cert_store(ctx.get());
  BIO* bio = BIO_new_mem_buf(ca_pem.data(), static_cast<int>(ca_pem.size()));
  int added = 0;
  while (X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr)) {
    if (X509_STORE_add_cert(store, cert) == 1) ++added;
    X509_free(cert);
  }
  BIO_free(bio);
  ERR_clear_error();
  if (added == 0) {
    return absl::InvalidArgumentError(
        "unable to load root certificates: unable to parse bytes as PEM block");
  }
  return ctx;
}

struct HttpAnswer {
  int status = 0;
  std::string content_type;
  std::string body;
};

// Parses a whole HTTP/1.1 response (Content-Length, chunked, or up to the close).
absl::StatusOr<HttpAnswer> ParseResponse(const std::string& raw) {
  size_t head_end = raw.find("\r\n\r\n");
  if (head_end == std::string::npos) return absl::UnavailableError("EOF");
  std::vector<std::string> lines = absl::StrSplit(raw.substr(0, head_end), "\r\n");
  std::vector<std::string> status = absl::StrSplit(lines[0], absl::MaxSplits(' ', 2));
  HttpAnswer a;
  if (status.size() < 2 || !absl::StartsWith(status[0], "HTTP/") ||
      !absl::SimpleAtoi(status[1], &a.status)) {
    return absl::UnavailableError(absl::StrCat("malformed HTTP response \"", lines[0], "\""));
  }
  bool chunked = false;
  long content_length = -1;
  for (size_t i = 1; i < lines.size(); ++i) {
    size_t colon = lines[i].find(':');
    if (colon == std::string::npos) continue;
    std::string name = absl::AsciiStrToLower(lines[i].substr(0, colon));
    std::string value(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
    if (name == "content-type") a.content_type = value;
    if (name == "transfer-encoding" && absl::StrContains(absl::AsciiStrToLower(value), "chunked")) {
      chunked = true;
    }
    if (name == "content-length") (void)absl::SimpleAtoi(value, &content_length);
  }
  std::string rest = raw.substr(head_end + 4);
  if (chunked) {
    size_t pos = 0;
    while (true) {
      size_t eol = rest.find("\r\n", pos);
      if (eol == std::string::npos) return absl::UnavailableError("unexpected EOF");
      size_t size = 0;
      std::string hex(absl::StripAsciiWhitespace(rest.substr(pos, eol - pos)));
      hex = hex.substr(0, hex.find(';'));
      if (hex.empty() || !absl::SimpleHexAtoi(hex, &size)) {
        return absl::UnavailableError("malformed chunked encoding");
      }
      pos = eol + 2;
      if (size == 0) break;
      if (rest.size() < pos + size) return absl::UnavailableError("unexpected EOF");
      a.body.append(rest, pos, size);
      pos += size + 2;
    }
  } else if (content_length >= 0) {
    if (rest.size() < static_cast<size_t>(content_length)) {
      return absl::UnavailableError("unexpected EOF");
    }
    a.body = rest.substr(0, static_cast<size_t>(content_length));
  } else {
    a.body = std::move(rest);
  }
  return a;
}

// True once `raw` holds a complete response (so a server that keeps the connection open
// despite Connection: close does not stall the call).
bool ResponseComplete(const std::string& raw) {
  size_t head_end = raw.find("\r\n\r\n");
  if (head_end == std::string::npos) return false;
  std::string head = absl::AsciiStrToLower(raw.substr(0, head_end));
  if (absl::StrContains(head, "transfer-encoding: chunked")) {
    return absl::EndsWith(raw, "\r\n0\r\n\r\n") || raw.size() == head_end + 9;
  }
  size_t cl = head.find("content-length:");
  if (cl == std::string::npos) return false;
  size_t eol = head.find("\r\n", cl);
  long n = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(head.substr(cl + 15, eol - cl - 15)), &n)) {
    return false;
  }
  return raw.size() >= head_end + 4 + static_cast<size_t>(n);
}

// POSTs `body` to the endpoint; the error (without the `Post "URL": ` prefix) reads like
// Go's net/http client's.
absl::StatusOr<HttpAnswer> HttpsPost(const Endpoint& e, const std::string& ca_pem,
                                     const std::string& body, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  auto ctx = ClientContext(ca_pem);
  if (!ctx.ok()) return ctx.status();
  absl::StatusOr<int> fd = Dial(e.dial_host, e.dial_port, deadline);
  if (!fd.ok()) return fd.status();
  std::unique_ptr<SSL, SslFree> ssl(SSL_new(ctx->get()));
  SSL_set_fd(ssl.get(), *fd);
  X509* leaf = nullptr;  // the server's certificate, kept by KeepLeafCertificate
  std::unique_ptr<X509*, void (*)(X509**)> leaf_owner(&leaf, [](X509** c) { X509_free(*c); });
  SSL_set_app_data(ssl.get(), &leaf);
  const bool ip = IsIpLiteral(e.server_name);
  if (!ip) SSL_set_tlsext_host_name(ssl.get(), e.server_name.c_str());
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl.get());
  // Like Go since 1.15: names come from the SANs only, never the subject's Common Name.
  X509_VERIFY_PARAM_set_hostflags(
      param, X509_CHECK_FLAG_NEVER_CHECK_SUBJECT | X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
  if (ip) {
    X509_VERIFY_PARAM_set1_ip_asc(param, e.server_name.c_str());
  } else {
    X509_VERIFY_PARAM_set1_host(param, e.server_name.c_str(), 0);
  }
  auto fail = [&](std::string message) {
    int raw_fd = *fd;
    ssl.reset();
    ::close(raw_fd);
    ERR_clear_error();
    return absl::UnavailableError(std::move(message));
  };
  // A blocking call cut by SO_RCVTIMEO/SO_SNDTIMEO fails with WANT_READ/WANT_WRITE.
  auto timed_out = [&](int ret) {
    int err = SSL_get_error(ssl.get(), ret);
    return err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE || MillisLeft(deadline) == 0;
  };
  SetIoTimeout(*fd, deadline);
  if (int ret = SSL_connect(ssl.get()); ret != 1) {
    if (SSL_get_verify_result(ssl.get()) != X509_V_OK) {
      return fail(VerifyError(ssl.get(), leaf, e.server_name));
    }
    if (timed_out(ret)) return fail(Timeout());
    unsigned long err = ERR_peek_last_error();
    return fail(err != 0 ? absl::StrCat("remote error: tls: ", ERR_reason_error_string(err))
                         : std::string("EOF"));
  }
  std::string request = absl::StrCat(
      "POST ", e.target, " HTTP/1.1\r\nHost: ", e.host_header,
      "\r\nUser-Agent: kube-apiserver/v1.32.0-sbx-emulator (linux/amd64) kubernetes/0000000"
      "\r\nContent-Type: application/json\r\nAccept: application/json, */*\r\nContent-Length: ",
      body.size(), "\r\nConnection: close\r\n\r\n", body);
  size_t off = 0;
  while (off < request.size()) {
    SetIoTimeout(*fd, deadline);
    int n = SSL_write(ssl.get(), request.data() + off, static_cast<int>(request.size() - off));
    if (n <= 0) return fail(timed_out(n) ? Timeout() : "write: broken pipe");
    off += static_cast<size_t>(n);
  }
  std::string raw;
  char buf[16384];
  while (!ResponseComplete(raw)) {
    SetIoTimeout(*fd, deadline);
    int n = SSL_read(ssl.get(), buf, sizeof(buf));
    if (n <= 0) {
      int err = SSL_get_error(ssl.get(), n);
      if (err == SSL_ERROR_ZERO_RETURN || (err == SSL_ERROR_SYSCALL && errno == 0)) break;
      if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE || MillisLeft(deadline) == 0) {
        return fail(Timeout());
      }
      if (raw.empty()) return fail("EOF");
      break;
    }
    raw.append(buf, static_cast<size_t>(n));
    if (raw.size() > kMaxResponseBytes) return fail("response too large");
  }
  int raw_fd = *fd;
  SSL_shutdown(ssl.get());
  ssl.reset();
  ::close(raw_fd);
  if (raw.empty()) return absl::UnavailableError("EOF");
  return ParseResponse(raw);
}

// client-go's message for a non-2xx answer without a Status body
// (errors.NewGenericServerResponse).
std::string GenericServerResponse(int code, const std::string& body, const std::string& ctype) {
  std::string server_message = "unknown";
  if (absl::StartsWith(ctype, "text/") && !body.empty() && body.size() <= 1024) {
    server_message = std::string(absl::StripAsciiWhitespace(body));
  }
  switch (code) {
    case 400:
      return "the server rejected our request for an unknown reason";
    case 401:
      return "Unauthorized";
    case 403:
      return "forbidden";
    case 404:
      return "the server could not find the requested resource";
    case 405:
      return "the server does not allow this method on the requested resource";
    case 409:
      return "the server reported a conflict";
    case 415:
      return "the server responded with the status code 415 but did not return more information";
    case 422:
      return "the server rejected our request due to an error in our request";
    case 429:
      return "the server has received too many requests and has asked us to try again later";
    case 503:
      return "the server is currently unable to handle the request";
    case 504:
      return "the server was unable to return a response in the time allotted, but may still be "
             "processing the request";
    default:
      if (code >= 500) {
        return absl::StrCat("an error on the server (", json(server_message).dump(),
                            ") has prevented the request from succeeding");
      }
      return absl::StrCat("the server responded with the status code ", code,
                          " but did not return more information");
  }
}

// apiVersion "g/v" as Go's GroupVersion prints it.
std::string GroupVersionOf(const json& o) {
  auto it = o.find("apiVersion");
  return it != o.end() && it->is_string() ? it->get<std::string>() : "";
}

std::string StringField(const json& o, const char* key) {
  if (!o.is_object()) return "";
  auto it = o.find(key);
  return it != o.end() && it->is_string() ? it->get<std::string>() : "";
}

std::string MetaField(const json& o, const char* key) {
  if (!o.is_object() || !o.contains("metadata")) return "";
  return StringField(o["metadata"], key);
}

// Go's %T of a decoded JSON value.
std::string GoType(const json& v) {
  if (v.is_string()) return "string";
  if (v.is_boolean()) return "bool";
  if (v.is_number_integer()) return "int64";
  if (v.is_number()) return "float64";
  if (v.is_array()) return "[]interface {}";
  if (v.is_object()) return "map[string]interface {}";
  return "<nil>";
}

// validateConvertedObject: only labels and annotations may differ in metadata.
std::string ValidateConverted(const json& in, const json& out) {
  struct Field {
    const char* what;
    std::string in, out;
  };
  const Field fields[] = {{"kind", StringField(in, "kind"), StringField(out, "kind")},
                          {"name", MetaField(in, "name"), MetaField(out, "name")},
                          {"namespace", MetaField(in, "namespace"), MetaField(out, "namespace")},
                          {"UID", MetaField(in, "uid"), MetaField(out, "uid")}};
  for (const Field& f : fields) {
    if (f.in != f.out)
      return absl::StrCat("must have the same ", f.what, ": ", f.in, " != ", f.out);
  }
  return "";
}

// restoreObjectMeta: the original's metadata with the converted labels and annotations.
std::string RestoreObjectMeta(const json& original, json& converted) {
  auto it = converted.find("metadata");
  if (it == converted.end()) return "missing metadata in converted object";
  if (!it->is_object()) {
    return absl::StrCat("invalid metadata of type ", GoType(*it), " in converted object");
  }
  json response_meta = *it;
  json meta = original.contains("metadata") ? original["metadata"] : json::object();
  for (const char* field : {"labels", "annotations"}) {
    auto f = response_meta.find(field);
    if (f == response_meta.end() || f->is_null()) {
      meta.erase(field);
      continue;
    }
    if (!f->is_object()) {
      return absl::StrCat("invalid metadata.", field, " of type ", GoType(*f),
                          " in converted object");
    }
    for (auto kv = f->begin(); kv != f->end(); ++kv) {
      if (!kv->is_string()) {
        return absl::StrCat("metadata.", field, "[", kv.key(), "] must be a string, but is ",
                            GoType(*kv), " in converted object");
      }
    }
    meta[field] = *f;
  }
  converted["metadata"] = std::move(meta);
  return "";
}

}  // namespace

absl::StatusOr<std::vector<json>> ConvertWithWebhook(const ConversionCall& call,
                                                     const std::string& uid,
                                                     const std::string& desired_api_version,
                                                     const std::string& in_gvk, bool list,
                                                     const std::vector<json>& objects) {
  const std::string failed = absl::StrCat("conversion webhook for ", in_gvk, " failed: ");
  auto failure = [&](const std::string& reason) { return absl::UnavailableError(failed + reason); };
  const bool v1 = call.review_version == "v1";
  const std::string review_api_version = "apiextensions.k8s.io/" + call.review_version;
  // The API server sends the (empty) response stanza along, as Go encodes it.
  json review = {
      {"kind", "ConversionReview"},
      {"apiVersion", review_api_version},
      {"request", {{"uid", uid}, {"desiredAPIVersion", desired_api_version}, {"objects", objects}}},
      {"response",
       {{"uid", ""}, {"convertedObjects", nullptr}, {"result", {{"metadata", json::object()}}}}}};
  absl::StatusOr<Endpoint> endpoint = EndpointFor(call);
  if (!endpoint.ok()) return failure(std::string(endpoint.status().message()));
  absl::StatusOr<HttpAnswer> answer =
      HttpsPost(*endpoint, call.client.ca_bundle, review.dump(), call.timeout);
  if (!answer.ok()) {
    return failure(absl::StrCat("Post \"", endpoint->url, "\": ", answer.status().message()));
  }
  json body = json::parse(answer->body, nullptr, false);
  if (answer->status < 200 || answer->status > 206) {
    if (body.is_object() && body.value("kind", "") == "Status" && body.contains("message") &&
        body["message"].is_string()) {
      return failure(body["message"].get<std::string>());
    }
    return failure(GenericServerResponse(answer->status, answer->body, answer->content_type));
  }
  if (body.is_discarded()) {
    std::string why;
    try {
      (void)json::parse(answer->body);
    } catch (const json::exception& e) {
      why = e.what();
    }
    return failure(absl::StrCat("couldn't get version/kind; json parse error: ", why));
  }
  if (!body.is_object() || StringField(body, "kind").empty()) {
    return failure(absl::StrCat("Object 'Kind' is missing in '", answer->body, "'"));
  }
  if (v1 && (StringField(body, "apiVersion") != review_api_version ||
             StringField(body, "kind") != "ConversionReview")) {
    std::string got = StringField(body, "apiVersion");
    if (got.find('/') == std::string::npos) got = "/" + got;
    return failure(absl::StrCat("expected webhook response of ", review_api_version,
                                ", Kind=ConversionReview, got ", got,
                                ", Kind=", StringField(body, "kind")));
  }
  auto response = body.find("response");
  if (response == body.end() || !response->is_object()) {
    return failure("no response provided");
  }
  if (v1 && StringField(*response, "uid") != uid) {
    return failure(absl::StrCat("expected response.uid=", json(uid).dump(), ", got ",
                                json(StringField(*response, "uid")).dump()));
  }
  const json result = response->value("result", json::object());
  const std::string status = StringField(result, "status");
  if (status != "Success") {
    std::string message = StringField(result, "message");
    if (!message.empty()) return failure(message);
    return failure(absl::StrCat("response.result.status was '", status, "', not 'Success'"));
  }
  json converted_objects = response->value("convertedObjects", json::array());
  if (converted_objects.is_null()) converted_objects = json::array();
  if (!converted_objects.is_array() || converted_objects.size() != objects.size()) {
    return absl::UnavailableError(
        absl::StrCat("conversion webhook for ", in_gvk, " returned ",
                     converted_objects.is_array() ? converted_objects.size() : 0,
                     " objects, expected ", objects.size()));
  }
  std::vector<json> out;
  out.reserve(objects.size());
  const std::string returned = absl::StrCat("conversion webhook for ", in_gvk, " returned ");
  for (size_t i = 0; i < objects.size(); ++i) {
    json converted = std::move(converted_objects[i]);
    const json& original = objects[i];
    // The index printed is the API server's: for a list, one past the object from the
    // version check on.
    const std::string where = list ? absl::StrCat("invalid converted object at index ", i + 1, ": ")
                                   : std::string("invalid object at index 0: ");
    if (!converted.is_object()) {
      return absl::UnavailableError(
          absl::StrCat(returned,
                       list ? absl::StrCat("invalid converted object at index ", i, ": ")
                            : std::string("invalid object at index 0: "),
                       "Object 'Kind' is missing in '", converted.dump(), "'"));
    }
    if (GroupVersionOf(converted) != desired_api_version) {
      return absl::UnavailableError(absl::StrCat(returned, where, "invalid groupVersion (expected ",
                                                 desired_api_version, ", received ",
                                                 GroupVersionOf(converted), ")"));
    }
    if (StringField(converted, "kind") != StringField(original, "kind")) {
      return absl::UnavailableError(absl::StrCat(returned, where, "invalid kind (expected ",
                                                 StringField(original, "kind"), ", received ",
                                                 StringField(converted, "kind"), ")"));
    }
    if (std::string bad = ValidateConverted(original, converted); !bad.empty()) {
      return absl::UnavailableError(
          absl::StrCat(returned, list ? where : std::string("invalid object: "), bad));
    }
    if (std::string bad = RestoreObjectMeta(original, converted); !bad.empty()) {
      return absl::UnavailableError(
          absl::StrCat(returned,
                       list ? absl::StrCat("invalid metadata in object at index ", i + 1, ": ")
                            : std::string("invalid metadata: "),
                       bad));
    }
    out.push_back(std::move(converted));
  }
  return out;
}

}  // namespace kube_emulator
