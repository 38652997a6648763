// Building an Instance from a model, a shape and a resource profile.
#include "plan/instance.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <set>

#include "core/error.h"
#include "model/accounting.h"
#include "model/param_layout.h"

namespace lt {

double Instance::pcie(double h, double d) const { return std::max({h / bh, d / bd, (h + d) / bb}); }

double Instance::slot_time(double C, double h, double d, double r, double w) const {
  return std::max({C, pcie(h, d), r / bnr, w / bnw});
}

namespace {

constexpr double kNever = 1e300;
using Intervals = std::vector<std::pair<double, double>>;  // sorted, disjoint [start, end)

// When work of x seconds at a lane's full rate, started at a, ends on a lane that is busy during `busy`.
double lane_finish(const Intervals& busy, double a, double x) {
  double t = a;
  for (const auto& [b0, b1] : busy) {
    if (b1 <= t) continue;
    if (b0 > t) {
      if (x <= b0 - t) return t + x;
      x -= b0 - t;
    }
    t = b1;
  }
  return t + x;
}

// The checkpoints' NVMe transfers placed on the timeline as the slots' waits become known (CheckpointNvmeIo).
struct CheckpointLanes {
  const Instance& in;
  const CheckpointNvmeIo* ck;
  Intervals read, write;
  int next = -1;  // next slot to place; -1: the first waits for layer 0's update
  double t = 0;   // end of the last placed slot

  CheckpointLanes(const Instance& x, const CheckpointNvmeIo* c) : in(x), ck(c && c->any() ? c : nullptr) {
    if (!ck) return;
    const size_t S = size_t(in.slots());
    LT_CHECK(ck->slot_s.size() == S && ck->read_s.size() == S && ck->write_s.size() == S,
             "plan: the checkpoints' NVMe timeline has {} slot times, {} reads and {} writes; the instance has {} slots",
             ck->slot_s.size(), ck->read_s.size(), ck->write_s.size(), S);
  }

  void place(size_t w, double start) {
    if (ck->read_s[w] > 0) read.emplace_back(start, start + ck->read_s[w]);
    if (ck->write_s[w] > 0) write.emplace_back(start, start + ck->write_s[w]);
    t = start + ck->slot_s[w];
  }
  // The later micro-batches: no waits.
  void place_repeats() {
    for (int m = 1; m < in.micro_batches; ++m) {
      t += ck->epilogue_s + ck->prologue_s;
      for (size_t w = 0; w < ck->slot_s.size(); ++w) place(w, t);
    }
  }
  // Places the slots whose updates are final (o[u] < kNever).
  void advance(const std::vector<double>& o) {
    if (!ck) return;
    const int L = in.L, S = in.slots();
    if (next < 0) {
      if (o[0] >= kNever) return;
      t = std::max(o[0], in.device_update_s) + ck->lead;
      next = 0;
    }
    while (next < S) {
      const double wait = next < L ? o[size_t(next + 1 <= L - 1 ? next + 1 : L)] : 0.0;
      if (wait >= kNever) return;
      place(size_t(next++), std::max(t, wait));
      if (next == S) place_repeats();
    }
  }
};

// The NVMe units' I/O queue beside the CPU optimizer (Instance::nvme_read): one operation at a time. The CPU updates
// the units in order; the queue does the oldest finished update's write-back, else the next read once a slot is free
// (the write-back nvme_slots NVMe units earlier ended). Events in time order (on a tie: an I/O's end, the CPU, an
// I/O's start); an operation's end is final at its end event, as the checkpoints' lanes are known up to then.
struct NvmePipeline {
  const Instance& in;
  std::vector<size_t> order;  // update order
  std::vector<double> ready;  // per position: the held gradient's arrival (0 without)
  std::vector<int> nv;        // per position: index among the NVMe units, -1 for a unit in DRAM
  std::vector<size_t> unit_of_nv;
  std::vector<double> read_end, cpu_end, write_end;  // per NVMe unit
  CheckpointLanes lanes;
  double ahead_end = 0;  // the next step's read-ahead's end

  NvmePipeline(const Instance& x, const CheckpointNvmeIo* ck) : in(x), order(x.opt_order()), lanes(x, ck) {
    double d2h = 0;
    for (size_t u : order) {
      if (u < in.opt_d2h.size()) d2h += in.opt_d2h[u];
      ready.push_back(u < in.opt_d2h.size() ? d2h : 0.0);
      const bool on_nvme = u < in.nvme_read.size() && in.nvme_read[u] + in.nvme_write[u] > 0;
      nv.push_back(on_nvme ? int(unit_of_nv.size()) : -1);
      if (on_nvme) unit_of_nv.push_back(u);
    }
    const size_t n = unit_of_nv.size();
    read_end.assign(n, kNever);
    cpu_end.assign(n, kNever);
    write_end.assign(n, kNever);
    for (size_t i = 0; i < std::min(n, slots()); ++i) read_end[i] = 0;  // read ahead during the previous step
  }

  size_t slots() const { return size_t(std::max(1, in.nvme_slots)); }

  // The operation in flight: a write-back (write) or a read of NVMe unit i, x seconds at the lane's full rate.
  struct Io {
    bool on = false, write = false;
    size_t i = 0;
    double start = 0, x = 0;
  };
  std::vector<double> o;  // per unit: its update's end (an NVMe unit's: its write-back's), kNever until final
  size_t next_cpu = 0, next_write = 0, next_read = 0;
  double cpu = 0, io = 0;  // the CPU's last update's end, the queue's last operation's end
  Io op;

  double io_done() const { return op.on ? lane_finish(op.write ? lanes.write : lanes.read, op.start, op.x) : kNever; }
  double cpu_start() const {
    if (next_cpu >= order.size()) return kNever;
    const int i = nv[next_cpu];
    const double rd = i < 0 ? 0.0 : read_end[size_t(i)];
    return rd < kNever ? std::max({cpu, ready[next_cpu], rd}) : kNever;
  }
  double write_start() const {
    const bool can = !op.on && next_write < unit_of_nv.size() && cpu_end[next_write] < kNever;
    return can ? std::max(io, cpu_end[next_write]) : kNever;
  }
  double read_start() const {
    const bool can = !op.on && next_read < unit_of_nv.size() && write_end[next_read - slots()] < kNever;
    return can ? std::max(io, write_end[next_read - slots()]) : kNever;
  }
  // The operation in flight ends at t: a read frees its unit's update, a write-back ends the unit.
  void finish_io(double t) {
    io = t;
    op.on = false;
    if (!op.write) {
      read_end[op.i] = t;
      return;
    }
    write_end[op.i] = o[unit_of_nv[op.i]] = t;
    lanes.advance(o);
  }
  void run_cpu(double start) {
    const size_t u = order[next_cpu];
    cpu = start + in.opt[u];
    const int i = nv[next_cpu++];
    if (i >= 0) {
      cpu_end[size_t(i)] = cpu;
      return;
    }
    o[u] = cpu;
    lanes.advance(o);
  }

  std::vector<double> run() {
    o.assign(in.opt.size(), kNever);
    next_read = std::min(unit_of_nv.size(), slots());
    lanes.advance(o);
    for (;;) {
      const double done = io_done(), c = cpu_start(), w = write_start(), r = read_start();
      if (std::min({done, c, w, r}) >= kNever) break;
      if (op.on && done <= c) finish_io(done);
      else if (c <= std::min(w, r)) run_cpu(c);
      else if (w <= r) {  // write-backs first: they free slots
        op = {true, true, next_write, w, in.nvme_write[unit_of_nv[next_write]]};
        ++next_write;
      } else {
        op = {true, false, next_read, r, in.nvme_read[unit_of_nv[next_read]]};
        ++next_read;
      }
    }
    // The next step's read-ahead follows the last write-back on the same queue.
    ahead_end = io;
    for (size_t i = 0; i < std::min(unit_of_nv.size(), slots()); ++i)
      ahead_end = lane_finish(lanes.read, ahead_end, in.nvme_read[unit_of_nv[i]]);
    for (double& x : o)
      if (x >= kNever) x = 0;  // units without an update (none in a consistent instance)
    return o;
  }
};

}  // namespace

bool CheckpointNvmeIo::any() const {
  for (size_t w = 0; w < read_s.size(); ++w)
    if (read_s[w] > 0 || write_s[w] > 0) return true;
  return false;
}

std::vector<double> Instance::opt_done(const CheckpointNvmeIo* ck) const {
  if (nvme_read.empty()) {  // no NVMe units: the plain recurrence
    std::vector<double> o(opt.size());
    double t = 0, d2h = 0;
    for (size_t u : opt_order()) {
      if (u < opt_d2h.size()) t = std::max(t, d2h += opt_d2h[u]);
      o[u] = (t += opt[u]);
    }
    return o;
  }
  return NvmePipeline(*this, ck).run();
}

std::vector<double> Instance::opt_done_ring(const std::vector<double>& reach) const {
  std::vector<double> o(opt.size(), 0.0);
  std::deque<std::pair<size_t, double>> flight;  // copied units still holding ring bytes, in copy order
  double t = 0, d2h = 0, used = 0;
  for (size_t u : opt_order()) {
    if (u < opt_d2h.size() && opt_d2h[u] > 0) {
      const double b = opt_d2h[u] * bd;
      double room = 0;  // when the ring has room for u: the oldest units' slots freed first
      while (!flight.empty() && used + b > grad_ring_bytes * (1 + 1e-9)) {
        const auto [v, vb] = flight.front();
        flight.pop_front();
        used -= vb;
        room = std::max({room, o[v], v < reach.size() ? reach[v] : 0.0});
      }
      d2h = std::max(d2h, room) + opt_d2h[u];
      flight.emplace_back(u, b);
      used += b;
      t = std::max(t, d2h);
    }
    o[u] = (t += opt[u]);
  }
  return o;
}

Instance Instance::solver_view() const {
  Instance v = *this;
  if (nvme_read.empty()) return v;
  double compute = head_s, reads = 0, writes = 0;
  for (int j = 0; j < L; ++j) compute += rho[size_t(j)] + beta[size_t(j)];
  for (size_t u = 0; u < nvme_read.size(); ++u) {
    reads += nvme_read[u];
    writes += nvme_write[u];
  }
  if (compute <= 0) return v;
  v.bnr = bnr * std::max(0.1, 1.0 - reads / compute);
  v.bnw = bnw * std::max(0.1, 1.0 - writes / compute);
  return v;
}

double Instance::nvme_io_s() const {
  double t = 0;
  for (size_t u = 0; u < nvme_read.size(); ++u) t += nvme_read[u] + nvme_write[u];
  return t;
}

std::vector<size_t> Instance::opt_order() const {
  // The executor's: the optimizer runs its units in unit order (embedding, layers, head) once the norm is known,
  // and the held gradients stream in that order (exec held_grad_order).
  std::vector<size_t> order;
  const bool emb = opt.size() == size_t(L + 2);
  if (emb && embedding_first) order.push_back(size_t(L + 1));
  for (size_t u = 0; u < opt.size() && u <= size_t(L); ++u) order.push_back(u);
  if (emb && !embedding_first) order.push_back(size_t(L + 1));
  return order;
}

double Instance::opt_last(const CheckpointNvmeIo* ck) const {
  if (nvme_read.empty()) {
    const auto o = opt_done();
    return o.empty() ? 0.0 : *std::max_element(o.begin(), o.end());
  }
  // The next step's read-ahead follows the last write-back on the same queue, before the next update phase.
  NvmePipeline pipe(*this, ck);
  const auto o = pipe.run();
  return std::max(o.empty() ? 0.0 : *std::max_element(o.begin(), o.end()), pipe.ahead_end);
}

double Instance::R(int s, int e) const {
  double r = 0;
  for (int j = s; j <= e - 2; ++j) r += rho[size_t(j)];
  return r;
}

double Instance::R_bytes(int s, int e) const {
  double b = 0;
  for (int j = s; j <= e - 2; ++j) b += P[size_t(j)];
  return b;
}

double Instance::max_ws_bwd() const { return *std::max_element(ws_bwd.begin(), ws_bwd.end()); }

double Instance::block_floor(int s, int e) const {
  double m = 0;
  for (int j = s; j < e; ++j) m = std::max(m, ws_bwd[size_t(j)] + A * double(j - s));
  return ring + m + A * (1 + (s > 0));
}

namespace {

double unit_opt_time(const UnitLayout& u, const std::set<std::string>& q8, double r32, double r8) {
  double t = 0;
  for (auto& p : u.params) t += double(p.numel) / (q8.count(p.name) ? r8 : r32);
  return t;
}

// What every layer of one kind shares: times for the whole batch run in chunks, costs at the whole batch and at the
// chunk, and the bytes one layer keeps (kept internals) for the whole batch: the executor keeps every chunk's.
struct KindCosts {
  LayerTimes times;
  LayerCost full, part;
  double keep_bytes = 0;
};

std::vector<KindCosts> kind_costs(const ModelConfig& c, int64_t batch, int64_t chunk, int64_t seq,
                                  const ResourceProfile& prof, double attention_fraction) {
  std::vector<KindCosts> k(static_cast<size_t>(kNumLayerKinds));
  for (int i = 0; i < kNumLayerKinds; ++i) {
    const auto kind = LayerKind(i);
    if (c.count(kind) == 0) continue;
    // The executor keeps every chunk's internals, in ceil(batch / chunk) chunk-sized parts.
    const int64_t kept_rows = (batch + chunk - 1) / chunk * chunk;
    k[size_t(i)] = {packed_layer_times(prof, c, kind, batch, seq, chunk, attention_fraction),
                    layer_cost(c, kind, batch, seq), layer_cost(c, kind, chunk, seq),
                    layer_times(prof, c, kind, kept_rows, seq).keep_bytes};
  }
  return k;
}

void set_optimizer_times(Instance& in, const ModelLayout& lay, const ResourceProfile& prof,
                         const std::vector<std::string>& eight_bit) {
  std::set<std::string> q8(eight_bit.begin(), eight_bit.end());
  const double r32 = prof.opt_fp32_params_per_s, r8 = prof.opt_8bit_params_per_s;
  for (int j = 0; j < in.L; ++j) in.opt.push_back(unit_opt_time(lay.layer(j), q8, r32, r8));
  // The embedding last here but first in update order (opt_order): the next forward's lookup needs it, tied or not
  // (a tied head's unit holds only the final norm).
  in.opt.push_back(unit_opt_time(lay.head(), q8, r32, r8));
  in.opt.push_back(unit_opt_time(lay.embedding(), q8, r32, r8));
}

// Gradients held on the device: no gradient D2H in the backward slots nor in the epilogue (the
// embedding's table is on the GPU: tied, or resident); instead each held unit's gradient (elem_bytes
// per element) streams down before its update (opt_d2h, update order).
void hold_gradients(Instance& in, const ModelConfig& c, const ModelLayout& lay, double elem_bytes) {
  std::fill(in.G.begin(), in.G.end(), 0.0);
  in.G_head = 0.0;
  for (int j = 0; j < in.L; ++j) in.opt_d2h.push_back(elem_bytes * double(unit_param_count(lay.layer(j))) / in.bd);
  in.opt_d2h.push_back(elem_bytes * double(unit_param_count(lay.head())) / in.bd);
  in.opt_d2h.push_back(elem_bytes * double(unit_param_count(lay.embedding())) / in.bd);
}

// Per-layer times, bytes and working sets, each from that layer's kind.
void set_layers(Instance& in, const ModelConfig& c, const ModelLayout& lay, const std::vector<KindCosts>& kc, int ring) {
  for (int j = 0; j < in.L; ++j) {
    const auto& k = kc[size_t(c.kind(j))];
    const double params = double(unit_param_count(lay.layer(j)));
    in.kind.push_back(c.kind(j));
    in.rho.push_back(k.times.fwd_s);
    in.beta.push_back(k.times.fwd_s + k.times.bwd_s);
    // Keeping needs both figures measured; otherwise the layer cannot keep (0 in both).
    const bool keepable = k.times.bwd_kept_s > 0 && k.keep_bytes > 0;
    in.beta_kept.push_back(keepable ? k.times.bwd_kept_s : 0.0);
    in.keep_bytes.push_back(keepable ? k.keep_bytes : 0.0);
    in.P.push_back(2.0 * params);
    in.G.push_back(4.0 * params);  // the backends write fp32 gradients; the D2H moves them as such
    in.ws_fwd.push_back(double(k.part.workspace_bytes));
  }
  // The ring's buffers are reused by every layer, so they must hold the largest layer. (The two fp32 gradient
  // buffers of the backward slots, one being written and one in its D2H, are the state's grad_scratch.)
  const double Pmax = *std::max_element(in.P.begin(), in.P.end());
  in.ring = double(ring) * Pmax;
  for (int j = 0; j < in.L; ++j) {
    const auto& part = kc[size_t(c.kind(j))].part;
    in.ws_bwd.push_back(double(part.internal_bytes + part.workspace_bytes) + 2.0 * in.A);
  }
}

// The backend allocates one workspace for the largest of its layer kinds, the head and the embedding
// (CudaBackend::layer_workspace_bytes), for the whole run: when the profile carries its size (the GPU
// profiler measures it at batch x seq tokens; linear in the tokens), no slot's working set is below it.
// That one buffer also serves the head's logits chunk, a constant size: at small chunks (one sample a pass, the
// largest batches) the head's part is the larger, and it is there in every slot.
void backend_workspace_floor(Instance& in, const ModelConfig& c, const ResourceProfile& prof, int64_t chunk_tokens,
                             int64_t head_chunk) {
  if (prof.workspace_tokens <= 0 && prof.workspace_points.empty()) return;
  const double ws = std::max(backend_workspace_bytes(prof, chunk_tokens), double(head_chunk_workspace_bytes(c, head_chunk)));
  for (int j = 0; j < in.L; ++j) {
    in.ws_fwd[size_t(j)] = std::max(in.ws_fwd[size_t(j)], ws);
    in.ws_bwd[size_t(j)] = std::max(in.ws_bwd[size_t(j)], ws + 2.0 * in.A);
  }
  in.ws_head = std::max(in.ws_head, ws + in.A);
}

}  // namespace

// The layers whose moments are on NVMe: the read and the write-back of each one's moment image (the DRAM arrays'
// bytes, each array 64-byte aligned and the whole rounded up to 4 KiB, as optim/nvme_moments.h stores it; the
// arrays' alignment is left out) at the profile's NVMe rates (Instance::nvme_read, opt_done()).
void nvme_moment_times(Instance& in, const ModelConfig& c, const InstanceOptions& o) {
  if (o.placement.nvme_layers <= 0) return;
  LT_CHECK(in.bnr > 0 && in.bnw > 0, "plan: moments of {} layers on NVMe, but the profile's NVMe rates are {} and {} "
           "B/s (nvme_read_gbps, nvme_write_gbps must be > 0)", o.placement.nvme_layers, in.bnr, in.bnw);
  in.nvme_read.assign(in.opt.size(), 0.0);
  in.nvme_write.assign(in.opt.size(), 0.0);
  for (int j = 0; j < in.L; ++j) {
    if (!moments_on_nvme(c, j, o.placement)) continue;
    // + the master remainders in the same image (StatePlacement::nvme_remainders)
    const double b = std::ceil(layer_nvme_image_bytes(c, j, o.optimizer_8bit, o.placement) / 4096.0) * 4096.0;
    in.nvme_read[size_t(j)] = b / in.bnr;
    in.nvme_write[size_t(j)] = b / in.bnw;
  }
}

double optimizer_derate(const Instance& in, const ResourceProfile& prof) {
  double bytes = 0, secs = 0;
  for (int j = 0; j < in.L; ++j) bytes += in.P[size_t(j)], secs += in.rho[size_t(j)];
  if (prof.host_mem_bw <= 0 || secs <= 0) return 1.0;
  const double dma = std::min(bytes / secs, in.bh);  // the uploads cannot outrun PCIe
  return std::max(0.5, 1.0 - dma / (2.0 * prof.host_mem_bw));
}

int keepable_tail(const Instance& in) {
  int n = 0;
  for (int j = in.L - 1; j >= 0; --j, ++n) {
    const size_t u = size_t(j);
    if (u >= in.beta_kept.size() || u >= in.keep_bytes.size() || in.beta_kept[u] <= 0 || in.keep_bytes[u] <= 0) break;
  }
  return n;
}

Instance with_kept(const Instance& in, int k) {
  LT_CHECK(in.kept == 0, "plan: with_kept on an instance that already keeps {} layers", in.kept);
  LT_CHECK(k >= 0 && k <= in.L, "plan: kept layers must be in [0, {}], got {}", in.L, k);
  const int tail = keepable_tail(in);
  if (k > tail) {
    const int j = in.L - 1 - tail;  // the first layer from the end that cannot keep
    fail("plan: cannot keep the internals of the last {} layers: layer {} has no measured kept backward or keep bytes "
         "(bwd_kept_s / keep_bytes in the profile's layer_timings; {} trailing layers can keep)", k, j, tail);
  }
  Instance out = in;
  for (int j = in.L - k; j < in.L; ++j) {
    out.beta[size_t(j)] = in.beta_kept[size_t(j)];
    out.hbm_fixed += in.keep_bytes[size_t(j)];
  }
  out.kept = k;
  return out;
}

double kept_hbm(const Instance& in) {
  double b = 0;
  for (int j = in.L - in.kept; j < in.L; ++j) b += in.keep_bytes[size_t(j)];
  return b;
}

namespace {

// The device updates' effective HBM rate, bytes/s: an element-wise pass on the H200 (4.8 TB/s peak).
constexpr double kDeviceUpdateBw = 3e12;

// The first device_update_layers layers are updated on the GPU (exec/device_update.h): no CPU optimizer time, no
// weight upload (their weights stay in HBM), no gradient D2H. Their updates and the embedding's run at HBM speed
// before the next forward: ~16 B moved per element with 8-bit moments (master halves, gradient, codes; read and
// written), ~28 with fp32 ones, at kDeviceUpdateBw.
void device_updated_layers(Instance& in, const ModelLayout& lay, const InstanceOptions& o) {
  const StatePlacement& s = o.placement;
  LT_CHECK(s.device_update_layers >= 0 && s.device_update_layers <= in.L,
           "plan: device_update_layers must be in [0, {}] (the model's layers), got {}", in.L, s.device_update_layers);
  const std::set<std::string> q8(o.optimizer_8bit.begin(), o.optimizer_8bit.end());
  auto bytes_of = [&](const UnitLayout& u) {
    double b = 0;
    for (const auto& p : u.params) b += double(p.numel) * (q8.count(p.name) ? 16.0 : 28.0);
    return b;
  };
  double bytes = s.embedding_update_device ? bytes_of(lay.embedding()) : 0.0;
  for (int64_t j = 0; j < s.device_update_layers; ++j) {
    in.opt[size_t(j)] = 0;
    in.P[size_t(j)] = 0;
    in.G[size_t(j)] = 0;
    bytes += bytes_of(lay.layer(j));
  }
  in.device_update_s = bytes / kDeviceUpdateBw;
}

}  // namespace

Instance make_instance(const ModelConfig& c, int64_t batch, int64_t seq, const ResourceProfile& prof,
                       const InstanceOptions& o) {
  LT_CHECK(batch >= 1 && seq >= 1, "plan: batch and seq must be >= 1, got {} and {}", batch, seq);
  LT_CHECK(o.ring >= 2, "plan: ring must be >= 2, got {}", o.ring);
  LT_CHECK(o.micro_batches >= 1, "plan: micro_batches must be >= 1, got {}", o.micro_batches);
  const int64_t chunk = o.chunk > 0 ? std::min(o.chunk, batch) : batch;
  Instance in;
  in.L = int(c.layers);
  in.micro_batches = o.micro_batches;
  in.coll = o.collectives;
  in.head_s = head_time(prof, c, batch, seq, o.placement.head_grad_slices);
  in.A = double(batch * seq * c.hidden * 2);  // bf16 hidden state, the same for every kind
  const auto lay = model_layout(c);
  set_layers(in, c, lay, kind_costs(c, batch, chunk, seq, prof, o.attention_fraction), o.ring);
  const double head_params = double(c.vocab * c.hidden + c.hidden);  // LM head matrix (tied: the embedding) + final norm
  in.P_head = 2.0 * head_params;
  in.G_head = 4.0 * head_params;  // fp32, as the layers'
  in.pro_h2d = in.A;
  in.epi_d2h = in.A;
  in.bh = prof.h2d_bw;
  in.bd = prof.d2h_bw;
  in.bb = prof.both_bw;
  in.bnr = prof.nvme_read_bw;
  in.bnw = prof.nvme_write_bw;
  set_optimizer_times(in, lay, prof, o.optimizer_8bit);
  if (o.placement.embedding_update_device) {
    // The tied table's update runs on the GPU (exec/device_update.h, ~28 B per element at HBM speed: ~2 ms for
    // Qwen2.5-3B's, left out): no CPU optimizer time, no table upload, no gradient D2H; the head's norm remains.
    in.opt[size_t(in.L + 1)] = 0;
    in.P_head = 2.0 * double(c.hidden);
    in.G_head = 4.0 * double(c.hidden);
  }
  device_updated_layers(in, lay, o);
  if (o.placement.host_bf16_grads()) {  // rounded on the device: the D2H moves bf16
    for (double& g : in.G) g /= 2.0;
    in.G_head /= 2.0;
  }
  in.hbm_cap = double(prof.hbm_bytes - prof.hbm_reserve);
  // The head's weights and gradient buffer are on the device for the whole step (the state's head_weights and
  // grad_scratch, in hbm_fixed); its slot adds dy_L and the head call's workspace. The head runs once per chunk of
  // samples (MicroBatchRun's for_chunks), so its logits chunk is at most the chunk's rows: at chunks of one sample
  // the Qwen3.5/3.6 head carves 1.42 GiB of logits, not the 5.68 GiB of a full 4,096-row chunk.
  const int64_t head_rows = chunk * seq;
  in.ws_head = double(head_workspace_bytes(c, head_rows, o.head_chunk_tokens)) + in.A;
  backend_workspace_floor(in, c, prof, head_rows, std::min(o.head_chunk_tokens, head_rows));
  in.ws_pro = in.A;
  const StateBytes state = model_state_bytes(c, o.optimizer_8bit, o.placement);
  in.hbm_fixed = state.hbm();
  if (o.placement.head_grad_slices) in.hbm_fixed += 4.0 * double(batch * seq);  // each row's log-sum-exp
  // The embedding updated on the GPU with several micro-batches: their gradients summed in an fp32 accumulator.
  if (o.placement.embedding_update_device && o.micro_batches > 1) in.hbm_fixed += 4.0 * double(c.vocab * c.hidden);
  if (o.placement.grads == GradHome::Device) {
    hold_gradients(in, c, lay, o.placement.grad_dtype == GradDType::Bf16 ? 2.0 : 4.0);
    in.grad_ring_bytes = state.staging;
  }
  // An untied table looked up on the host, one process, with the trainer's rows-first order (embedding_rows_first):
  // the next batch's rows of its update go first (the rest last), so the next forward does not wait for the table.
  in.embedding_first = !o.embedding_rows_first || c.tied || embedding_resident_for(c, o.placement) ||
                       o.collectives.h2d() + o.collectives.d2h() > 0;
  if (embedding_resident_for(c, o.placement)) {
    // The table lives in HBM and is uploaded once per step after its update, instead of boundary 0.
    // Its lookup and backward run on the GPU: no boundary 0 up, no boundary-0 gradient down.
    in.pro_h2d = state.resident_table;  // its HBM is in state.hbm()
    in.epi_d2h = 0;
  }
  const double f = optimizer_derate(in, prof);
  for (size_t u = 0; u < in.opt.size(); ++u)
    if (!(u == size_t(in.L + 1) && in.embedding_first)) in.opt[u] /= f;
  in.dram_cap = double(prof.dram_bytes);
  in.dram_fixed = state.dram();
  in.nvme_cap = double(prof.nvme_bytes) - state.nvme();  // the moments' files come first
  in.allow_nvme = o.allow_nvme && in.nvme_cap > 0;
  nvme_moment_times(in, c, o);
  return in;
}

}  // namespace lt
