// File rendezvous for ranks started by `lazytrain launch` on one host (or hosts sharing a directory):
// rank 0 publishes a small blob (the NCCL unique id) under a key in LT_RDZV_DIR, the others wait for it.
// Writes are atomic (temp file + rename), so a reader never sees a partial blob.
#pragma once
#include <filesystem>
#include <string>

namespace lt::dist {

void rdzv_publish(const std::filesystem::path& dir, const std::string& key, const std::string& bytes);
// Waits up to timeout_s for the key; throws lt::Error naming the directory and key on timeout.
std::string rdzv_wait(const std::filesystem::path& dir, const std::string& key, double timeout_s);

}  // namespace lt::dist
