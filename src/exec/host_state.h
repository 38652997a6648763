// Host-side model state (the master copy lives in host memory; core/model_state.h), one entry per unit (0 = embedding, 1..L =
// layers, L+1 = head):
//  * the master weights, the source of truth, in one of four storages (MasterStorage below);
//  * stream(u): the streaming copy in pinned memory, in the backend's weight dtype, uploaded to the
//    device each step;
//  * grad(u): the fp32 gradient in pinned memory, summed over the micro-batches of a step. With
//    gradients held on the device (GradHome::Device) only units whose gradient the host computes
//    (the embedding when it is not on the device) have one; grad(u) is null for the others. With
//    gradients on the host in bf16 (GradHome::Host, grad_dtype Bf16) the host gradients are bf16
//    instead: grad_bf16(u), and grad(u) refuses;
//  * sumsq(u): sum of squares of the step's gradient (set by the executor, for exact clipping).
// With tied embeddings the head has no LM matrix: its gradient lands in unit 0.
#pragma once
#include <cstdint>
#include <set>
#include <vector>

#include "backend/backend.h"
#include "core/model_state.h"
#include "optim/optimizer.h"

namespace lt {

// How the masters are held (bytes per parameter for master + streaming copy in brackets).
//   Aliased  fp32 master that is itself the fp32 streaming copy (CPU backend) [4]
//   F32Copy  fp32 master + separate bf16 streaming copy (the data-parallel path all-gathers fp32) [6]
//   Split    bf16 streaming copy + 16-bit remainder: the exact fp32 master (core/split_master.h) [4];
//            on an fp32-streaming backend a rebuilt fp32 streaming copy is kept beside it [+4]
//   Bf16     the bf16 master, stochastically rounded (bf16-sr) [2]; on fp32 streaming +4 as above
enum class MasterStorage : uint8_t { Aliased, F32Copy, Split, Bf16 };
const char* master_storage_name(MasterStorage s);

struct HostStateOptions {
  MasterMode master = MasterMode::Fp32;
  GradHome grads = GradHome::Host;
  // Of the gradients held on the device (grads == Device), or of the host gradients (grads == Host: bf16 = one
  // micro-batch's gradient, rounded on the device as it left; core/model_state.h).
  GradDType grad_dtype = GradDType::F32;
  bool host_bf16_grads() const { return grads == GradHome::Host && grad_dtype == GradDType::Bf16; }
  // Units that keep a host gradient although grads == Device (the executor's host-computed ones).
  std::vector<int64_t> host_grad_units;
  bool split_on_fp32_stream = false;  // fp32 streaming (CPU backend): store the master split anyway
  bool fp32_master_array = false;     // bf16 streaming: F32Copy instead of Split (data parallel)
  // The embedding's update runs on the device (StatePlacement::embedding_update_device, exec/device_update.h): its
  // master here is a copy written back at Executor::flush_updates, and it has no host gradient.
  bool embedding_update_device = false;
  // The first device_update_layers layers too (StatePlacement::device_update_layers): their masters here are copies
  // written back at Executor::flush_updates, and they have no host gradient.
  int64_t device_update_layers = 0;
  // Units whose split-master remainders live only in the optimizer's NVMe images (StatePlacement::nvme_remainders):
  // no DRAM array is ever allocated for them, so the DRAM the plan counts is never exceeded; their masters are
  // written and read once attach_nvme_remainders has run (the trainer builds the optimizer before the weights).
  std::set<int64_t> nvme_remainder_units;
  // Gradients held on the device: the depth of their pinned staging ring (StatePlacement::grad_ring_depth).
  int grad_ring_depth = kGradRingDepth;
  // The head's and the embedding's held gradients written without their fp32 buffers (StatePlacement::head_grad_slices).
  bool head_grad_slices = false;
  bool updated_on_device(int64_t u) const {
    return (u == 0 && embedding_update_device) || (u >= 1 && u <= device_update_layers);
  }
};

class HostState {
 public:
  // Zero-initialised master weights.
  explicit HostState(Backend& be, HostStateOptions o = {});
  int64_t units() const { return int64_t(numel_.size()); }
  int64_t numel(int64_t u) const { return numel_[size_t(u)]; }
  MasterStorage storage() const { return storage_; }
  const HostStateOptions& options() const { return opt_; }
  optim::MasterFormat optimizer_format() const;

  // The fp32 master array (Aliased, F32Copy only; throws for the others: use read/write_master).
  float* master(int64_t u);
  const float* master(int64_t u) const;
  // The exact fp32 values of unit u (all storages), and setting them (refreshes the streaming copy).
  void read_master(int64_t u, float* dst) const { read_master(u, 0, numel(u), dst); }
  void read_master(int64_t u, int64_t offset, int64_t n, float* dst) const;  // elements [offset, offset + n)
  void write_master(int64_t u, const float* src) { write_master(u, 0, numel(u), src); }
  // Elements [offset, offset + n) of unit u: a unit written in pieces (starting weights, checkpoints) needs no fp32
  // buffer of the whole unit. A unit whose master remainders live in its NVMe image takes one whole write.
  void write_master(int64_t u, int64_t offset, int64_t n, const float* src);
  // The largest piece write_master takes for unit u: kMasterWritePiece elements (64 MiB of fp32), the whole unit
  // where its remainders are on NVMe.
  static constexpr int64_t kMasterWritePiece = int64_t(1) << 24;
  int64_t master_write_piece(int64_t u) const;

  void* stream(int64_t u) { return stream_ptr_[size_t(u)]; }
  bool aliased() const { return storage_ == MasterStorage::Aliased; }  // stream(u) is master(u)
  // The streaming copy is rebuilt from the master after an update (fp32 streaming of a Split or Bf16
  // master); the optimizer hook calls refresh_stream(u) once the update is done.
  bool stream_rebuilt() const;
  // The fp32 host gradient (null without one); throws for a bf16 one.
  float* grad(int64_t u);
  // The bf16 host gradient (HostStateOptions::host_bf16_grads; null otherwise).
  bf16_t* grad_bf16(int64_t u) { return grad16_ptr_[size_t(u)]; }
  bool has_host_grad(int64_t u) const { return grad_ptr_[size_t(u)] != nullptr || grad16_ptr_[size_t(u)] != nullptr; }
  double& sumsq(int64_t u) { return sumsq_[size_t(u)]; }
  DType stream_dtype() const { return stream_dtype_; }
  // What the optimizer updates for unit u, its gradient taken from grad(u) (null when not on the host).
  optim::UnitBuffers update_buffers(int64_t u);
  // Rewrites stream(u) from the master (rounding to bf16 for F32Copy, rebuilding fp32 for a rebuilt
  // copy; nothing to do where the copy is the master or its high half).
  void refresh_stream(int64_t u) { refresh_stream(u, 0, numel(u)); }
  void refresh_stream(int64_t u, int64_t offset, int64_t n);  // elements [offset, offset + n)
  void refresh_all_streams();
  void zero_grads();
  int64_t total_numel() const;
  // Host bytes per storage part (for the start-up report): master + copy, gradients.
  int64_t master_bytes() const;
  int64_t grad_bytes() const;

  // Split masters: the 16-bit remainders of the units whose optimizer keeps them in their NVMe moment image
  // (optim::UnitSpec::remainders_on_nvme; the planner's StatePlacement::nvme_remainders) move there: each such
  // unit's remainders are written into its image and its DRAM array is freed. From then on read_master/write_master
  // join/split that unit's fp32 master with the remainders the optimizer reads/writes (between steps: checkpoint
  // save and load, evaluation, the non-finite scan), and update_buffers(u).lo is null (the update finds them in the
  // staging slot). opt must outlive this state's use of those units. Units in HostStateOptions::nvme_remainder_units
  // never had a DRAM array: their images start at zero remainders (the zero masters), and their masters are written
  // after this call.
  void attach_nvme_remainders(optim::CpuAdamW& opt);
  bool remainders_on_nvme(int64_t u) const { return rem_nvme_.size() > size_t(u) && rem_nvme_[size_t(u)]; }
  // Split masters whose remainders have no home yet (nvme_remainder_units before attach_nvme_remainders): a write is
  // a clear error instead of one through a null array (a read sees zero remainders, as the image starts).
  void check_remainders_home(int64_t u) const;

 private:
  void allocate_unit(Backend& be, int64_t u, int64_t n, bool host_grad);

  DType stream_dtype_;
  HostStateOptions opt_;
  MasterStorage storage_;
  std::vector<int64_t> numel_;
  std::vector<Buffer> pinned_;               // streaming copies (and Aliased masters)
  std::vector<std::vector<float>> f32_;      // F32Copy masters
  std::vector<std::vector<bf16_t>> hi_;      // Split / Bf16 on fp32 streaming (else the pinned copy)
  std::vector<std::vector<uint16_t>> lo_;    // Split remainders
  std::vector<Buffer> grad_;
  std::vector<float*> f32_ptr_, grad_ptr_;
  std::vector<bf16_t*> grad16_ptr_;
  std::vector<bf16_t*> hi_ptr_;
  std::vector<void*> stream_ptr_;
  std::vector<double> sumsq_;
  optim::CpuAdamW* rem_opt_ = nullptr;        // attach_nvme_remainders
  std::vector<char> rem_nvme_;                // units whose remainders are in the optimizer's NVMe images
};

}  // namespace lt
