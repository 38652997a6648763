// Byte quantities: parsing ("24GiB", "80G", "512MiB", "1.5e9") and printing.
#pragma once
#include <cstdint>
#include <string>

namespace lt {

constexpr int64_t KiB = 1024, MiB = 1024 * KiB, GiB = 1024 * MiB;

// Accepts an integer or decimal number with an optional unit B, K/KB/KiB, M/MB/MiB, G/GB/GiB, T/TB/TiB.
// Binary units for both spellings (K = KiB), since memory capacities are meant. Throws lt::Error.
int64_t parse_bytes(const std::string& text);
// "1.50 GiB", "12.0 MiB", "512 B". Negative values keep their sign.
std::string format_bytes(double bytes);

}  // namespace lt
