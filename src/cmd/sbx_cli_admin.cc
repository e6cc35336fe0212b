// `sbx pools [get|scale]`, `sbx templates [get]`: AdminService; `sbx images [pull|rm]`:
// ImageService (admin token).

#include <cctype>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "src/cmd/sbx_cli_commands.h"

namespace sbx::cli {
namespace {

constexpr int kPageSize = 500;
// How often `pools scale --wait` reads the pool.
constexpr absl::Duration kScalePoll = absl::Milliseconds(250);

std::string PolicyName(v1::EmptyPoolPolicy p) {
  if (p == v1::EMPTY_POOL_POLICY_UNSPECIFIED) return "wait (default)";
  std::string name = ShortEnumName(v1::EmptyPoolPolicy_Name(p), "EMPTY_POOL_POLICY_");
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

std::string DurationOr(const google::protobuf::Duration& d, bool set, const std::string& unset) {
  if (!set || (d.seconds() == 0 && d.nanos() == 0)) return unset;
  return absl::FormatDuration(FromProto(d));
}

const char* SizingName(v1::PoolSizing s) {
  return s == v1::POOL_SIZING_DEMAND ? "demand" : "static";
}

// What the ERROR column says: the last create's error, else that the pool's image is
// being pulled (its first sandboxes wait for it), else "-".
std::string PoolProblem(const v1::PoolStatus& s) {
  if (!s.last_error().empty()) return s.last_error();
  if (s.image_state() == "pulling") return absl::StrCat("pulling image ", s.image());
  return "-";
}

void PrintPools(const std::vector<v1::Pool>& pools) {
  Table table({"NAME", "TEMPLATE", "WARM", "STARTING", "CLAIMED", "WAITING", "TARGET", "WHY", "MIN",
               "MAX", "SIZING", "RATE/S", "ERROR"});
  for (const v1::Pool& p : pools) {
    const v1::PoolStatus& s = p.status();
    table.AddRow({p.name(), p.template_(), absl::StrCat(s.warm()), absl::StrCat(s.starting()),
                  absl::StrCat(s.claimed()), absl::StrCat(s.waiting_claims()),
                  absl::StrCat(s.target()), s.target_reason().empty() ? "-" : s.target_reason(),
                  absl::StrCat(p.min_warm()), absl::StrCat(p.max_warm()), SizingName(p.sizing()),
                  absl::StrFormat("%.1f", s.arrival_rate()), PoolProblem(s)});
  }
  table.Print(stdout);
}

void PrintPoolDetail(const v1::Pool& p) {
  const v1::PoolStatus& s = p.status();
  Table table({"FIELD", "VALUE"});
  table.AddRow({"name", p.name()});
  table.AddRow({"template", p.template_()});
  table.AddRow({"min_warm", absl::StrCat(p.min_warm())});
  table.AddRow({"max_warm", absl::StrCat(p.max_warm())});
  table.AddRow(
      {"max_sandboxes", p.max_sandboxes() == 0 ? "no cap" : absl::StrCat(p.max_sandboxes())});
  table.AddRow({"empty_pool_policy", PolicyName(p.empty_pool_policy())});
  table.AddRow({"default_wait", DurationOr(p.default_wait(), p.has_default_wait(), "30s")});
  table.AddRow({"default_ttl", DurationOr(p.default_ttl(), p.has_default_ttl(), "none")});
  table.AddRow({"max_ttl", DurationOr(p.max_ttl(), p.has_max_ttl(), "none")});
  table.AddRow({"selection_policy", p.selection_policy().empty() ? "fifo" : p.selection_policy()});
  table.AddRow({"generation", absl::StrCat(p.generation())});
  table.AddRow({"created", AbsoluteTime(p.has_created_at(), p.created_at())});
  table.AddRow({"warm", absl::StrCat(s.warm())});
  table.AddRow({"starting", absl::StrCat(s.starting())});
  table.AddRow({"claimed", absl::StrCat(s.claimed())});
  table.AddRow({"waiting_claims", absl::StrCat(s.waiting_claims())});
  table.AddRow({"sizing", SizingName(p.sizing())});
  table.AddRow({"target", absl::StrCat(s.target())});
  table.AddRow({"target_reason", s.target_reason().empty() ? "-" : s.target_reason()});
  table.AddRow({"demand", absl::StrCat(s.demand())});
  table.AddRow({"arrival_rate", absl::StrFormat("%.2f/s (last seconds), %.2f/s (last minutes)",
                                                s.arrival_rate(), s.arrival_rate_long())});
  table.AddRow({"create_latency", absl::FormatDuration(FromProto(s.create_latency()))});
  table.AddRow({"stale", absl::StrCat(s.stale())});
  table.AddRow({"observed_generation", absl::StrCat(s.observed_generation())});
  table.AddRow({"template_generation", absl::StrCat(s.template_generation())});
  table.AddRow({"last_error", s.last_error().empty() ? "-" : s.last_error()});
  if (!s.image().empty()) {
    table.AddRow({"image", s.image()});
    table.AddRow({"image_state", s.image_state().empty() ? "not pulled" : s.image_state()});
  }
  if (!s.snapshot().empty()) table.AddRow({"snapshot", s.snapshot()});
  table.Print(stdout);
}

void PrintTemplates(const std::vector<v1::Template>& templates) {
  Table table({"NAME", "RUNTIME", "GENERATION", "UPDATED"});
  for (const v1::Template& t : templates) {
    table.AddRow({t.name(), t.runtime(), absl::StrCat(t.generation()),
                  AbsoluteTime(t.has_updated_at(), t.updated_at())});
  }
  table.Print(stdout);
}

void PrintTemplateDetail(const v1::Template& t) {
  Table table({"FIELD", "VALUE"});
  table.AddRow({"name", t.name()});
  table.AddRow({"runtime", t.runtime()});
  table.AddRow({"generation", absl::StrCat(t.generation())});
  table.AddRow({"created", AbsoluteTime(t.has_created_at(), t.created_at())});
  table.AddRow({"updated", AbsoluteTime(t.has_updated_at(), t.updated_at())});
  table.Print(stdout);
  // The spec is nested (mounts, env, a pod template): shown as JSON rather than squeezed
  // into cells.
  if (t.has_local()) std::printf("local:\n%s\n", ToJson(t.local(), true).c_str());
  if (t.has_kubernetes()) std::printf("kubernetes:\n%s\n", ToJson(t.kubernetes(), true).c_str());
}

std::string Bytes(int64_t n) {
  if (n >= int64_t{1} << 30) return absl::StrFormat("%.1f GiB", static_cast<double>(n) / (1 << 30));
  if (n >= int64_t{1} << 20) return absl::StrFormat("%.1f MiB", static_cast<double>(n) / (1 << 20));
  return absl::StrCat(n, " B");
}

void PrintImages(const std::vector<v1::Image>& images) {
  Table table({"DIGEST", "REF", "SIZE", "HOLDERS", "LAST USED"});
  for (const v1::Image& i : images) {
    table.AddRow({i.digest().substr(0, 19), i.ref(), Bytes(i.bytes()), absl::StrCat(i.holders()),
                  AbsoluteTime(i.has_last_used(), i.last_used())});
  }
  table.Print(stdout);
}

absl::StatusOr<std::vector<v1::Pool>> ListAllPools(Client& client, const std::string& tmpl) {
  v1::ListPoolsRequest req;
  req.set_page_size(kPageSize);
  req.set_template_(tmpl);
  std::vector<v1::Pool> pools;
  while (true) {
    v1::ListPoolsResponse resp;
    if (absl::Status s = client.Call(
            [&](grpc::ClientContext* c) { return client.admin().ListPools(c, req, &resp); });
        !s.ok()) {
      return s;
    }
    for (v1::Pool& p : *resp.mutable_pools()) pools.push_back(std::move(p));
    if (resp.next_page_token().empty() || resp.next_page_token() == req.page_token()) break;
    req.set_page_token(resp.next_page_token());
  }
  return pools;
}

absl::StatusOr<v1::Pool> GetPool(Client& client, const std::string& name) {
  v1::GetPoolRequest req;
  req.set_name(name);
  v1::GetPoolResponse resp;
  if (absl::Status s = client.Call(
          [&](grpc::ClientContext* c) { return client.admin().GetPool(c, req, &resp); });
      !s.ok()) {
    return s;
  }
  return resp.pool();
}

struct ScaleArgs {
  std::string name;
  int min = 0;
  int max = 0;
  CLI::Option* min_opt = nullptr;
  CLI::Option* max_opt = nullptr;
  bool wait = false;
  std::string wait_timeout = "5m";
};

absl::StatusOr<int> RunScale(Context& ctx, const ScaleArgs& a) {
  if (a.min_opt->count() == 0 && a.max_opt->count() == 0) {
    return UsageError("pools scale: give --min, --max or both");
  }
  auto connected = ctx.Connect();
  if (!connected.ok()) return connected.status();
  Client& client = **connected;
  v1::ScalePoolRequest req;
  req.set_name(a.name);
  if (a.min_opt->count() > 0) req.mutable_min_warm()->set_value(a.min);
  if (a.max_opt->count() > 0) req.mutable_max_warm()->set_value(a.max);
  v1::ScalePoolResponse resp;
  if (absl::Status s = client.Call(
          [&](grpc::ClientContext* c) { return client.admin().ScalePool(c, req, &resp); });
      !s.ok()) {
    return s;
  }
  v1::Pool pool = resp.pool();
  if (a.wait) {
    const int want = pool.min_warm();
    const absl::Time deadline = absl::Now() + ParseDurationFlag(a.wait_timeout);
    Progress progress(ctx.stderr_tty, absl::StrCat("pool \"", a.name, "\" warm"));
    while (true) {
      const v1::PoolStatus& s = pool.status();
      std::string detail = absl::StrCat("(", s.starting(), " starting, ", s.claimed(), " claimed)");
      if (!s.last_error().empty()) absl::StrAppend(&detail, " last error: ", s.last_error());
      progress.Set(s.warm(), want, detail);
      if (s.warm() >= want) break;
      if (absl::Now() >= deadline) {
        progress.Finish("");
        return absl::DeadlineExceededError(absl::StrCat(
            "pool \"", a.name, "\" has ", s.warm(), " warm sandboxes, not ", want, " after ",
            a.wait_timeout, s.last_error().empty() ? "" : "; last error: ", s.last_error()));
      }
      absl::SleepFor(kScalePoll);
      absl::StatusOr<v1::Pool> got = GetPool(client, a.name);
      if (!got.ok()) {
        progress.Finish("");
        return got.status();
      }
      pool = std::move(*got);
    }
    progress.Finish(absl::StrCat("pool \"", a.name, "\": ", pool.status().warm(),
                                 " warm sandboxes (min ", want, ")"));
  }
  if (ctx.json()) {
    PrintJson(pool);
  } else {
    PrintPools({pool});
  }
  return 0;
}

}  // namespace

void AddAdminCommands(CLI::App& app, Context& ctx, Actions& actions) {
  {
    auto tmpl = std::make_shared<std::string>();
    CLI::App* pools =
        app.add_subcommand("pools", "List pools with their status (admin), or get / scale one");
    pools->require_subcommand(0, 1);
    pools->add_option("--template", *tmpl, "Only pools made from this template");
    actions[pools] = [&ctx, tmpl]() -> absl::StatusOr<int> {
      auto connected = ctx.Connect();
      if (!connected.ok()) return connected.status();
      absl::StatusOr<std::vector<v1::Pool>> pools = ListAllPools(**connected, *tmpl);
      if (!pools.ok()) return pools.status();
      if (ctx.json()) {
        PrintJsonArrayOf(*pools);
      } else if (pools->empty()) {
        std::fprintf(stderr, "No pools found.\n");
      } else {
        PrintPools(*pools);
      }
      return 0;
    };

    auto name = std::make_shared<std::string>();
    CLI::App* get = pools->add_subcommand("get", "Show one pool: its spec and status");
    get->add_option("name", *name, "Pool name")->required();
    actions[get] = [&ctx, name]() -> absl::StatusOr<int> {
      auto connected = ctx.Connect();
      if (!connected.ok()) return connected.status();
      absl::StatusOr<v1::Pool> pool = GetPool(**connected, *name);
      if (!pool.ok()) return pool.status();
      if (ctx.json()) {
        PrintJson(*pool);
      } else {
        PrintPoolDetail(*pool);
      }
      return 0;
    };

    auto a = std::make_shared<ScaleArgs>();
    CLI::App* scale = pools->add_subcommand(
        "scale", "Change a pool's floor (--min) and/or ceiling (--max) of warm sandboxes");
    scale->add_option("name", a->name, "Pool name")->required();
    a->min_opt = scale->add_option("--min", a->min, "New min_warm")->check(CLI::Range(0, 10000));
    a->max_opt = scale->add_option("--max", a->max, "New max_warm")->check(CLI::Range(0, 10000));
    CLI::Option* wait =
        scale->add_flag("--wait", a->wait,
                        "Wait until the pool has at least min_warm warm sandboxes, with progress");
    scale->add_option("--wait-timeout", a->wait_timeout, "Give up waiting after this long")
        ->check(DurationCheck())
        ->capture_default_str()
        ->needs(wait);
    actions[scale] = [&ctx, a] { return RunScale(ctx, *a); };
  }
  {
    CLI::App* templates =
        app.add_subcommand("templates", "List templates (admin), or `templates get NAME`");
    templates->require_subcommand(0, 1);
    actions[templates] = [&ctx]() -> absl::StatusOr<int> {
      auto connected = ctx.Connect();
      if (!connected.ok()) return connected.status();
      Client& client = **connected;
      v1::ListTemplatesRequest req;
      req.set_page_size(kPageSize);
      std::vector<v1::Template> all;
      while (true) {
        v1::ListTemplatesResponse resp;
        if (absl::Status s = client.Call([&](grpc::ClientContext* c) {
              return client.admin().ListTemplates(c, req, &resp);
            });
            !s.ok()) {
          return s;
        }
        for (v1::Template& t : *resp.mutable_templates()) all.push_back(std::move(t));
        if (resp.next_page_token().empty() || resp.next_page_token() == req.page_token()) break;
        req.set_page_token(resp.next_page_token());
      }
      if (ctx.json()) {
        PrintJsonArrayOf(all);
      } else if (all.empty()) {
        std::fprintf(stderr, "No templates found.\n");
      } else {
        PrintTemplates(all);
      }
      return 0;
    };

    auto name = std::make_shared<std::string>();
    CLI::App* get = templates->add_subcommand("get", "Show one template and its spec");
    get->add_option("name", *name, "Template name")->required();
    actions[get] = [&ctx, name]() -> absl::StatusOr<int> {
      auto connected = ctx.Connect();
      if (!connected.ok()) return connected.status();
      Client& client = **connected;
      v1::GetTemplateRequest req;
      req.set_name(*name);
      v1::GetTemplateResponse resp;
      if (absl::Status s = client.Call(
              [&](grpc::ClientContext* c) { return client.admin().GetTemplate(c, req, &resp); });
          !s.ok()) {
        return s;
      }
      if (ctx.json()) {
        PrintJson(resp.template_());
      } else {
        PrintTemplateDetail(resp.template_());
      }
      return 0;
    };
  }
  {
    CLI::App* images = app.add_subcommand(
        "images", "List the image cache (admin), or `images pull REF`, `images rm DIGEST`");
    images->require_subcommand(0, 1);
    actions[images] = [&ctx]() -> absl::StatusOr<int> {
      auto connected = ctx.Connect();
      if (!connected.ok()) return connected.status();
      Client& client = **connected;
      v1::ListImagesResponse resp;
      if (absl::Status s = client.Call([&](grpc::ClientContext* c) {
            return client.images().ListImages(c, v1::ListImagesRequest(), &resp);
          });
          !s.ok()) {
        return s;
      }
      std::vector<v1::Image> all(resp.images().begin(), resp.images().end());
      if (ctx.json()) {
        PrintJsonArrayOf(all);
      } else if (all.empty()) {
        std::fprintf(stderr, "No images in the cache (%s of %s used).\n",
                     Bytes(resp.bytes()).c_str(), Bytes(resp.budget_bytes()).c_str());
      } else {
        PrintImages(all);
        std::fprintf(stderr, "%s of %s used.\n", Bytes(resp.bytes()).c_str(),
                     Bytes(resp.budget_bytes()).c_str());
      }
      return 0;
    };

    auto ref = std::make_shared<std::string>();
    CLI::App* pull = images->add_subcommand(
        "pull",
        "Fetch and unpack an image into the cache (oci:DIR[:TAG], oci-archive:FILE, "
        "docker-archive:FILE, docker://NAME[:TAG])");
    pull->add_option("ref", *ref, "Image reference")->required();
    actions[pull] = [&ctx, ref]() -> absl::StatusOr<int> {
      auto connected = ctx.Connect();
      if (!connected.ok()) return connected.status();
      Client& client = **connected;
      v1::PullImageRequest req;
      req.set_ref(*ref);
      v1::PullImageResponse resp;
      // A pull fetches and unpacks: it may take much longer than a claim.
      if (absl::Status s = client.Call(
              absl::Minutes(15),
              [&](grpc::ClientContext* c) { return client.images().PullImage(c, req, &resp); });
          !s.ok()) {
        return s;
      }
      if (ctx.json()) {
        PrintJson(resp.image());
      } else {
        PrintImages({resp.image()});
      }
      return 0;
    };

    auto digest = std::make_shared<std::string>();
    CLI::App* rm = images->add_subcommand("rm", "Remove an image nobody uses from the cache");
    rm->add_option(
          "digest", *digest,
          "The image's digest (sha256:..., or a unique prefix of 12+ hex digits as listed)")
        ->required();
    actions[rm] = [&ctx, digest]() -> absl::StatusOr<int> {
      auto connected = ctx.Connect();
      if (!connected.ok()) return connected.status();
      Client& client = **connected;
      v1::RemoveImageRequest req;
      req.set_digest(*digest);
      v1::RemoveImageResponse resp;
      if (absl::Status s = client.Call(
              [&](grpc::ClientContext* c) { return client.images().RemoveImage(c, req, &resp); });
          !s.ok()) {
        return s;
      }
      if (!ctx.json()) std::fprintf(stderr, "Removed %s.\n", EscapeForTerminal(*digest).c_str());
      return 0;
    };
  }
}

}  // namespace sbx::cli
