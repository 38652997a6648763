#include "dist/nccl/nccl_comm.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "dist/rendezvous.h"
#include "dist/staging.h"

namespace lt::dist {

#define LT_CUDA_OK(expr)                                                                               \
  do {                                                                                                 \
    cudaError_t e_ = (expr);                                                                           \
    LT_CHECK(e_ == cudaSuccess, "nccl communicator: {} failed: {}", #expr, cudaGetErrorString(e_)); \
  } while (0)
#define LT_NCCL_OK(expr)                                                                                           \
  do {                                                                                                             \
    ncclResult_t r_ = (expr);                                                                                      \
    LT_CHECK(r_ == ncclSuccess, "nccl communicator: {} failed: {} ({})", #expr, ncclGetErrorString(r_),          \
             ncclGetLastError(nullptr) ? ncclGetLastError(nullptr) : "");                                          \
  } while (0)

struct NcclCommunicator::Impl {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  char* scratch = nullptr;  // device staging for host buffers
  int64_t scratch_bytes = 0;
  int rank = 0;
  double timeout_s = 300;
  const char* op = "setup";  // the collective in progress (messages)

  // Waits for the stream. A collective that does not complete within timeout_s (a peer that died or
  // hangs: NCCL's kernels would wait for it forever), or an asynchronous NCCL error, aborts the
  // communicator (ncclCommAbort ends its kernels) and throws.
  void sync() {
    const double t0 = now_seconds();
    for (int i = 0;; ++i) {
      const cudaError_t e = cudaStreamQuery(stream);
      if (e == cudaSuccess) return;
      LT_CHECK(e == cudaErrorNotReady, "nccl communicator: rank {}: {}: {}", rank, op, cudaGetErrorString(e));
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(comm, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress)
        abort_and_fail(fmt::format("failed: NCCL reported {}", ncclGetErrorString(async)));
      if (now_seconds() - t0 > timeout_s)
        abort_and_fail(fmt::format("did not complete within {:.0f} s (a peer died or hangs; the timeout is "
                                   "LT_COMM_TIMEOUT_S)",
                                   timeout_s));
      if (i < 2000)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  [[noreturn]] void abort_and_fail(const std::string& why) {
    ncclCommAbort(comm);
    comm = nullptr;
    fail("nccl communicator: rank {}: {} {}; the communicator was aborted", rank, op, why);
  }
};

namespace {
ncclDataType_t nccl_type(CommType t) {
  switch (t) {
    case CommType::F32: return ncclFloat32;
    case CommType::F64: return ncclFloat64;
    case CommType::I64: return ncclInt64;
    case CommType::BF16: return ncclBfloat16;
  }
  fail("nccl communicator: unknown element type {}", int(t));
}

bool on_device(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();  // plain host memory on old runtimes reports an error: clear it
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

bool equal_ranges(const std::vector<int64_t>& b) {
  const int64_t c = b[1] - b[0];
  for (size_t r = 0; r + 1 < b.size(); ++r)
    if (b[r + 1] - b[r] != c) return false;
  return true;
}

char* at(void* base, int64_t elem, size_t es) { return static_cast<char*>(base) + elem * int64_t(es); }
}  // namespace

std::unique_ptr<NcclCommunicator> NcclCommunicator::create(const DistEnv& env, int64_t staging_bytes,
                                                           double rdzv_timeout_s) {
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator());
  c->rank_ = env.rank;
  c->world_ = env.world;
  c->impl_ = std::make_unique<Impl>();
  c->impl_->rank = env.rank;
  c->impl_->timeout_s = comm_timeout_from_environment();
  int ndev = 0;
  LT_CUDA_OK(cudaGetDeviceCount(&ndev));
  LT_CHECK(env.local_rank < ndev, "nccl communicator: LT_LOCAL_RANK {} but this host has {} GPUs", env.local_rank, ndev);
  LT_CUDA_OK(cudaSetDevice(env.local_rank));
  ncclUniqueId id;
  if (env.rank == 0) {
    LT_NCCL_OK(ncclGetUniqueId(&id));
    rdzv_publish(env.rdzv_dir, "nccl-id", std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
  } else {
    const std::string s = rdzv_wait(env.rdzv_dir, "nccl-id", rdzv_timeout_s);
    LT_CHECK(s.size() == sizeof(id), "rendezvous {}: nccl-id has {} bytes, expected {}", env.rdzv_dir, s.size(),
             sizeof(id));
    std::memcpy(&id, s.data(), sizeof(id));
  }
  LT_NCCL_OK(ncclCommInitRank(&c->impl_->comm, env.world, id, env.rank));
  LT_CUDA_OK(cudaStreamCreateWithFlags(&c->impl_->stream, cudaStreamNonBlocking));
  c->impl_->scratch_bytes = std::max<int64_t>(staging_bytes, 1 << 20);
  LT_CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&c->impl_->scratch), size_t(c->impl_->scratch_bytes)));
  log_info("nccl communicator: rank {}/{} on GPU {}, NCCL {}", env.rank, env.world, env.local_rank, NCCL_VERSION_CODE);
  return c;
}

NcclCommunicator::~NcclCommunicator() {
  if (!impl_) return;
  if (impl_->scratch) cudaFree(impl_->scratch);
  if (impl_->stream) cudaStreamDestroy(impl_->stream);
  if (impl_->comm) ncclCommDestroy(impl_->comm);
}

void NcclCommunicator::all_reduce(void* buf, int64_t n, CommType t) {
  Impl& I = *impl_;
  I.op = "all_reduce";
  const size_t es = comm_type_size(t);
  LT_CHECK(t != CommType::BF16, "all_reduce: bf16 reduction is not supported (reduce in fp32)");
  if (on_device(buf)) {
    LT_NCCL_OK(ncclAllReduce(buf, buf, size_t(n), nccl_type(t), ncclSum, I.comm, I.stream));
    I.sync();
    return;
  }
  const int64_t chunk = I.scratch_bytes / int64_t(es);
  for (int64_t k = 0; k < n; k += chunk) {
    const int64_t m = std::min(chunk, n - k);
    LT_CUDA_OK(cudaMemcpyAsync(I.scratch, at(buf, k, es), size_t(m) * es, cudaMemcpyHostToDevice, I.stream));
    LT_NCCL_OK(ncclAllReduce(I.scratch, I.scratch, size_t(m), nccl_type(t), ncclSum, I.comm, I.stream));
    LT_CUDA_OK(cudaMemcpyAsync(at(buf, k, es), I.scratch, size_t(m) * es, cudaMemcpyDeviceToHost, I.stream));
  }
  I.sync();
}

void NcclCommunicator::reduce_scatter(void* buf, const std::vector<int64_t>& b, CommType t) {
  check_bounds(b, world_, "reduce_scatter");
  LT_CHECK(t != CommType::BF16, "reduce_scatter: bf16 reduction is not supported (reduce in fp32)");
  Impl& I = *impl_;
  I.op = "reduce_scatter";
  const size_t es = comm_type_size(t);
  const auto ty = nccl_type(t);
  if (on_device(buf)) {
    if (equal_ranges(b)) {
      const int64_t c = b[1];
      LT_NCCL_OK(ncclReduceScatter(buf, at(buf, b[size_t(rank_)], es), size_t(c), ty, ncclSum, I.comm, I.stream));
    } else {
      LT_NCCL_OK(ncclGroupStart());
      for (int r = 0; r < world_; ++r)
        if (b[size_t(r) + 1] > b[size_t(r)])
          LT_NCCL_OK(ncclReduce(at(buf, b[size_t(r)], es), at(buf, b[size_t(r)], es), size_t(b[size_t(r) + 1] - b[size_t(r)]),
                                ty, ncclSum, r, I.comm, I.stream));
      LT_NCCL_OK(ncclGroupEnd());
    }
    I.sync();
    return;
  }
  // Host buffer: rounds of one piece per rank range, staged side by side in the scratch buffer.
  for (const auto& round : staging_rounds(b, I.scratch_bytes / int64_t(es) / world_)) {
    for (const StagePiece& p : round)  // every rank contributes to every range
      LT_CUDA_OK(cudaMemcpyAsync(I.scratch + p.scratch * int64_t(es), at(buf, p.elem, es), size_t(p.count) * es,
                                 cudaMemcpyHostToDevice, I.stream));
    LT_NCCL_OK(ncclGroupStart());
    for (const StagePiece& p : round) {
      char* d = I.scratch + p.scratch * int64_t(es);
      LT_NCCL_OK(ncclReduce(d, d, size_t(p.count), ty, ncclSum, p.root, I.comm, I.stream));
    }
    LT_NCCL_OK(ncclGroupEnd());
    for (const StagePiece& p : round)
      if (p.root == rank_)
        LT_CUDA_OK(cudaMemcpyAsync(at(buf, p.elem, es), I.scratch + p.scratch * int64_t(es), size_t(p.count) * es,
                                   cudaMemcpyDeviceToHost, I.stream));
    I.sync();  // the scratch is reused by the next round
  }
}

void NcclCommunicator::all_gather(void* buf, const std::vector<int64_t>& b, CommType t) {
  check_bounds(b, world_, "all_gather");
  Impl& I = *impl_;
  I.op = "all_gather";
  const size_t es = comm_type_size(t);
  const auto ty = nccl_type(t);
  if (on_device(buf)) {
    if (equal_ranges(b)) {
      LT_NCCL_OK(ncclAllGather(at(buf, b[size_t(rank_)], es), buf, size_t(b[1]), ty, I.comm, I.stream));
    } else {
      LT_NCCL_OK(ncclGroupStart());
      for (int r = 0; r < world_; ++r)
        if (b[size_t(r) + 1] > b[size_t(r)])
          LT_NCCL_OK(ncclBroadcast(at(buf, b[size_t(r)], es), at(buf, b[size_t(r)], es),
                                   size_t(b[size_t(r) + 1] - b[size_t(r)]), ty, r, I.comm, I.stream));
      LT_NCCL_OK(ncclGroupEnd());
    }
    I.sync();
    return;
  }
  for (const auto& round : staging_rounds(b, I.scratch_bytes / int64_t(es) / world_)) {
    for (const StagePiece& p : round)
      if (p.root == rank_)
        LT_CUDA_OK(cudaMemcpyAsync(I.scratch + p.scratch * int64_t(es), at(buf, p.elem, es), size_t(p.count) * es,
                                   cudaMemcpyHostToDevice, I.stream));
    LT_NCCL_OK(ncclGroupStart());
    for (const StagePiece& p : round) {
      char* d = I.scratch + p.scratch * int64_t(es);
      LT_NCCL_OK(ncclBroadcast(d, d, size_t(p.count), ty, p.root, I.comm, I.stream));
    }
    LT_NCCL_OK(ncclGroupEnd());
    for (const StagePiece& p : round)
      if (p.root != rank_)
        LT_CUDA_OK(cudaMemcpyAsync(at(buf, p.elem, es), I.scratch + p.scratch * int64_t(es), size_t(p.count) * es,
                                   cudaMemcpyDeviceToHost, I.stream));
    I.sync();
  }
}

void NcclCommunicator::broadcast(void* buf, int64_t n, CommType t, int root) {
  LT_CHECK(root >= 0 && root < world_, "broadcast: root {} out of range [0, {})", root, world_);
  Impl& I = *impl_;
  I.op = "broadcast";
  const size_t es = comm_type_size(t);
  if (on_device(buf)) {
    LT_NCCL_OK(ncclBroadcast(buf, buf, size_t(n), nccl_type(t), root, I.comm, I.stream));
    I.sync();
    return;
  }
  const int64_t chunk = I.scratch_bytes / int64_t(es);
  for (int64_t k = 0; k < n; k += chunk) {
    const int64_t m = std::min(chunk, n - k);
    if (rank_ == root)
      LT_CUDA_OK(cudaMemcpyAsync(I.scratch, at(buf, k, es), size_t(m) * es, cudaMemcpyHostToDevice, I.stream));
    LT_NCCL_OK(ncclBroadcast(I.scratch, I.scratch, size_t(m), nccl_type(t), root, I.comm, I.stream));
    if (rank_ != root)
      LT_CUDA_OK(cudaMemcpyAsync(at(buf, k, es), I.scratch, size_t(m) * es, cudaMemcpyDeviceToHost, I.stream));
    I.sync();
  }
}

void NcclCommunicator::barrier() {
  Impl& I = *impl_;
  I.op = "barrier";
  LT_NCCL_OK(ncclAllReduce(I.scratch, I.scratch, 1, ncclInt32, ncclSum, I.comm, I.stream));
  I.sync();
}

double NcclCommunicator::timeout_s() const { return impl_->timeout_s; }
void NcclCommunicator::set_timeout_s(double s) { impl_->timeout_s = s; }

}  // namespace lt::dist
