// CUDA backend sources live in this folder; this file keeps the library non-empty until they land.
