// Atomic checkpoint directories: output_dir/checkpoint-<step>/.
// A save writes into a temporary sibling directory, fsyncs every file and the directory, renames it
// to checkpoint-<step>, and only then writes the completion marker (COMPLETE) and fsyncs again.
// The marker is the checkpoint's manifest: every other file's path and size (JSON). A checkpoint is
// complete when its marker is a whole manifest and every file it lists is there with that size; a
// marker of the older form (the text "complete") needs the files a resume reads (kResumeFiles).
// A directory that is not complete is never resumed from, never counted by rotation, and cleaned up
// by the next save. A crash at any point leaves every earlier checkpoint valid.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace lt::train {

namespace fs = std::filesystem;

inline constexpr const char* kCompleteMarker = "COMPLETE";

fs::path checkpoint_path(const fs::path& output_dir, int64_t step);
// Step of a "checkpoint-<step>" name, or -1.
int64_t checkpoint_step(const fs::path& dir);
// Files a resume reads, required of a checkpoint whose marker predates the manifest.
inline constexpr const char* kResumeFiles[] = {"trainer_state/trainer_state.json", "trainer_state/optimizer.bin",
                                               "trainer_state/master/config.json", "config.json"};
// Why dir is not a complete checkpoint ("no COMPLETE marker", "trainer_state/optimizer.bin is missing",
// "model.safetensors has 12 bytes, the manifest says 4096 bytes", ...), or "" when it is one.
std::string checkpoint_problem(const fs::path& dir);
bool is_complete_checkpoint(const fs::path& dir);

struct CheckpointInfo {
  int64_t step = 0;
  fs::path path;
};
// Complete checkpoints in output_dir, by ascending step.
std::vector<CheckpointInfo> list_checkpoints(const fs::path& output_dir);
std::optional<CheckpointInfo> latest_checkpoint(const fs::path& output_dir);

// Resolves resume_from_checkpoint: "" -> nullopt, "auto" -> latest complete one in output_dir (nullopt
// if none; with report_skipped, a warning names each newer checkpoint directory skipped and why), a
// path -> that directory, which must be complete (else lt::Error saying why).
std::optional<fs::path> resolve_resume(const std::string& spec, const fs::path& output_dir,
                                       bool report_skipped = true);

// Writes one checkpoint atomically. Usage: CheckpointWriter w(out, step); write files under w.dir();
// w.commit(). If the writer is destroyed without commit (an exception), the temp dir is removed.
class CheckpointWriter {
 public:
  CheckpointWriter(const fs::path& output_dir, int64_t step);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  const fs::path& dir() const { return tmp_; }  // where to write files
  fs::path commit();                            // returns the final directory

  // Test hook: called with a stage name ("files", "fsync", "rename", "marker") before that stage;
  // throwing from it simulates a crash there.
  static std::function<void(const std::string& stage)> fault_hook;

 private:
  fs::path output_dir_, tmp_, final_;
  bool committed_ = false;
};

// Deletes the oldest complete checkpoints so that at most `limit` remain (0 = keep all); also removes
// leftover temp directories and incomplete checkpoint directories. Returns the deleted paths.
std::vector<fs::path> rotate_checkpoints(const fs::path& output_dir, int64_t limit);

// fsync a file or a directory (throws lt::Error on failure).
void fsync_path(const fs::path& p);
// Writes a whole file and fsyncs it.
void write_file_durable(const fs::path& p, const std::string& bytes);
std::string read_file_text(const fs::path& p);

}  // namespace lt::train
