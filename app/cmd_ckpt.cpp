// `weft ckpt`: inspect (keys, shapes, dtypes, bytes, the saving layout, the iteration), verify
// (every checksum and the coverage of every key) and diff (per key, bitwise or with
// --rtol/--atol). A DIR is either a save directory (its tracker's latest is used) or one
// iter_NNNNNNN directory. export/import convert to and from the Hugging Face layout
// (docs/hf-interop.md). Exit codes: 0 ok/identical, 1 differences or corruption, 2 bad input.
#include "cmd_ckpt.h"

#include <ATen/Functions.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <algorithm>
#include <filesystem>
#include <memory>

#include <sys/resource.h>

#include "weft/checkpoint/checkpoint.h"
#include "weft/checkpoint/format.h"
#include "weft/core/error.h"
#include "weft/train/hf_convert.h"

namespace weft::app {
namespace {

struct Loaded {
  std::string dir;
  nlohmann::json meta;
  CkptIndex index;
};

Loaded open_checkpoint(const std::string& path) {
  Loaded l;
  l.dir = path;
  int it = 0;
  if (!std::filesystem::exists(path + "/metadata.json")) {
    if (Status s = ckpt_read_tracker(path, &it); !s)
      fail_usage("{} is neither a checkpoint (no metadata.json) nor a save directory ({})", path,
                 s.message());
    l.dir = ckpt_iter_dir(path, it);
  }
  if (Status s = ckpt_read_metadata(l.dir, &l.meta, &l.index); !s) fail_usage("{}", s.message());
  return l;
}

// The full tensor of `key`, assembled from its chunks (checksums verified).
Status read_full(const Loaded& l, const std::string& key, CkptFileCache& files, at::Tensor* out) {
  const CkptTensorInfo& t = l.index.at(key);
  *out = at::empty(t.shape, at::TensorOptions().dtype(ckpt_torch_dtype(t.dtype)));
  for (const auto& c : t.chunks) {
    at::Tensor buf = at::empty(c.lengths, out->options());
    if (Status s = files.read_chunk(c, buf.data_ptr()); !s) return s;
    out->narrow(0, c.offsets[0], c.lengths[0]).copy_(buf);
  }
  return Status::ok();
}

// The peak resident memory of this process so far, in GB (export and import stream one weight
// at a time and print it).
double peak_host_gb() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) * 1024 * 1e-9;
}

int inspect(const std::string& path) {
  Loaded l = open_checkpoint(path);
  fmt::print("checkpoint {}\n  iteration {} | consumed samples {} | format {} v{}\n", l.dir,
             l.meta.value("iteration", -1), l.meta.value("consumed_samples", int64_t{-1}),
             l.meta.value("format", ""), l.meta.value("version", -1));
  fmt::print("  saved with layout {}\n", l.meta.value("layout", nlohmann::json()).dump());
  int64_t total = 0;
  for (const auto& [key, t] : l.index) {
    int64_t bytes = 0;
    for (const auto& c : t.chunks) bytes += c.nbytes();
    total += bytes;
    fmt::print("  {:<64} {:>5} [{}] {} bytes in {} chunk(s)\n", key, t.dtype,
               fmt::join(t.shape, ", "), bytes, t.chunks.size());
  }
  fmt::print("  {} keys, {} bytes\n", l.index.size(), total);
  return 0;
}

int verify(const std::string& path) {
  Loaded l = open_checkpoint(path);  // coverage is checked while building the index
  CkptFileCache files(l.dir);
  int bad = 0;
  int64_t chunks = 0, bytes = 0;
  for (const auto& [key, t] : l.index)
    for (const auto& c : t.chunks) {
      std::vector<uint8_t> buf(static_cast<size_t>(c.nbytes()));
      if (Status s = files.read_chunk(c, buf.data()); !s) {
        fmt::print("BAD  {}\n", s.message());
        ++bad;
      }
      ++chunks;
      bytes += c.nbytes();
    }
  fmt::print("{}: {} keys, {} chunks, {} bytes: {}\n", l.dir, l.index.size(), chunks, bytes,
             bad ? fmt::format("{} corrupted chunk(s)", bad) : "all checksums and coverage ok");
  return bad ? 1 : 0;
}

int diff(const std::string& a, const std::string& b, double rtol, double atol) {
  const std::vector<std::string> d = ckpt_differences(a, b, rtol, atol);
  for (const std::string& line : d) fmt::print("{}\n", line);
  fmt::print("{} key(s) differ{}\n", d.size(), rtol == 0 && atol == 0 ? " (bitwise)" : "");
  return d.empty() ? 0 : 1;
}

}  // namespace

std::vector<std::string> ckpt_differences(const std::string& a, const std::string& b, double rtol,
                                          double atol) {
  Loaded la = open_checkpoint(a), lb = open_checkpoint(b);
  CkptFileCache fa(la.dir), fb(lb.dir);
  std::vector<std::string> out;
  for (const auto& [key, t] : la.index) {
    if (!lb.index.count(key)) {
      out.push_back(fmt::format("only in A: {}", key));
      continue;
    }
    at::Tensor x, y;
    if (Status s = read_full(la, key, fa, &x); !s) fail("{}", s.message());
    if (Status s = read_full(lb, key, fb, &y); !s) fail("{}", s.message());
    if (x.sizes() != y.sizes()) {
      out.push_back(fmt::format("differ: {} (shape [{}] vs [{}])", key, fmt::join(x.sizes(), ","),
                                fmt::join(y.sizes(), ",")));
      continue;
    }
    if (x.scalar_type() != y.scalar_type()) {  // e.g. `weft ckpt import --dtype source` vs fp32
      const at::Tensor u = x.to(at::kDouble), v = y.to(at::kDouble);
      const bool values =
          at::logical_or(u.eq(v), at::logical_and(u.isnan(), v.isnan())).all().item<bool>();
      out.push_back(fmt::format("differ: {} (dtype {} vs {}; {})", key,
                                ckpt_dtype_name(x.scalar_type()), ckpt_dtype_name(y.scalar_type()),
                                values ? "the same values" : "the values differ too"));
      continue;
    }
    // atol < 0: scaled to the key, rtol * its largest magnitude (elements near zero, e.g. Adam
    // moments, then compare against the tensor's scale rather than their own).
    const double key_atol =
        atol >= 0 ? atol : rtol * std::max(x.abs().max().item<double>(), y.abs().max().item<double>());
    const bool same = (rtol == 0 && atol == 0)
                          ? at::equal(x, y)
                          : at::allclose(x.to(at::kDouble), y.to(at::kDouble), rtol, key_atol);
    if (!same) {
      double m = x.to(at::kDouble).sub(y.to(at::kDouble)).abs().max().item<double>();
      out.push_back(fmt::format("differ: {} (max abs diff {:.3g})", key, m));
    }
  }
  for (const auto& [key, t] : lb.index)
    if (!la.index.count(key)) {
      out.push_back(fmt::format("only in B: {}", key));
    }
  return out;
}

void add_ckpt_command(CLI::App* app) {
  CLI::App* ck = app->add_subcommand("ckpt", "inspect, verify, compare, export and import checkpoints");
  ck->require_subcommand(1);
  auto dir = std::make_shared<std::string>();
  auto other = std::make_shared<std::string>();
  auto rtol = std::make_shared<double>(0.0), atol = std::make_shared<double>(0.0);
  auto rc = std::make_shared<int>(0);
  CLI::App* in = ck->add_subcommand("inspect", "keys, shapes, dtypes, bytes, layout, iteration");
  in->add_option("DIR", *dir, "save directory or iter_NNNNNNN directory")->required();
  in->callback([=] { *rc = inspect(*dir); });
  CLI::App* ve = ck->add_subcommand("verify", "all checksums and coverage");
  ve->add_option("DIR", *dir, "save directory or iter_NNNNNNN directory")->required();
  ve->callback([=] {
    if (int r = verify(*dir)) throw CLI::RuntimeError(r);
  });
  CLI::App* di = ck->add_subcommand("diff", "compare two checkpoints key by key");
  di->add_option("A", *dir, "first checkpoint")->required();
  di->add_option("B", *other, "second checkpoint")->required();
  di->add_option("--rtol", *rtol, "relative tolerance (0 with --atol 0: bitwise)")->capture_default_str();
  di->add_option("--atol", *atol, "absolute tolerance")->capture_default_str();
  di->callback([=] {
    if (!(std::isfinite(*rtol) && *rtol >= 0))
      fail_usage("--rtol must be a finite number >= 0 (got {})", *rtol);
    if (!(std::isfinite(*atol) && *atol >= 0))
      fail_usage("--atol must be a finite number >= 0 (got {})", *atol);
    if (int r = diff(*dir, *other, *rtol, *atol)) throw CLI::RuntimeError(r);
  });
  auto format = std::make_shared<std::string>("hf");
  auto dtype = std::make_shared<std::string>("fp32");
  auto shard = std::make_shared<std::string>("5GB");
  auto check_format = [format] {
    if (*format != "hf") fail_usage("--format must be hf (got '{}')", *format);
  };
  CLI::App* ex = ck->add_subcommand("export", "write a checkpoint in the Hugging Face layout "
                                              "(Llama, Qwen2, Qwen3, Qwen3-MoE, Mixtral, "
                                              "DeepSeek-V3, NemotronH)");
  ex->add_option("CKPT", *dir, "save directory or iter_NNNNNNN directory")->required();
  ex->add_option("OUT", *other, "new output directory")->required();
  ex->add_option("--format", *format, "hf")->capture_default_str();
  ex->add_option("--dtype", *dtype, "fp32 | bf16 (from the fp32 master, else the stored weights)")
      ->capture_default_str();
  ex->add_option("--max-shard-size", *shard, "largest safetensors file (5GB, 500MB, 2GiB, ...)")
      ->capture_default_str();
  ex->callback([=] {
    check_format();
    HfExportOptions o;
    o.dtype = *dtype;
    o.max_shard_bytes = hf_parse_shard_size(*shard);
    hf_export_checkpoint(*dir, *other, o);
    fmt::print("exported {} to {}; peak host memory {:.2f} GB\n", *dir, *other, peak_host_gb());
  });
  CLI::App* im = ck->add_subcommand("import", "turn a Hugging Face model directory into a "
                                              "weights-only weft checkpoint (iteration 0)");
  im->add_option("HFDIR", *dir, "directory with config.json and safetensors")->required();
  im->add_option("OUT", *other, "new checkpoint directory (weft train --load OUT --finetune)")
      ->required();
  im->add_option("--format", *format, "hf")->capture_default_str();
  auto import_dtype = std::make_shared<std::string>("fp32");
  im->add_option("--dtype", *import_dtype,
                 "fp32 | bf16 (wider tensors rounded; NemotronH's expert bias kept) | source "
                 "(each weight as its files hold it: exact); any loads into the float32 master")
      ->capture_default_str();
  im->callback([=] {
    check_format();
    const HfImportStats st = hf_import_checkpoint(*dir, *other, *import_dtype);
    fmt::print("imported {} to {}: {} tensors, {} parameters ({:.2f} GB stored); peak host "
               "memory {:.2f} GB\n", *dir, *other, st.tensors, st.parameters,
               st.bytes * 1e-9, peak_host_gb());
  });
}

}  // namespace weft::app
