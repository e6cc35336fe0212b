// envd's files: REST GET/POST /files (streamed both ways, at constant memory, multipart
// uploads part by part through MultipartReader) and the Filesystem
// service (Stat, MakeDir, Move, ListDir, Remove), on sbx's file RPCs.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "e2b/envd/filesystem.pb.h"
#include "nlohmann/json.hpp"
#include "src/gateway/e2b/connect.h"
#include "src/gateway/e2b/control_plane.h"
#include "src/gateway/e2b/envd.h"
#include "src/gateway/e2b/multipart.h"

namespace sbx::e2b {

using json = nlohmann::json;

namespace {

// sbx's UploadFile takes chunks of up to 4 MiB; 1 MiB keeps the front's memory per upload
// small and the calls few.
constexpr size_t kUploadChunk = 1024 * 1024;
// Bytes after a multipart body's close delimiter read to keep the connection (more: it is
// closed after the answer).
constexpr size_t kMaxEpilogueBytes = 64 * 1024;
// ListDir reads every page: at most this many entries.
constexpr int kMaxListEntries = 100000;

// envd's REST errors: {"code": status, "message"} with the status its SDK maps (404 is
// FileNotFoundError).
void RespondFileError(HttpResponder& out, const grpc::Status& s) {
  RespondError(out, HttpStatusOf(s.error_code()), s.error_message());
}

std::string Basename(absl::string_view path) {
  const size_t slash = path.rfind('/');
  return std::string(slash == absl::string_view::npos ? path : path.substr(slash + 1));
}

// "drwxr-xr-x" of a mode and type.
std::string Permissions(uint32_t mode, v1::FileType type) {
  std::string p = type == v1::FILE_TYPE_DIRECTORY ? "d" : type == v1::FILE_TYPE_SYMLINK ? "L" : "-";
  const char* rwx = "rwxrwxrwx";
  for (int i = 0; i < 9; ++i) p.push_back((mode & (0400 >> i)) ? rwx[i] : '-');
  return p;
}

// sbx's FileInfo (path relative to the workspace) as envd's EntryInfo.
void ToEntry(const v1::FileInfo& f, filesystem::EntryInfo* e) {
  e->set_name(Basename(f.path()));
  e->set_path(E2bPath(f.path()));
  switch (f.type()) {
    case v1::FILE_TYPE_REGULAR:
      e->set_type(filesystem::FILE_TYPE_FILE);
      break;
    case v1::FILE_TYPE_DIRECTORY:
      e->set_type(filesystem::FILE_TYPE_DIRECTORY);
      break;
    case v1::FILE_TYPE_SYMLINK:
      e->set_type(filesystem::FILE_TYPE_SYMLINK);
      break;
    default:
      e->set_type(filesystem::FILE_TYPE_UNSPECIFIED);
  }
  e->set_size(f.size());
  e->set_mode(f.mode());
  e->set_permissions(Permissions(f.mode(), f.type()));
  if (f.has_modified_at()) *e->mutable_modified_time() = f.modified_at();
}

}  // namespace

void Envd::FilesGet(const Target& t, const HttpRequest& req, HttpResponder& out) {
  std::optional<std::string> path = QueryParam(req.query, "path");
  if (!path.has_value() || path->empty()) {
    RespondError(out, 400, "the query names no path (?path=...)");
    return;
  }
  absl::StatusOr<std::string> rel = WorkspacePath("path", *path);
  if (!rel.ok()) return RespondFileError(out, ToGrpc(rel.status()));
  grpc::ClientContext ctx;
  Prepare(t, options_.io_timeout, &ctx);
  v1::DownloadRequest download;
  download.set_claim_id(t.sandbox_id);
  download.set_path(*rel);
  std::unique_ptr<grpc::ClientReader<v1::DownloadChunk>> reader =
      sandboxes_->DownloadFile(&ctx, download);
  v1::DownloadChunk chunk;
  // The first message says whether the file can be read: errors get a JSON answer.
  if (!reader->Read(&chunk)) {
    grpc::Status s = reader->Finish();
    if (s.ok()) s = grpc::Status(grpc::StatusCode::INTERNAL, "the download ended before it began");
    return RespondFileError(out, s);
  }
  if (!out.StartStream(200, "application/octet-stream",
                       {{"Content-Disposition",
                         absl::StrCat("attachment; filename=\"",
                                      absl::StrReplaceAll(Basename(*rel), {{"\"", ""}}), "\"")}})) {
    ctx.TryCancel();
    reader->Finish();
    return;
  }
  bool ok = out.WriteChunk(chunk.data());
  while (ok && reader->Read(&chunk)) ok = out.WriteChunk(chunk.data());
  if (!ok) ctx.TryCancel();
  grpc::Status s = reader->Finish();
  // An error mid-way cannot change the status any more: cut the answer short (the client
  // sees a chunked body without its end) rather than end it as if complete.
  if (ok && s.ok()) out.FinishStream();
}

grpc::Status Envd::Upload(const Target& t, const std::string& path, BodyReader* body,
                          absl::string_view data) {
  grpc::ClientContext ctx;
  Prepare(t, options_.io_timeout, &ctx);
  v1::UploadResponse res;
  std::unique_ptr<grpc::ClientWriter<v1::UploadRequest>> writer =
      sandboxes_->UploadFile(&ctx, &res);
  v1::UploadRequest msg;
  msg.mutable_start()->set_claim_id(t.sandbox_id);
  msg.mutable_start()->set_path(path);
  msg.mutable_start()->set_create_parents(true);  // envd makes the parents
  bool ok = writer->Write(msg);
  grpc::Status read_error;
  if (body != nullptr) {
    std::string buf(kUploadChunk, '\0');
    while (ok) {
      // Fill a chunk before sending it: the client's writes may be small.
      size_t filled = 0;
      bool end = false;
      while (filled < buf.size()) {
        absl::StatusOr<size_t> n = body->Read(buf.data() + filled, buf.size() - filled);
        if (!n.ok()) {
          read_error = ToGrpc(n.status());
          break;
        }
        if (*n == 0) {
          end = true;
          break;
        }
        filled += *n;
      }
      if (!read_error.ok()) break;
      if (filled > 0) {
        msg.Clear();
        msg.set_chunk(buf.data(), filled);
        ok = writer->Write(msg);
      }
      if (end) break;
    }
  } else {
    for (size_t at = 0; ok && at < data.size(); at += kUploadChunk) {
      msg.Clear();
      const absl::string_view piece = data.substr(at, kUploadChunk);
      msg.set_chunk(piece.data(), piece.size());
      ok = writer->Write(msg);
    }
  }
  if (!read_error.ok()) {
    // Without `finish` the daemon leaves nothing behind.
    ctx.TryCancel();
    writer->Finish();
    return read_error;
  }
  if (ok) {
    msg.Clear();
    msg.set_finish(true);
    ok = writer->Write(msg);
  }
  writer->WritesDone();
  return writer->Finish();
}

void Envd::FilesPost(const Target& t, const HttpRequest& req, HttpResponder& out) {
  std::optional<std::string> path = QueryParam(req.query, "path");
  const std::string type(req.Header("content-type").value_or(""));
  if (req.Header("content-encoding").has_value()) {
    RespondError(out, 400,
                 "Content-Encoding on uploads is not served (send the bytes as they are)");
    return;
  }
  json answer = json::array();
  auto entry = [](const std::string& rel) {
    json e;
    e["path"] = E2bPath(rel);
    e["name"] = Basename(rel);
    e["type"] = "file";
    return e;
  };
  if (absl::StartsWithIgnoreCase(type, "multipart/form-data")) {
    absl::StatusOr<std::string> boundary = MultipartBoundary(type);
    if (!boundary.ok()) return RespondError(out, 400, boundary.status().message());
    // Each part is streamed into its file as it arrives (constant memory; the socket is
    // read only as fast as the upload drains). A part's file appears whole or not at all;
    // the parts before a malformed one are written.
    WholeBodyReader whole(req.body);
    MultipartReader reader(req.body_reader != nullptr ? req.body_reader : &whole, *boundary);
    while (true) {
      absl::StatusOr<std::optional<FormPart>> part = reader.NextPart();
      if (!part.ok()) {
        if (part.status().code() == absl::StatusCode::kInvalidArgument) {
          return RespondError(out, 400, part.status().message());
        }
        return RespondFileError(out, ToGrpc(part.status()));
      }
      if (!part->has_value()) break;
      if ((*part)->name != "file") continue;  // skipped by the next NextPart
      const std::string& target = path.has_value() && !path->empty() ? *path : (*part)->filename;
      if (target.empty()) {
        RespondError(out, 400, "a file part has no path (?path=... or its filename)");
        return;
      }
      absl::StatusOr<std::string> rel = WorkspacePath("path", target);
      if (!rel.ok()) return RespondFileError(out, ToGrpc(rel.status()));
      grpc::Status s = Upload(t, *rel, reader.data(), "");
      if (!s.ok()) {
        if (s.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
          return RespondError(out, 400, s.error_message());
        }
        return RespondFileError(out, s);
      }
      answer.push_back(entry(*rel));
    }
    if (answer.empty()) return RespondError(out, 400, "the multipart body has no \"file\" part");
    // What follows the close delimiter (the SDK's final CRLF, an epilogue) is read, up to a
    // bound, so that the connection stays usable for the next request.
    if (req.body_reader != nullptr) {
      char rest[4096];
      for (size_t total = 0; total < kMaxEpilogueBytes;) {
        absl::StatusOr<size_t> n = req.body_reader->Read(rest, sizeof(rest));
        if (!n.ok() || *n == 0) break;
        total += *n;
      }
    }
  } else {
    if (!path.has_value() || path->empty()) {
      RespondError(out, 400, "the query names no path (?path=...)");
      return;
    }
    absl::StatusOr<std::string> rel = WorkspacePath("path", *path);
    if (!rel.ok()) return RespondFileError(out, ToGrpc(rel.status()));
    grpc::Status s = req.body_reader != nullptr ? Upload(t, *rel, req.body_reader, "")
                                                : Upload(t, *rel, nullptr, req.body);
    if (!s.ok()) return RespondFileError(out, s);
    answer.push_back(entry(*rel));
  }
  out.Respond(200, "application/json", answer.dump());
}

void Envd::FsStat(const Target& t, const HttpRequest& req, HttpResponder& out) {
  filesystem::StatRequest in;
  if (!ParseUnary(req, out, &in)) return;
  absl::StatusOr<std::string> rel = WorkspacePath("path", in.path());
  if (!rel.ok()) return RespondConnectError(out, ToGrpc(rel.status()));
  grpc::ClientContext ctx;
  Prepare(t, options_.call_timeout, &ctx);
  v1::StatRequest stat;
  stat.set_claim_id(t.sandbox_id);
  stat.set_path(*rel);
  v1::StatResponse res;
  grpc::Status s = sandboxes_->Stat(&ctx, stat, &res);
  if (!s.ok()) return RespondConnectError(out, s);
  filesystem::StatResponse answer;
  ToEntry(res.file(), answer.mutable_entry());
  answer.mutable_entry()->set_path(E2bPath(*rel));
  answer.mutable_entry()->set_name(Basename(*rel));
  RespondUnary(out, answer);
}

void Envd::FsMakeDir(const Target& t, const HttpRequest& req, HttpResponder& out) {
  filesystem::MakeDirRequest in;
  if (!ParseUnary(req, out, &in)) return;
  absl::StatusOr<std::string> rel = WorkspacePath("path", in.path());
  if (!rel.ok()) return RespondConnectError(out, ToGrpc(rel.status()));
  // envd: parents are made; an existing entry is ALREADY_EXISTS (the SDK's false).
  {
    grpc::ClientContext ctx;
    Prepare(t, options_.call_timeout, &ctx);
    v1::StatRequest stat;
    stat.set_claim_id(t.sandbox_id);
    stat.set_path(*rel);
    v1::StatResponse res;
    grpc::Status s = sandboxes_->Stat(&ctx, stat, &res);
    if (s.ok()) {
      return RespondConnectError(out, grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                                                   absl::StrCat(in.path(), " already exists")));
    }
    if (s.error_code() != grpc::StatusCode::NOT_FOUND) return RespondConnectError(out, s);
  }
  grpc::ClientContext ctx;
  Prepare(t, options_.call_timeout, &ctx);
  v1::MakeDirRequest mk;
  mk.set_claim_id(t.sandbox_id);
  mk.set_path(*rel);
  mk.set_parents(true);
  v1::MakeDirResponse res;
  grpc::Status s = sandboxes_->MakeDir(&ctx, mk, &res);
  if (!s.ok()) return RespondConnectError(out, s);
  filesystem::MakeDirResponse answer;
  answer.mutable_entry()->set_name(Basename(*rel));
  answer.mutable_entry()->set_path(E2bPath(*rel));
  answer.mutable_entry()->set_type(filesystem::FILE_TYPE_DIRECTORY);
  RespondUnary(out, answer);
}

void Envd::FsMove(const Target& t, const HttpRequest& req, HttpResponder& out) {
  filesystem::MoveRequest in;
  if (!ParseUnary(req, out, &in)) return;
  absl::StatusOr<std::string> from = WorkspacePath("source", in.source());
  if (!from.ok()) return RespondConnectError(out, ToGrpc(from.status()));
  absl::StatusOr<std::string> to = WorkspacePath("destination", in.destination());
  if (!to.ok()) return RespondConnectError(out, ToGrpc(to.status()));
  grpc::ClientContext ctx;
  Prepare(t, options_.call_timeout, &ctx);
  v1::MoveRequest mv;
  mv.set_claim_id(t.sandbox_id);
  mv.set_from(*from);
  mv.set_to(*to);
  mv.set_overwrite(true);       // as a rename(2)
  mv.set_create_parents(true);  // envd makes the destination's parents
  v1::MoveResponse res;
  grpc::Status s = sandboxes_->Move(&ctx, mv, &res);
  if (!s.ok()) return RespondConnectError(out, s);
  filesystem::MoveResponse answer;
  answer.mutable_entry()->set_name(Basename(*to));
  answer.mutable_entry()->set_path(E2bPath(*to));
  RespondUnary(out, answer);
}

void Envd::FsListDir(const Target& t, const HttpRequest& req, HttpResponder& out) {
  filesystem::ListDirRequest in;
  if (!ParseUnary(req, out, &in)) return;
  absl::StatusOr<std::string> rel = WorkspacePath("path", in.path());
  if (!rel.ok()) return RespondConnectError(out, ToGrpc(rel.status()));
  const uint32_t depth = in.depth() == 0 ? 1 : in.depth();
  v1::ListFilesRequest list;
  list.set_claim_id(t.sandbox_id);
  list.set_path(*rel);
  list.set_recursive(depth > 1);
  list.set_page_size(1000);
  filesystem::ListDirResponse answer;
  // Entries' paths are relative to the workspace: their depth below the listed folder is
  // their number of components beyond its own.
  const size_t base =
      rel->empty()
          ? 0
          : std::vector<absl::string_view>(absl::StrSplit(*rel, '/', absl::SkipEmpty())).size();
  while (true) {
    grpc::ClientContext ctx;
    Prepare(t, options_.call_timeout, &ctx);
    v1::ListFilesResponse res;
    grpc::Status s = sandboxes_->ListFiles(&ctx, list, &res);
    if (!s.ok()) return RespondConnectError(out, s);
    for (const v1::FileInfo& f : res.files()) {
      const size_t parts =
          std::vector<absl::string_view>(absl::StrSplit(f.path(), '/', absl::SkipEmpty())).size();
      if (parts > base + depth) continue;
      ToEntry(f, answer.add_entries());
    }
    if (res.next_page_token().empty()) break;
    if (answer.entries_size() >= kMaxListEntries) {
      return RespondConnectError(
          out, grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                            absl::StrCat("more than ", kMaxListEntries, " entries under ",
                                         in.path(), "; list with a smaller depth")));
    }
    list.set_page_token(res.next_page_token());
  }
  RespondUnary(out, answer);
}

void Envd::FsRemove(const Target& t, const HttpRequest& req, HttpResponder& out) {
  filesystem::RemoveRequest in;
  if (!ParseUnary(req, out, &in)) return;
  absl::StatusOr<std::string> rel = WorkspacePath("path", in.path());
  if (!rel.ok()) return RespondConnectError(out, ToGrpc(rel.status()));
  if (rel->empty()) {
    return RespondConnectError(out, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                                 "the workspace itself cannot be removed"));
  }
  grpc::ClientContext ctx;
  Prepare(t, options_.call_timeout, &ctx);
  v1::RemoveRequest rm;
  rm.set_claim_id(t.sandbox_id);
  rm.set_path(*rel);
  rm.set_recursive(true);  // envd removes folders with their contents
  v1::RemoveResponse res;
  grpc::Status s = sandboxes_->Remove(&ctx, rm, &res);
  if (!s.ok()) return RespondConnectError(out, s);
  RespondUnary(out, filesystem::RemoveResponse());
}

}  // namespace sbx::e2b
