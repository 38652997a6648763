// One step: its micro-batches (micro_batch_run.h) in order, the gradients' norm and hand-over to the
// optimizer, recovery after a failure, and evaluation. See docs/executor.md.
#include "exec/executor.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "core/units.h"
#include "exec/executor_impl.h"
#include "exec/micro_batch_run.h"
#include "model/sequence.h"

namespace lt {

// ---------------------------------------------------------------------------------------- Executor

Executor::Executor(const ModelConfig& c, Backend& be, const ExecPlan& plan, HostState& state, ExecOptions opts)
    : cfg_(c), be_(be), plan_(plan), state_(state), opts_(std::move(opts)) {
  impl_ = std::make_unique<Impl>(*this);
}

Executor::~Executor() = default;

int64_t Executor::nvme_files_live() const { return impl_->store ? impl_->store->live_files() : 0; }

void Executor::set_update_hook(UpdateHook* hook) {
  hook_ = hook;
  if (hook && !impl_->dev_updates.empty()) {
    for (auto& d : impl_->dev_updates) d->load(*hook);
    be_.synchronize();
  }
}

void Executor::flush_updates() {
  if (impl_->dgrads) impl_->dgrads->flush();
  for (auto& d : impl_->dev_updates) d->store();
}

// After a failed step or eval: drain every lane and worker, drop this step's NVMe files, put gradients
// whose streaming failed back in line, forget the error.
void Executor::Impl::recover_from_failure() {
  try {
    be.synchronize();
  } catch (...) {
  }
  if (nvme_worker) nvme_worker->drain();
  sink_worker->drain();
  if (dgrads) dgrads->recover();  // before clear_error: a skipped copy must still read as failed
  if (store) store->remove_all();
  be.clear_error();
  pool->reset();
  pool->mark_reserved();
  be.take_spans();
}

// The step's per-unit sums of squares (device, or host where the host formed the gradient) into the
// host state; the update hook gets each unit (grad_ready, or grad_norm_part for a gradient held on the
// device), then the held gradients start streaming. Returns the global norm.
double Executor::Impl::report_gradients(int32_t nmb, UpdateHook* hook) {
  const double* sc = p_scal.as<double>();
  double total = 0;
  for (int64_t u = 0; u < L + 2; ++u) {
    const bool host = (u == 0 && !emb_on_device) || (!dgrads && nmb > 1 && !updated_on_device(u));
    st.sumsq(u) = host ? host_sumsq[size_t(u)] : sc[2 + u];
    total += st.sumsq(u);
  }
  if (!hook) return std::sqrt(total);
  for (int64_t u = 0; u < L + 2; ++u) {
    if ((dgrads && dgrads->held(u)) || updated_on_device(u)) hook->grad_norm_part(u, st.sumsq(u));
    else hook->grad_ready(u, st.sumsq(u));
  }
  if (dgrads) dgrads->start(hook);
  if (!dev_updates.empty()) {  // the norm is known
    for (auto& d : dev_updates) d->update(*hook);
    be.synchronize();
  }
  return std::sqrt(total);
}


void Executor::prepare(const std::vector<MicroBatch>& mbs) {
  std::vector<char> waited(size_t(impl_->L + 2), 0);
  double wait = 0;
  for (size_t m = 0; m < mbs.size(); ++m)
    MicroBatchRun(*impl_, mbs[m], int32_t(m), int32_t(mbs.size()), 1.0f, true, nullptr, waited, wait).prepare();
}

bool Executor::wants_next_step_ids() const { return hook_ && !impl_->emb_on_device; }

StepResult Executor::train_step(const std::vector<MicroBatch>& mbs, int64_t loss_tokens, const StepCallbacks& cb) {
  Impl& I = *impl_;
  LT_CHECK(!mbs.empty(), "train_step: no micro-batches");
  StepResult res;
  const double t_step = now_seconds();
  const int64_t T = I.T, L = I.L;
  int64_t n_tok = 0;
  for (auto& mb : mbs) {
    LT_CHECK(mb.ids && mb.targets, "train_step: micro-batch without ids or targets");
    for (int64_t t = 0; t < T; ++t) n_tok += mb.targets[t] != kIgnoreIndex;
  }
  const float scale = 1.0f / float(std::max<int64_t>(1, loss_tokens > 0 ? loss_tokens : n_tok));
  {
    std::lock_guard<std::mutex> g(I.trace_mu);
    I.trace.clear();
    I.trace_windows.clear();
    I.trace_t0 = t_step;
  }
  be_.take_spans();
  be_.memory().reset_peaks();
  const int32_t nmb = int32_t(mbs.size());
  LT_CHECK(!I.held_direct || nmb == 1, "train_step: {} micro-batches, but the gradients held on the device are "
           "sized for one (set ExecOptions::micro_batches)", nmb);
  LT_CHECK(!I.host_bf16 || nmb == 1, "train_step: {} micro-batches, but gradients on the host in bf16 take one per "
           "step (each is rounded on the device as it leaves)", nmb);
  if (!I.dgrads && (nmb > 1 || I.g_sz != 4)) {
    if (I.gslab.empty()) {
      int64_t mx = 0;
      for (auto& u : be_.layout().units) mx = std::max(mx, u.numel);
      for (int k = 0; k < 2; ++k) I.gslab.emplace_back(be_, MemKind::Pinned, mx * int64_t(I.g_sz), "grads.staging");
    }
  }
  std::vector<char> waited(size_t(L + 2), 0);
  double update_wait = 0;
  I.host_sumsq.assign(size_t(L + 2), 0.0);
  I.hint_next_rows(hook_, next_ids_);
  next_ids_.clear();
  try {
    for (int32_t m = 0; m < nmb; ++m) {
      if (m > 0 && cb.stop && cb.stop(m)) throw StepInterrupted(m, nmb);
      if (m + 1 == nmb && cb.before_last) cb.before_last();
      const double t_mb = now_seconds();
      MicroBatchRun run(I, mbs[size_t(m)], m, nmb, scale, true, hook_, waited, update_wait);
      run.run();
      be_.synchronize();
      run.finish();
      I.sink_worker->drain();
      if (!I.emb_on_device)
        I.host_embedding_backward(mbs[size_t(m)].ids, m == 0, m + 1 == nmb, !hook_ || !hook_->rewrites_host_gradients());
      const double t_end = now_seconds();
      I.collect_backend_spans(m);
      res.forward_s = run.t_forward_end - t_mb;
      res.backward_s = t_end - run.t_forward_end;
      auto ws = I.window_stats(m, t_mb);
      I.trace_windows.push_back(ws);
      for (auto& w : ws) {
        res.exposed_s += w.measured.exposed;
        res.exposed_optimizer_s += w.measured.exposed_optimizer;
        res.totals.compute += w.measured.compute;
        res.totals.h2d += w.measured.h2d;
        res.totals.d2h += w.measured.d2h;
        res.totals.nvme_read += w.measured.nvme_read;
        res.totals.nvme_write += w.measured.nvme_write;
        res.totals.exposed += w.measured.exposed;
        res.totals.exposed_optimizer += w.measured.exposed_optimizer;
      }
      if (m + 1 == nmb) res.windows = std::move(ws);
      if (I.pool->grown() > 0) {
        log_warn("executor: {} activation buffers beyond the planned {} (NVMe staging forced an early reload)",
                 I.pool->grown(), I.pool->size() - I.pool->grown());
        res.act_buffers_over_plan = std::max(res.act_buffers_over_plan, I.pool->grown());
      }
      I.pool->reset();
    }
    // Loss and per-unit sums of squares.
    be_.wait(Lane::D2H, be_.record(Lane::Compute));
    be_.copy(Lane::D2H, I.p_scal.data(), I.d_scal.data(), I.d_scal.bytes(), OpLabel{"scalars.d2h", -1, -1});
    be_.synchronize();
  } catch (const StepInterrupted&) {
    I.recover_from_failure();
    I.first_rows_pending.clear();
    throw;
  } catch (const std::exception& e) {
    I.recover_from_failure();
    I.first_rows_pending.clear();  // the hinted update may not run: the next lookup waits for the whole table
    fail("train step failed: {}", e.what());
  }
  const double* sc = I.p_scal.as<double>();
  res.n_tokens = int64_t(sc[1]);
  res.loss = res.n_tokens > 0 ? sc[0] / double(res.n_tokens) : 0.0;
  res.rows = T * nmb;
  res.grad_norm = I.report_gradients(nmb, hook_);
  res.update_wait_s = update_wait;
  for (auto& w : res.windows) res.predicted_exposed_s += w.predicted.exposed * nmb;
  res.peak_device = be_.memory().peak(MemKind::Device);
  res.peak_pinned = be_.memory().peak(MemKind::Pinned);
  res.step_s = now_seconds() - t_step;
  return res;
}

double Executor::eval_loss(const MicroBatch& mb, int64_t* n_tokens) {
  Impl& I = *impl_;
  std::vector<char> waited(size_t(I.L + 2), 0);
  double uw = 0;
  try {
    MicroBatchRun run(I, mb, 0, 1, 1.0f, false, hook_, waited, uw);
    run.run();
    be_.wait(Lane::D2H, be_.record(Lane::Compute));
    be_.copy(Lane::D2H, I.p_scal.data(), I.d_scal.data(), 16, OpLabel{"scalars.d2h", -1, -1});
    be_.synchronize();
    I.pool->reset();
  } catch (const std::exception& e) {
    I.recover_from_failure();
    fail("eval failed: {}", e.what());
  }
  be_.take_spans();
  const double* sc = I.p_scal.as<double>();
  if (n_tokens) *n_tokens = int64_t(sc[1]);
  return sc[1] > 0 ? sc[0] / sc[1] : 0.0;
}

}  // namespace lt
