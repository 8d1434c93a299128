// verispec's native decoder: one forward pass of a Llama-family model on the CPU.
//
// Every row of a pass (one token at one position) is computed by code whose order of
// operations depends on that row alone: its own activations, its own position, its own
// prefix of the KV cache. Nothing sums across rows, and work is split between threads by
// output columns and (row, head) pairs, never inside a reduction. So a verify pass of M
// rows gives each row exactly the logits a single decode step would: row invariance holds
// by construction, and the load-time self-test checks it on the real weights.
//
// Weights ("matrices", y = x W^T with W of N rows and K columns) come in four formats:
//   Q4    4-bit codes q in blocks of 32 along K: w = d * q + m (GGUF Q4_1; Q4_0 as m = -8 d)
//   Q8_0  8-bit codes in blocks of 32: w = d * q
//   F32, F16, BF16  float values
// packed in tiles of 4 output rows so that one tile's bytes are contiguous (see pack.py).
// Quantised matrices multiply activations quantised per row to 8 bits in blocks of 32
// (xq, with scale dx and dx * sum(xq)), with integer dot products inside a block, as
// llama.cpp does; float matrices multiply float32 activations. Where the CPU has AVX-512
// VNNI, quantised matrices also carry a wide layout of 16 outputs per group (matmul_wide_rows),
// as Q4 matrices do where it has AVX2 and no VNNI, and where it has AMX tiles, passes of many rows take them for the integer products
// (matmul_amx); every kernel gives a row the same bits.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define VS_AVX2 1
// Sums of 4 products u8 x s8 in each int32 lane. maddubs never saturates here (codes are
// at most 15, or 128 in absolute value for 8-bit codes, times |x| <= 127), so the VNNI
// instruction, where the CPU has it, gives the same integers in one step.
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define VS_DOT4(w, x, ones) _mm256_dpbusd_epi32(_mm256_setzero_si256(), (w), (x))
#elif defined(__AVXVNNI__)
#define VS_DOT4(w, x, ones) _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), (w), (x))
#else
#define VS_DOT4(w, x, ones) _mm256_madd_epi16(_mm256_maddubs_epi16((w), (x)), (ones))
#endif
// acc + sums of 4 products u8 x s8 per int32 lane, in one instruction (the VNNI kernels).
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define VS_VNNI 1
#define VS_DPBUSD(acc, u, s) _mm256_dpbusd_epi32((acc), (u), (s))
#elif defined(__AVXVNNI__)
#define VS_VNNI 1
#define VS_DPBUSD(acc, u, s) _mm256_dpbusd_avx_epi32((acc), (u), (s))
#endif
#endif

// AVX-512 for the attention's scores and sums (the same chains per lane, twice the lanes).
#if defined(VS_AVX2) && defined(__AVX512F__)
#define VS_AVX512 1
#endif

// The wide layout (16 outputs per group, see prepack_wide) and its AVX-512 VNNI kernel, where
// the CPU has AVX-512 VNNI (Intel from Ice Lake, AMD from Zen 4).
#if defined(VS_AVX2) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define VS_WIDE 1
#endif
// AVX2 and no VNNI of either width (AMD Zen 2 and 3, Intel Haswell to Comet Lake): kernels of
// their own for short passes (the duo and quads kernels, part groups of rows).
#if defined(VS_AVX2) && !defined(VS_VNNI)
#define VS_AVX2_NO_VNNI 1
#endif
// There, the same layout with an AVX2 kernel: maddubs against broadcast codes of the row
// instead of tile_quant's horizontal adds.
#ifdef VS_AVX2_NO_VNNI
#define VS_WIDE 1
#define VS_WIDE_AVX2 1
#endif

// AMX tiles (int8) on the wide layout for passes of many rows, where the CPU has them
// (runtime-checked too: the kernel must grant the process the tile state).
#if defined(VS_WIDE) && defined(__AMX_TILE__) && defined(__AMX_INT8__)
#define VS_AMX 1
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace vs {

constexpr int64_t QK = 32;   // weights per quantisation block
constexpr int64_t TILE = 4;  // output rows per packed tile
constexpr int64_t FK = 8;    // float formats: columns per packed group
enum Format : int64_t { F32 = 0, BF16 = 1, Q8_0 = 2, Q4 = 3, F16 = 4 };  // formats.FORMATS

// ---------------------------------------------------------------------------------------
// Threads. A pass runs a few hundred parallel loops back to back (every matrix, every
// attention), so how a loop hands out its work decides what a busy machine costs: with a
// static split (OpenMP's, at::parallel_for's) each thread owns a part, and when another
// process holds a core the loop waits a whole time slice for the thread that cannot run
// (measured: 5 tok/s instead of 34 for batched generation beside a test run). Here the work
// is cut into more chunks than threads, and each thread, the caller included, has a home
// range of them: it runs its own chunks front to back, then takes the chunks still left in
// the others' ranges from their backs, until none is left. A thread that is not running
// holds no chunk, and the caller waits only for chunks another thread has claimed. A home
// range keeps a thread on one contiguous stretch of a matrix (the prefetchers' stream) and
// its claims on a cache line of its own. One shared counter for all claims (the design
// before) bounced its line between the cores at every chunk and restarted the threads'
// streams at every chunk. Whole passes at 400 tokens of context on 2 cores (Zen 5), both
// designs switched in one process between interleaved passes, medians in ms (shared, 4
// chunks a thread -> home ranges, 2 a thread): 1 row 2.17 -> 1.83, 2 rows 2.50 -> 2.08, 4
// rows 2.81 -> 2.53, 8 rows 4.00 -> 3.76, 16 rows 7.07 -> 6.68, 32 rows 13.09 -> 12.31. Beside
// a process spinning on one of the 2 cores, 32 rows: 25.3 -> 23.9 ms; with 1 chunk a thread
// 33.3 (a thread that loses its core holds half the loop), hence 2. A chunk is computed
// whole by one thread, so results do not depend on who ran it (row invariance is untouched).
class Pool {
 public:
  using Body = std::function<void(int64_t, int64_t)>;

  explicit Pool(int workers) : slots_(new Slot[workers + 1]) {
    for (int i = 0; i < workers; i++) threads_.emplace_back([this, i] { work(i + 1); });
  }
  int workers() const { return (int)threads_.size(); }
  uint64_t threads() const { return threads_.size() + 1; }  // the workers and the caller
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  // fn(chunk's begin, chunk's end) for every chunk of [begin, end), chunks of ``chunk``.
  void run(int64_t begin, int64_t end, int64_t chunk, const Body& fn) {
    std::lock_guard<std::mutex> one_loop_at_a_time(run_mutex_);
    struct Inside {  // a loop inside one of this loop's chunks runs on the caller alone
      Inside() { inside() = true; }
      ~Inside() { inside() = false; }
    } inside_this_loop;
    const uint64_t chunks = (uint64_t)((end - begin + chunk - 1) / chunk);
    begin_ = begin, end_ = end, chunk_ = chunk, fn_ = &fn, error_ = nullptr;
    done_.store(0, std::memory_order_relaxed);
    const uint64_t n = threads();
    for (uint64_t t = 0; t < n; t++)  // home ranges [front, back): front in bits 0-23, back in 24-47
      slots_[t].word.store(chunks * t / n | (chunks * (t + 1) / n) << 24, std::memory_order_release);
    generation_ = (generation_ + 1) & 0xFFFF;
    posted_.store(generation_ + 1, std::memory_order_seq_cst);  // never 0: a worker's first seen value
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lock(mutex_);
      wake_.notify_all();
    }
    claim_all(0);
    for (int spins = 0; done_.load(std::memory_order_acquire) < chunks; spins++) {
      if (spins < 4096)
        pause();
      else
        std::this_thread::yield();  // the chunk's thread may need this core to finish it
    }
    if (error_) std::rethrow_exception(error_);
  }

 private:
  static inline void pause() {
#ifdef VS_AVX2
    _mm_pause();
#endif
  }

  // Claim and run chunks of the current loop until none is left: thread ``self``'s own range
  // from its front, then the others' from their backs. A claim is an atomic step of a range
  // word that found it non-empty, so every chunk runs once; the loop's fields are those of the
  // word's loop (the caller wrote them before the words, and the loop cannot end before a
  // claimed chunk is done). The chunks run are counted once, at the end: the caller waits for
  // all of them, so no thread is still claiming when the next loop's words are written.
  void claim_all(uint64_t self) {
    constexpr uint64_t FIELD = 0xFFFFFF, BACK = 1ull << 24;
    const uint64_t n = threads();
    uint64_t ran = 0;
    for (;;) {  // own range: the front moves on (past the back once it is empty: harmless)
      const uint64_t word = slots_[self].word.fetch_add(1, std::memory_order_acq_rel);
      if ((word & FIELD) >= (word >> 24 & FIELD)) break;
      run_chunk(word & FIELD), ran++;
    }
    for (uint64_t v = 1; v < n; v++) {  // the others': the back moves down
      std::atomic<uint64_t>& range = slots_[(self + v) % n].word;
      uint64_t word = range.load(std::memory_order_acquire);
      while ((word & FIELD) < (word >> 24 & FIELD))
        if (range.compare_exchange_weak(word, word - BACK, std::memory_order_acq_rel, std::memory_order_acquire)) {
          run_chunk((word >> 24 & FIELD) - 1), ran++;
          word = range.load(std::memory_order_acquire);
        }
    }
    if (ran > 0) done_.fetch_add(ran, std::memory_order_acq_rel);
  }

  void run_chunk(uint64_t index) {
    const int64_t b = begin_ + (int64_t)index * chunk_, e = std::min(end_, b + chunk_);
    try {
      (*fn_)(b, e);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
  }

  void work(uint64_t self) {
    inside() = true;  // a loop inside a chunk runs on its own thread
    uint32_t seen = 0;
    for (;;) {
      for (int spins = 0; posted_.load(std::memory_order_acquire) == seen && spins < 20000; spins++) pause();
      if (posted_.load(std::memory_order_acquire) == seen) {
        std::unique_lock<std::mutex> lock(mutex_);
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        wake_.wait(lock, [&] { return stopping_ || posted_.load(std::memory_order_seq_cst) != seen; });
        sleepers_.fetch_sub(1, std::memory_order_seq_cst);
        if (stopping_) return;
      }
      seen = posted_.load(std::memory_order_acquire);
      claim_all(self);
    }
  }

 public:
  static bool& inside() {
    static thread_local bool flag = false;
    return flag;
  }

 private:
  std::vector<std::thread> threads_;
  std::mutex mutex_, run_mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  // Each on its own cache line: threads spinning on one must not be slowed by writes to another.
  struct alignas(64) Slot {
    std::atomic<uint64_t> word{0};  // a thread's range of the current loop's chunks
  };
  std::unique_ptr<Slot[]> slots_;  // the caller's, then each worker's
  alignas(64) std::atomic<uint64_t> done_{0};
  alignas(64) std::atomic<uint32_t> posted_{0};
  alignas(64) std::atomic<int> sleepers_{0};
  uint32_t generation_ = 0;
  int64_t begin_ = 0, end_ = 0, chunk_ = 1;
  const Body* fn_ = nullptr;
  std::exception_ptr error_;
};

static Pool* pool_ = nullptr;  // made on first use; abandoned (not joined) in a forked child
static std::mutex pool_mutex_;

static void forget_pool_in_child() { pool_ = nullptr; }  // its threads do not exist there

// The decoder's own thread count (set_threads; 0: torch's, at::get_num_threads). Its own so
// that the engine can run torch single-threaded between passes (a drafter's small ops gain
// nothing from a second thread, and an OpenMP worker spinning after them holds the core this
// pool's next loop needs) while the passes keep every thread.
static std::atomic<int> threads_setting_{0};
static void set_threads(int threads) { threads_setting_.store(std::max(0, threads)); }
static int64_t pass_threads() {
  const int setting = threads_setting_.load();
  return setting > 0 ? setting : at::get_num_threads();
}

// fn(b, e) over [begin, end) on pass_threads() threads, in chunks of at least ``grain``; on
// the calling thread alone when the range is a single chunk. ``per_thread``: chunks a thread.
static void parallel_for(int64_t begin, int64_t end, int64_t grain, const Pool::Body& fn, int64_t per_thread = 2) {
  const int64_t n = end - begin, threads = pass_threads();
  if (n <= 0) return;
  if (threads <= 1 || n <= grain || Pool::inside()) return fn(begin, end);
  // Two chunks a thread by default, so that a thread that ran late leaves part of its share to
  // the others (Pool: four cost 2-5% more on a quiet machine, one much more on a busy one).
  const int64_t chunk = std::max(grain, (n + per_thread * threads - 1) / (per_thread * threads));
  if (chunk >= n) return fn(begin, end);
  Pool* pool;
  {
    std::lock_guard<std::mutex> lock(pool_mutex_);
    static bool registered = (pthread_atfork(nullptr, nullptr, forget_pool_in_child), true);
    (void)registered;
    if (pool_ == nullptr || pool_->workers() != threads - 1) {
      if (pool_ != nullptr) {
        pool_->stop();
        delete pool_;
      }
      pool_ = new Pool((int)threads - 1);
    }
    pool = pool_;
  }
  pool->run(begin, end, chunk, fn);
}

// How many times parallel_for ran each index of [0, n) in chunks of at least ``grain``, over
// ``loops`` loops back to back (for tests of the pool: every count must equal ``loops``).
static std::vector<int64_t> parallel_cover(int64_t n, int64_t grain, int64_t loops) {
  std::vector<std::atomic<int64_t>> counts(n);
  for (int64_t loop = 0; loop < loops; loop++)
    parallel_for(0, n, grain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; i++) counts[i].fetch_add(1, std::memory_order_relaxed);
    });
  std::vector<int64_t> out(n);
  for (int64_t i = 0; i < n; i++) out[i] = counts[i].load();
  return out;
}

// Row-wise work between the parallel loops (norms, the activations' quantisation, RoPE and
// cache writes, SiLU, residual adds): on the calling thread up to ROWS_SERIAL rows, where a
// hand-off to the pool costs about what it saves, else split by rows over the pool (chunks of
// at least ROWS_SERIAL / 2). Each row's arithmetic is the same either way. In a prefill it
// had the pool's worker waiting for a fifth of a pass.
constexpr int64_t ROWS_SERIAL = 16;
static void for_rows(int64_t M, const Pool::Body& fn) {
  if (M <= ROWS_SERIAL) return fn(0, M);
  parallel_for(0, M, ROWS_SERIAL / 2, fn);
}

// ---------------------------------------------------------------------------------------
// Small vector helpers with scalar twins that sum in the same order.

#ifdef VS_AVX2
static inline float hsum8(__m256 v) {  // ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7))
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  a = _mm_add_ss(a, _mm_movehdup_ps(a));
  return _mm_cvtss_f32(a);
}
// exp(x) for x <= 88.3, x >= -87.3 (clamped): Cody-Waite reduction and a degree-6
// polynomial (Cephes' expf coefficients), about 1 ulp.
static inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
#endif
#ifdef VS_AVX512
// exp8 on 16 lanes: the same operations, so the same value in every lane.
static inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.3f));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}
#endif

static inline float hsum8(const float* l) {
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

static inline float exp1(float x) {
  x = std::min(std::max(x, -87.3f), 88.3f);
  float n = std::nearbyint(x * 1.44269504088896341f);
  float r = std::fma(-n, 0.693359375f, x);
  r = std::fma(-n, -2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  p = std::fma(p, r * r, r + 1.0f);
  int32_t bits = ((int32_t)n + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

// exp of n floats in place (16 or 8 lanes, then the scalar twin for the rest).
static void exp_inplace(float* v, int64_t n) {
  int64_t i = 0;
#ifdef VS_AVX512
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(v + i, exp16(_mm512_loadu_ps(v + i)));
#endif
#ifdef VS_AVX2
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(v + i, exp8(_mm256_loadu_ps(v + i)));
#endif
  for (; i < n; i++) v[i] = exp1(v[i]);
}

// The largest of n floats (n >= 1; a NaN is passed over, as std::max(best, v) does). A
// maximum is exact, so the vector lanes give the scalar loop's value.
static float max_of(const float* v, int64_t n) {
  float best = -INFINITY;
  int64_t i = 0;
#ifdef VS_AVX512
  __m512 m[4] = {_mm512_set1_ps(-INFINITY), _mm512_set1_ps(-INFINITY), _mm512_set1_ps(-INFINITY),
                 _mm512_set1_ps(-INFINITY)};
  // max_ps(x, m) gives m where x is NaN; four chains hide the instruction's latency.
  for (; i + 64 <= n; i += 64)
    for (int u = 0; u < 4; u++) m[u] = _mm512_max_ps(_mm512_loadu_ps(v + i + 16 * u), m[u]);
  for (; i + 16 <= n; i += 16) m[0] = _mm512_max_ps(_mm512_loadu_ps(v + i), m[0]);
  best = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(m[0], m[1]), _mm512_max_ps(m[2], m[3])));
#elif defined(VS_AVX2)
  __m256 m[4] = {_mm256_set1_ps(-INFINITY), _mm256_set1_ps(-INFINITY), _mm256_set1_ps(-INFINITY),
                 _mm256_set1_ps(-INFINITY)};
  for (; i + 32 <= n; i += 32)
    for (int u = 0; u < 4; u++) m[u] = _mm256_max_ps(_mm256_loadu_ps(v + i + 8 * u), m[u]);
  for (; i + 8 <= n; i += 8) m[0] = _mm256_max_ps(_mm256_loadu_ps(v + i), m[0]);
  float lanes[8];
  _mm256_storeu_ps(lanes, _mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3])));
  for (int l = 0; l < 8; l++) best = std::max(best, lanes[l]);
#endif
  for (; i < n; i++) best = std::max(best, v[i]);
  return best;
}

static inline float fp16_to_float(uint16_t h) {
#ifdef VS_AVX2
  return _cvtsh_ss(h);
#else
  return c10::detail::fp16_ieee_to_fp32_value(h);
#endif
}
static inline uint16_t float_to_fp16(float f) {
#ifdef VS_AVX2
  return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
  return c10::detail::fp16_ieee_from_fp32_value(f);
#endif
}

// ---------------------------------------------------------------------------------------
// AMX's tile state: Linux keeps it off until the process asks for it, once.

static bool amx_permitted() {
#ifdef VS_AMX
  static const bool permitted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  return permitted;
#else
  return false;
#endif
}

static bool setting_off(const char* name) {
  const char* setting = std::getenv(name);
  return setting != nullptr && std::strcmp(setting, "0") == 0;
}

// Whether quantised matrices carry the wide layout (VERISPEC_WIDE=0 keeps it, and its copy
// of the weights, out: the vector kernels then run every pass).
static bool wide_wanted() {
#ifdef VS_WIDE
  return !setting_off("VERISPEC_WIDE");
#else
  return false;
#endif
}

// Whether passes of many rows take AMX tiles on the wide layout (VERISPEC_AMX=0: never).
static bool amx_wanted() { return wide_wanted() && !setting_off("VERISPEC_AMX") && amx_permitted(); }

// The two answers above, read once per process: every matrix and every pass sees the same.
static bool wide_available() {
  static const bool wanted = wide_wanted();
  return wanted;
}
static bool amx_available() {
  static const bool wanted = amx_wanted();
  return wanted;
}

// Whether the AVX-512 wide layout keeps its scales and minimums as float16 beside each
// block's codes (prepack_wide; VERISPEC_WIDE_HALVES=0: as float32 arrays, the layout AMX's
// kernel reads, which keeps it wherever the tiles run).
static bool wide_halves_available() {
#if defined(VS_WIDE) && !defined(VS_WIDE_AVX2)
  static const bool wanted = !amx_available() && !setting_off("VERISPEC_WIDE_HALVES");
  return wanted;
#else
  return false;
#endif
}

// ---------------------------------------------------------------------------------------
// Weights.

struct Matrix {
  int64_t format = F32, rows = 0, cols = 0;
  at::Tensor data, scale, minimum, bias;  // owners of the memory below
  const void* raw = nullptr;              // data
  const float *d = nullptr, *m = nullptr, *b = nullptr;  // scale, minimum, bias (or null)
  // The wide layout's copy of a quantised matrix, where it runs (prepack_wide; else empty).
  at::Tensor wide_data, wide_scales;
  const uint8_t* wide_codes = nullptr;
  const float *wide_d = nullptr, *wide_m = nullptr;
  // AVX2 without VNNI keeps the wide layout's scales and minimums as float16 instead, per
  // group and block 16 scales, then 16 minimums: one cache line (see prepack_wide).
  const uint16_t* wide_halves = nullptr;
  // AVX-512 VNNI without AMX keeps them as float16 too, that line right after the block's
  // codes: wide_stride bytes a block, one stream (0: the float arrays wide_d and wide_m).
  int64_t wide_stride = 0;
  int64_t tiles() const { return (rows + TILE - 1) / TILE; }
  int64_t blocks() const { return cols / QK; }
  bool quantized() const { return format == Q8_0 || format == Q4; }
  bool floating() const { return !quantized(); }
};

#ifdef VS_WIDE
static void prepack_wide(Matrix& m);
#endif

static Matrix make_matrix(int64_t format, int64_t rows, int64_t cols, at::Tensor data,
                          std::optional<at::Tensor> scale_, std::optional<at::Tensor> minimum_,
                          std::optional<at::Tensor> bias_) {
  TORCH_CHECK(format >= F32 && format <= F16, "unknown weight format ", format);
  at::Tensor scale = scale_.value_or(at::Tensor()), minimum = minimum_.value_or(at::Tensor());
  at::Tensor bias = bias_.value_or(at::Tensor());
  const bool quantized = format == Q8_0 || format == Q4;
  TORCH_CHECK(cols % (quantized ? QK : FK) == 0, "columns must be a multiple of ", quantized ? QK : FK, ", got ", cols);
  TORCH_CHECK(data.is_contiguous() && data.device().is_cpu(), "weight data must be contiguous CPU memory");
  int64_t tiles = (rows + TILE - 1) / TILE, blocks = cols / QK;
  const int64_t bytes[] = {4 * TILE * cols, 2 * TILE * cols, TILE * cols + 0, TILE * cols / 2, 2 * TILE * cols};
  TORCH_CHECK(data.nbytes() == (size_t)(tiles * bytes[format]), "packed weight data has the wrong size");
  if (quantized) {
    TORCH_CHECK(scale.defined() && scale.scalar_type() == at::kFloat && scale.numel() == tiles * blocks * TILE, "bad scales");
  }
  if (format == Q4) TORCH_CHECK(minimum.defined() && minimum.scalar_type() == at::kFloat && minimum.numel() == scale.numel(), "bad minimums");
  if (bias.defined()) TORCH_CHECK(bias.scalar_type() == at::kFloat && bias.numel() == rows, "bad bias");
  Matrix m;
  m.format = format, m.rows = rows, m.cols = cols, m.data = data, m.scale = scale, m.minimum = minimum, m.bias = bias;
  m.raw = data.data_ptr();
  if (scale.defined()) m.d = scale.data_ptr<float>();
  if (minimum.defined()) m.m = minimum.data_ptr<float>();
  if (bias.defined()) m.b = bias.data_ptr<float>();
#ifdef VS_WIDE
#ifdef VS_WIDE_AVX2  // 4-bit only: its kernel for 8-bit codes measured slower than tile_quant
  if (format == Q4 && wide_available()) prepack_wide(m);
#else
  if (quantized && wide_available()) prepack_wide(m);
#endif
#endif
  return m;
}

// Element ``at`` of a float matrix's packed data as float32.
static inline float float_value(const Matrix& w, int64_t at) {
  if (w.format == F32) return ((const float*)w.raw)[at];
  uint16_t raw = ((const uint16_t*)w.raw)[at];
  if (w.format == F16) return fp16_to_float(raw);
  uint32_t bits = (uint32_t)raw << 16;
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}

// Row n of W as float32 (embedding lookups): the same values the kernels multiply with.
static void matrix_row(const Matrix& w, int64_t n, float* out) {
  int64_t t = n / TILE, j = n % TILE, K = w.cols, B = w.blocks();
  if (w.floating()) {
    for (int64_t g = 0; g < K / FK; g++)
      for (int64_t l = 0; l < FK; l++) out[g * FK + l] = float_value(w, ((t * (K / FK) + g) * TILE + j) * FK + l);
    return;
  }
  const float* d = w.d + t * B * TILE;
  for (int64_t b = 0; b < B; b++) {
    float scale = d[b * TILE + j];
    if (w.format == Q8_0) {
      const int8_t* q = (const int8_t*)w.raw + ((t * B + b) * TILE + j) * QK;
      for (int64_t i = 0; i < QK; i++) out[b * QK + i] = scale * (float)q[i];
    } else {
      const uint8_t* q = (const uint8_t*)w.raw + ((t * B + b) * TILE + j) * (QK / 2);
      float minimum = w.m[(t * B + b) * TILE + j];
      for (int64_t i = 0; i < QK / 2; i++) {
        out[b * QK + i] = scale * (float)(q[i] & 15) + minimum;
        out[b * QK + i + 16] = scale * (float)(q[i] >> 4) + minimum;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Activations quantised per row in blocks of 32: q = round(x / d), d = max|x| / 127.

// Bytes whose first one sits on a 64-byte boundary (std::vector's are 16-byte aligned): the
// kernels' 32-byte loads of them then never straddle a cache line.
struct AlignedBytes {
  std::vector<int8_t> raw;
  int8_t* first = nullptr;
  void assign(size_t n) {
    raw.assign(n + 64, 0);
    first = (int8_t*)(((uintptr_t)raw.data() + 63) & ~(uintptr_t)63);
  }
  int8_t* data() { return first; }
  const int8_t* data() const { return first; }
  int8_t& operator[](size_t i) { return first[i]; }
};

struct QuantRows {
  std::vector<int8_t> q;
  std::vector<float> d, s;  // per block: scale, and scale * sum(q)
  // The same rows in groups of 8, for the lanes kernel (tile_q4_lanes): per group and block,
  // 8 groups of 4 activations x 8 rows x 4 bytes, and the rows' d and s side by side.
  AlignedBytes q8;
  std::vector<float> d8, s8;
  // The last 4 rows for the quads kernel (tile_q4_quads): per block, 4 pairs of groups x 4 rows
  // x 8 bytes, and the rows' d and s as [r0 r1 r0 r1 r2 r3 r2 r3].
  AlignedBytes q4x;
  std::vector<float> d4x, s4x;
  // q + 128 as unsigned bytes (q ^ 0x80; q is never -128), for tile_quant_vnni on 8-bit weights.
  std::vector<uint8_t> biased;
};

constexpr int64_t LANES = 8;  // rows per group in the lanes kernel

// Rows 0 .. M - 1 of xq into the lanes layout, 8 * groups rows (rows from M on are zero).
static void pack_lanes(QuantRows& xq, int64_t groups, int64_t K, int64_t M) {
  const int64_t B = K / QK;
  xq.q8.assign(groups * B * QK * LANES);
  xq.d8.assign(groups * B * LANES, 0.f);
  xq.s8.assign(groups * B * LANES, 0.f);
  for (int64_t grp = 0; grp < groups; grp++)
    for (int64_t r = 0; r < LANES; r++) {
      const int64_t row = grp * LANES + r;
      if (row >= M) break;
      for (int64_t b = 0; b < B; b++) {
        for (int64_t g = 0; g < QK / 4; g++)
          std::memcpy(&xq.q8[((grp * B + b) * (QK / 4) + g) * LANES * 4 + r * 4], &xq.q[row * K + b * QK + 4 * g], 4);
        xq.d8[(grp * B + b) * LANES + r] = xq.d[row * B + b];
        xq.s8[(grp * B + b) * LANES + r] = xq.s[row * B + b];
      }
    }
}

#ifdef VS_AVX2_NO_VNNI
constexpr int64_t QUAD = 4;  // rows per group in the quads kernel
// Without VNNI, a Q4 pass's rows past its groups of 8: from QUADS_FROM of them a part group
// (matmul_q4_part_group), from LANES_PADDED_FROM one of the lanes kernel, else the quads kernel.
constexpr int64_t QUADS_FROM = 4, LANES_PADDED_FROM = 5;

// Rows r0 .. r0 + 3 of xq into the quads layout.
static void pack_quads(QuantRows& xq, int64_t r0, int64_t K) {
  const int64_t B = K / QK;
  xq.q4x.assign(B * QK * QUAD);
  xq.d4x.resize(B * 2 * QUAD);
  xq.s4x.resize(B * 2 * QUAD);
  static const int lane_row[2 * QUAD] = {0, 1, 0, 1, 2, 3, 2, 3};
  for (int64_t b = 0; b < B; b++) {
    for (int64_t r = 0; r < QUAD; r++)
      for (int64_t p = 0; p < QK / 8; p++)
        std::memcpy(&xq.q4x[(b * (QK / 8) + p) * QUAD * 8 + r * 8], &xq.q[(r0 + r) * K + b * QK + 8 * p], 8);
    for (int l = 0; l < 2 * QUAD; l++) {
      xq.d4x[b * 2 * QUAD + l] = xq.d[(r0 + lane_row[l]) * B + b];
      xq.s4x[b * 2 * QUAD + l] = xq.s[(r0 + lane_row[l]) * B + b];
    }
  }
}
#endif

// Blocks [first, last) of quantize_rows, counted over the rows one after another.
static void quantize_blocks(const float* x, int64_t first, int64_t last, QuantRows& out) {
  for (int64_t i = first; i < last; i++) {
    const float* v = x + i * QK;
    int8_t* q = out.q.data() + i * QK;
    int32_t sum = 0;
    float amax = 0.f;
#ifdef VS_AVX2
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + 8), v2 = _mm256_loadu_ps(v + 16),
           v3 = _mm256_loadu_ps(v + 24);
    __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                              _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    amax = _mm_cvtss_f32(m4);
    float d = amax / 127.f, id = d != 0.f ? 1.f / d : 0.f;
    const __m256 idv = _mm256_set1_ps(id);
    const int round = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v0, idv), round));
    __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v1, idv), round));
    __m256i i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v2, idv), round));
    __m256i i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v3, idv), round));
    __m256i total = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
    __m128i t4 = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
    t4 = _mm_hadd_epi32(t4, t4);
    t4 = _mm_hadd_epi32(t4, t4);
    sum = _mm_cvtsi128_si32(t4);
    // pack 32 int32 -> 32 int8 in order (packs interleave 128-bit lanes; the permute undoes it)
    __m256i p01 = _mm256_packs_epi32(i0, i1), p23 = _mm256_packs_epi32(i2, i3);
    __m256i p = _mm256_packs_epi16(p01, p23);
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i*)q, p);
    out.d[i] = d;
#else
    for (int64_t j = 0; j < QK; j++) amax = std::max(amax, std::fabs(v[j]));
    float d = amax / 127.f, id = d != 0.f ? 1.f / d : 0.f;
    for (int64_t j = 0; j < QK; j++) {
      int32_t value = (int32_t)std::nearbyint(v[j] * id);
      q[j] = (int8_t)value;
      sum += value;
    }
    out.d[i] = d;
#endif
    out.s[i] = out.d[i] * (float)sum;
  }
}

// Each row of x (M x K) in blocks of QK: codes q = round(x / d), d = max|x| / 127, and s = d
// times the codes' sum (quantize_blocks).
static void quantize_rows(const float* x, int64_t M, int64_t K, QuantRows& out) {
  const int64_t B = K / QK;
  out.q.resize(M * K), out.d.resize(M * B), out.s.resize(M * B);
  for_rows(M, [&](int64_t r0, int64_t r1) { quantize_blocks(x, r0 * B, r1 * B, out); });
}

// ---------------------------------------------------------------------------------------
// Matrix tiles: R rows of activations times one tile of 4 output rows. For every
// (row, output) pair the arithmetic is the same whatever R is: that is row invariance.

#ifdef VS_AVX2
// A block's 16 bytes of 4-bit codes as 32 code bytes: low nibbles (weights 0..15), then high
// nibbles (weights 16..31). One broadcast load and a shift of the upper half: no shuffle-port
// instruction, the bound of the one-row kernel.
static inline __m256i unpack_q4_block(const uint8_t* raw) {
  const __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)raw));
  return _mm256_and_si256(_mm256_srlv_epi64(both, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0F));
}

// The 4 outputs' weights of block b of tile t: 4-bit codes unpacked to bytes, or 8-bit codes.
template <bool Q4BLOCKS>
static inline void load_tile_block(const Matrix& w, int64_t t, int64_t b, __m256i* wv) {
  const int64_t B = w.blocks();
  for (int j = 0; j < TILE; j++) {
    if (Q4BLOCKS)
      wv[j] = unpack_q4_block((const uint8_t*)w.raw + ((t * B + b) * TILE + j) * (QK / 2));
    else
      wv[j] = _mm256_loadu_si256((const __m256i*)((const int8_t*)w.raw + ((t * B + b) * TILE + j) * QK));
  }
}
#endif

// The valid outputs of a tile's R rows into y.
template <int R>
static inline void store_tile(const Matrix& w, int64_t t, const float (*out)[TILE], float* y, int64_t ldy) {
  const int64_t valid = std::min<int64_t>(TILE, w.rows - t * TILE);
  for (int r = 0; r < R; r++)
    for (int j = 0; j < valid; j++) y[r * ldy + j] = out[r][j];
}

#ifdef VS_WIDE
// Weights are read once a pass and are far larger than the caches (106 MiB on the embedded
// model, against 16 MiB of L3 on Zen 2), so the kernels that prefetch them (AVX2's, the
// wide layout's) do it non-temporally: they then do not push out what the next pass and the
// Python between passes use again (the KV cache, the activations, the engine's own state).
// On Zen 2, a plain step was 16% faster than with _MM_HINT_T0 and a 2-row pass 17%, 8 rows 4%
// (whole passes at 400 tokens of context); on Zen 4 T0 measured level.
constexpr auto WEIGHT_HINT = _MM_HINT_NTA;
#endif

#ifdef VS_AVX2_NO_VNNI
// How many blocks ahead the kernels of AVX2 CPUs without VNNI prefetch their weights: with
// the hardware prefetchers alone the wide layout's AVX2 kernel left a plain step 7% and a
// 2-row pass 8-10% slower (Zen 2, whole passes; 8 ahead measured the same as 4).
constexpr int64_t PREFETCH_BLOCKS = 4;

// Prefetches block b of tile t (its codes and scales, and Q4's minimums) into L1. Past the
// tile's last block it reads the next tile's, the same thread's next mostly.
template <bool Q4BLOCKS>
static inline void prefetch_tile_block(const Matrix& w, int64_t t, int64_t b) {
  const int64_t at = (t * w.blocks() + b) * TILE;
  const char* codes = (const char*)w.raw + at * (Q4BLOCKS ? QK / 2 : QK);
  for (int64_t c = 0; c < TILE * (Q4BLOCKS ? QK / 2 : QK); c += 64) _mm_prefetch(codes + c, WEIGHT_HINT);
  _mm_prefetch((const char*)(w.d + at), WEIGHT_HINT);
  if (Q4BLOCKS) _mm_prefetch((const char*)(w.m + at), WEIGHT_HINT);
}
#endif

// A quantised tile's last step: Q4 adds the sum over blocks of m_w * s_x per output (in block
// order, after the products), then the valid outputs are stored.
template <int R, bool Q4BLOCKS>
static void finish_tile(const Matrix& w, int64_t t, const QuantRows& xq, int64_t r0, float (*out)[TILE], float* y,
                        int64_t ldy) {
  if (Q4BLOCKS) {
    const int64_t B = w.blocks();
    const float* Mn = w.m + t * B * TILE;
    const float* SX = xq.s.data() + r0 * B;
    for (int r = 0; r < R; r++) {
      float minimum[TILE] = {0, 0, 0, 0};
      for (int64_t b = 0; b < B; b++)
        for (int j = 0; j < TILE; j++) minimum[j] = std::fma(Mn[b * TILE + j], SX[r * B + b], minimum[j]);
      for (int j = 0; j < TILE; j++) out[r][j] += minimum[j];
    }
  }
  store_tile<R>(w, t, out, y, ldy);
}

// Quantised: per block and output, the exact integer dot product of the codes and the row's
// 8-bit activations over the block's 32 weights, times d_w * d_x, accumulated over the
// blocks in order; Q4 then adds m_w * s_x per block (summed in block order, after the
// products). Every quantised kernel runs these float steps in this order, whatever parts it
// sums the integers in (integer sums do not depend on their order). The 4 outputs of a tile
// share one vector per row: their integer sums are gathered with horizontal adds (each
// 128-bit lane holds one half block's) and the two lanes' added before the conversion to
// float, so the float work per block is one convert, one multiply and one fused multiply-add
// per 4 outputs.
template <int R, bool Q4BLOCKS>
static void tile_quant(const Matrix& w, int64_t t, const QuantRows& xq, int64_t r0, float* y, int64_t ldy) {
  const int64_t B = w.blocks(), K = w.cols;
  const float* D = w.d + t * B * TILE;
  const int8_t* X = xq.q.data() + r0 * K;
  const float* DX = xq.d.data() + r0 * B;
  float out[R][TILE];
#ifdef VS_AVX2
  const __m256i ones = _mm256_set1_epi16(1);
  // Q4's sums of m_w * s_x per output run beside the products (finish_tile's chains in
  // the same order, one vector a row): after the loop they were latency-bound, 5 cycles a
  // block and row.
  const float* Mn = Q4BLOCKS ? w.m + t * B * TILE : nullptr;
  const float* SX = xq.s.data() + r0 * B;
  __m128 acc[R], minimum[R];
  for (int r = 0; r < R; r++) acc[r] = minimum[r] = _mm_setzero_ps();
  for (int64_t b = 0; b < B; b++) {
    __m256i wv[TILE];  // 8-bit: signed codes (|w| as unsigned bytes below, the sign moving onto x)
#ifdef VS_AVX2_NO_VNNI
    prefetch_tile_block<Q4BLOCKS>(w, t, b + PREFETCH_BLOCKS);
#endif
    load_tile_block<Q4BLOCKS>(w, t, b, wv);
    const __m128 d4 = _mm_loadu_ps(D + b * TILE);  // d_w of outputs 0..3
    if (Q4BLOCKS) {
      const __m128 m4 = _mm_loadu_ps(Mn + b * TILE);
      for (int r = 0; r < R; r++) minimum[r] = _mm_fmadd_ps(m4, _mm_broadcast_ss(SX + r * B + b), minimum[r]);
    }
    for (int r = 0; r < R; r++) {
      const __m256i xv = _mm256_loadu_si256((const __m256i*)(X + r * K + b * QK));
      __m256i sums;  // per 128-bit half: outputs 0..3, 16 products each
#if defined(__AVX512VNNI__) || defined(__AVXVNNI__)
      __m256i p[TILE];
      for (int j = 0; j < TILE; j++)
        p[j] = Q4BLOCKS ? VS_DOT4(wv[j], xv, ones)
                        : VS_DOT4(_mm256_sign_epi8(wv[j], wv[j]), _mm256_sign_epi8(xv, wv[j]), ones);
      sums = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
#else
      if (Q4BLOCKS) {  // pairs of 2 products (at most 2 * 15 * 127) stay exact in 16 bits up to 4
        __m256i p[TILE];
        for (int j = 0; j < TILE; j++) p[j] = _mm256_maddubs_epi16(wv[j], xv);
        const __m256i h01 = _mm256_madd_epi16(_mm256_hadd_epi16(p[0], p[1]), ones);
        const __m256i h23 = _mm256_madd_epi16(_mm256_hadd_epi16(p[2], p[3]), ones);
        sums = _mm256_hadd_epi32(h01, h23);
      } else {
        __m256i p[TILE];
        for (int j = 0; j < TILE; j++)
          p[j] = VS_DOT4(_mm256_sign_epi8(wv[j], wv[j]), _mm256_sign_epi8(xv, wv[j]), ones);
        sums = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
      }
#endif
      const __m128i block = _mm_add_epi32(_mm256_castsi256_si128(sums), _mm256_extracti128_si256(sums, 1));
      const __m128 scale = _mm_mul_ps(d4, _mm_broadcast_ss(DX + r * B + b));
      acc[r] = _mm_fmadd_ps(_mm_cvtepi32_ps(block), scale, acc[r]);
    }
  }
  for (int r = 0; r < R; r++) _mm_storeu_ps(out[r], Q4BLOCKS ? _mm_add_ps(acc[r], minimum[r]) : acc[r]);
  store_tile<R>(w, t, out, y, ldy);
#else
  const uint8_t* C4 = (const uint8_t*)w.raw;
  const int8_t* C8 = (const int8_t*)w.raw;
  for (int r = 0; r < R; r++)
    for (int j = 0; j < TILE; j++) {
      float acc = 0;
      for (int64_t b = 0; b < B; b++) {
        const int8_t* xv = X + r * K + b * QK;
        const float scale = D[b * TILE + j] * DX[r * B + b];
        int32_t dot = 0;
        for (int i = 0; i < QK; i++) {
          int32_t code;
          if (Q4BLOCKS) {
            uint8_t byte = C4[((t * B + b) * TILE + j) * (QK / 2) + i % 16];
            code = i < 16 ? (byte & 15) : (byte >> 4);
          } else {
            code = C8[((t * B + b) * TILE + j) * QK + i];
          }
          dot += code * xv[i];
        }
        acc = std::fma((float)dot, scale, acc);
      }
      out[r][j] = acc;
    }
  finish_tile<R, Q4BLOCKS>(w, t, xq, r0, out, y, ldy);
#endif
}

#ifdef VS_AVX2_NO_VNNI
// 2 rows times one tile, for CPUs without VNNI: the same integers and float steps per (row,
// output) as tile_quant, so a row's result does not depend on which kernel ran it. A vector
// holds both rows: [row 0 | row 1] by 128-bit halves, 16 activations each, against the
// output's 16 weights of that half of the block broadcast to both (a 4-bit block's low
// nibbles are weights 0..15 and its high nibbles 16..31, so no unpacking shuffle is needed).
// Each row's sums then land in its own half, and three horizontal adds a block gather both
// rows' 4 outputs, [row 0: o0 o1 o2 o3 | row 1: o0 o1 o2 o3], where tile_quant spends three a
// row and a block and a lane extraction besides: on AVX2 these shuffles bound its passes.
// 4-bit: the two halves' pairs of products are summed in 16 bits (at most 4 * 15 * 127);
// 8-bit: widened first (a pair reaches 2 * 128 * 127).
// P pairs of rows (rows r0 .. r0 + 2P - 1) share each block's broadcast weights (and for
// 8-bit their magnitudes |w|): the LM head's (8-bit) 4-row tiles take P = 2, 13-15% faster
// than tile_quant's 4 rows there (Zen 2: 49,152 x 576, 4 to 16 rows), where two calls of
// one pair each were 0-8% faster.
template <bool Q4BLOCKS, int P = 1>
static void tile_duo(const Matrix& w, int64_t t, const QuantRows& xq, int64_t r0, float* y, int64_t ldy) {
  const int64_t B = w.blocks(), K = w.cols;
  const float* D = w.d + t * B * TILE;
  const int8_t* X = xq.q.data() + r0 * K;
  const float* DX = xq.d.data() + r0 * B;
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const float* Mn = Q4BLOCKS ? w.m + t * B * TILE : nullptr;
  const float* SX = xq.s.data() + r0 * B;
  __m256 acc[P], minimum[P];  // per pair of rows, as tile_quant's
  for (int p = 0; p < P; p++) acc[p] = minimum[p] = _mm256_setzero_ps();
  for (int64_t b = 0; b < B; b++) {
    prefetch_tile_block<Q4BLOCKS>(w, t, b + PREFETCH_BLOCKS);
    if (Q4BLOCKS) {
      const __m256 m4 = _mm256_broadcast_ps((const __m128*)(Mn + b * TILE));
      for (int p = 0; p < P; p++) {
        const float* sx = SX + 2 * p * B + b;
        minimum[p] = _mm256_fmadd_ps(m4, _mm256_set_m128(_mm_broadcast_ss(sx + B), _mm_broadcast_ss(sx)), minimum[p]);
      }
    }
    __m256i xv[P][2];  // pair p, half h of the block: both rows
    for (int p = 0; p < P; p++)
      for (int h = 0; h < 2; h++) {
        const int8_t* row = X + 2 * p * K + b * QK + 16 * h;
        xv[p][h] = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i*)row)),
                                           _mm_loadu_si128((const __m128i*)(row + K)), 1);
      }
    __m256i s[P][TILE];  // per pair and output: 4 sums of 8 products per row
    for (int j = 0; j < TILE; j++) {
      if (Q4BLOCKS) {
        const uint8_t* raw = (const uint8_t*)w.raw + ((t * B + b) * TILE + j) * (QK / 2);
        const __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)raw));
        const __m256i lo = _mm256_and_si256(both, nibble);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(both, 4), nibble);
        for (int p = 0; p < P; p++)
          s[p][j] = _mm256_madd_epi16(
              _mm256_add_epi16(_mm256_maddubs_epi16(lo, xv[p][0]), _mm256_maddubs_epi16(hi, xv[p][1])), ones);
      } else {
        const int8_t* codes = (const int8_t*)w.raw + ((t * B + b) * TILE + j) * QK;
        for (int p = 0; p < P; p++) s[p][j] = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
          const __m256i wv = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(codes + 16 * h)));
          const __m256i magnitude = _mm256_sign_epi8(wv, wv);  // |w|, shared by the pairs
          for (int p = 0; p < P; p++)
            s[p][j] = _mm256_add_epi32(s[p][j], VS_DOT4(magnitude, _mm256_sign_epi8(xv[p][h], wv), ones));
        }
      }
    }
    const __m256 d4 = _mm256_broadcast_ps((const __m128*)(D + b * TILE));
    for (int p = 0; p < P; p++) {
      const __m256i sums =
          _mm256_hadd_epi32(_mm256_hadd_epi32(s[p][0], s[p][1]), _mm256_hadd_epi32(s[p][2], s[p][3]));
      const float* dx = DX + 2 * p * B + b;
      const __m256 dxs = _mm256_set_m128(_mm_broadcast_ss(dx + B), _mm_broadcast_ss(dx));
      acc[p] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(d4, dxs), acc[p]);
    }
  }
  float out[2 * P][TILE];
  for (int p = 0; p < P; p++)
    _mm256_storeu_ps(&out[2 * p][0], Q4BLOCKS ? _mm256_add_ps(acc[p], minimum[p]) : acc[p]);
  store_tile<2 * P>(w, t, out, y, ldy);
}
#endif

#ifdef VS_VNNI
// 2 to 4 rows times one tile on VNNI: the same integers, products and sums per (row, output)
// as tile_quant, hence the same results bit for bit, with fewer instructions per row.
// tile_quant reduces each row's 4 per-output vectors with three horizontal adds (six
// shuffle-port operations per row and block: the bound once rows share a tile). Here the
// tile's weights are transposed once per block by 8-byte groups: vector g holds bytes
// 8g..8g+7 of each of the 4 outputs, so one dpbusd against a row's 8 activations 8g..8g+7,
// broadcast to every quarter, serves all 4 outputs: after the block's four groups, lanes
// 2j and 2j + 1 hold output j's two partial sums, and one horizontal add per row gathers
// them into [o0 o1 o0 o1 | o2 o3 o2 o3] (o: output).
// 8-bit weights are signed, and dpbusd multiplies unsigned by signed bytes: the row's codes
// go in as q + 128 and 128 times the weights' sums (per output) come off again,
// exactly, in integers.
template <int R, bool Q4BLOCKS>
static void tile_quant_vnni(const Matrix& w, int64_t t, const QuantRows& xq, int64_t r0, float* y, int64_t ldy) {
  const int64_t B = w.blocks(), K = w.cols;
  const float* D = w.d + t * B * TILE;
  // The row's codes as dpbusd's other operand: signed against 4-bit weights, biased unsigned against 8-bit ones.
  const uint8_t* X = (Q4BLOCKS ? (const uint8_t*)xq.q.data() : xq.biased.data()) + r0 * K;
  const float* DX = xq.d.data() + r0 * B;
  const __m256i pairs = _mm256_setr_epi32(0, 1, 0, 1, 2, 3, 2, 3);  // d_w in the lanes' order
  const __m256i bias = _mm256_set1_epi8((char)0x80);
  __m256 acc[R];
  for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < B; b++) {
    __m256i wv[TILE];
    load_tile_block<Q4BLOCKS>(w, t, b, wv);
    // 4 x 4 transpose of 8-byte groups: v[g] = group g of outputs 0, 1, 2, 3.
    const __m256i lo01 = _mm256_unpacklo_epi64(wv[0], wv[1]), hi01 = _mm256_unpackhi_epi64(wv[0], wv[1]);
    const __m256i lo23 = _mm256_unpacklo_epi64(wv[2], wv[3]), hi23 = _mm256_unpackhi_epi64(wv[2], wv[3]);
    const __m256i v[4] = {_mm256_permute2x128_si256(lo01, lo23, 0x20), _mm256_permute2x128_si256(hi01, hi23, 0x20),
                          _mm256_permute2x128_si256(lo01, lo23, 0x31), _mm256_permute2x128_si256(hi01, hi23, 0x31)};
    __m256i offset = _mm256_setzero_si256();  // 128 x the weights' sums, 8-bit weights only
    if (!Q4BLOCKS) {
      __m256i z = _mm256_setzero_si256();
      for (int g = 0; g < 4; g++) z = VS_DPBUSD(z, bias, v[g]);
      offset = _mm256_hadd_epi32(z, z);
    }
    const __m256 dw = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(D + b * TILE)), pairs);
    for (int r = 0; r < R; r++) {
      __m256i part[2];  // two chains of two groups each (shorter dependency chains)
      for (int h = 0; h < 2; h++) {
        int64_t g0, g1;
        std::memcpy(&g0, X + r * K + b * QK + 16 * h, 8), std::memcpy(&g1, X + r * K + b * QK + 16 * h + 8, 8);
        const __m256i x0 = _mm256_set1_epi64x(g0), x1 = _mm256_set1_epi64x(g1), z = _mm256_setzero_si256();
        part[h] = Q4BLOCKS ? VS_DPBUSD(VS_DPBUSD(z, v[2 * h], x0), v[2 * h + 1], x1)  // u8 weights, s8 codes
                           : VS_DPBUSD(VS_DPBUSD(z, x0, v[2 * h]), x1, v[2 * h + 1]);  // u8 codes, s8 weights
      }
      const __m256i both = _mm256_add_epi32(part[0], part[1]);
      const __m256i sums = _mm256_sub_epi32(_mm256_hadd_epi32(both, both), offset);
      const __m256 scale = _mm256_mul_ps(dw, _mm256_broadcast_ss(DX + r * B + b));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scale, acc[r]);
    }
  }
  float out[R][TILE];
  for (int r = 0; r < R; r++) {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, acc[r]);
    out[r][0] = lanes[0], out[r][1] = lanes[1], out[r][2] = lanes[4], out[r][3] = lanes[5];
  }
  finish_tile<R, Q4BLOCKS>(w, t, xq, r0, out, y, ldy);
}
#endif

#ifdef VS_AVX2
// Q4 times 8 rows at once, the rows in the 8 lanes of a vector: the same arithmetic per
// (row, output) as tile_quant (each block's integer dot product, times d_w * d_x,
// accumulated over the blocks in order; then the minimums), so a row's result does not
// depend on which kernel ran it. The integer sums come from each output's 4 weights of a
// group broadcast against 4 activations of each row: maddubs, a block's 8 groups summed in
// 16 bits (at most 8 * 2 * 15 * 127 = 30480), then widened.
// Faster than tile_quant from 8 rows up: the weights' unpacking is shared by all row
// groups, and no horizontal adds are needed. ``codes`` is the tile's weights unpacked,
// [4 outputs][blocks][32] bytes.
static void tile_q4_lanes(const Matrix& w, int64_t t, const uint8_t* codes, const QuantRows& xq, int64_t grp,
                          float* y, int64_t ldy, int64_t rows) {
  const int64_t B = w.blocks();
  const float* D = w.d + t * B * TILE;
  const float* Mn = w.m + t * B * TILE;
  const int8_t* X = xq.q8.data() + grp * B * QK * LANES;
  const float* DX = xq.d8.data() + grp * B * LANES;
  const float* SX = xq.s8.data() + grp * B * LANES;
  [[maybe_unused]] const __m256i ones = _mm256_set1_epi16(1);
  alignas(32) float out[TILE][LANES];
  for (int j0 = 0; j0 < TILE; j0 += 2) {
    __m256 acc[2], minimum[2];
    for (int j = 0; j < 2; j++) acc[j] = minimum[j] = _mm256_setzero_ps();
    for (int64_t b = 0; b < B; b++) {
      __m256i sums[2];
      for (int j = 0; j < 2; j++) sums[j] = _mm256_setzero_si256();
      for (int g = 0; g < QK / 4; g++) {
        const __m256i xv = _mm256_loadu_si256((const __m256i*)(X + (b * (QK / 4) + g) * LANES * 4));
        for (int j = 0; j < 2; j++) {
          int32_t four;
          std::memcpy(&four, codes + ((j0 + j) * B + b) * QK + 4 * g, 4);
#ifdef VS_VNNI  // the same integers, summed in 32 bits in one instruction
          sums[j] = VS_DPBUSD(sums[j], _mm256_set1_epi32(four), xv);
#else
          sums[j] = _mm256_add_epi16(sums[j], _mm256_maddubs_epi16(_mm256_set1_epi32(four), xv));
#endif
        }
      }
      const __m256 dx = _mm256_loadu_ps(DX + b * LANES);
      const __m256 sx = _mm256_loadu_ps(SX + b * LANES);
      for (int j = 0; j < 2; j++) {
        const __m256 scale = _mm256_mul_ps(_mm256_set1_ps(D[b * TILE + j0 + j]), dx);
#ifdef VS_VNNI
        const __m256i wide = sums[j];
#else
        const __m256i wide = _mm256_madd_epi16(sums[j], ones);
#endif
        acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(wide), scale, acc[j]);
        minimum[j] = _mm256_fmadd_ps(_mm256_set1_ps(Mn[b * TILE + j0 + j]), sx, minimum[j]);
      }
    }
    for (int j = 0; j < 2; j++) _mm256_store_ps(out[j0 + j], _mm256_add_ps(acc[j], minimum[j]));
  }
  const int64_t valid = std::min<int64_t>(TILE, w.rows - t * TILE);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t j = 0; j < valid; j++) y[r * ldy + j] = out[j][r];
}

#ifdef VS_AVX2_NO_VNNI
// Q4 times 4 rows at once, for CPUs without VNNI: the same arithmetic per (row, output)
// as tile_quant, so a row's result does not depend on which kernel ran it. A vector's 8 lanes
// are (row, half of an 8-byte pair of groups): the rows' codes of bytes 8p..8p+7 of a block
// side by side (pack_quads), against the output's 8 weights there broadcast to every quarter.
// maddubs gives 2 products per 16-bit lane; the block's 4 pairs are summed in 16 bits (at most
// 4 * 2 * 15 * 127 = 15240), widened, and one horizontal add per 2 outputs gathers each row's
// two halves: [o0 r0, o0 r1, o1 r0, o1 r1 | o0 r2, o0 r3, o1 r2, o1 r3]. tile_quant spends
// three horizontal adds a row and block instead. ``codes`` is the tile's weights unpacked.
static void tile_q4_quads(const Matrix& w, int64_t t, const uint8_t* codes, const QuantRows& xq, float* y,
                          int64_t ldy) {
  const int64_t B = w.blocks();
  const int8_t* X = xq.q4x.data();
  const float* DX = xq.d4x.data();
  const float* SX = xq.s4x.data();
  const float* D = w.d + t * B * TILE;
  const float* Mn = w.m + t * B * TILE;
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i pairs = _mm256_setr_epi32(0, 0, 1, 1, 0, 0, 1, 1);  // [o0 o0 o1 o1 | o0 o0 o1 o1]
  __m256 acc[2], minimum[2];
  for (int h = 0; h < 2; h++) acc[h] = minimum[h] = _mm256_setzero_ps();
  for (int64_t b = 0; b < B; b++) {
    __m256i sums[TILE];
    for (int j = 0; j < TILE; j++) sums[j] = _mm256_setzero_si256();
    for (int64_t p = 0; p < QK / 8; p++) {
      const __m256i xv = _mm256_load_si256((const __m256i*)(X + (b * (QK / 8) + p) * QUAD * 8));
      for (int j = 0; j < TILE; j++) {
        int64_t eight;
        std::memcpy(&eight, codes + (j * B + b) * QK + 8 * p, 8);
        sums[j] = _mm256_add_epi16(sums[j], _mm256_maddubs_epi16(_mm256_set1_epi64x(eight), xv));
      }
    }
    const __m256 dx = _mm256_loadu_ps(DX + b * 2 * QUAD);
    const __m256 sx = _mm256_loadu_ps(SX + b * 2 * QUAD);
    for (int h = 0; h < 2; h++) {  // outputs 2h, 2h + 1
      const __m256i both =
          _mm256_hadd_epi32(_mm256_madd_epi16(sums[2 * h], ones), _mm256_madd_epi16(sums[2 * h + 1], ones));
      double dw, mw;  // the two outputs' d (and m) as one 8-byte load
      std::memcpy(&dw, D + b * TILE + 2 * h, 8), std::memcpy(&mw, Mn + b * TILE + 2 * h, 8);
      const __m256 dv = _mm256_permutevar8x32_ps(_mm256_castpd_ps(_mm256_set1_pd(dw)), pairs);
      const __m256 mv = _mm256_permutevar8x32_ps(_mm256_castpd_ps(_mm256_set1_pd(mw)), pairs);
      acc[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(both), _mm256_mul_ps(dv, dx), acc[h]);
      minimum[h] = _mm256_fmadd_ps(mv, sx, minimum[h]);
    }
  }
  alignas(32) float out[2][8];
  for (int h = 0; h < 2; h++) _mm256_store_ps(out[h], _mm256_add_ps(acc[h], minimum[h]));
  const int64_t valid = std::min<int64_t>(TILE, w.rows - t * TILE);
  static const int lane[QUAD][2] = {{0, 2}, {1, 3}, {4, 6}, {5, 7}};  // (row, output within the pair)
  for (int64_t r = 0; r < QUAD; r++)
    for (int64_t j = 0; j < valid; j++) y[r * ldy + j] = out[j / 2][lane[r][j % 2]];
}
#endif

// The tile's 4-bit codes as bytes, [4 outputs][blocks][32] (weights 0..31 of each block).
static void unpack_q4_tile(const Matrix& w, int64_t t, uint8_t* codes) {
  const int64_t B = w.blocks();
  for (int64_t j = 0; j < TILE; j++)
    for (int64_t b = 0; b < B; b++) {
      const __m256i both = unpack_q4_block((const uint8_t*)w.raw + ((t * B + b) * TILE + j) * (QK / 2));
      _mm256_storeu_si256((__m256i*)(codes + (j * B + b) * QK), both);
    }
}
#endif

// Float: per column group of 8, w * x accumulated per lane (lane = column mod 8).
template <int R, int64_t FMT>
static void tile_float(const Matrix& w, int64_t t, const float* x, int64_t r0, float* y, int64_t ldy) {
  const int64_t K = w.cols, G = K / FK;
  const float* X = x + r0 * K;
  float out[R][TILE];
#ifdef VS_AVX2
  __m256 acc[TILE][R];
  for (int j = 0; j < TILE; j++)
    for (int r = 0; r < R; r++) acc[j][r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < G; g++) {
    __m256 wv[TILE];
    for (int j = 0; j < TILE; j++) {
      int64_t at = ((t * G + g) * TILE + j) * FK;
      if (FMT == BF16) {
        __m128i raw = _mm_loadu_si128((const __m128i*)((const uint16_t*)w.raw + at));
        wv[j] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
      } else if (FMT == F16) {
        wv[j] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)((const uint16_t*)w.raw + at)));
      } else {
        wv[j] = _mm256_loadu_ps((const float*)w.raw + at);
      }
    }
    for (int r = 0; r < R; r++) {
      __m256 xv = _mm256_loadu_ps(X + r * K + g * FK);
      for (int j = 0; j < TILE; j++) acc[j][r] = _mm256_fmadd_ps(wv[j], xv, acc[j][r]);
    }
  }
  for (int r = 0; r < R; r++)
    for (int j = 0; j < TILE; j++) out[r][j] = hsum8(acc[j][r]);
#else
  float acc[TILE][R][8] = {};
  for (int64_t g = 0; g < G; g++)
    for (int j = 0; j < TILE; j++)
      for (int l = 0; l < 8; l++) {
        float wl = float_value(w, ((t * G + g) * TILE + j) * FK + l);
        for (int r = 0; r < R; r++) acc[j][r][l] = std::fma(wl, X[r * K + g * FK + l], acc[j][r][l]);
      }
  for (int r = 0; r < R; r++)
    for (int j = 0; j < TILE; j++) out[r][j] = hsum8(acc[j][r]);
#endif
  int64_t valid = std::min<int64_t>(TILE, w.rows - t * TILE);
  for (int r = 0; r < R; r++)
    for (int j = 0; j < valid; j++) y[r * ldy + j] = out[r][j];
}

template <int R>
static void run_tile(const Matrix& w, int64_t t, const float* x, const QuantRows& xq, int64_t r0, float* y,
                     int64_t ldy) {
#ifdef VS_VNNI
  if (R >= 2 && w.format == Q4) return tile_quant_vnni<R, true>(w, t, xq, r0, y, ldy);
  if (R >= 2 && w.format == Q8_0) return tile_quant_vnni<R, false>(w, t, xq, r0, y, ldy);
#endif
#ifdef VS_AVX2_NO_VNNI
  // 2 rows in tile_duo; 3 as 2 there and 1 in tile_quant (the tile's weights are in L1 by then).
  if ((R == 2 || R == 3) && (w.format == Q4 || w.format == Q8_0)) {
    if (w.format == Q4)
      tile_duo<true>(w, t, xq, r0, y, ldy);
    else
      tile_duo<false>(w, t, xq, r0, y, ldy);
    if (R == 3) run_tile<1>(w, t, x, xq, r0 + 2, y + 2 * ldy, ldy);
    return;
  }
  // 8-bit, 4 rows: two pairs in one pass over the block, sharing each broadcast and |w|.
  if (R == 4 && w.format == Q8_0) return tile_duo<false, 2>(w, t, xq, r0, y, ldy);
#endif
  switch (w.format) {
    case Q4: tile_quant<R, true>(w, t, xq, r0, y, ldy); break;
    case Q8_0: tile_quant<R, false>(w, t, xq, r0, y, ldy); break;
    case BF16: tile_float<R, BF16>(w, t, x, r0, y, ldy); break;
    case F16: tile_float<R, F16>(w, t, x, r0, y, ldy); break;
    default: tile_float<R, F32>(w, t, x, r0, y, ldy); break;
  }
}

// Work below this many multiply-adds runs on the calling thread: waking a second thread
// costs more than it saves (and far more on a busy machine, where it may wait for a core).
constexpr int64_t MIN_PARALLEL_WORK = 1 << 16;

static void add_bias(const Matrix& w, int64_t M, float* y, int64_t ldy) {
  if (w.b != nullptr) {
    for (int64_t r = 0; r < M; r++)
      for (int64_t n = 0; n < w.rows; n++) y[r * ldy + n] += w.b[n];
  }
}

// Where the CPU has AVX-512 VNNI, quantised passes run on the wide layout (prepack_wide):
// passes of up to wide_max_rows() rows on its VNNI kernel (matmul_wide_rows), and where it
// also has AMX tiles, passes of at least AMX_MIN_ROWS rows on tile products (matmul_amx);
// set_amx_min_rows moves the tiles' threshold (-1: this default; 0: neither, the vector
// kernels on every pass). Whole passes of the embedded model on 2 cores at 500 tokens of
// context (benchmarks/verify_cost.py: native, native-amx2 = tiles from 2 rows,
// native-vector; medians of 12, interleaved), Sapphire Rapids: 1 row 6.9 / 6.7 / 8.5 ms,
// 2 rows 7.4 / 9.5 / 10.9, 5 rows 9.3 / 10.5 / 18.8, 8 rows 10.9 / 12.1 / 16.0, 9 rows
// 13.5 / 13.6 / 18.4, 16 rows 18.1 / 18.0 / 25.6. A tile product takes 16 rows whatever
// the pass has; the VNNI kernel's work grows with its rows. Without tiles (AMD Zen 4, 2
// cores, same measure, native / native-vector): 1 row 5.5 / 6.5 ms, 8 rows 12.9 / 19.8,
// 16 rows 21.9 / 33.4, 64 rows 73.1 / 119.9, 128 rows 142 / 226: the VNNI kernel at every size.
static std::atomic<int64_t> amx_min_rows_{-1};
constexpr int64_t AMX_MIN_ROWS = 9;
constexpr int64_t WIDE_ROWS_MAX = 8;  // with tiles; without, the VNNI kernel takes every pass
constexpr int64_t WIDE_OUTPUTS = 16;  // outputs per group of the wide layout
// Rows per call of the wide layout's kernel (a group's weights stay in L1 between calls).
// With AVX-512 VNNI, 4: from 7 rows the kernel's accumulators (2 a row for Q4) and the
// unpacked weights outgrow the 32 registers. Zen 4, 2 cores, whole verify passes at 400
// tokens against chunks of 8 (verify_cost.py, old and new builds alternating, 2 pairs): 5 rows
// 4-11% faster, 8 rows 8-12%, 9 rows 14-16%, 16 rows 7-10%; 1-4 rows the same code. A last
// chunk of 5 or 6 rows (WIDE_MERGE, below) was measured on Zen 5 only; where AMX tiles take
// passes from 9 rows, rows 5-6 run as one chunk too (not measured there).
// With AVX2 alone (Zen 2), 8, as measured there.
#ifdef VS_WIDE_AVX2
constexpr int64_t WIDE_CHUNK = 8, WIDE_MERGE = 0;
#else
// Zen 5, 2 cores, whole verify passes at 40 and 300 tokens of context (verify_cost.py, builds
// alternating): 5 rows as one chunk instead of 4 + 1, 6 as one instead of 4 + 2 and 9-10 as
// 4 + 5-6 took 3-6% less time (at 40 tokens, 5 rows 1.12-1.14x a single row's pass against
// 1.17-1.18x, 9 rows 1.47-1.50x against 1.56x). Chunks of 8 cost more from 7 rows (8 rows
// 4.2 ms against 3.6, 16 rows 7.7 against 6.4): there the registers run out.
constexpr int64_t WIDE_CHUNK = 4, WIDE_MERGE = 2;
#endif
// The most rows the AVX2 kernel of the wide layout takes: from there the lanes kernel is as
// fast (AMD Zen 2, 2 cores, whole verify passes against the vector kernels: 8 rows 7% faster,
// 16 level, 64 5% slower).
constexpr int64_t WIDE_AVX2_ROWS_MAX = 16;
#ifdef VS_AMX
// ---------------------------------------------------------------------------------------
// AMX (Intel's tile matrix unit): 16 rows x 16 outputs of a quantised matrix at a time.
// One tile instruction gives the exact integer dot products of 16 rows' and 16 outputs'
// codes over a block: the very integers the other kernels sum (integer sums do not depend
// on their order). The float steps then follow tile_quant's per (row, output) order: each
// block's integer times d_w * d_x accumulated over the blocks in order, then Q4's minimums:
// bit for bit tile_quant's results, so which kernel ran a row never shows
// (tests/native/test_kernels.py; the load-time self-test).
//
// Weights in the wide layout (prepack_wide, at load; a second copy beside the packed tiles):
// per group of 16 outputs and block, row k of a tile holds bytes 4k .. 4k + 3 of each
// output's codes. The rows' codes are read in place (row r of a tile is row r's block). The
// integer work is the tile unit's; the float steps (a convert and a fused multiply-add per
// row and block, 16 outputs a vector) and the tile stores share the bound.

constexpr int64_t AMX_ROWS = 16;

struct TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0, 1: two blocks' sums (16 x 16 int32); 2, 3: their rows' codes (16 x 32 bytes);
// 4, 5: their weights (8 x 64 bytes).
static void load_amx_config() {
  alignas(64) TileConfig config;
  for (int i = 0; i < 2; i++) config.rows[i] = AMX_ROWS, config.colsb[i] = 4 * WIDE_OUTPUTS;
  for (int i = 2; i < 4; i++) config.rows[i] = AMX_ROWS, config.colsb[i] = QK;
  for (int i = 4; i < 6; i++) config.rows[i] = QK / 4, config.colsb[i] = 4 * WIDE_OUTPUTS;
  _tile_loadconfig(&config);
}

// Rows r0 .. r0 + R times group g, the group's weight tiles at ``tiles`` ([blocks][8][64]
// bytes); ``xa``: row r0's codes, a row every K bytes (the tiles read 16 rows: those past R
// are padding, their sums dropped). Every tile a block uses has a twin for the
// next block, so the tile unit works on block b + 1 while the vector unit scales block
// b - 1's sums (stored an iteration earlier, so the vector loads never wait on the tile
// store), and the R accumulators stay in registers.
// R: the chunk's rows, 1 to 16 (a last chunk of 1 row takes the tile products of 16, but
// scales and stores 1).
template <bool Q4BLOCKS, int R>
static void amx_chunk(const Matrix& w, int64_t g, const uint8_t* tiles, const int8_t* xa, const QuantRows& xq,
                      int64_t r0, float* y, int64_t ldy) {
  const int64_t B = w.blocks(), K = w.cols;
  const float* DX = xq.d.data() + r0 * B;
  const float* dw = w.wide_d + g * B * WIDE_OUTPUTS;
  alignas(64) int32_t sums[2][AMX_ROWS][WIDE_OUTPUTS];  // one per accumulator tile
  __m512 acc[R];
  for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
  // Q4: signed codes of the rows times unsigned 4-bit weights; Q8: both signed.
#define VS_AMX_ISSUE(b, c, a, wt)          \
  do {                                     \
    _tile_loadd(a, xa + (b) * QK, K);      \
    _tile_loadd(wt, tiles + (b) * 512, 64); \
    _tile_zero(c);                         \
    if (Q4BLOCKS)                          \
      _tile_dpbsud(c, a, wt);              \
    else                                   \
      _tile_dpbssd(c, a, wt);              \
  } while (0)
#define VS_AMX_SCALE(b, s)                                                                              \
  do {                                                                                                  \
    const __m512 d = _mm512_loadu_ps(dw + (b) * WIDE_OUTPUTS);                                          \
    for (int r = 0; r < R; r++) {                                                                       \
      const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(DX[r * B + (b)]));                           \
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(sums[s][r])), scale, acc[r]);       \
    }                                                                                                   \
  } while (0)
  // The tile unit runs its instructions in order: a block's sums are stored before the next
  // block's product is issued, which then runs while the vector unit scales the block before:
  // sums stored a block earlier, so the vector loads never wait for the tile store.
  VS_AMX_ISSUE(0, 0, 2, 4);
  for (int64_t b = 0; b < B; b += 2) {
    _tile_stored(0, sums[0], 4 * WIDE_OUTPUTS);
    if (b + 1 < B) VS_AMX_ISSUE(b + 1, 1, 3, 5);
    if (b > 0) VS_AMX_SCALE(b - 1, 1);
    if (b + 1 < B) {
      _tile_stored(1, sums[1], 4 * WIDE_OUTPUTS);
      if (b + 2 < B) VS_AMX_ISSUE(b + 2, 0, 2, 4);
      VS_AMX_SCALE(b, 0);
    }
  }
  if (B % 2)
    VS_AMX_SCALE(B - 1, 0);
  else
    VS_AMX_SCALE(B - 1, 1);
#undef VS_AMX_ISSUE
#undef VS_AMX_SCALE
  const int64_t valid = std::min<int64_t>(WIDE_OUTPUTS, w.rows - g * WIDE_OUTPUTS);
  const __mmask16 store = (__mmask16)((1u << valid) - 1);
  for (int r = 0; r < R; r++) {
    __m512 out = acc[r];
    if (Q4BLOCKS) {
      const float* mw = w.wide_m + g * B * WIDE_OUTPUTS;
      const float* SX = xq.s.data() + (r0 + r) * B;
      __m512 minimum = _mm512_setzero_ps();
      for (int64_t b = 0; b < B; b++)
        minimum = _mm512_fmadd_ps(_mm512_loadu_ps(mw + b * WIDE_OUTPUTS), _mm512_set1_ps(SX[b]), minimum);
      out = _mm512_add_ps(out, minimum);
    }
    _mm512_mask_storeu_ps(y + (r0 + r) * ldy + g * WIDE_OUTPUTS, store, out);
  }
}

// y = x W^T for the rows quantised in xq (M of them), by groups of 16 outputs over threads.
template <bool Q4BLOCKS>
static void matmul_amx(const Matrix& w, QuantRows& xq, int64_t M, float* y, int64_t ldy) {
  const int64_t K = w.cols, B = w.blocks(), chunks = (M + AMX_ROWS - 1) / AMX_ROWS;
  // A last chunk's tile loads read whole 16 rows: the codes padded (with anything: those
  // rows' sums are dropped).
  xq.q.resize(chunks * AMX_ROWS * K);
  const int64_t groups = (w.rows + WIDE_OUTPUTS - 1) / WIDE_OUTPUTS;
  const int64_t grain = std::max<int64_t>(1, MIN_PARALLEL_WORK / (WIDE_OUTPUTS * K * M));
  parallel_for(0, groups, grain, [&](int64_t g0, int64_t g1) {
    load_amx_config();
    // Q4: a group's 4-bit codes unpacked to the halves' byte tiles, once for all chunks.
    std::vector<uint8_t> storage(Q4BLOCKS ? B * 512 + 64 : 0);
    uint8_t* unpacked = (uint8_t*)(((uintptr_t)storage.data() + 63) & ~(uintptr_t)63);
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int64_t g = g0; g < g1; g++) {
      const uint8_t* tiles = w.wide_codes + g * B * (Q4BLOCKS ? 256 : 512);
      if (Q4BLOCKS) {
        for (int64_t b = 0; b < B; b++)
          for (int k = 0; k < 4; k++) {
            const __m512i v = _mm512_loadu_si512(tiles + b * 256 + 64 * k);
            _mm512_store_si512(unpacked + b * 512 + 64 * k, _mm512_and_si512(v, low));
            _mm512_store_si512(unpacked + b * 512 + 256 + 64 * k, _mm512_and_si512(_mm512_srli_epi16(v, 4), low));
          }
        tiles = unpacked;
      }
      for (int64_t c = 0; c < chunks; c++) {
        const int8_t* codes = xq.q.data() + c * AMX_ROWS * K;
        const int64_t r0 = c * AMX_ROWS, rows = std::min<int64_t>(AMX_ROWS, M - r0);
        // The float steps are a bound: a chunk scales only its own rows.
#define VS_AMX_ROWS(R)                                             \
  case R:                                                          \
    amx_chunk<Q4BLOCKS, R>(w, g, tiles, codes, xq, r0, y, ldy); \
    break
        switch (rows) {
          VS_AMX_ROWS(1);
          VS_AMX_ROWS(2);
          VS_AMX_ROWS(3);
          VS_AMX_ROWS(4);
          VS_AMX_ROWS(5);
          VS_AMX_ROWS(6);
          VS_AMX_ROWS(7);
          VS_AMX_ROWS(8);
          VS_AMX_ROWS(9);
          VS_AMX_ROWS(10);
          VS_AMX_ROWS(11);
          VS_AMX_ROWS(12);
          VS_AMX_ROWS(13);
          VS_AMX_ROWS(14);
          VS_AMX_ROWS(15);
          default:
            amx_chunk<Q4BLOCKS, 16>(w, g, tiles, codes, xq, r0, y, ldy);
        }
#undef VS_AMX_ROWS
      }
    }
    _tile_release();
  });
}

#endif

#ifdef VS_WIDE_AVX2
// Up to 8 rows times a group of 16 outputs of a 4-bit matrix on the wide layout, with AVX2
// and no VNNI: each half of a tile row (8 outputs x 4 codes) against 4 of a row's codes
// broadcast; maddubs gives pairs of products, a block's 8 groups are summed in 16 bits (at
// most 8 * 2 * 15 * 127 = 30480) and widened once, so no horizontal adds (tile_quant's bound
// on AVX2) and one unpacking of the weights for all the rows. The same integers and float
// steps, in tile_quant's order, as every kernel. (8-bit matrices keep the vector kernels:
// with |w| against sign-moved codes, widened per group, this kernel measured slower there.)
template <bool Q4BLOCKS, int R, bool HALVES>
static void wide_rows(const Matrix& w, int64_t g, const QuantRows& xq, int64_t r0, float* y, int64_t ldy) {
  static_assert(Q4BLOCKS && HALVES, "the AVX2 wide layout holds 4-bit matrices, scales as float16");
  const int64_t B = w.blocks(), K = w.cols;
  const uint8_t* tiles = w.wide_codes + g * B * 256;
  const uint16_t* halves = w.wide_halves + g * B * 2 * WIDE_OUTPUTS;  // [B][scales 16, minimums 16]
  const float* DX = xq.d.data() + r0 * B;
  const float* SX = xq.s.data() + r0 * B;
  const int8_t* X = xq.q.data() + r0 * K;
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  __m256 acc[R][2], minimum[R][2];
  for (int r = 0; r < R; r++)
    for (int h = 0; h < 2; h++) acc[r][h] = minimum[r][h] = _mm256_setzero_ps();
  for (int64_t b = 0; b < B; b++) {
    // The block PREFETCH_BLOCKS on (past the group's last, the next group's: the same
    // thread's next, mostly): its 4 lines of codes and its line of scales and minimums.
    const int64_t ahead = b + PREFETCH_BLOCKS;
    for (int c = 0; c < 4; c++) _mm_prefetch((const char*)(tiles + ahead * 256 + 64 * c), WEIGHT_HINT);
    _mm_prefetch((const char*)(halves + ahead * 2 * WIDE_OUTPUTS), WEIGHT_HINT);
    for (int h = 0; h < 2; h++) {  // outputs 8h .. 8h + 7
      __m256i wv[QK / 4];          // wv[k]: codes 4k .. 4k + 3 of the 8 outputs
      for (int k = 0; k < 4; k++) {
        const __m256i v = _mm256_load_si256((const __m256i*)(tiles + b * 256 + 64 * k + 32 * h));
        wv[k] = _mm256_and_si256(v, low), wv[4 + k] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
      }
      const uint16_t* half = halves + b * 2 * WIDE_OUTPUTS + 8 * h;
      const __m256 d = _mm256_cvtph_ps(_mm_load_si128((const __m128i*)half));
      const __m256 mins = _mm256_cvtph_ps(_mm_load_si128((const __m128i*)(half + WIDE_OUTPUTS)));
      for (int r = 0; r < R; r++) {
        const int8_t* x = X + r * K + b * QK;
        __m256i sums = _mm256_setzero_si256();
        for (int k = 0; k < 8; k++) {
          int32_t four;
          std::memcpy(&four, x + 4 * k, 4);
          sums = _mm256_add_epi16(sums, _mm256_maddubs_epi16(wv[k], _mm256_set1_epi32(four)));
        }
        const __m256 scale = _mm256_mul_ps(d, _mm256_set1_ps(DX[r * B + b]));
        acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(sums, ones)), scale, acc[r][h]);
        // the minimums in block order too, apart from the products
        minimum[r][h] = _mm256_fmadd_ps(mins, _mm256_set1_ps(SX[r * B + b]), minimum[r][h]);
      }
    }
  }
  const int64_t valid = std::min<int64_t>(WIDE_OUTPUTS, w.rows - g * WIDE_OUTPUTS);
  for (int r = 0; r < R; r++) {
    float* out = y + (r0 + r) * ldy + g * WIDE_OUTPUTS;
    for (int h = 0; h < 2; h++) {
      const __m256 v = _mm256_add_ps(acc[r][h], minimum[r][h]);
      if (valid >= 8 * (h + 1)) {
        _mm256_storeu_ps(out + 8 * h, v);
      } else {
        alignas(32) float part[8];
        _mm256_store_ps(part, v);
        for (int64_t n = 8 * h; n < valid; n++) out[n] = part[n - 8 * h];
      }
    }
  }
}
#elif defined(VS_WIDE)
// Up to 8 rows times a group of 16 outputs on the wide layout, with AVX-512 VNNI:
// a tile row of weights is one vector whose lane n holds 4 codes of output n, so one dpbusd
// against 4 of a row's codes, broadcast, adds to all 16 outputs' block sums at once; no
// horizontal adds (tile_quant's bound for a single row), and the weights' unpacking is shared
// by the rows. The same integers and float steps, in tile_quant's order, as every kernel.
// 8-bit weights are signed, and dpbusd multiplies unsigned by signed bytes: the row's codes
// go in as q + 128 and 128 times the weights' sums (per output) come off again, exactly.
//
// The first chunk of a group's rows prefetches the weights WIDE_PREFETCH_BLOCKS blocks ahead
// (past the group's last block, the next group's: the layout is one stream), non-temporal
// (WEIGHT_HINT): the hardware prefetchers alone fell behind on the short stretches each
// thread claims. Later chunks find the group in L1. Zen 4, 2 cores, whole passes at 400
// tokens of context, distances interleaved in one process (medians of 9, ms): none 1 row
// 2.65, 4 rows 4.04, 8 rows 5.96, 16 rows 10.2; 16 blocks ahead 2.28, 3.34, 4.66, 8.23; 4 and
// 8 ahead gained less, 24 and 32 as much as 16, 48 and 64 less; T0 hints level with NTA.
constexpr int64_t WIDE_PREFETCH_BLOCKS = 16;

// HALVES: the layout with each block's scales and minimums as float16 right after its codes
// (wide_stride bytes a block), else the float32 arrays wide_d and wide_m.
template <bool Q4BLOCKS, int R, bool HALVES>
static void wide_rows(const Matrix& w, int64_t g, const QuantRows& xq, int64_t r0, float* y, int64_t ldy) {
  const int64_t B = w.blocks(), K = w.cols;
  constexpr int64_t CODE_BYTES = Q4BLOCKS ? 256 : 512;  // a block's codes for the group's 16 outputs
  const int64_t stride = HALVES ? w.wide_stride : CODE_BYTES;
  const uint8_t* tiles = w.wide_codes + g * B * stride;
  const float* dw = HALVES ? nullptr : w.wide_d + g * B * WIDE_OUTPUTS;
  const float* mw = HALVES || !Q4BLOCKS ? nullptr : w.wide_m + g * B * WIDE_OUTPUTS;
  const float* DX = xq.d.data() + r0 * B;
  const float* SX = xq.s.data() + r0 * B;
  const int8_t* X = xq.q.data() + r0 * K;
  const __m512i low = _mm512_set1_epi8(0x0F), bias = _mm512_set1_epi8((char)0x80);
  __m512 acc[R], minimum[R];
  for (int r = 0; r < R; r++) acc[r] = minimum[r] = _mm512_setzero_ps();
  const bool fetch = r0 == 0;
  for (int64_t b = 0; b < B; b++) {
    const uint8_t* block = tiles + b * stride;
    if (fetch) {  // prefetches never fault: past the matrix's end they read nothing it needs
      const int64_t ahead = b + WIDE_PREFETCH_BLOCKS;
      const char* codes = (const char*)(tiles + ahead * stride);
      for (int64_t c = 0; c < (HALVES ? stride : CODE_BYTES); c += 64) _mm_prefetch(codes + c, WEIGHT_HINT);
      if (!HALVES) {
        _mm_prefetch((const char*)(dw + ahead * WIDE_OUTPUTS), WEIGHT_HINT);
        if (Q4BLOCKS) _mm_prefetch((const char*)(mw + ahead * WIDE_OUTPUTS), WEIGHT_HINT);
      }
    }
    __m512i wv[QK / 4];  // wv[k]: codes 4k .. 4k + 3 of the 16 outputs
    if (Q4BLOCKS) {
      for (int k = 0; k < 4; k++) {
        const __m512i v = _mm512_loadu_si512(block + 64 * k);
        wv[k] = _mm512_and_si512(v, low), wv[4 + k] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      }
    } else {
      for (int k = 0; k < 8; k++) wv[k] = _mm512_loadu_si512(block + 64 * k);
    }
    __m512i offset = _mm512_setzero_si512();  // 128 x the weights' sums, 8-bit weights only
    if (!Q4BLOCKS)
      for (int k = 0; k < 8; k++) offset = _mm512_dpbusd_epi32(offset, bias, wv[k]);
    const __m512 d = HALVES ? _mm512_cvtph_ps(_mm256_load_si256((const __m256i*)(block + CODE_BYTES)))
                            : _mm512_loadu_ps(dw + b * WIDE_OUTPUTS);
    __m512 mins = _mm512_setzero_ps();
    if (Q4BLOCKS)
      mins = HALVES ? _mm512_cvtph_ps(_mm256_load_si256((const __m256i*)(block + CODE_BYTES + 32)))
                    : _mm512_loadu_ps(mw + b * WIDE_OUTPUTS);
    for (int r = 0; r < R; r++) {
      const int8_t* x = X + r * K + b * QK;
      __m512i part[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};  // two shorter chains
      for (int k = 0; k < 8; k++) {
        int32_t four;
        std::memcpy(&four, x + 4 * k, 4);
        const __m512i xv = _mm512_set1_epi32(four);
        part[k % 2] = Q4BLOCKS ? _mm512_dpbusd_epi32(part[k % 2], wv[k], xv)  // u8 weights, s8 codes
                               : _mm512_dpbusd_epi32(part[k % 2], _mm512_xor_si512(xv, bias), wv[k]);  // u8 codes
      }
      __m512i sums = _mm512_add_epi32(part[0], part[1]);
      if (!Q4BLOCKS) sums = _mm512_sub_epi32(sums, offset);
      const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(DX[r * B + b]));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), scale, acc[r]);
      if (Q4BLOCKS)  // the minimums in block order too, apart from the products
        minimum[r] = _mm512_fmadd_ps(mins, _mm512_set1_ps(SX[r * B + b]), minimum[r]);
    }
  }
  const int64_t valid = std::min<int64_t>(WIDE_OUTPUTS, w.rows - g * WIDE_OUTPUTS);
  const __mmask16 store = (__mmask16)((1u << valid) - 1);
  for (int r = 0; r < R; r++) {
    const __m512 out = Q4BLOCKS ? _mm512_add_ps(acc[r], minimum[r]) : acc[r];
    _mm512_mask_storeu_ps(y + (r0 + r) * ldy + g * WIDE_OUTPUTS, store, out);
  }
}

// Rows r0 .. r0 + R times the two groups g and g + 1 of a 4-bit matrix in the layout with the
// float16 line (wide_stride): each of a row's 4-code broadcasts feeds both groups' dpbusd, and
// the block's row scale is broadcast once for both, so a pass with many rows issues ~30% fewer
// instructions a product than wide_rows. Each output's float steps are wide_rows' (the same
// products, converted, scaled and added block by block; the minimums in a chain of their own,
// added last), so the bits are too. The minimums run in a second sweep over the group's lines
// (still in L1): their accumulators would not fit in the registers beside the sums.
// CHAINS: dpbusd chains a (row, group) and block; 2 hide dpbusd's latency where 4 rows give
// 8 accumulators, 1 keeps 5 or 6 rows' 10-12 in the registers.
// Measured alone (Zen 5, one thread, a 3072 x 576 and a 576 x 1536 matrix, 120 rows, L2
// resident; dpbusd's peak is 554-575 GMAC/s a thread): wide_rows in chunks of 4 rows 327-339
// GMAC/s; 2 groups x 4 rows 365-377, x 6 rows 364-386; 4 groups x 2-4 rows 342-373. Without
// the float steps 2 groups x 4 rows reach 443-456: those steps (a convert, a multiply and two
// fused adds a row, group and block beside 8 dpbusd, which share their pipes), not the loads,
// keep the kernel at ~2/3 of the peak.
template <int R, int CHAINS>
static void wide_rows_pair(const Matrix& w, int64_t g, const QuantRows& xq, int64_t r0, float* y, int64_t ldy) {
  constexpr int64_t CODE_BYTES = 256;
  const int64_t B = w.blocks(), K = w.cols, stride = w.wide_stride;
  const uint8_t* tiles[2] = {w.wide_codes + g * B * stride, w.wide_codes + (g + 1) * B * stride};
  const float* DX = xq.d.data() + r0 * B;
  const float* SX = xq.s.data() + r0 * B;
  const int8_t* X = xq.q.data() + r0 * K;
  const __m512i low = _mm512_set1_epi8(0x0F);
  __m512 acc[R][2];
  for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  const bool fetch = r0 == 0;
  for (int64_t b = 0; b < B; b++) {
    if (fetch) {  // as wide_rows, in both groups; past their last block, the next pair's
      const int64_t ahead = b + WIDE_PREFETCH_BLOCKS < B ? b + WIDE_PREFETCH_BLOCKS : b + WIDE_PREFETCH_BLOCKS + B;
      for (int j = 0; j < 2; j++) {
        const char* codes = (const char*)(tiles[j] + ahead * stride);
        for (int64_t c = 0; c < stride; c += 64) _mm_prefetch(codes + c, WEIGHT_HINT);
      }
    }
    __m512i part[R][2][CHAINS];
    for (int r = 0; r < R; r++)
      for (int j = 0; j < 2; j++)
        for (int c = 0; c < CHAINS; c++) part[r][j][c] = _mm512_setzero_si512();
    for (int k = 0; k < 4; k++) {  // a load's low nibbles are codes 4k.., its high ones 16 + 4k..
      __m512i lo[2], hi[2];
      for (int j = 0; j < 2; j++) {
        const __m512i v = _mm512_loadu_si512(tiles[j] + b * stride + 64 * k);
        lo[j] = _mm512_and_si512(v, low), hi[j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      }
      for (int r = 0; r < R; r++) {
        const int8_t* x = X + r * K + b * QK;
        int32_t first, second;
        std::memcpy(&first, x + 4 * k, 4);
        std::memcpy(&second, x + 16 + 4 * k, 4);
        const __m512i xf = _mm512_set1_epi32(first), xs = _mm512_set1_epi32(second);
        for (int j = 0; j < 2; j++) {
          __m512i& sum = part[r][j][k % CHAINS];
          sum = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(sum, lo[j], xf), hi[j], xs);
        }
      }
    }
    __m512 d[2];
    for (int j = 0; j < 2; j++) d[j] = _mm512_cvtph_ps(_mm256_load_si256((const __m256i*)(tiles[j] + b * stride + CODE_BYTES)));
    for (int r = 0; r < R; r++) {
      const __m512 dx = _mm512_set1_ps(DX[r * B + b]);
      for (int j = 0; j < 2; j++) {
        __m512i sums = part[r][j][0];
        for (int c = 1; c < CHAINS; c++) sums = _mm512_add_epi32(sums, part[r][j][c]);
        acc[r][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), _mm512_mul_ps(d[j], dx), acc[r][j]);
      }
    }
  }
  for (int j = 0; j < 2; j++) {
    __m512 minimum[R];
    for (int r = 0; r < R; r++) minimum[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < B; b++) {
      const __m512 mins = _mm512_cvtph_ps(_mm256_load_si256((const __m256i*)(tiles[j] + b * stride + CODE_BYTES + 32)));
      for (int r = 0; r < R; r++) minimum[r] = _mm512_fmadd_ps(mins, _mm512_set1_ps(SX[r * B + b]), minimum[r]);
    }
    const int64_t valid = std::min<int64_t>(WIDE_OUTPUTS, w.rows - (g + j) * WIDE_OUTPUTS);
    const __mmask16 store = (__mmask16)((1u << valid) - 1);
    for (int r = 0; r < R; r++)
      _mm512_mask_storeu_ps(y + (r0 + r) * ldy + (g + j) * WIDE_OUTPUTS, store, _mm512_add_ps(acc[r][j], minimum[r]));
  }
}

#endif

#ifdef VS_WIDE
// Group g's M rows, wide_rows in chunks of at most WIDE_CHUNK (a group's weights stay in L1
// between chunks).
template <bool Q4BLOCKS, bool HALVES>
static void wide_group(const Matrix& w, int64_t g, const QuantRows& xq, int64_t M, float* y, int64_t ldy) {
  for (int64_t r0 = 0, rows = 0; r0 < M; r0 += rows) {
    // A last 1 or 2 rows join the chunk before them (WIDE_MERGE): one more read and
    // unpacking of the group's weights for 1-2 rows cost more than wider accumulators.
    rows = M - r0 <= WIDE_CHUNK + WIDE_MERGE ? M - r0 : WIDE_CHUNK;
    switch (rows) {
      case 1: wide_rows<Q4BLOCKS, 1, HALVES>(w, g, xq, r0, y, ldy); break;
      case 2: wide_rows<Q4BLOCKS, 2, HALVES>(w, g, xq, r0, y, ldy); break;
      case 3: wide_rows<Q4BLOCKS, 3, HALVES>(w, g, xq, r0, y, ldy); break;
      case 4: wide_rows<Q4BLOCKS, 4, HALVES>(w, g, xq, r0, y, ldy); break;
      case 5:
#ifdef VS_WIDE_AVX2  // as 3 and 2 rows: on Zen 2 wide_rows<5> cost as much as 6 rows (its registers)
        wide_rows<Q4BLOCKS, 3, HALVES>(w, g, xq, r0, y, ldy);
        wide_rows<Q4BLOCKS, 2, HALVES>(w, g, xq, r0 + 3, y, ldy);
#else
        wide_rows<Q4BLOCKS, 5, HALVES>(w, g, xq, r0, y, ldy);
#endif
        break;
      case 6: wide_rows<Q4BLOCKS, 6, HALVES>(w, g, xq, r0, y, ldy); break;
      case 7: wide_rows<Q4BLOCKS, 7, HALVES>(w, g, xq, r0, y, ldy); break;
      default: wide_rows<Q4BLOCKS, 8, HALVES>(w, g, xq, r0, y, ldy); break;
    }
  }
}

#ifndef VS_WIDE_AVX2
// Passes of at least this many rows run a 4-bit matrix with the float16 line two groups at a
// time (wide_rows_pair; set_wide_pair_rows moves it, 0: never). Zen 5, 2 cores, whole verify
// passes at 300 tokens of context, the kernel switched on and off in one process (medians of
// 15, the order rotating): 1-6 rows 7-13% slower with pairs (still bound by reading the
// weights, two streams a thread cost more), 8 rows 3% slower, 9-10 rows 3-4% faster, 12-128
// rows 5-6% faster. With chunks of 4 rows instead of 6, 12-128 rows gained 0-4%.
// The prefetches must run ahead in both groups and on into the next pair: with each group's
// prefetch carried on past its end into the group after it (as wide_rows does), every pair's
// second group started cold and 8-16 rows ran 16-22% slower.
constexpr int64_t WIDE_PAIR_ROWS = 9;
static std::atomic<int64_t> wide_pair_rows_{-1};
static int64_t wide_pair_rows() {
  const int64_t rows = wide_pair_rows_.load();
  return rows == 0 ? INT64_MAX : rows < 0 ? WIDE_PAIR_ROWS : rows;
}

// Pair p's M rows (groups 2p and 2p + 1) in chunks of 6 rows; a last 1-6 as one chunk, 7 as
// 3 + 4 and 8 as 4 + 4 (chunks of 4 instead of 6 measured 0-4% slower past 12 rows).
static void wide_pair(const Matrix& w, int64_t p, const QuantRows& xq, int64_t M, float* y, int64_t ldy) {
  for (int64_t r0 = 0, rows = 0; r0 < M; r0 += rows) {
    const int64_t left = M - r0;
    rows = left <= 6 ? left : left <= 8 ? left - 4 : 6;
    switch (rows) {
      case 1: wide_rows_pair<1, 2>(w, 2 * p, xq, r0, y, ldy); break;
      case 2: wide_rows_pair<2, 2>(w, 2 * p, xq, r0, y, ldy); break;
      case 3: wide_rows_pair<3, 2>(w, 2 * p, xq, r0, y, ldy); break;
      case 4: wide_rows_pair<4, 2>(w, 2 * p, xq, r0, y, ldy); break;
      case 5: wide_rows_pair<5, 1>(w, 2 * p, xq, r0, y, ldy); break;
      default: wide_rows_pair<6, 1>(w, 2 * p, xq, r0, y, ldy); break;
    }
  }
}
#endif

// y = x W^T for the M rows quantised in xq by groups of 16 outputs over threads: wide_group,
// or with enough rows (a 4-bit matrix with the float16 line) wide_pair and a last odd group
// alone.
template <bool Q4BLOCKS, bool HALVES>
static void matmul_wide_rows(const Matrix& w, const QuantRows& xq, int64_t M, float* y, int64_t ldy) {
  const int64_t groups = (w.rows + WIDE_OUTPUTS - 1) / WIDE_OUTPUTS;
#ifndef VS_WIDE_AVX2
  if (Q4BLOCKS && HALVES && M >= wide_pair_rows()) {
    const int64_t grain = std::max<int64_t>(1, MIN_PARALLEL_WORK / (2 * WIDE_OUTPUTS * w.cols * M));
    parallel_for(0, (groups + 1) / 2, grain, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; p++)
        2 * p + 1 < groups ? wide_pair(w, p, xq, M, y, ldy) : wide_group<Q4BLOCKS, HALVES>(w, 2 * p, xq, M, y, ldy);
    });
    return;
  }
#endif
  const int64_t grain = std::max<int64_t>(1, MIN_PARALLEL_WORK / (WIDE_OUTPUTS * w.cols * M));
  parallel_for(0, groups, grain, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; g++) wide_group<Q4BLOCKS, HALVES>(w, g, xq, M, y, ldy);
  });
}

// The float16 bits of v where float16 holds v exactly, else -1. It holds every q4 matrix's
// scales and minimums: they come from GGUF Q4_0 / Q4_1 blocks, which store them as float16
// (Q4_0's minimum is -8 times its scale, exact too), and Q8_0's scales.
static int32_t exact_half(float v) {
  const uint16_t half = _cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const float back = _cvtsh_ss(half);
  return std::memcmp(&back, &v, sizeof v) == 0 ? half : -1;
}

// The float16 bits of a matrix's scales (and Q4's minimums), [tiles][blocks][TILE] as m.d,
// or empty where one value has none exactly.
static std::vector<uint16_t> exact_halves(const float* values, int64_t n) {
  std::vector<uint16_t> halves(n);
  for (int64_t i = 0; i < n; i++) {
    const int32_t half = exact_half(values[i]);
    if (half < 0) return {};
    halves[i] = (uint16_t)half;
  }
  return halves;
}

// The weights in the wide layout, AMX's (see above), kept beside the packed tiles: per group of 16
// outputs and block, Q4's 16-byte halves as one 4 x 64-byte tile of code bytes whose low
// nibbles are the first half and high nibbles the second (a Q4 byte holds weights i and
// i + 16), Q8's as two; the scales (and minimums) as [groups][blocks][16]. Outputs past the
// matrix's rows are zero.
// A 1-row pass is bound by memory, and the scales as float32 are a third of a Q4 matrix's
// bytes (0.25 a weight beside 0.5 of codes). Where they are float16 in the file (every GGUF
// Q4_0, Q4_1 and Q8_0 block; a Q4_0 minimum is -8 times its scale) they are kept so, per
// group and block one 64-byte line of 16 scales and then 16 minimums (Q4) or 16 zeros (Q8):
// - on AVX2 without VNNI (4-bit only), in an array of their own (wide_halves);
// - with AVX-512 VNNI and no AMX, right after the block's codes (wide_stride: 320 bytes a Q4
//   block, 576 a Q8 one), so a group is one stream instead of three.
// The kernels widen them to the same floats, so the bits do not change. On AVX2 a matrix with
// a value float16 does not hold exactly keeps no wide layout (the vector kernels, the same
// bits again); with AVX-512 it keeps the float32 arrays, as wherever AMX tiles run.
static void prepack_wide(Matrix& m) {
  const int64_t B = m.blocks(), groups = (m.rows + WIDE_OUTPUTS - 1) / WIDE_OUTPUTS, tiles = m.tiles();
  const bool q4 = m.format == Q4;
  const int64_t words = q4 ? 64 : 128;  // 4-byte words of codes per group and block
  const int64_t scale_count = tiles * B * TILE;
#ifdef VS_WIDE_AVX2
  const bool want_halves = true;
#else
  const bool want_halves = wide_halves_available();
#endif
  std::vector<uint16_t> d16, m16;
  if (want_halves) {
    d16 = exact_halves(m.d, scale_count);
    if (q4 && !d16.empty()) m16 = exact_halves(m.m, scale_count);
  }
  const bool halves = !d16.empty() && (!q4 || !m16.empty());
#ifdef VS_WIDE_AVX2
  if (!halves) return;  // the vector kernels
  const int64_t stride = words * 4;  // codes only: the halves in their own array
#else
  const int64_t stride = words * 4 + (halves ? 64 : 0);
#endif
  m.wide_data = at::zeros({groups * B * stride + 64}, at::kByte);
  uint8_t* base = (uint8_t*)(((uintptr_t)m.wide_data.data_ptr<uint8_t>() + 63) & ~(uintptr_t)63);
  uint16_t* line_array = nullptr;  // AVX2: [groups][blocks][32] float16
  float* scales = nullptr;         // float32: [groups][blocks][16], then Q4's minimums so
#ifdef VS_WIDE_AVX2
  m.wide_scales = at::zeros({groups * B * 2 * WIDE_OUTPUTS + 32}, at::kShort);
  line_array = (uint16_t*)(((uintptr_t)m.wide_scales.data_ptr<int16_t>() + 63) & ~(uintptr_t)63);
#else
  if (!halves) {
    m.wide_scales = at::zeros({(q4 ? 2 : 1) * groups * B * WIDE_OUTPUTS}, at::kFloat);
    scales = m.wide_scales.data_ptr<float>();
  }
#endif
  for (int64_t g = 0; g < groups; g++)
    for (int64_t b = 0; b < B; b++) {
      uint8_t* block = base + (g * B + b) * stride;
      uint32_t* out = (uint32_t*)block;
      uint16_t* line = line_array != nullptr ? line_array + (g * B + b) * 2 * WIDE_OUTPUTS
                                             : (uint16_t*)(block + words * 4);
      for (int64_t n = 0; n < WIDE_OUTPUTS; n++) {
        const int64_t t = g * (WIDE_OUTPUTS / TILE) + n / TILE, at = (t * B + b) * TILE + n % TILE;
        if (t >= tiles) continue;
        if (halves) {
          line[n] = d16[at];
          if (q4) line[WIDE_OUTPUTS + n] = m16[at];
        } else {
          scales[(g * B + b) * WIDE_OUTPUTS + n] = m.d[at];
          if (q4) scales[(groups + g) * B * WIDE_OUTPUTS + b * WIDE_OUTPUTS + n] = m.m[at];
        }
        const uint8_t* raw = (const uint8_t*)m.raw + at * (q4 ? QK / 2 : QK);
        for (int64_t k = 0; k < words / WIDE_OUTPUTS; k++) std::memcpy(&out[k * WIDE_OUTPUTS + n], raw + 4 * k, 4);
      }
    }
  m.wide_codes = base;
#ifdef VS_WIDE_AVX2
  m.wide_halves = line_array;
#else
  if (halves) {
    m.wide_stride = stride;
  } else {
    m.wide_d = scales;
    m.wide_m = q4 ? scales + groups * B * WIDE_OUTPUTS : nullptr;
  }
#endif
}
#endif

// The fewest rows a pass needs for the tiles (INT64_MAX: never), and the most the wide
// layout's VNNI kernel takes (0: none), from set_amx_min_rows.
static int64_t amx_min_rows() {
  const int64_t rows = amx_min_rows_.load();
  if (!amx_available() || rows == 0) return INT64_MAX;
  return rows < 0 ? AMX_MIN_ROWS : rows;
}
static int64_t wide_max_rows() {
  if (amx_min_rows_.load() == 0) return 0;
#ifdef VS_WIDE_AVX2
  return WIDE_AVX2_ROWS_MAX;
#else
  return amx_available() ? WIDE_ROWS_MAX : INT64_MAX;
#endif
}

// Sets the rows from which 4-bit passes run two groups at a time (0: never; -1: the default,
// WIDE_PAIR_ROWS); returns whether that kernel exists here (AVX-512 VNNI's wide layout).
static bool set_wide_pair_rows(int64_t rows) {
#if defined(VS_WIDE) && !defined(VS_WIDE_AVX2)
  wide_pair_rows_.store(std::max<int64_t>(-1, rows));
  return true;
#else
  (void)rows;
  return false;
#endif
}

// Sets the rows from which passes take AMX tiles (0: neither tiles nor the wide layout's
// VNNI kernel, the vector kernels on every pass; -1: the default); returns whether the
// tiles run here at all.
static bool set_amx_min_rows(int64_t rows) {
  amx_min_rows_.store(std::max<int64_t>(-1, rows));
  return amx_available();
}

#ifdef VS_AVX2_NO_VNNI
// A Q4 pass whose rows past its groups of 8 are 4 to 7, without VNNI: those rows cost less in
// a part group than in tile_quant, whose horizontal adds bound its passes of 2 to 4 rows on
// AVX2 (the shuffle port). 5 to 7 of them take a group of 8 in the lanes kernel, padded with
// zero rows; 4 take the quads kernel. Measured on AMD Zen 2 (a Q4 matrix of 53M weights,
// medians of 15, M rows against 1 row): tile_quant 4 rows 2.26x, 5 3.0x, 7 4.0x; quads 4 rows
// 1.7x; lanes 5 to 8 rows 2.4x. 3 rows stay with tile_quant (quads measured level there).
// A function of its own: the common passes (1 to 3 rows) keep matmul's code as it was.
static void matmul_q4_part_group(const Matrix& w, int64_t M, float* y, int64_t ldy, QuantRows& scratch) {
  const int64_t padded = M % LANES >= LANES_PADDED_FROM;  // else the last 4 rows take the quads kernel
  const int64_t groups = M / LANES + padded;
  if (groups > 0) pack_lanes(scratch, groups, w.cols, M);
  if (!padded) pack_quads(scratch, groups * LANES, w.cols);
  const int64_t grain = std::max<int64_t>(1, MIN_PARALLEL_WORK / (TILE * w.cols * M));
  parallel_for(0, w.tiles(), grain, [&](int64_t t0, int64_t t1) {
    AlignedBytes unpacked;
    unpacked.assign(TILE * w.cols);
    uint8_t* codes = (uint8_t*)unpacked.data();
    for (int64_t t = t0; t < t1; t++) {
      unpack_q4_tile(w, t, codes);
      for (int64_t grp = 0; grp < groups; grp++)
        tile_q4_lanes(w, t, codes, scratch, grp, y + grp * LANES * ldy + t * TILE, ldy,
                      std::min<int64_t>(LANES, M - grp * LANES));
      if (!padded) tile_q4_quads(w, t, codes, scratch, y + groups * LANES * ldy + t * TILE, ldy);
    }
  });
  add_bias(w, M, y, ldy);
}
#endif

// y[M, ldy] (first w.rows columns) = x[M, K] W^T (+ bias). Threads split the output tiles.
static void matmul(const Matrix& w, const float* x, int64_t M, float* y, int64_t ldy, QuantRows& scratch) {
  if (w.quantized()) quantize_rows(x, M, w.cols, scratch);
#ifdef VS_WIDE
  if (w.wide_codes != nullptr) {
#ifdef VS_AMX
    if (M >= amx_min_rows() && w.wide_stride == 0) {  // the tiles read the float32 scales
      if (w.format == Q4)
        matmul_amx<true>(w, scratch, M, y, ldy);
      else
        matmul_amx<false>(w, scratch, M, y, ldy);
      return add_bias(w, M, y, ldy);
    }
#endif
    if (M <= wide_max_rows()) {
#ifdef VS_WIDE_AVX2
      matmul_wide_rows<true, true>(w, scratch, M, y, ldy);  // only 4-bit matrices carry the layout here
#else
      const bool halves = w.wide_stride != 0;
      if (w.format == Q4)
        halves ? matmul_wide_rows<true, true>(w, scratch, M, y, ldy) : matmul_wide_rows<true, false>(w, scratch, M, y, ldy);
      else
        halves ? matmul_wide_rows<false, true>(w, scratch, M, y, ldy) : matmul_wide_rows<false, false>(w, scratch, M, y, ldy);
#endif
      return add_bias(w, M, y, ldy);
    }
  }
#endif
#ifdef VS_VNNI
  if (w.format == Q8_0 && M >= 2) {
    scratch.biased.resize(M * w.cols);
    for (int64_t i = 0; i < M * w.cols; i++) scratch.biased[i] = (uint8_t)scratch.q[i] ^ 0x80;
  }
#endif
#ifdef VS_AVX2_NO_VNNI
  if (w.format == Q4 && M % LANES >= QUADS_FROM) return matmul_q4_part_group(w, M, y, ldy, scratch);
#endif
#ifdef VS_AVX2
  const int64_t groups = w.format == Q4 ? M / LANES : 0;  // rows in the lanes kernel: 8 at a time
  if (groups > 0) pack_lanes(scratch, groups, w.cols, M);
#else
  const int64_t groups = 0;
#endif
  const int64_t grain = std::max<int64_t>(1, MIN_PARALLEL_WORK / (TILE * w.cols * M));
  parallel_for(0, w.tiles(), grain, [&](int64_t t0, int64_t t1) {
#ifdef VS_AVX2
    std::vector<uint8_t> codes(groups > 0 ? TILE * w.cols : 0);
#endif
    for (int64_t t = t0; t < t1; t++) {
#ifdef VS_AVX2
      if (groups > 0) {
        unpack_q4_tile(w, t, codes.data());
        for (int64_t grp = 0; grp < groups; grp++)
          tile_q4_lanes(w, t, codes.data(), scratch, grp, y + grp * LANES * ldy + t * TILE, ldy, LANES);
      }
#endif
      // The other rows in groups of 4 and the rest (measured faster than evening the groups
      // out): a group reads and unpacks the tile's weights once for all its rows.
      for (int64_t r = groups * LANES; r < M;) {
        const int64_t rows = std::min<int64_t>(4, M - r);
        float* out = y + r * ldy + t * TILE;
        switch (rows) {
          case 4: run_tile<4>(w, t, x, scratch, r, out, ldy); break;
          case 3: run_tile<3>(w, t, x, scratch, r, out, ldy); break;
          case 2: run_tile<2>(w, t, x, scratch, r, out, ldy); break;
          default: run_tile<1>(w, t, x, scratch, r, out, ldy); break;
        }
        r += rows;
      }
    }
  });
  add_bias(w, M, y, ldy);
}

// ---------------------------------------------------------------------------------------
// The decoder.

static void rmsnorm(const float* x, const float* weight, int64_t M, int64_t H, float eps, float* out) {
  for_rows(M, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
      const float* v = x + r * H;
      float squares[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // lane l: v[i]^2 for i = l mod 8, in order
      int64_t i = 0;
#ifdef VS_AVX2
      __m256 acc = _mm256_setzero_ps();
      for (; i + 8 <= H; i += 8) {
        const __m256 a = _mm256_loadu_ps(v + i);
        acc = _mm256_fmadd_ps(a, a, acc);
      }
      _mm256_storeu_ps(squares, acc);
#endif
      for (; i < H; i++) squares[i % 8] = std::fma(v[i], v[i], squares[i % 8]);
      float inv = 1.0f / std::sqrt(hsum8(squares) / (float)H + eps);
      for (i = 0; i < H; i++) out[r * H + i] = weight[i] * (v[i] * inv);
    }
  });
}

// x += delta, M rows of H.
static void add_rows(float* x, const float* delta, int64_t M, int64_t H) {
  for_rows(M, [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0 * H; i < r1 * H; i++) x[i] += delta[i];
  });
}

// RoPE in the rotate-half layout (as transformers' Llama) on ``heads`` vectors of D values
// side by side, at the angles whose cos and sin (D / 2 each) are given.
static void rotate_half(float* row, int64_t heads, int64_t D, const float* c, const float* s) {
  const int64_t half = D / 2;
  for (int64_t head = 0; head < heads; head++) {
    float* v = row + head * D;
    for (int64_t i = 0; i < half; i++) {
      const float a = v[i], b = v[i + half];
      v[i] = a * c[i] - b * s[i];
      v[i + half] = b * c[i] + a * s[i];
    }
  }
}

struct Layer {
  at::Tensor attn_norm, ffn_norm;
  Matrix qkv, o, gate_up, down;
};

// Rows row0 .. row0 + count of a pass: one sequence (a KV cache slot) at positions start..
// A tree segment (``parent_row`` set) is a token tree instead: row r still writes its keys
// and values at cache slot start + r, but sits at position start + depth(r) and attends to
// the prefix [0, start) and then to its own ancestors' slots and its own, root first.
struct Segment {
  int64_t slot, start, count, row0;
  bool logits;
  const int64_t* parent_row = nullptr;  // tree segments: each row's parent row, -1 for row 0
};

// Depth of each row of a tree segment (0 for the root), or of a plain one (its row index).
static std::vector<int64_t> row_depths(const Segment& seg) {
  std::vector<int64_t> depth(seg.count);
  for (int64_t r = 0; r < seg.count; r++)
    depth[r] = seg.parent_row == nullptr ? r : seg.parent_row[r] < 0 ? 0 : depth[seg.parent_row[r]] + 1;
  return depth;
}

class Decoder {
 public:
  // slots: sequences the KV cache holds side by side, each of the rope tables' length.
  Decoder(int64_t hidden, int64_t intermediate, int64_t heads, int64_t kv_heads, int64_t head_dim, double eps,
          at::Tensor cos, at::Tensor sin, int64_t slots)
      : hidden_(hidden), inter_(intermediate), heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim),
        slots_(slots), eps_((float)eps), cos_(cos.contiguous()), sin_(sin.contiguous()) {
    TORCH_CHECK(heads % kv_heads == 0, "heads must be a multiple of kv_heads");
    TORCH_CHECK(slots >= 1, "slots must be >= 1");
    TORCH_CHECK(head_dim % 2 == 0, "head_dim must be even");
    TORCH_CHECK(cos_.dim() == 2 && cos_.size(1) == head_dim / 2 && cos_.sizes() == sin_.sizes(), "bad rope tables");
    context_ = cos_.size(0);
  }

  void add_layer(at::Tensor attn_norm, at::Tensor ffn_norm, Matrix qkv, Matrix o, Matrix gate_up, Matrix down) {
    const int64_t qkv_rows = (heads_ + 2 * kv_heads_) * head_dim_;
    TORCH_CHECK(qkv.rows == qkv_rows && qkv.cols == hidden_, "qkv has the wrong shape");
    TORCH_CHECK(o.rows == hidden_ && o.cols == heads_ * head_dim_, "o has the wrong shape");
    TORCH_CHECK(gate_up.rows == 2 * inter_ && gate_up.cols == hidden_, "gate_up has the wrong shape");
    TORCH_CHECK(down.rows == hidden_ && down.cols == inter_, "down has the wrong shape");
    layers_.push_back(Layer{attn_norm.contiguous(), ffn_norm.contiguous(), qkv, o, gate_up, down});
    auto options = at::TensorOptions().dtype(at::kShort);
    // Keys in blocks of KEY_BLOCK positions, dimension-major inside a block (see key_at); a
    // slot's KV heads follow the previous slot's. Left uninitialised: a pass reads only the
    // positions its sequence wrote (the unused lanes of a last key block are scored, never
    // used), and the pages of slots never run stay untouched, so they cost no memory.
    keys_.push_back(at::empty({slots_ * kv_heads_, key_blocks(), head_dim_, KEY_BLOCK}, options));
    values_.push_back(at::empty({slots_ * kv_heads_, context_, head_dim_}, options));
  }

  void set_output(Matrix embed, at::Tensor norm, Matrix head) {
    TORCH_CHECK(embed.cols == hidden_ && head.cols == hidden_, "embedding and head must have hidden columns");
    embed_ = embed, norm_ = norm.contiguous(), head_ = head;
    if (embed_.raw != head_.raw) {  // an embedding apart from the head is only read by rows
      embed_.wide_data = embed_.wide_scales = at::Tensor();
      embed_.wide_codes = nullptr, embed_.wide_d = embed_.wide_m = nullptr, embed_.wide_halves = nullptr;
      embed_.wide_stride = 0;
    }
  }

  // One forward pass over ids at positions start, start + 1, ... of slot 0; returns
  // (logits [M, V] when asked, hidden states [M, len(capture) * hidden] when asked).
  std::vector<at::Tensor> forward(at::Tensor ids, int64_t start, bool logits, std::vector<int64_t> capture) {
    TORCH_CHECK(ids.dim() == 1, "ids must be a 1-d int64 tensor");
    auto segments = at::tensor({(int64_t)0, start, ids.size(0), (int64_t)logits}, at::kLong).view({1, 4});
    return forward_segments(ids, segments, capture);
  }

  // One forward pass over several sequences ("segments", rows contiguous per segment):
  // segments [S, 4] int64, each (slot, start, count, logits): ``count`` rows of ids at
  // positions start.. of ``slot``, whose logits are returned when the flag is set. Returns
  // (logits [rows of flagged segments, V], in segment order, or undefined when none;
  // hidden states [M, len(capture) * hidden] when asked). A row's arithmetic is the same
  // whatever the other segments are: batching requests keeps every row's result.
  std::vector<at::Tensor> forward_segments(at::Tensor ids, at::Tensor segments, std::vector<int64_t> capture) {
    TORCH_CHECK(ids.dim() == 1 && ids.scalar_type() == at::kLong, "ids must be a 1-d int64 tensor");
    TORCH_CHECK(segments.dim() == 2 && segments.size(1) == 4 && segments.scalar_type() == at::kLong,
                "segments must be an (S, 4) int64 tensor");
    segments = segments.contiguous();
    const int64_t M = ids.size(0);
    std::vector<Segment> segs;
    int64_t row = 0;
    const int64_t* sp = segments.data_ptr<int64_t>();
    for (int64_t i = 0; i < segments.size(0); i++) {
      Segment seg{sp[4 * i], sp[4 * i + 1], sp[4 * i + 2], row, sp[4 * i + 3] != 0};
      TORCH_CHECK(seg.slot >= 0 && seg.slot < slots_, "slot ", seg.slot, " out of range [0, ", slots_, ")");
      TORCH_CHECK(seg.count > 0 && seg.start >= 0 && seg.start + seg.count <= context_, "positions ", seg.start,
                  "..", seg.start + seg.count, " exceed the context of ", context_);
      for (const Segment& other : segs) TORCH_CHECK(other.slot != seg.slot, "slot ", seg.slot, " appears twice");
      row += seg.count;
      segs.push_back(seg);
    }
    TORCH_CHECK(M > 0 && row == M, "segments cover ", row, " rows but ids has ", M);
    return run(ids, segs, capture);
  }

  // forward_segments with ids and segments (S * 4 values, row-major) as Python lists: what a
  // decoding round passes, converted here rather than through torch.tensor in Python, which
  // costs ~60 us a round right after a pass has swept the caches (measured in the engine).
  std::vector<at::Tensor> forward_lists(const std::vector<int64_t>& ids, const std::vector<int64_t>& segments,
                                        std::vector<int64_t> capture) {
    TORCH_CHECK(segments.size() % 4 == 0, "segments must hold 4 values per segment, got ", segments.size());
    auto ids_t = at::tensor(ids, at::kLong);
    auto segments_t = at::tensor(segments, at::kLong).view({(int64_t)segments.size() / 4, 4});
    return forward_segments(ids_t, segments_t, capture);
  }

  // One pass over a token tree of one sequence: ids [n + 1] = the root (the pending token),
  // then node 0 .. n-1; parents [n] int64, node j's parent node (< j) or -1 for the root.
  // Row r (the root, then node r - 1) writes its keys and values at slot start + r of
  // ``slot`` and sits at position start + depth(r); it attends to [0, start) and then to the
  // slots of its ancestors and itself in depth order, so its logits are exactly those of the
  // single step at that position after decoding its path. Returns what forward_segments does.
  std::vector<at::Tensor> forward_tree(at::Tensor ids, int64_t slot, int64_t start, at::Tensor parents, bool logits,
                                       std::vector<int64_t> capture) {
    TORCH_CHECK(ids.dim() == 1 && ids.scalar_type() == at::kLong, "ids must be a 1-d int64 tensor");
    TORCH_CHECK(parents.dim() == 1 && parents.scalar_type() == at::kLong, "parents must be a 1-d int64 tensor");
    const int64_t n = parents.size(0);
    TORCH_CHECK(ids.size(0) == n + 1, n, " nodes take ", n + 1, " ids (the root first), got ", ids.size(0));
    TORCH_CHECK(slot >= 0 && slot < slots_, "slot ", slot, " out of range [0, ", slots_, ")");
    TORCH_CHECK(start >= 0 && start + n + 1 <= context_, "slots ", start, "..", start + n + 1,
                " exceed the context of ", context_);
    parents = parents.contiguous();
    const int64_t* par = parents.data_ptr<int64_t>();
    std::vector<int64_t> parent_row(n + 1, -1);
    for (int64_t j = 0; j < n; j++) {
      TORCH_CHECK(par[j] >= -1 && par[j] < j, "node ", j, " has parent ", par[j], ": must be -1 or a node below ", j);
      parent_row[j + 1] = par[j] + 1;
    }
    Segment seg{slot, start, n + 1, 0, logits};
    seg.parent_row = parent_row.data();
    return run(ids, {seg}, capture);
  }

  // After a tree pass at ``start`` of ``slot``: the accepted path (path [k] int64, nodes root
  // to leaf, increasing) moves its keys and values from slots start + 1 + node to
  // start + 1, start + 2, ..., in every layer and KV head, where plain decoding of the path
  // would have put them. Sources lie at or past their targets, so moving in order is safe.
  void keep_path(int64_t slot, int64_t start, at::Tensor path) {
    TORCH_CHECK(path.dim() == 1 && path.scalar_type() == at::kLong, "path must be a 1-d int64 tensor");
    TORCH_CHECK(slot >= 0 && slot < slots_, "slot ", slot, " out of range [0, ", slots_, ")");
    path = path.contiguous();
    const int64_t* nodes = path.data_ptr<int64_t>();
    const int64_t k = path.size(0), D = head_dim_;
    for (int64_t d = 0; d < k; d++) {
      TORCH_CHECK(nodes[d] >= 0 && (d == 0 || nodes[d] > nodes[d - 1]), "path nodes must increase from 0 up");
      TORCH_CHECK(start >= 0 && start + 1 + nodes[d] < context_, "path node ", nodes[d], " lies past the context");
    }
    for (size_t l = 0; l < layers_.size(); l++) {
      int16_t* kc = keys_[l].data_ptr<int16_t>();
      int16_t* vc = values_[l].data_ptr<int16_t>();
      for (int64_t g = slot * kv_heads_; g < (slot + 1) * kv_heads_; g++)
        for (int64_t d = 0; d < k; d++) {
          const int64_t from = start + 1 + nodes[d], to = start + 1 + d;
          if (from == to) continue;
          for (int64_t i = 0; i < D; i++) kc[key_at(g, to, i)] = kc[key_at(g, from, i)];
          std::memcpy(vc + (g * context_ + to) * D, vc + (g * context_ + from) * D, D * sizeof(int16_t));
        }
    }
  }

 private:
  std::vector<at::Tensor> run(at::Tensor ids, const std::vector<Segment>& segs, const std::vector<int64_t>& capture) {
    const int64_t M = ids.size(0), H = hidden_, L = (int64_t)layers_.size();
    int64_t logit_rows = 0;
    for (const Segment& seg : segs)
      if (seg.logits) logit_rows += seg.count;
    const int64_t* tok = ids.data_ptr<int64_t>();
    for (int64_t r = 0; r < M; r++) TORCH_CHECK(tok[r] >= 0 && tok[r] < embed_.rows, "token id out of range");
    at::NoGradGuard no_grad;
    const int64_t qkv_cols = (heads_ + 2 * kv_heads_) * head_dim_;
    std::vector<float> x(M * H), h(M * H), qkv(M * qkv_cols), attn(M * heads_ * head_dim_);
    std::vector<float> gu(M * 2 * inter_), act(M * inter_), delta(M * H);
    QuantRows scratch;
    at::Tensor captured;
    if (!capture.empty()) captured = at::empty({M, (int64_t)capture.size() * H}, at::kFloat);
    auto keep = [&](int64_t index, const float* state) {
      for (size_t c = 0; c < capture.size(); c++)
        if (capture[c] == index)
          for (int64_t r = 0; r < M; r++)
            std::memcpy(captured.data_ptr<float>() + (r * capture.size() + c) * H, state + r * H, H * 4);
    };
    for (int64_t r = 0; r < M; r++) matrix_row(embed_, tok[r], x.data() + r * H);
    keep(0, x.data());
    for (int64_t l = 0; l < L; l++) {
      const Layer& layer = layers_[l];
      rmsnorm(x.data(), layer.attn_norm.data_ptr<float>(), M, H, eps_, h.data());
      matmul(layer.qkv, h.data(), M, qkv.data(), qkv_cols, scratch);
      for (const Segment& seg : segs) rope_and_cache(qkv.data() + seg.row0 * qkv_cols, seg, l);
      attention(qkv.data(), segs, M, l, attn.data());
      matmul(layer.o, attn.data(), M, delta.data(), H, scratch);
      add_rows(x.data(), delta.data(), M, H);
      rmsnorm(x.data(), layer.ffn_norm.data_ptr<float>(), M, H, eps_, h.data());
      matmul(layer.gate_up, h.data(), M, gu.data(), 2 * inter_, scratch);
      silu_mul(gu.data(), M, act.data());
      matmul(layer.down, act.data(), M, delta.data(), H, scratch);
      add_rows(x.data(), delta.data(), M, H);
      if (l + 1 < L) keep(l + 1, x.data());
    }
    rmsnorm(x.data(), norm_.data_ptr<float>(), M, H, eps_, h.data());
    keep(L, h.data());
    std::vector<at::Tensor> out(2);
    if (logit_rows > 0) {
      // Only the flagged segments' rows go through the head (a prefill chunk needs none).
      std::vector<float> picked;
      const float* rows = h.data();
      if (logit_rows < M) {
        picked.resize(logit_rows * H);
        int64_t at_row = 0;
        for (const Segment& seg : segs)
          if (seg.logits) {
            std::memcpy(picked.data() + at_row * H, h.data() + seg.row0 * H, seg.count * H * 4);
            at_row += seg.count;
          }
        rows = picked.data();
      }
      out[0] = at::empty({logit_rows, head_.rows}, at::kFloat);
      matmul(head_, rows, logit_rows, out[0].data_ptr<float>(), head_.rows, scratch);
    }
    out[1] = captured;
    return out;
  }

  // y = x W^T for tests of the kernels.
 public:
  static at::Tensor apply(const Matrix& w, at::Tensor x) {
    TORCH_CHECK(x.dim() == 2 && x.size(1) == w.cols && x.scalar_type() == at::kFloat, "x must be (M, cols) float32");
    x = x.contiguous();
    auto y = at::empty({x.size(0), w.rows}, at::kFloat);
    QuantRows scratch;
    matmul(w, x.data_ptr<float>(), x.size(0), y.data_ptr<float>(), w.rows, scratch);
    return y;
  }

  int64_t context() const { return context_; }
  int64_t slots() const { return slots_; }
  at::Tensor keys(int64_t layer) const { return keys_.at(layer); }
  at::Tensor values(int64_t layer) const { return values_.at(layer); }

 private:
  // RoPE (rotate-half layout, as transformers' Llama) on the queries and keys of each row
  // at its own position; the row's keys and values go into the cache as fp16.
  void rope_and_cache(float* qkv, const Segment& seg, int64_t layer) {
    const int64_t D = head_dim_, half = D / 2, cols = (heads_ + 2 * kv_heads_) * D;
    const int64_t M = seg.count, start = seg.start, base = seg.slot * kv_heads_;
    int16_t* kc = keys_[layer].data_ptr<int16_t>();
    int16_t* vc = values_[layer].data_ptr<int16_t>();
    const std::vector<int64_t> depth = row_depths(seg);
    const float* cosines = cos_.data_ptr<float>();
    const float* sines = sin_.data_ptr<float>();
    for_rows(M, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; r++) {
        const int64_t pos = start + depth[r], at = start + r;  // its position (rope), its cache slot
        float* row = qkv + r * cols;
        rotate_half(row, heads_ + kv_heads_, D, cosines + pos * half, sines + pos * half);
        for (int64_t g = 0; g < kv_heads_; g++) {
          const float* k = row + (heads_ + g) * D;
          const float* v = row + (heads_ + kv_heads_ + g) * D;
          for (int64_t i = 0; i < D; i++) {
            kc[key_at(base + g, at, i)] = (int16_t)float_to_fp16(k[i]);
            vc[((base + g) * context_ + at) * D + i] = (int16_t)float_to_fp16(v[i]);
          }
        }
      }
    });
  }

  static constexpr int64_t KEY_BLOCK = 8;  // positions per key block: one vector of scores
  int64_t key_blocks() const { return (context_ + KEY_BLOCK - 1) / KEY_BLOCK; }
  // Index of dimension i of the key at position pos of cache head g (slot * kv_heads + KV
  // head): the keys of a block lie
  // dimension-major, so one vector load holds dimension i of KEY_BLOCK consecutive keys and a
  // query scores KEY_BLOCK keys at once, with no horizontal sums.
  int64_t key_at(int64_t g, int64_t pos, int64_t i) const {
    return ((g * key_blocks() + pos / KEY_BLOCK) * head_dim_ + i) * KEY_BLOCK + pos % KEY_BLOCK;
  }

  // Each (row, head) attends over exactly its own causal prefix of its slot's cache. Per
  // query: score[t] = one FMA chain over the head dimension in order (q pre-scaled), the
  // softmax (max, exp, sum in 8 lanes), out[i] = (FMA chain over t in order of w[t] V[t][i])
  // / sum. The queries of one segment's KV head run in groups (of 1, 3 or 4, below) that
  // share each loaded key and value; a query's arithmetic is the same in any group, so a
  // row's result depends neither on the other rows of its segment nor on other segments.
  void attention(const float* qkv, const std::vector<Segment>& segs, int64_t M, int64_t layer, float* out) {
    const int64_t D = head_dim_, group = heads_ / kv_heads_;
    if (segs.size() == 1 && segs[0].parent_row != nullptr) return attention_tree(qkv, segs[0], layer, out);
#ifdef VS_AVX2
    if (D % 8 == 0) {
      // A model with 3 query heads per KV head fills groups of 3 exactly: in many-row passes,
      // for each segment that is a single row (a batched decode step), where groups of 4 would
      // spend a quarter on a copy; and in short passes (under 16 queries a thread), where a
      // group reads each key and value once for its 3 heads instead of once per head, as
      // long as its tasks (KV heads x rows) still give every thread one. On the embedded
      // model (3 KV heads, 2 threads, Zen 2), against groups of 1 there: a plain step at 400
      // tokens of context 10% faster, at 1,000 14%; 2 and 3 rows 6-11%.
      const int64_t threads = pass_threads();
      const bool many = M * heads_ >= 16 * threads;
      // Segments of several rows (prompt chunks, verify rows) in a many-row pass take groups
      // of 4, the single rows beside them groups of 3, each segment its own size.
      std::vector<int> sizes(segs.size());
      for (size_t s = 0; s < segs.size(); s++)
        sizes[s] = group == 3 && (many ? segs[s].count == 1 : kv_heads_ * M >= threads) ? 3 : many ? 4 : 1;
      attention_groups(qkv, segs, layer, out, sizes);
      return;
    }
#endif
    const int64_t cols = (heads_ + 2 * kv_heads_) * D;
    const float scale = 1.0f / std::sqrt((float)D);
    const uint16_t* kc = (const uint16_t*)keys_[layer].data_ptr<int16_t>();
    const uint16_t* vc = (const uint16_t*)values_[layer].data_ptr<int16_t>();
    int64_t longest = 0;
    for (const Segment& seg : segs) longest = std::max(longest, seg.start + seg.count);
    const int64_t grain = std::max<int64_t>(1, MIN_PARALLEL_WORK / (longest * D));
    parallel_for(0, M * heads_, grain, [&](int64_t begin, int64_t end) {
      std::vector<float> scores(longest);
      std::vector<float> q(D);
      for (int64_t task = begin; task < end; task++) {
        const int64_t row = task / heads_, head = task % heads_;
        const Segment& seg = segment_of(segs, row);
        const int64_t g = seg.slot * kv_heads_ + head / group, keys = seg.start + (row - seg.row0) + 1;
        const float* query = qkv + row * cols + head * D;
        for (int64_t i = 0; i < D; i++) q[i] = query[i] * scale;
        for (int64_t t = 0; t < keys; t++) {
          float acc = 0.f;
          for (int64_t i = 0; i < D; i++) acc = std::fma(q[i], fp16_to_float(kc[key_at(g, t, i)]), acc);
          scores[t] = acc;
        }
        float* o = out + row * heads_ * D + head * D;
        const float inv = softmax(scores.data(), keys);
        weighted_sum_fp16(scores.data(), vc + g * context_ * D, keys, D, o);
        for (int64_t i = 0; i < D; i++) o[i] *= inv;
      }
    });
  }

  // attention() for a tree segment. Row r's logical keys are the prefix [0, start) and then
  // the slots of its path (root, ..., r): as many as the single step at its position has,
  // in the same order. Its scores are computed on the contiguous slots [0, start + r] (one
  // FMA chain per key, whatever block the key lies in), gathered into that logical order,
  // and then go through the same softmax and the same per-dimension FMA chains over V
  // (rows fetched through the map) as a single step's: the same floats, bit for bit.
  void attention_tree(const float* qkv, const Segment& seg, int64_t layer, float* out) {
    const int64_t D = head_dim_, cols = (heads_ + 2 * kv_heads_) * D, group = heads_ / kv_heads_;
    const int64_t n = seg.count, start = seg.start;
    const float scale = 1.0f / std::sqrt((float)D);
    const uint16_t* kc = (const uint16_t*)keys_[layer].data_ptr<int16_t>();
    const uint16_t* vc = (const uint16_t*)values_[layer].data_ptr<int16_t>();
    std::vector<std::vector<int64_t>> path(n);  // the slots of each row's path, root first
    for (int64_t r = 0; r < n; r++) {
      if (seg.parent_row[r] >= 0) path[r] = path[seg.parent_row[r]];
      path[r].push_back(start + r);
    }
    const int64_t widest = (start + n + KEY_BLOCK - 1) / KEY_BLOCK * KEY_BLOCK;
    const int64_t grain = std::max<int64_t>(1, MIN_PARALLEL_WORK / ((start + n) * D));
    parallel_for(0, n * heads_, grain, [&](int64_t begin, int64_t end) {
      std::vector<float> raw(widest), scores(start + n), q(D);
      for (int64_t task = begin; task < end; task++) {
        const int64_t r = task / heads_, head = task % heads_, g = seg.slot * kv_heads_ + head / group;
        const float* query = qkv + (seg.row0 + r) * cols + head * D;
        for (int64_t i = 0; i < D; i++) q[i] = query[i] * scale;
        const uint16_t* K = kc + g * key_blocks() * D * KEY_BLOCK;
        const int64_t reach = start + r + 1;  // slots [0, start + r] hold every key the row sees
        int64_t t = 0;
#ifdef VS_AVX2
        if (D % 8 == 0) {
          const int64_t blocks = (reach + KEY_BLOCK - 1) / KEY_BLOCK;
          int64_t b = 0;
          for (; b + 4 <= blocks; b += 4) score_blocks<1, 4>(q.data(), K + b * D * KEY_BLOCK, D, raw.data() + b * KEY_BLOCK, 0);
          for (; b < blocks; b++) score_blocks<1, 1>(q.data(), K + b * D * KEY_BLOCK, D, raw.data() + b * KEY_BLOCK, 0);
          t = reach;
        }
#endif
        for (; t < reach; t++) {
          float acc = 0.f;
          for (int64_t i = 0; i < D; i++) acc = std::fma(q[i], fp16_to_float(kc[key_at(g, t, i)]), acc);
          raw[t] = acc;
        }
        const std::vector<int64_t>& tail = path[r];
        const int64_t keys = start + (int64_t)tail.size();
        std::copy(raw.begin(), raw.begin() + start, scores.begin());
        for (size_t j = 0; j < tail.size(); j++) scores[start + j] = raw[tail[j]];
        float* o = out + (seg.row0 + r) * heads_ * D + head * D;
        const float inv = softmax(scores.data(), keys);
        weighted_sum_mapped(scores.data(), vc + g * context_ * D, start, tail.data(), (int64_t)tail.size(), D, o);
        for (int64_t i = 0; i < D; i++) o[i] *= inv;
      }
    });
  }

  // o[D] = sum of weights[t] * V[slot t] over the keys [0, prefix) and then the slots
  // ``tail``: each output dimension one FMA chain over those keys in that order, as in weigh;
  // eight 8-wide accumulators cover 64 dimensions per pass (independent chains).
  static void weighted_sum_mapped(const float* weights, const uint16_t* V, int64_t prefix, const int64_t* tail,
                                  int64_t ntail, int64_t D, float* o) {
    const int64_t keys = prefix + ntail;
    auto row = [&](int64_t t) { return V + (t < prefix ? t : tail[t - prefix]) * D; };
    int64_t base = 0;
#ifdef VS_AVX2
    for (; base + 64 <= D; base += 64) {
      __m256 acc[8];
      for (int c = 0; c < 8; c++) acc[c] = _mm256_setzero_ps();
      for (int64_t t = 0; t < keys; t++) {
        const __m256 w = _mm256_set1_ps(weights[t]);
        const uint16_t* v = row(t) + base;
        for (int c = 0; c < 8; c++)
          acc[c] = _mm256_fmadd_ps(w, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(v + 8 * c))), acc[c]);
      }
      for (int c = 0; c < 8; c++) _mm256_storeu_ps(o + base + 8 * c, acc[c]);
    }
    for (; base + 8 <= D; base += 8) {
      __m256 acc = _mm256_setzero_ps();
      for (int64_t t = 0; t < keys; t++)
        acc = _mm256_fmadd_ps(_mm256_set1_ps(weights[t]), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(row(t) + base))), acc);
      _mm256_storeu_ps(o + base, acc);
    }
#endif
    for (int64_t i = base; i < D; i++) {
      float acc = 0.f;
      for (int64_t t = 0; t < keys; t++) acc = std::fma(weights[t], fp16_to_float(row(t)[i]), acc);
      o[i] = acc;
    }
  }

  static const Segment& segment_of(const std::vector<Segment>& segs, int64_t row) {
    size_t i = 0;
    while (i + 1 < segs.size() && segs[i + 1].row0 <= row) i++;
    return segs[i];
  }

  // exp(s - max s) in place over n scores; returns 1 / their sum, summed in 8 lanes (lane =
  // index mod 8, in index order) and then hsum8. Each exp is exp_inplace's (exp16 or exp8 over
  // whole vectors, exp1 for the tail), in the same pass as the subtraction and the sum.
  static float softmax(float* s, int64_t n) {
    const float best = max_of(s, n);
    float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t t = 0;
#ifdef VS_AVX2
    const __m256 b = _mm256_set1_ps(best);
    __m256 acc = _mm256_setzero_ps();
#ifdef VS_AVX512
    const __m512 b16 = _mm512_set1_ps(best);
    for (; t + 16 <= n; t += 16) {  // the low 8 lanes are added first: the 8-lane order
      const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + t), b16));
      _mm512_storeu_ps(s + t, e);
      acc = _mm256_add_ps(_mm256_add_ps(acc, _mm512_castps512_ps256(e)), _mm512_extractf32x8_ps(e, 1));
    }
#endif
    for (; t + 8 <= n; t += 8) {
      const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + t), b));
      _mm256_storeu_ps(s + t, e);
      acc = _mm256_add_ps(acc, e);
    }
    _mm256_storeu_ps(lanes, acc);
#endif
    for (; t < n; t++) {
      s[t] = exp1(s[t] - best);
      lanes[t % 8] += s[t];
    }
    return 1.0f / hsum8(lanes);
  }

#ifdef VS_AVX2
  // attention() with the queries of each segment's KV head (row-major, then head) in groups
  // of sizes[segment] (1, 3 or 4), one task each; a short last group repeats its first query
  // and drops that copy's output. Tasks are numbered segment by segment (``first_task``), all
  // in one parallel loop.
  // Its loop runs in ATTENTION_CHUNKS chunks a thread, not the default 2: a batched pass's
  // tasks differ in cost (a decode step's reads its own sequence's keys from memory, a prompt
  // chunk's share theirs), and with 2 chunks a thread the caller waited for the other thread
  // for ~5% of such a pass. Zen 5, 2 cores, 16 single rows at 300 tokens of context beside a
  // prompt chunk of 20 rows, medians of 27 passes (2 / 4 / 8 / 16 chunks a thread, processes
  // alternating): 14.23-14.58 / 14.15-14.22 / 13.70-14.03 / 13.76-14.01 ms; 1 to 8 rows level.
  static constexpr int64_t ATTENTION_CHUNKS = 8;
  void attention_groups(const float* qkv, const std::vector<Segment>& segs, int64_t layer, float* out,
                        const std::vector<int>& sizes) {
    constexpr int MAX_G = 4;
    const int64_t D = head_dim_, cols = (heads_ + 2 * kv_heads_) * D, group = heads_ / kv_heads_;
    const float scale = 1.0f / std::sqrt((float)D);
    const uint16_t* kc = (const uint16_t*)keys_[layer].data_ptr<int16_t>();
    const uint16_t* vc = (const uint16_t*)values_[layer].data_ptr<int16_t>();
    std::vector<int64_t> first_task(segs.size() + 1, 0);
    int64_t longest = 0, widest_group = 1;
    for (size_t s = 0; s < segs.size(); s++) {
      first_task[s + 1] = first_task[s] + kv_heads_ * ((segs[s].count * group + sizes[s] - 1) / sizes[s]);
      longest = std::max(longest, segs[s].start + segs[s].count);
      widest_group = std::max<int64_t>(widest_group, sizes[s]);
    }
    const int64_t widest = (longest + KEY_BLOCK - 1) / KEY_BLOCK * KEY_BLOCK;
    const int64_t grain = std::max<int64_t>(1, MIN_PARALLEL_WORK / (widest_group * longest * D));
    parallel_for(0, first_task.back(), grain, [&](int64_t begin, int64_t end) {
      std::vector<float> scores(MAX_G * widest), queries(MAX_G * D), dummy(D);
      size_t s = 0;
      for (int64_t task = begin; task < end; task++) {
        while (first_task[s + 1] <= task) s++;
        const Segment& seg = segs[s];
        const int G = sizes[s];
        const int64_t per_head = seg.count * group, tasks_per_head = (per_head + G - 1) / G;
        const int64_t local = task - first_task[s], g = local / tasks_per_head, first = local % tasks_per_head * G;
        const int64_t n = std::min<int64_t>(G, per_head - first);
        const int64_t stride = (seg.start + seg.count + KEY_BLOCK - 1) / KEY_BLOCK * KEY_BLOCK;
        const int64_t cache_head = seg.slot * kv_heads_ + g;
        int64_t keys[MAX_G];
        float* outs[MAX_G];
        for (int j = 0; j < G; j++) {
          const int64_t index = first + (j < n ? j : 0), r = seg.row0 + index / group;
          const int64_t head = g * group + index % group;
          const float* query = qkv + r * cols + head * D;
          for (int64_t i = 0; i < D; i++) queries[j * D + i] = query[i] * scale;
          keys[j] = seg.start + (r - seg.row0) + 1;
          outs[j] = j < n ? out + r * heads_ * D + head * D : dummy.data();
        }
        const uint16_t* K = kc + cache_head * key_blocks() * D * KEY_BLOCK;
        const uint16_t* V = vc + cache_head * context_ * D;
        switch (G) {
          case 1: attend<1>(queries.data(), keys, K, V, D, stride, scores.data(), outs); break;
          case 3: attend<3>(queries.data(), keys, K, V, D, stride, scores.data(), outs); break;
          default: attend<4>(queries.data(), keys, K, V, D, stride, scores.data(), outs); break;
        }
      }
    }, ATTENTION_CHUNKS);
  }

  // G scaled queries of one KV head (rows of q), query j over keys [0, keys[j]); K in key
  // blocks, V position-major; scores has a row of ``stride`` floats per query.
  template <int G>
  static void attend(const float* q, const int64_t* keys, const uint16_t* K, const uint16_t* V, int64_t D,
                     int64_t stride, float* scores, float* const* outs) {
    constexpr int64_t B = KEY_BLOCK;
    constexpr int KB = G >= 3 ? 2 : 4;  // key blocks per step: KB * G independent FMA chains
    int64_t lo = keys[0], hi = keys[0];
    for (int j = 1; j < G; j++) lo = std::min(lo, keys[j]), hi = std::max(hi, keys[j]);
    const int64_t blocks = (hi + B - 1) / B;
    int64_t b = 0;
#ifdef VS_AVX512
    // 16 lanes: the same FMA chain per score and per output dimension, half the instructions.
    constexpr int KP = G >= 2 ? 2 : 4;  // pairs of key blocks per step
    for (; b + 2 * KP <= blocks; b += 2 * KP) score_block_pairs<G, KP>(q, K + b * D * B, D, scores + b * B, stride);
    for (; b + 2 <= blocks; b += 2) score_block_pairs<G, 1>(q, K + b * D * B, D, scores + b * B, stride);
#endif
    for (; b + KB <= blocks; b += KB) score_blocks<G, KB>(q, K + b * D * B, D, scores + b * B, stride);
    for (; b < blocks; b++) score_blocks<G, 1>(q, K + b * D * B, D, scores + b * B, stride);
    float inv[G];
    for (int j = 0; j < G; j++) inv[j] = softmax(scores + j * stride, keys[j]);
    int64_t base = 0;
#ifdef VS_AVX512
    constexpr int NW = 4;  // 16-wide accumulators per query per pass: 64 dimensions
    for (; base + 16 * NW <= D; base += 16 * NW) weigh16<G, NW>(scores, stride, keys, lo, hi, V, D, base, inv, outs);
    for (; base + 16 <= D; base += 16) weigh16<G, 1>(scores, stride, keys, lo, hi, V, D, base, inv, outs);
#endif
    constexpr int NV = G == 1 ? 8 : G == 2 ? 4 : 2;  // 8-wide accumulators per query per pass
    for (; base + 8 * NV <= D; base += 8 * NV) weigh<G, NV>(scores, stride, keys, lo, hi, V, D, base, inv, outs);
    for (; base < D; base += 8) weigh<G, 1>(scores, stride, keys, lo, hi, V, D, base, inv, outs);
  }

#ifdef VS_AVX512
  // score_blocks on 2 KP key blocks, two a vector (block 2u in the low 8 lanes, 2u + 1 in
  // the high): each score the same FMA chain over the dimensions in order.
  template <int G, int KP>
  static inline void score_block_pairs(const float* q, const uint16_t* K, int64_t D, float* scores, int64_t stride) {
    constexpr int64_t B = KEY_BLOCK;
    __m512 acc[KP][G];
    for (int u = 0; u < KP; u++)
      for (int j = 0; j < G; j++) acc[u][j] = _mm512_setzero_ps();
    for (int64_t i = 0; i < D; i++) {
      __m512 k[KP];
      if (i % 4 == 0)  // the next step's blocks: another sequence's cache comes from memory
        for (int u = 0; u < 2 * KP; u++) _mm_prefetch((const char*)(K + ((2 * KP + u) * D + i) * B), _MM_HINT_T0);
      for (int u = 0; u < KP; u++) {
        const __m128i low = _mm_loadu_si128((const __m128i*)(K + (2 * u * D + i) * B));
        const __m128i high = _mm_loadu_si128((const __m128i*)(K + ((2 * u + 1) * D + i) * B));
        k[u] = _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(low), high, 1));
      }
      for (int j = 0; j < G; j++) {
        const __m512 qv = _mm512_set1_ps(q[j * D + i]);
        for (int u = 0; u < KP; u++) acc[u][j] = _mm512_fmadd_ps(qv, k[u], acc[u][j]);
      }
    }
    for (int j = 0; j < G; j++)
      for (int u = 0; u < KP; u++) _mm512_storeu_ps(scores + j * stride + 2 * u * B, acc[u][j]);
  }

  // weigh with 16-wide accumulators: dimensions [base, base + 16 NW).
  template <int G, int NW>
  static inline void weigh16(const float* scores, int64_t stride, const int64_t* keys, int64_t lo, int64_t hi,
                             const uint16_t* V, int64_t D, int64_t base, const float* inv, float* const* outs) {
    __m512 acc[G][NW];
    for (int j = 0; j < G; j++)
      for (int c = 0; c < NW; c++) acc[j][c] = _mm512_setzero_ps();
    for (int64_t t = 0; t < hi; t++) {
      __m512 v[NW];
      for (int64_t c = 0; c < NW * 16; c += 32)  // 64-byte lines, 16 positions ahead
        _mm_prefetch((const char*)(V + (t + 16) * D + base + c), _MM_HINT_T0);
      for (int c = 0; c < NW; c++)
        v[c] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(V + t * D + base + 16 * c)));
      for (int j = 0; j < G; j++) {
        if (t >= lo && t >= keys[j]) continue;  // past this query's prefix (only near the end)
        const __m512 w = _mm512_set1_ps(scores[j * stride + t]);
        for (int c = 0; c < NW; c++) acc[j][c] = _mm512_fmadd_ps(w, v[c], acc[j][c]);
      }
    }
    for (int j = 0; j < G; j++) {
      const __m512 s = _mm512_set1_ps(inv[j]);
      for (int c = 0; c < NW; c++) _mm512_storeu_ps(outs[j] + base + 16 * c, _mm512_mul_ps(acc[j][c], s));
    }
  }
#endif

  // Scores of KB key blocks for G queries: lane l of block b is key b * B + l.
  template <int G, int KB>
  static inline void score_blocks(const float* q, const uint16_t* K, int64_t D, float* scores, int64_t stride) {
    constexpr int64_t B = KEY_BLOCK;
    __m256 acc[KB][G];
    for (int u = 0; u < KB; u++)
      for (int j = 0; j < G; j++) acc[u][j] = _mm256_setzero_ps();
    for (int64_t i = 0; i < D; i++) {
      __m256 k[KB];
      if (i % 4 == 0)  // the next step's blocks (as score_block_pairs)
        for (int u = 0; u < KB; u++) _mm_prefetch((const char*)(K + ((KB + u) * D + i) * B), _MM_HINT_T0);
      for (int u = 0; u < KB; u++) k[u] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(K + (u * D + i) * B)));
      for (int j = 0; j < G; j++) {
        const __m256 qv = _mm256_broadcast_ss(q + j * D + i);
        for (int u = 0; u < KB; u++) acc[u][j] = _mm256_fmadd_ps(qv, k[u], acc[u][j]);
      }
    }
    for (int j = 0; j < G; j++)
      for (int u = 0; u < KB; u++) _mm256_storeu_ps(scores + j * stride + u * B, acc[u][j]);
  }

  // Dimensions [base, base + 8 NV) of the G outputs: sums over keys in order, then / sum.
  template <int G, int NV>
  static inline void weigh(const float* scores, int64_t stride, const int64_t* keys, int64_t lo, int64_t hi,
                           const uint16_t* V, int64_t D, int64_t base, const float* inv, float* const* outs) {
    __m256 acc[G][NV];
    for (int j = 0; j < G; j++)
      for (int c = 0; c < NV; c++) acc[j][c] = _mm256_setzero_ps();
    for (int64_t t = 0; t < hi; t++) {
      __m256 v[NV];
      for (int64_t c = 0; c < NV * 8; c += 32)  // as weigh16
        _mm_prefetch((const char*)(V + (t + 16) * D + base + c), _MM_HINT_T0);
      for (int c = 0; c < NV; c++) v[c] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(V + t * D + base + 8 * c)));
      for (int j = 0; j < G; j++) {
        if (t >= lo && t >= keys[j]) continue;  // past this query's prefix (only near the end)
        const __m256 w = _mm256_set1_ps(scores[j * stride + t]);
        for (int c = 0; c < NV; c++) acc[j][c] = _mm256_fmadd_ps(w, v[c], acc[j][c]);
      }
    }
    for (int j = 0; j < G; j++) {
      const __m256 s = _mm256_set1_ps(inv[j]);
      for (int c = 0; c < NV; c++) _mm256_storeu_ps(outs[j] + base + 8 * c, _mm256_mul_ps(acc[j][c], s));
    }
  }
#endif

  // o[D] = sum over t of weights[t] * V[t], each output one FMA chain in key order.
  static void weighted_sum_fp16(const float* weights, const uint16_t* V, int64_t keys, int64_t D, float* o) {
    weighted_sum_mapped(weights, V, keys, nullptr, 0, D, o);
  }

  void silu_mul(const float* gu, int64_t M, float* out) {
    const int64_t I = inter_;
    for_rows(M, [&](int64_t r0, int64_t r1) {
      std::vector<float> e(I);
      for (int64_t r = r0; r < r1; r++) {
        const float* gate = gu + r * 2 * I;
        const float* up = gate + I;
        for (int64_t i = 0; i < I; i++) e[i] = -gate[i];
        exp_inplace(e.data(), I);
        for (int64_t i = 0; i < I; i++) out[r * I + i] = gate[i] / (1.0f + e[i]) * up[i];
      }
    });
  }

  int64_t hidden_, inter_, heads_, kv_heads_, head_dim_, slots_, context_;
  float eps_;
  at::Tensor cos_, sin_, norm_;
  Matrix embed_, head_;
  std::vector<Layer> layers_;
  std::vector<at::Tensor> keys_, values_;
};

// ---------------------------------------------------------------------------------------
// A trained head's layers in the kernels (drafters/head.py, drafting's hot path). Its input
// is x = fuse([norm_f(f) ; norm_e(e)]) per row: f a feature, either the target's states of
// the layers the head reads (then first reduced to ``hidden`` columns) or the head's own
// previous output, and e the drafted token's embedding; then Llama decoder layers whose
// attention reads the head's own keys of the last ``window`` positions. The keys and values
// live in a ring of ``capacity`` positions, each entry tagged with the position it holds: a
// query at p reads the entries tagged p - window + 1 .. p, so a position never written, or
// forgotten by ``truncate``, is no key, whatever the ring's slot held before.
class HeadStack {
 public:
  HeadStack(int64_t hidden, int64_t intermediate, int64_t heads, int64_t kv_heads, int64_t head_dim, double eps,
            at::Tensor cos, at::Tensor sin, int64_t window, at::Tensor feature_norm, at::Tensor embed_norm, Matrix fuse)
      : hidden_(hidden), inter_(intermediate), heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim),
        window_(window), eps_((float)eps), cos_(cos.contiguous()), sin_(sin.contiguous()),
        feature_norm_(feature_norm.contiguous()), embed_norm_(embed_norm.contiguous()), fuse_(fuse) {
    TORCH_CHECK(heads % kv_heads == 0 && head_dim % 2 == 0, "heads must be a multiple of kv_heads, head_dim even");
    TORCH_CHECK(cos_.dim() == 2 && cos_.size(1) == head_dim / 2 && cos_.sizes() == sin_.sizes(), "bad rope tables");
    TORCH_CHECK(window >= 1, "window must be >= 1");
    TORCH_CHECK(fuse.rows == hidden && fuse.cols == 2 * hidden, "fuse has the wrong shape");
    TORCH_CHECK(feature_norm_.numel() == hidden && embed_norm_.numel() == hidden, "input norms have the wrong size");
    capacity_ = 2 * window + 64;  // a pass of up to window + 64 rows never overwrites a key it reads
    tags_.assign(capacity_, -1);
  }

  void set_reduce(Matrix reduce) {
    TORCH_CHECK(reduce.rows == hidden_, "reduce has the wrong shape");
    reduce_ = reduce, has_reduce_ = true;
  }

  // The token embeddings (V, hidden) float32 the rows' ids are looked up in, and the output:
  // the head's out norm, then the draft vocabulary's rows of the target's LM head.
  void set_ends(at::Tensor embeddings, at::Tensor out_norm, Matrix head) {
    TORCH_CHECK(embeddings.dim() == 2 && embeddings.size(1) == hidden_ && embeddings.scalar_type() == at::kFloat,
                "embeddings must be (V, hidden) float32");
    TORCH_CHECK(out_norm.numel() == hidden_ && head.cols == hidden_, "out norm or head has the wrong shape");
    embeddings_ = embeddings.contiguous(), out_norm_ = out_norm.contiguous(), head_ = head;
  }

  void add_layer(at::Tensor attn_norm, at::Tensor ffn_norm, Matrix qkv, Matrix o, Matrix gate_up, Matrix down) {
    TORCH_CHECK(qkv.rows == (heads_ + 2 * kv_heads_) * head_dim_ && qkv.cols == hidden_, "qkv has the wrong shape");
    TORCH_CHECK(o.rows == hidden_ && o.cols == heads_ * head_dim_, "o has the wrong shape");
    TORCH_CHECK(gate_up.rows == 2 * inter_ && gate_up.cols == hidden_, "gate_up has the wrong shape");
    TORCH_CHECK(down.rows == hidden_ && down.cols == inter_, "down has the wrong shape");
    layers_.push_back(Layer{attn_norm.contiguous(), ffn_norm.contiguous(), qkv, o, gate_up, down});
    keys_.emplace_back(capacity_ * kv_heads_ * head_dim_);
    values_.emplace_back(capacity_ * kv_heads_ * head_dim_);
  }

  // Rows at positions start, start + 1, ...: features [M, F] (F = hidden, or the reduce's
  // columns), ids [M] int64, the tokens at those positions. Writes their keys and values;
  // returns the outputs [M, hidden] and the last row's draft logits [N] (the head's out norm
  // and the LM head's rows).
  std::vector<at::Tensor> forward(at::Tensor features, at::Tensor ids, int64_t start) {
    TORCH_CHECK(embeddings_.defined(), "set_ends first");
    TORCH_CHECK(features.dim() == 2 && features.scalar_type() == at::kFloat, "features must be (M, F) float32");
    TORCH_CHECK(ids.dim() == 1 && ids.scalar_type() == at::kLong, "ids must be a 1-d int64 tensor");
    const int64_t M = features.size(0), H = hidden_;
    TORCH_CHECK(M >= 1 && ids.size(0) == M, "ids must match the features' rows");
    TORCH_CHECK(M <= capacity_ - window_, "at most ", capacity_ - window_, " rows a pass, got ", M);
    TORCH_CHECK(start >= 0 && start + M <= cos_.size(0), "positions ", start, "..", start + M, " exceed ", cos_.size(0));
    TORCH_CHECK(features.size(1) == H || (has_reduce_ && features.size(1) == reduce_.cols),
                "features have ", features.size(1), " columns");
    features = features.contiguous(), ids = ids.contiguous();
    const int64_t* tok = ids.data_ptr<int64_t>();
    for (int64_t r = 0; r < M; r++) TORCH_CHECK(tok[r] >= 0 && tok[r] < embeddings_.size(0), "token id out of range");
    at::NoGradGuard no_grad;
    QuantRows scratch;
    const float* f = features.data_ptr<float>();
    std::vector<float> reduced, normed(M * H), in(M * 2 * H), x(M * H);
    if (features.size(1) != H) {
      reduced.resize(M * H);
      matmul(reduce_, f, M, reduced.data(), H, scratch);
      f = reduced.data();
    }
    rmsnorm(f, feature_norm_.data_ptr<float>(), M, H, eps_, normed.data());
    for (int64_t r = 0; r < M; r++) std::memcpy(in.data() + r * 2 * H, normed.data() + r * H, H * 4);
    std::vector<float> embeds(M * H);
    for (int64_t r = 0; r < M; r++) std::memcpy(embeds.data() + r * H, embeddings_.data_ptr<float>() + tok[r] * H, H * 4);
    rmsnorm(embeds.data(), embed_norm_.data_ptr<float>(), M, H, eps_, normed.data());
    for (int64_t r = 0; r < M; r++) std::memcpy(in.data() + r * 2 * H + H, normed.data() + r * H, H * 4);
    matmul(fuse_, in.data(), M, x.data(), H, scratch);
    for (int64_t r = 0; r < M; r++) tags_[(start + r) % capacity_] = start + r;

    const int64_t D = head_dim_, cols = (heads_ + 2 * kv_heads_) * D;
    std::vector<float> h(M * H), qkv(M * cols), attn(M * heads_ * D), gu(M * 2 * inter_), act(M * inter_), delta(M * H);
    for (size_t l = 0; l < layers_.size(); l++) {
      const Layer& layer = layers_[l];
      rmsnorm(x.data(), layer.attn_norm.data_ptr<float>(), M, H, eps_, h.data());
      matmul(layer.qkv, h.data(), M, qkv.data(), cols, scratch);
      rope_and_store(qkv.data(), M, start, l);
      attend(qkv.data(), M, start, l, attn.data());
      matmul(layer.o, attn.data(), M, delta.data(), H, scratch);
      add_rows(x.data(), delta.data(), M, H);
      rmsnorm(x.data(), layer.ffn_norm.data_ptr<float>(), M, H, eps_, h.data());
      matmul(layer.gate_up, h.data(), M, gu.data(), 2 * inter_, scratch);
      for (int64_t r = 0; r < M; r++)
        for (int64_t i = 0; i < inter_; i++) {
          const float gate = gu[r * 2 * inter_ + i], up = gu[r * 2 * inter_ + inter_ + i];
          act[r * inter_ + i] = gate / (1.0f + std::exp(-gate)) * up;
        }
      matmul(layer.down, act.data(), M, delta.data(), H, scratch);
      add_rows(x.data(), delta.data(), M, H);
    }
    auto out = at::empty({M, H}, at::kFloat);
    std::memcpy(out.data_ptr<float>(), x.data(), M * H * 4);
    rmsnorm(x.data() + (M - 1) * H, out_norm_.data_ptr<float>(), 1, H, eps_, h.data());
    auto logits = at::empty({head_.rows}, at::kFloat);
    matmul(head_, h.data(), 1, logits.data_ptr<float>(), head_.rows, scratch);
    return {out, logits};
  }

  // Forget the keys of positions >= position (drafted positions a round did not keep).
  void truncate(int64_t position) {
    for (int64_t& tag : tags_)
      if (tag >= position) tag = -1;
  }

  void clear() { tags_.assign(capacity_, -1); }

 private:
  // RoPE (rotate-half, as layers.rotary) on each row's queries and keys at its position; the
  // keys and values go into the ring.
  void rope_and_store(float* qkv, int64_t M, int64_t start, size_t layer) {
    const int64_t D = head_dim_, half = D / 2, cols = (heads_ + 2 * kv_heads_) * D;
    for (int64_t r = 0; r < M; r++) {
      const int64_t pos = start + r, slot = pos % capacity_;
      float* row = qkv + r * cols;
      rotate_half(row, heads_ + kv_heads_, D, cos_.data_ptr<float>() + pos * half, sin_.data_ptr<float>() + pos * half);
      std::memcpy(keys_[layer].data() + slot * kv_heads_ * D, row + heads_ * D, kv_heads_ * D * 4);
      std::memcpy(values_[layer].data() + slot * kv_heads_ * D, row + (heads_ + kv_heads_) * D, kv_heads_ * D * 4);
    }
  }

  // Each (row, head): softmax over the window's tagged keys of q . k / sqrt(d), then the
  // weighted sum of their values.
  void attend(const float* qkv, int64_t M, int64_t start, size_t layer, float* out) {
    const int64_t D = head_dim_, cols = (heads_ + 2 * kv_heads_) * D, group = heads_ / kv_heads_;
    const float scale = 1.0f / std::sqrt((float)D);
    const float* K = keys_[layer].data();
    const float* V = values_[layer].data();
    parallel_for(0, M * heads_, std::max<int64_t>(1, MIN_PARALLEL_WORK / (window_ * D * 2)), [&](int64_t b, int64_t e) {
      std::vector<float> scores(window_);
      std::vector<int64_t> slots(window_);
      for (int64_t task = b; task < e; task++) {
        const int64_t r = task / heads_, head = task % heads_, g = head / group, pos = start + r;
        const float* q = qkv + r * cols + head * D;
        int64_t n = 0;
        float top = -INFINITY;
        for (int64_t p = std::max<int64_t>(0, pos - window_ + 1); p <= pos; p++) {
          const int64_t slot = p % capacity_;
          if (tags_[slot] != p) continue;
          const float* k = K + (slot * kv_heads_ + g) * D;
          float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
          for (int64_t i = 0; i < D; i++) lanes[i % 8] += q[i] * k[i];
          scores[n] = hsum8(lanes) * scale;
          slots[n] = slot;
          top = std::max(top, scores[n++]);
        }
        float* o = out + r * heads_ * D + head * D;
        std::fill(o, o + D, 0.0f);
        float total = 0.0f;
        for (int64_t j = 0; j < n; j++) {
          const float w = std::exp(scores[j] - top);
          total += w;
          const float* v = V + (slots[j] * kv_heads_ + g) * D;
          for (int64_t i = 0; i < D; i++) o[i] += w * v[i];
        }
        for (int64_t i = 0; i < D; i++) o[i] /= total;
      }
    });
  }

  int64_t hidden_, inter_, heads_, kv_heads_, head_dim_, window_, capacity_;
  float eps_;
  at::Tensor cos_, sin_, feature_norm_, embed_norm_, embeddings_, out_norm_;
  Matrix fuse_, reduce_, head_;
  bool has_reduce_ = false;
  std::vector<Layer> layers_;
  std::vector<std::vector<float>> keys_, values_;  // per layer [capacity, kv_heads, head_dim]
  std::vector<int64_t> tags_;                       // the position each ring slot holds, -1 for none
};

}  // namespace vs

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  py::class_<vs::Matrix>(m, "Matrix")
      .def_readonly("format", &vs::Matrix::format)
      .def_readonly("rows", &vs::Matrix::rows)
      .def_readonly("cols", &vs::Matrix::cols)
      .def_property_readonly(
          "wide", [](const vs::Matrix& w) { return w.wide_codes != nullptr; }, "whether it carries the wide layout")
      .def_property_readonly(
          "wide_halves", [](const vs::Matrix& w) { return w.wide_stride != 0 || w.wide_halves != nullptr; },
          "whether its wide layout keeps the scales (and minimums) as float16");
  m.def("make_matrix", &vs::make_matrix, py::arg("format"), py::arg("rows"), py::arg("cols"), py::arg("data"),
        py::arg("scale") = py::none(), py::arg("minimum") = py::none(), py::arg("bias") = py::none());
  m.def("apply", &vs::Decoder::apply, "y = x W^T", py::call_guard<py::gil_scoped_release>());
  m.def("set_threads", &vs::set_threads, "threads of every pass (0: torch's count)", py::arg("threads"));
  m.def("pass_threads", &vs::pass_threads, "threads a pass runs on");
  m.def("parallel_cover", &vs::parallel_cover, "runs of each index by parallel_for (pool tests)", py::arg("n"),
        py::arg("grain"), py::arg("loops"), py::call_guard<py::gil_scoped_release>());
  m.def("amx_available", &vs::amx_available, "whether the AMX kernel can run here");
  m.def("wide_available", &vs::wide_available, "whether quantised matrices carry the wide layout");
  m.def("set_amx_min_rows", &vs::set_amx_min_rows,
        "passes of >= rows take AMX tiles (-1: default; 0: neither tiles nor the wide layout's VNNI kernel)",
        py::arg("rows"));
  m.def("set_wide_pair_rows", &vs::set_wide_pair_rows,
        "4-bit passes of >= rows run two groups of outputs at a time (-1: default; 0: never); "
        "whether that kernel exists here",
        py::arg("rows"));
  py::class_<vs::Decoder>(m, "Decoder")
      .def(py::init<int64_t, int64_t, int64_t, int64_t, int64_t, double, at::Tensor, at::Tensor, int64_t>(),
           py::arg("hidden"), py::arg("intermediate"), py::arg("heads"), py::arg("kv_heads"), py::arg("head_dim"),
           py::arg("eps"), py::arg("cos"), py::arg("sin"), py::arg("slots") = 1)
      .def("add_layer", &vs::Decoder::add_layer)
      .def("set_output", &vs::Decoder::set_output)
      .def("forward", &vs::Decoder::forward, py::call_guard<py::gil_scoped_release>())
      .def("forward_segments", &vs::Decoder::forward_segments, py::call_guard<py::gil_scoped_release>())
      .def("forward_lists", &vs::Decoder::forward_lists, py::call_guard<py::gil_scoped_release>())
      .def("forward_tree", &vs::Decoder::forward_tree, py::call_guard<py::gil_scoped_release>())
      .def("keep_path", &vs::Decoder::keep_path, py::call_guard<py::gil_scoped_release>())
      .def("keys", &vs::Decoder::keys)
      .def("values", &vs::Decoder::values)
      .def_property_readonly("context", &vs::Decoder::context)
      .def_property_readonly("slots", &vs::Decoder::slots);
  py::class_<vs::HeadStack>(m, "HeadStack")
      .def(py::init<int64_t, int64_t, int64_t, int64_t, int64_t, double, at::Tensor, at::Tensor, int64_t, at::Tensor,
                    at::Tensor, vs::Matrix>(),
           py::arg("hidden"), py::arg("intermediate"), py::arg("heads"), py::arg("kv_heads"), py::arg("head_dim"),
           py::arg("eps"), py::arg("cos"), py::arg("sin"), py::arg("window"), py::arg("feature_norm"),
           py::arg("embed_norm"), py::arg("fuse"))
      .def("set_reduce", &vs::HeadStack::set_reduce)
      .def("set_ends", &vs::HeadStack::set_ends)
      .def("add_layer", &vs::HeadStack::add_layer)
      .def("forward", &vs::HeadStack::forward, py::call_guard<py::gil_scoped_release>())
      .def("truncate", &vs::HeadStack::truncate)
      .def("clear", &vs::HeadStack::clear);
}
