#include "io/model_io.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/log.h"

namespace lt {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// Writes s and a newline to p. The bytes reach the file at the flush and close, so a full disk is an error
// there (naming the OS reason), not a file left empty by a stream's destructor.
void write_text(const fs::path& p, const std::string& s) {
  std::FILE* f = std::fopen(p.c_str(), "w");
  LT_CHECK(f, "{}: cannot create: {}", p.string(), std::strerror(errno));
  const bool written = std::fwrite(s.data(), 1, s.size(), f) == s.size() && std::fputc('\n', f) != EOF &&
                       std::fflush(f) == 0;
  const int write_errno = errno;
  const int closed = std::fclose(f);
  LT_CHECK(written, "{}: write failed: {}", p.string(), std::strerror(write_errno));
  LT_CHECK(closed == 0, "{}: close failed: {}", p.string(), std::strerror(errno));
}

int pick_threads(int t) {
  if (t > 0) return t;
  return int(std::clamp(std::thread::hardware_concurrency(), 1u, 16u));
}

bool ignorable(const std::string& name) {
  // Some older checkpoints carry the RoPE inverse-frequency buffer; it is derived, not a parameter.
  const std::string s = "rotary_emb.inv_freq";
  return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
}

}  // namespace

bool passthrough_tensor(const ModelConfig& c, const std::string& name) {
  if (c.arch != Arch::Qwen3_5) return false;
  return name.rfind("model.visual.", 0) == 0 || name.rfind("mtp.", 0) == 0;
}

std::vector<std::pair<std::string, std::string>> parse_safetensors_index(const std::string& text,
                                                                        const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail("{}: invalid JSON: {}", source, e.what());
  }
  LT_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
           "{}: field 'weight_map' (object of tensor -> shard file) is missing or not an object", source);
  std::vector<std::pair<std::string, std::string>> out;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    const json& v = it.value();
    LT_CHECK(v.is_string(), "{}: weight_map['{}']: expected a shard file name (string), got {}", source, it.key(),
             v.type_name());
    std::string shard = v.get<std::string>();
    // A shard is a plain file next to the index: no directories, no escaping the model directory.
    LT_CHECK(!shard.empty() && shard.find('/') == std::string::npos && shard.find('\0') == std::string::npos &&
                 shard != "." && shard != "..",
             "{}: weight_map['{}']: '{}' is not a plain file name", source, it.key(), shard);
    out.emplace_back(it.key(), std::move(shard));
  }
  if (auto m = j.find("metadata"); m != j.end() && !m->is_null()) {
    LT_CHECK(m->is_object(), "{}: field 'metadata' must be an object, got {}", source, m->type_name());
    if (auto ts = m->find("total_size"); ts != m->end())
      LT_CHECK(ts->is_number_unsigned() || (ts->is_number_integer() && ts->get<int64_t>() >= 0),
               "{}: field 'metadata.total_size': expected a non-negative integer, got {}", source, ts->dump());
  }
  return out;
}

TensorStore::TensorStore(const fs::path& dir_or_file) : source_(dir_or_file) {
  auto add_file = [&](const fs::path& p) -> SafetensorsFile* {
    files_.push_back(std::make_unique<SafetensorsFile>(p));
    return files_.back().get();
  };
  if (!fs::is_directory(dir_or_file)) {
    LT_CHECK(fs::exists(dir_or_file), "{}: no such file or directory", dir_or_file.string());
    auto* f = add_file(dir_or_file);
    for (auto& t : f->header().tensors) refs_[t.name] = {f, &t};
    return;
  }
  const fs::path index = dir_or_file / kIndexName;
  if (!fs::exists(index)) {
    const fs::path single = dir_or_file / kSingleName;
    LT_CHECK(fs::exists(single), "{}: no {} or {} (expected a model directory with safetensors weights)",
             dir_or_file.string(), kSingleName, kIndexName);
    auto* f = add_file(single);
    for (auto& t : f->header().tensors) refs_[t.name] = {f, &t};
    return;
  }
  std::ifstream in(index, std::ios::binary);
  LT_CHECK(in.good(), "{}: cannot open", index.string());
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::map<std::string, SafetensorsFile*> shards;
  for (auto& [tensor, shard] : parse_safetensors_index(text, index.string())) {
    auto s = shards.find(shard);
    if (s == shards.end()) s = shards.emplace(shard, add_file(dir_or_file / shard)).first;
    const StTensor* t = s->second->find(tensor);
    LT_CHECK(t, "{}: tensor '{}' is listed in {} but not present in that shard", (dir_or_file / shard).string(),
             tensor, kIndexName);
    refs_[tensor] = {s->second, t};
  }
  // Tensors a shard holds beyond the index are still reachable (the index is advisory for them).
  for (auto& [name, f] : shards)
    for (auto& t : f->header().tensors)
      if (!refs_.count(t.name)) refs_[t.name] = {f, &t};
}

const TensorStore::Ref* TensorStore::find(const std::string& name) const {
  auto it = refs_.find(name);
  return it == refs_.end() ? nullptr : &it->second;
}

std::vector<std::string> TensorStore::names() const {
  std::vector<std::string> n;
  for (auto& [k, v] : refs_) n.push_back(k);
  return n;
}

void TensorStore::read_f32(const std::string& name, float* out) const {
  auto* r = find(name);
  LT_CHECK(r, "{}: tensor '{}' not found", source_.string(), name);
  r->file->read_f32(*r->tensor, out);
}

namespace {

// A model directory's tensors checked against the model once (every expected tensor present with its shape and a
// float dtype, nothing unexpected), then read as fp32 window by window of a unit.
class CheckedWeights {
 public:
  CheckedWeights(const fs::path& dir, const ModelConfig& c, const ModelLayout& layout)
      : layout_(layout), store_(dir) {
    std::vector<std::string> missing;
    std::map<std::string, bool> used;
    refs_.resize(layout.units.size());
    for (size_t u = 0; u < layout.units.size(); ++u)
      for (auto& p : layout.units[u].params) {
        const TensorStore::Ref* r = store_.find(p.name);
        refs_[u].push_back(r);
        if (!r) {
          missing.push_back(p.name);
          continue;
        }
        used[p.name] = true;
        LT_CHECK(r->tensor->shape == p.shape, "{}: tensor '{}': expected shape {} for {}, got {}",
                 r->file->path().string(), p.name, shape_str(p.shape), c.name, shape_str(r->tensor->shape));
        LT_CHECK(r->tensor->dtype == "F32" || r->tensor->dtype == "BF16" || r->tensor->dtype == "F16",
                 "{}: tensor '{}': dtype {} cannot be loaded as weights (supported: F32, BF16, F16)",
                 r->file->path().string(), p.name, r->tensor->dtype);
      }
    if (!missing.empty())
      fail("{}: {} expected tensor(s) missing for {}: {}", dir.string(), missing.size(), c.name, first_five(missing));
    std::vector<std::string> extra;
    for (auto& n : store_.names()) {
      if (used.count(n) || ignorable(n) || passthrough_tensor(c, n)) continue;
      if (n == "lm_head.weight" && c.tied) continue;  // tied: the head reads the embedding
      extra.push_back(n);
    }
    if (!extra.empty())
      fail("{}: {} unexpected tensor(s) not part of {} ({}, {} layers): {}", dir.string(), extra.size(), c.name,
           arch_hf_name(c.arch), c.layers, first_five(extra));
  }

  // Elements [off, off + n) of unit u into out[0, n) (alignment padding zeroed), converted on `threads` threads in
  // pieces of at most 8M elements, biggest first.
  void read(int64_t u, int64_t off, int64_t n, float* out, int threads) const {
    std::fill(out, out + n, 0.0f);
    struct Job {
      const TensorStore::Ref* ref;
      float* out;              // the tensor's element `begin`
      int64_t begin, count;    // element range of the tensor
    };
    std::vector<Job> jobs;
    const UnitLayout& lay = layout_.units[size_t(u)];
    constexpr int64_t kPiece = 8 << 20;
    for (size_t k = 0; k < lay.params.size(); ++k) {
      const ParamInfo& p = lay.params[k];
      const int64_t b = std::max(off, p.offset) - p.offset, e = std::min(off + n, p.offset + p.numel) - p.offset;
      for (int64_t s = b; s < e; s += kPiece)
        jobs.push_back({refs_[size_t(u)][k], out + (p.offset + s - off), s, std::min(kPiece, e - s)});
    }
    std::stable_sort(jobs.begin(), jobs.end(), [](const Job& a, const Job& b) { return a.count > b.count; });
    std::atomic<size_t> next{0};
    std::exception_ptr err;
    std::mutex err_mu;
    auto work = [&] {
      for (size_t i; (i = next.fetch_add(1)) < jobs.size();) {
        try {
          const Job& j = jobs[i];
          const StTensor& t = *j.ref->tensor;
          convert_to_f32(t.dtype, j.ref->file->raw(t) + uint64_t(j.begin) * t.elem_size, j.count, j.out,
                         j.ref->file->path().string() + ": tensor '" + t.name + "'");
        } catch (...) {
          std::lock_guard<std::mutex> g(err_mu);
          if (!err) err = std::current_exception();
        }
      }
    };
    const int nt = std::min<int>(pick_threads(threads), int(std::max<size_t>(jobs.size(), 1)));
    std::vector<std::thread> ts;
    for (int t = 1; t < nt; ++t) ts.emplace_back(work);
    work();
    for (auto& t : ts) t.join();
    if (err) std::rethrow_exception(err);
  }

 private:
  static std::string first_five(const std::vector<std::string>& names) {
    std::string list;
    for (size_t i = 0; i < std::min<size_t>(names.size(), 5); ++i) list += (i ? ", " : "") + names[i];
    return list + (names.size() > 5 ? ", ..." : "");
  }

  const ModelLayout& layout_;
  TensorStore store_;
  std::vector<std::vector<const TensorStore::Ref*>> refs_;  // per unit, per parameter
};

}  // namespace

void load_weights(const fs::path& dir, const ModelConfig& c, const ModelLayout& layout,
                  const std::vector<float*>& units, int threads) {
  LT_CHECK(units.size() == layout.units.size(), "load_weights: {} unit buffers for {} units", units.size(),
           layout.units.size());
  for (size_t u = 0; u < units.size(); ++u) LT_CHECK(units[u], "load_weights: unit {} has no buffer", u);
  const CheckedWeights w(dir, c, layout);
  for (size_t u = 0; u < units.size(); ++u) w.read(int64_t(u), 0, layout.units[u].numel, units[u], threads);
}

void load_weights(const fs::path& dir, const ModelConfig& c, const ModelLayout& layout, const UnitSink& sink,
                  const PieceSize& piece, int threads) {
  int64_t largest = 0;
  for (size_t u = 0; u < layout.units.size(); ++u)
    largest = std::max(largest, std::min(piece(int64_t(u)), layout.units[u].numel));
  std::vector<float> buf(static_cast<size_t>(largest));
  for (size_t u = 0; u < layout.units.size(); ++u) {
    // Opened per unit: the mapped shards' pages this unit touched are let go before the next.
    const CheckedWeights w(dir, c, layout);
    const int64_t numel = layout.units[u].numel, step = std::max<int64_t>(piece(int64_t(u)), 1);
    for (int64_t off = 0; off < numel; off += step) {
      const int64_t n = std::min(step, numel - off);
      w.read(int64_t(u), off, n, buf.data(), threads);
      sink(int64_t(u), off, n, buf.data());
    }
  }
}

ModelWeights load_model(const fs::path& dir, int threads) {
  ModelConfig c = load_model_config(dir);
  ModelWeights w = make_weights(c);
  std::vector<float*> ptrs;
  for (auto& u : w.units) ptrs.push_back(u.data());
  load_weights(dir, c, w.layout, ptrs, threads);
  return w;
}

void save_model(const fs::path& dir, const ModelConfig& c, const ModelLayout& layout,
                const std::vector<const float*>& units, const SaveOptions& opt) {
  LT_CHECK(units.size() == layout.units.size(), "save_model: {} unit buffers for {} units", units.size(),
           layout.units.size());
  save_model(dir, c, layout, [&](int64_t u, int64_t off, int64_t n, float* dst) {
    std::copy(units[size_t(u)] + off, units[size_t(u)] + off + n, dst);
  }, opt);
}

void save_model(const fs::path& dir, const ModelConfig& c, const ModelLayout& layout, const UnitReader& read,
                const SaveOptions& opt) {
  LT_CHECK(opt.dtype == DType::F32 || opt.dtype == DType::BF16, "save_model: dtype must be F32 or BF16, got {}",
           dtype_name(opt.dtype));
  LT_CHECK(opt.max_shard_bytes > 0, "save_model: max_shard_bytes must be positive");
  std::error_code ec;
  fs::create_directories(dir, ec);
  LT_CHECK(!ec, "{}: cannot create the model directory: {}", dir.string(), ec.message());
  // Remove earlier weights so a stale index or shard cannot shadow the new ones.
  for (auto& e : fs::directory_iterator(dir, ec)) {
    auto n = e.path().filename().string();
    bool weights = n == kIndexName || (n.rfind("model", 0) == 0 && n.size() > 12 &&
                                       n.compare(n.size() - 12, 12, ".safetensors") == 0);
    if (weights && e.is_regular_file()) {
      fs::remove(e.path(), ec);
      LT_CHECK(!ec, "{}: cannot remove the earlier weights: {}", e.path().string(), ec.message());
    }
  }
  LT_CHECK(!ec, "{}: cannot list the model directory: {}", dir.string(), ec.message());

  // HF order: embedding, layers, final norm, lm_head.
  std::vector<StWriteTensor> all;
  for (size_t u = 0; u < layout.units.size(); ++u)
    for (auto& p : layout.units[u].params) {
      StWriteTensor t{p.name, p.shape, nullptr};
      t.read = [&read, u, off = p.offset](int64_t b, int64_t n, float* dst) { read(int64_t(u), off + b, n, dst); };
      all.push_back(std::move(t));
    }
  // Pass-through tensors last (the writer puts raw tensors after converted ones in every shard).
  std::unique_ptr<TensorStore> source;
  if (!opt.passthrough_from.empty()) source = std::make_unique<TensorStore>(opt.passthrough_from);
  int64_t n_passed = 0;
  for (const std::string& n : source ? source->names() : std::vector<std::string>{}) {
    if (!passthrough_tensor(c, n)) continue;
    const TensorStore::Ref* r = source->find(n);
    StWriteTensor t{n, r->tensor->shape, nullptr};
    t.raw = r->file->raw(*r->tensor);
    t.raw_dtype = r->tensor->dtype;
    t.raw_bytes = r->tensor->numel() * int64_t(r->tensor->elem_size);
    all.push_back(std::move(t));
    ++n_passed;
  }
  const int64_t es = int64_t(dtype_size(opt.dtype));
  std::vector<std::vector<StWriteTensor>> shards(1);
  int64_t cur = 0, total = 0;
  for (auto& t : all) {
    int64_t b = es;
    for (auto d : t.shape) b *= d;
    if (t.raw) b = t.raw_bytes;
    if (!shards.back().empty() && cur + b > opt.max_shard_bytes) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(t);
    cur += b;
    total += b;
  }
  if (shards.size() == 1) {
    write_safetensors(dir / kSingleName, shards[0], opt.dtype);
  } else {
    json wm = json::object();
    for (size_t s = 0; s < shards.size(); ++s) {
      std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
      write_safetensors(dir / name, shards[s], opt.dtype);
      for (auto& t : shards[s]) wm[t.name] = name;
    }
    json idx = {{"metadata", {{"total_size", total}}}, {"weight_map", wm}};
    write_text(dir / kIndexName, idx.dump(2));
  }
  if (n_passed > 0) log_info("{}: {} tensor(s) passed through unchanged from {}", dir.string(), n_passed,
                             opt.passthrough_from.string());
  json cfg = model_config_to_json(c);
  cfg["dtype"] = opt.dtype == DType::BF16 ? "bfloat16" : "float32";
  if (!c.composite) cfg["torch_dtype"] = cfg["dtype"];
  write_text(dir / "config.json", cfg.dump(2));
  json gen = {{"_from_model_config", true}, {"transformers_version", cfg["transformers_version"]}};
  if (c.bos_token_id >= 0) gen["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_id >= 0) gen["eos_token_id"] = c.eos_token_id;
  if (c.pad_token_id >= 0) gen["pad_token_id"] = c.pad_token_id;
  write_text(dir / "generation_config.json", gen.dump(2));
}

void save_model(const fs::path& dir, const ModelWeights& w, const SaveOptions& opt) {
  std::vector<const float*> ptrs;
  for (auto& u : w.units) ptrs.push_back(u.data());
  save_model(dir, w.config, w.layout, ptrs, opt);
}

}  // namespace lt
