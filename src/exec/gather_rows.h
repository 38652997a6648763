// Row gather for the host embedding lookup: dst row t = src row ids[t], rowb bytes each.
#pragma once
#include <cstdint>

namespace lt {

// The rows are scattered over a large table, so one thread is latency-bound: the rows are split over
// up to max_threads threads (0 = min(16, cores)), one per 4 MiB of output at most.
void gather_rows(char* dst, const char* src, const int32_t* ids, int64_t n, int64_t rowb, int max_threads = 0);

}  // namespace lt
