// Test-only driver: includes a generated .hip (path via -DKDA_SOURCE) and exposes CPU launchers.
#define KDA_DEVICE_ONLY 1
#include KDA_SOURCE

extern "C" void emu_prologue(kda::PrologueArgs* a, int64_t num_chunks) {
  kda::PrologueArgs p = *a;
  kda_emu_launch((unsigned)num_chunks, (unsigned)p.H, kda::THREADS, [&] { kda::kda_prologue_kernel(p); });
}
extern "C" void emu_recurrence(kda::RecurrenceArgs* a, int64_t num_seqs) {
  kda::RecurrenceArgs p = *a;
  kda_emu_launch((unsigned)(num_seqs * p.H), (unsigned)(kda::V / kda::BVS), kda::THREADS,
                 [&] { kda::kda_recurrence_kernel(p); });
}
extern "C" int emu_sizes(int which) { return which ? (int)sizeof(kda::RecurrenceArgs) : (int)sizeof(kda::PrologueArgs); }
