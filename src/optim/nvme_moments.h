// NVMe tier for the optimizer moments (UnitSpec::moments_on_nvme): each such unit keeps its moments in
// one file (NvmeStore, O_DIRECT, io_uring by default), the same bytes as its DRAM arrays would hold, laid
// out as a UnitImage. Only a small ring of kIoAlign-aligned DRAM staging slots exists for these units.
// One I/O thread moves whole unit images: reads into a free slot (FIFO, strictly in request order),
// write-backs from a slot (before any read: they free the slots that reads need). CpuAdamW drives it
// (optimizer.cpp): it requests the reads of a step's NVMe units at begin_step, lowest unit first, so the
// first units are staged before the global norm is known and reads of later units overlap the updates
// of earlier ones; an update runs in the slot and its write-back frees the slot.
//
// Why the store moved below both modules (src/nvme) instead of an abstract "moment store" that exec
// implements: the optimizer needs exactly the activation tier's semantics (O_DIRECT from aligned
// buffers, the injectable IoLayer for fault tests, errors naming file, bytes and cause); an interface
// would restate that API for its single implementation, and the optimizer tests and bench_optim would
// have to link the executor to use it.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "nvme/nvme_store.h"
#include "optim/optimizer.h"

namespace lt::optim {

// Pointers to one tensor's moments: fp32 m, v, or 8-bit codes mq, vq and block scales ms, vs.
struct MomentArrays {
  float* m = nullptr;
  float* v = nullptr;
  uint8_t* mq = nullptr;
  uint8_t* vq = nullptr;
  float* ms = nullptr;
  float* vs = nullptr;
};

// Byte offsets of a unit's arrays in its image: per tensor in state-file order (fp32: m, v; 8-bit: mq,
// vq, ms, vs), each 64-byte aligned, then (UnitSpec::remainders_on_nvme) the unit's numel 16-bit master
// remainders at `lo`; `bytes` is the whole, rounded up to kIoAlign.
struct UnitImage {
  struct Tensor {
    int64_t a = 0, b = 0, c = 0, d = 0;  // fp32: m at a, v at b; 8-bit: mq a, vq b, ms c, vs d
  };
  std::vector<Tensor> tensors;
  int64_t lo = -1;  // byte offset of the remainders; -1: not in the image
  int64_t bytes = 0;
};
UnitImage unit_image(const UnitSpec& u);
MomentArrays image_arrays(char* base, const UnitSpec& u, const UnitImage& img, size_t tensor);
inline uint16_t* image_remainders(char* base, const UnitImage& img) {
  return img.lo < 0 ? nullptr : reinterpret_cast<uint16_t*>(base + img.lo);
}

// kIoAlign-aligned heap bytes (staging slots, scratch).
class IoBuffer {
 public:
  IoBuffer() = default;
  explicit IoBuffer(int64_t bytes);
  char* data() const { return p_.get(); }
  int64_t bytes() const { return n_; }

 private:
  struct Free {
    void operator()(char* p) const;
  };
  std::unique_ptr<char, Free> p_;
  int64_t n_ = 0;
};

struct NvmeIoStats {
  int64_t read_bytes = 0, write_bytes = 0;  // moved to/from the files (a never-written unit reads as zeros, not counted)
  double io_s = 0;                          // the I/O thread's time in reads and writes
};

class NvmeMoments {
 public:
  // A finished transfer, reported from the I/O thread without the pipeline's lock held. Reads carry the
  // ticket prefetch() returned and the slot holding the image; err names file, bytes and cause.
  struct Event {
    int unit = 0;
    bool write = false;
    uint64_t ticket = 0;
    char* slot = nullptr;
    std::exception_ptr err;
  };
  using Listener = std::function<void(const Event&)>;

  // units: all of the optimizer's units (those without moments_on_nvme get no file); slots >= 1.
  NvmeMoments(const std::vector<UnitSpec>& units, const std::filesystem::path& dir, std::shared_ptr<IoLayer> io,
              int slots, Listener listener);
  ~NvmeMoments();  // finishes the transfer in progress, drops queued ones, removes the files
  NvmeMoments(const NvmeMoments&) = delete;
  NvmeMoments& operator=(const NvmeMoments&) = delete;

  const UnitImage& image(int unit) const { return images_[size_t(unit)]; }
  int64_t slot_bytes() const { return slot_bytes_; }
  int slots() const { return int(slots_.size()); }
  int64_t file_bytes() const;  // bytes of all NVMe units' images
  std::string file_name(int unit) const;

  // Queues the read of unit's image into a slot; the read starts when it reaches the head of the queue,
  // a slot is free and the unit has no transfer in flight. Returns the ticket its Event carries.
  uint64_t prefetch(int unit);
  // Queues the write of a loaded unit's slot; the slot frees when it completes (or fails).
  void write_back(int unit);
  // Drops the unit's queued read or loaded slot without writing (its file is unchanged); a read in
  // flight completes unreported and frees its slot.
  void release(int unit);
  // Blocks until nothing is queued or in flight and every slot is free (call after releasing).
  void quiesce();

  // Synchronous whole-image transfers on the caller's thread (save/load/read_state; the unit must have
  // no write in flight). buf: kIoAlign-aligned, image(unit).bytes long. A never-written unit reads as
  // zeros (the moments' initial value).
  void read_image(int unit, void* buf);
  // Bytes [offset, offset + bytes) of the image (both multiples of kIoAlign, inside it) into buf (aligned);
  // thread-safe (the unit must have no write in flight).
  void read_part(int unit, int64_t offset, void* buf, int64_t bytes);
  // load(): stage_image writes a second generation of the file; commit_staged() switches every staged
  // unit to it and removes the old ones, discard_staged() removes the staged files.
  void stage_image(int unit, const void* buf);
  void commit_staged();
  void discard_staged();
  // Scratch of one slot's size for the synchronous transfers (only while quiesced).
  char* scratch() const { return slots_[0].data(); }
  NvmeIoStats stats() const;

 private:
  enum class Phase { Idle, Reading, Loaded, Writing };
  struct Unit {
    Phase phase = Phase::Idle;
    bool queued = false, cancel = false;
    bool written = false;  // the file holds the moments (false: never written, they are zero)
    int gen = 0;           // which of the two generations (keys) is current
    bool staged = false;
    int slot = -1;
    uint64_t ticket = 0;
  };
  // File key: generation 0 is moments-<unit>.bin, generation 1 moments-<unit + units>.bin.
  int64_t key(int unit, int gen) const { return int64_t(unit) + int64_t(gen) * int64_t(units_.size()); }
  void loop();
  bool read_ready_locked() const;

  std::vector<UnitImage> images_;
  std::vector<bool> on_nvme_;
  int64_t slot_bytes_ = 0;
  std::unique_ptr<NvmeStore> store_;
  std::vector<IoBuffer> slots_;
  Listener listener_;

  mutable std::mutex mu_;
  std::condition_variable cv_;   // the I/O thread: work arrived
  std::condition_variable idle_cv_;  // quiesce(): a transfer finished
  std::vector<Unit> units_;
  std::deque<int> reads_, writes_;
  std::vector<int> free_;
  uint64_t next_ticket_ = 0;
  bool busy_ = false, stop_ = false;
  NvmeIoStats stats_;
  std::thread thread_;
};

}  // namespace lt::optim
