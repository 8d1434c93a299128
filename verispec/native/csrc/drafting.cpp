// verispec's drafting helpers: the suffix drafter's chain search and the phrase table's chain,
// in C++. verispec/drafters/suffix.py (``SuffixDrafter.search`` with one branch) and
// verispec/drafters/phrases.py (``PhraseTable.chain``) hold the Python reference; these give
// the same tokens, the same frequencies (the same double divisions in the same order) and the
// same match, count and store, which tests/drafters/test_native_drafting.py checks on random
// stores and on the shipped table.
//
// Why C++: a proposal is asked for every round, between forward passes that stream the whole
// weights (~80 MB) through the caches, so the drafter's data is cold each time. The Python walk
// touches hundreds of scattered objects (list items, ints, dict entries, tuples), and each call
// between them is cold code too. With 100 MB read between proposals (dev answers, 1,852
// proposals), a proposal and its observation took 77 us (the request alone) to 119 us (with
// the cache of earlier requests and the phrase table); prompt lookup's took 35. Here one call a
// round (``Suffix.propose``: the document brought up to the context, the chain, the table's
// fallback) reads a few contiguous arrays, and the phrase table is a hash table (one cache line
// a look-up) instead of binary searches over ~250k sorted keys (~19 lines each): 33-38 us.
// (A first version that kept the document in Python and passed 13 arguments a call took 56-72:
// the binding's argument conversions are cold code as well.)
//
// Terms as in suffix.py: an occurrence is a position right after a match of the context's last
// n tokens (n = KEY, or fewer where those have none); its match length is how many of the
// context's last tokens equal the tokens before it; the runs are what followed the deepest
// occurrences; the chain follows the most frequent next token of the runs (ties: the most
// recent occurrence, the request's own before the cache's) while the product of frequencies
// stays at least min_score.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace vsd {

// Token arrays as NumPy hands them over: int64, contiguous, no copy (the bindings mark them
// noconvert: another dtype is refused rather than copied behind the caller's back).
using I64 = py::array_t<int64_t, py::array::c_style>;
using U64 = py::array_t<uint64_t, py::array::c_style>;
using I32 = py::array_t<int32_t, py::array::c_style>;
using U32 = py::array_t<uint32_t, py::array::c_style>;

template <typename A>
static int64_t length(const A& a, const char* name) {
  if (a.ndim() != 1) throw std::invalid_argument(std::string(name) + " must be one-dimensional");
  return a.shape(0);
}

// ---------------------------------------------------------------------------------------
// The suffix drafter's chain.

struct Run {
  int64_t recency;     // ranks ties: the cache's position p, the request's (1 << 40) + p
  const int64_t* tok;  // what followed the occurrence
  int64_t len;         // up to the walk's depth, cut at a document separator
};

// The positions e in [n, size - 1] (each followed by a token) whose n tokens before equal the
// store's last n tokens: the most recent ``limit`` of them, oldest first (as the Python index
// keeps them).
static void occurrences(const int64_t* t, int64_t size, int64_t n, int64_t limit, std::vector<int64_t>& out) {
  out.clear();
  const int64_t* tail = t + size - n;
  for (int64_t e = size - 1; e >= n && static_cast<int64_t>(out.size()) < limit; --e) {
    if (t[e - 1] != tail[n - 1]) continue;
    int64_t i = 0;
    while (i < n - 1 && t[e - n + i] == tail[i]) ++i;
    if (i == n - 1) out.push_back(e);
  }
  std::reverse(out.begin(), out.end());
}

// suffix.py's ``_key``: n tokens of ``bits`` bits each, and n above them.
static int64_t cache_key(const int64_t* tail, int64_t n, int64_t bits, int64_t key_len) {
  const uint64_t mask = (uint64_t{1} << bits) - 1;
  uint64_t key = 0;
  for (int64_t i = 0; i < n; ++i) key = (key << bits) | (static_cast<uint64_t>(tail[i]) & mask);
  return static_cast<int64_t>(key + (static_cast<uint64_t>(n) << (bits * key_len)));
}

// How many of the context's last tokens (ending just before ``context_end``) equal the tokens
// of ``store`` right before position p, up to ``limit``. A separator (-1) never matches.
static int64_t match_before(const int64_t* store, int64_t p, const int64_t* context_end, int64_t limit) {
  const int64_t most = std::min(limit, p);
  int64_t n = 0;
  while (n < most && store[p - 1 - n] == context_end[-1 - n]) ++n;
  return n;
}

// suffix.py's ``_follow_runs``: the chain of most frequent next tokens.
static void follow_runs(std::vector<Run> runs, int64_t depth, double min_score, std::vector<int64_t>& tokens,
                        std::vector<double>& frequencies) {
  if (runs.size() == 1) {
    for (int64_t i = 0; i < runs[0].len; ++i) {
      tokens.push_back(runs[0].tok[i]);
      frequencies.push_back(1.0);
    }
    return;
  }
  double score = 1.0;
  std::vector<std::pair<int64_t, int64_t>> next;  // (token, recency) of each run still going
  for (int64_t d = 0; d < depth; ++d) {
    next.clear();
    for (const Run& run : runs)
      if (d < run.len) next.emplace_back(run.tok[d], run.recency);
    if (next.empty()) break;
    std::sort(next.begin(), next.end());
    int64_t best = -1, best_count = 0, best_latest = -1;
    for (size_t i = 0; i < next.size();) {
      size_t j = i;
      while (j < next.size() && next[j].first == next[i].first) ++j;
      const int64_t count = static_cast<int64_t>(j - i), latest = next[j - 1].second;  // sorted: largest last
      if (count > best_count || (count == best_count && latest > best_latest)) {
        best = next[i].first, best_count = count, best_latest = latest;
      }
      i = j;
    }
    const double frequency = static_cast<double>(best_count) / static_cast<double>(next.size());
    if (score * frequency < min_score) break;
    score *= frequency;
    tokens.push_back(best);
    frequencies.push_back(frequency);
    size_t kept = 0;
    for (const Run& run : runs)
      if (d < run.len && run.tok[d] == best) runs[kept++] = run;
    runs.resize(kept);
  }
}

// ---------------------------------------------------------------------------------------
// The phrase table as hash tables, one per context length.

static inline uint64_t mix(uint64_t x) {  // splitmix64's finaliser: every key bit moves the top bits
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

static constexpr uint64_t MULTIPLIER = 0x9E3779B97F4A7C15ULL;  // phrases.py's _MULTIPLIER

struct Slot {
  uint64_t key;
  double frequency;  // count / total, the division phrases.py makes
  int32_t token;     // -1: empty
};

struct Order {
  int64_t n;
  int shift;  // 64 - log2(slots)
  std::vector<Slot> slots;

  const Slot* find(uint64_t key) const {
    const size_t mask = slots.size() - 1;
    for (size_t at = mix(key) >> shift;; at = (at + 1) & mask) {
      const Slot& slot = slots[at];
      if (slot.token < 0) return nullptr;
      if (slot.key == key) return &slot;
    }
  }
};

class Phrases {
 public:
  // ``orders``: (n, keys, tokens, counts, totals) per context length, longest first, as
  // ``PhraseTable.orders`` holds them (keys sorted and unique within an order).
  explicit Phrases(const py::list& orders) {
    for (const py::handle& item : orders) {
      auto parts = item.cast<py::tuple>();
      if (parts.size() != 5) throw std::invalid_argument("an order is (n, keys, tokens, counts, totals)");
      const auto n = parts[0].cast<int64_t>();
      const auto keys = parts[1].cast<U64>();
      const auto ids = parts[2].cast<I32>();
      const auto counts = parts[3].cast<U32>();
      const auto totals = parts[4].cast<U32>();
      const int64_t entries = length(keys, "keys");
      if (n < 1 || length(ids, "tokens") != entries || length(counts, "counts") != entries ||
          length(totals, "totals") != entries)
        throw std::invalid_argument("an order's arrays differ in length, or its n is below 1");
      if (!orders_.empty() && n >= orders_.back().n) throw std::invalid_argument("orders go longest first");
      Order order{n, 0, {}};
      size_t slots = 16;
      while (slots * 2 < static_cast<size_t>(entries) * 3) slots *= 2;  // load at most 2/3
      order.shift = 64 - __builtin_ctzll(slots);
      order.slots.assign(slots, Slot{0, 0.0, -1});
      const uint64_t* key_of = keys.data();
      const int32_t* token_of = ids.data();
      const uint32_t* count_of = counts.data();
      const uint32_t* total_of = totals.data();
      for (int64_t i = 0; i < entries; ++i) {
        const uint64_t key = key_of[i];
        if (token_of[i] < 0 || total_of[i] == 0) throw std::invalid_argument("an entry has no token or no total");
        if (i > 0 && key <= key_of[i - 1]) throw std::invalid_argument("an order's keys must be sorted and unique");
        size_t at = mix(key) >> order.shift;
        while (order.slots[at].token >= 0) at = (at + 1) & (slots - 1);
        order.slots[at] = Slot{key, static_cast<double>(count_of[i]) / static_cast<double>(total_of[i]), token_of[i]};
      }
      longest_ = std::max(longest_, n);
      orders_.push_back(std::move(order));
    }
  }

  // ``PhraseTable.chain`` after the first ``size`` tokens of ``doc``: (tokens, frequencies,
  // the context length the first token rested on, 0 if none).
  py::tuple chain(const I64& doc, int64_t size, int64_t k, double min_score) const {
    if (size < 0 || size > length(doc, "doc")) throw std::invalid_argument("size is beyond the document");
    std::vector<int64_t> tokens;
    std::vector<double> frequencies;
    const int64_t first = chain_into(doc.data(), size, k, min_score, tokens, frequencies);
    return py::make_tuple(tokens, frequencies, first);
  }

  // ``chain`` into ``tokens`` and ``frequencies`` (empty before), returning the first's order.
  int64_t chain_into(const int64_t* doc, int64_t size, int64_t k, double min_score, std::vector<int64_t>& tokens,
                     std::vector<double>& frequencies) const {
    std::vector<int64_t> tail(doc + std::max<int64_t>(0, size - longest_), doc + size);
    int64_t first = 0;
    double score = 1.0;
    while (static_cast<int64_t>(tokens.size()) < k) {
      const Slot* found = nullptr;
      int64_t used = 0;
      for (const Order& order : orders_) {
        const auto have = static_cast<int64_t>(tail.size());
        if (have < order.n) continue;
        uint64_t key = static_cast<uint64_t>(order.n);
        for (int64_t i = have - order.n; i < have; ++i) key = key * MULTIPLIER + static_cast<uint64_t>(tail[i] + 1);
        if ((found = order.find(key)) != nullptr) {
          used = order.n;
          break;
        }
      }
      if (found == nullptr || score * found->frequency < min_score) break;
      score *= found->frequency;
      tokens.push_back(found->token);
      frequencies.push_back(found->frequency);
      first = first != 0 ? first : used;
      tail.push_back(found->token);
      if (static_cast<int64_t>(tail.size()) > longest_) tail.erase(tail.begin());
    }
    return first;
  }

  size_t bytes() const {
    size_t total = 0;
    for (const Order& order : orders_) total += order.slots.size() * sizeof(Slot);
    return total;
  }

 private:
  std::vector<Order> orders_;
  int64_t longest_ = 0;
};

// ---------------------------------------------------------------------------------------
// The proposal.

enum Store { REQUEST = 0, CACHE = 1, PHRASES = 2 };  // suffix.py's, the store a proposal rests on

struct Settings {  // SuffixDrafter's, and suffix.py's constants
  double min_score;
  int64_t max_match;
  double spec_factor;
  int64_t key_len, max_candidates, token_bits;
};

struct CacheView {  // SuffixCache's arrays: tokens, sorted keys, the position after each key's n-gram
  const int64_t* tokens;
  int64_t n_tokens;
  const int64_t* keys;
  const int64_t* next;
  int64_t n_keys;
};

struct Found {  // a proposal: suffix.py's Walk of a chain
  std::vector<int64_t> tokens;
  std::vector<double> frequencies;
  int64_t match = 0, count = 0;
  int store = REQUEST;
};

// ``SuffixDrafter.search`` with one branch, then, where it proposes nothing and ``phrases`` is
// given, the phrase table's chain (``phrase_walk``). ``t``: the request's prompt and output so
// far (``size`` tokens, at least one).
static void chain(const int64_t* t, int64_t size, const CacheView& cache, int64_t k, const Settings& s,
                  const Phrases* phrases, Found& out) {
  std::vector<int64_t> own;
  const int64_t* cached = nullptr;
  int64_t n_cached = 0, n = std::min(s.key_len, size);
  for (; n >= 1; --n) {
    occurrences(t, size, n, s.max_candidates, own);
    if (n == s.key_len && cache.n_tokens > 0) {
      const int64_t key = cache_key(t + size - n, n, s.token_bits, s.key_len);
      const int64_t* end = cache.keys + cache.n_keys;
      const int64_t lo = std::lower_bound(cache.keys, end, key) - cache.keys;
      const int64_t hi = std::lower_bound(cache.keys, end, key + 1) - cache.keys;
      const int64_t start = std::max(lo, hi - s.max_candidates);
      cached = cache.next + start, n_cached = hi - start;
    }
    if (!own.empty() || n_cached > 0) break;
  }
  if (n > 0) {
    // Below KEY every occurrence matches exactly n tokens (one of n + 1 would be of that key).
    const int64_t limit = std::min(s.max_match, size), shallow = std::min(n, s.max_match);
    std::vector<int64_t> cached_lengths(n_cached, shallow), own_lengths(own.size(), shallow);
    if (n == s.key_len) {
      for (int64_t i = 0; i < n_cached; ++i) cached_lengths[i] = match_before(cache.tokens, cached[i], t + size, limit);
      for (size_t i = 0; i < own.size(); ++i) own_lengths[i] = match_before(t, own[i], t + size, limit);
    }
    int64_t deepest = 0;
    for (int64_t each : cached_lengths) deepest = std::max(deepest, each);
    for (int64_t each : own_lengths) deepest = std::max(deepest, each);
    const auto scaled = static_cast<int64_t>(s.spec_factor * static_cast<double>(deepest));
    const int64_t depth = std::min(k, std::max<int64_t>(1, scaled));
    std::vector<Run> runs;
    for (int64_t i = 0; i < n_cached; ++i) {
      if (cached_lengths[i] < deepest) continue;
      const int64_t p = cached[i];
      int64_t len = std::max<int64_t>(0, std::min(depth, cache.n_tokens - p));
      for (int64_t j = 0; j < len; ++j)
        if (cache.tokens[p + j] < 0) len = j;  // a document's end
      runs.push_back({p, cache.tokens + p, len});
    }
    bool own_deepest = false;
    for (size_t i = 0; i < own.size(); ++i) {
      if (own_lengths[i] < deepest) continue;
      own_deepest = true;
      runs.push_back({(int64_t{1} << 40) + own[i], t + own[i], std::min(depth, size - own[i])});
    }
    follow_runs(runs, depth, s.min_score, out.tokens, out.frequencies);
    out.match = deepest, out.count = static_cast<int64_t>(runs.size()), out.store = own_deepest ? REQUEST : CACHE;
  }
  if (out.tokens.empty() && phrases != nullptr) {
    out = Found{};
    out.match = phrases->chain_into(t, size, k, s.min_score, out.tokens, out.frequencies);
    out.store = PHRASES;
  }
}

// A token id of a Python sequence (an int, or anything with __index__; ids are >= 0).
static int64_t as_id(PyObject* item) {
  const long long id = PyLong_AsLongLong(item);
  if (id == -1 && PyErr_Occurred()) throw py::error_already_set();
  if (id < 0) throw std::invalid_argument("token ids are >= 0, got " + std::to_string(id));
  return id;
}

// A sequence's items without copies where it is a list or tuple (PySequence_Fast).
class Items {
 public:
  explicit Items(py::handle sequence) {
    PyObject* fast = PySequence_Fast(sequence.ptr(), "token ids must be a sequence");
    if (fast == nullptr) throw py::error_already_set();
    owner_ = py::reinterpret_steal<py::object>(fast);
    size_ = PySequence_Fast_GET_SIZE(fast);
    items_ = PySequence_Fast_ITEMS(fast);
  }
  int64_t size() const { return size_; }
  int64_t operator[](int64_t i) const { return as_id(items_[i]); }

 private:
  py::object owner_;
  Py_ssize_t size_ = 0;
  PyObject** items_ = nullptr;
};

// The suffix drafter's request in C++: its document (prompt and output so far), a view of the
// cache of earlier requests (``set_cache``), the phrase table, the settings. One call a round
// (``propose``: bring the document up to the context, then the chain) keeps the Python work of
// a proposal to building its Draft.
class Suffix {
 public:
  Suffix(double min_score, int64_t max_match, double spec_factor, int64_t key_len, int64_t max_candidates,
         int64_t token_bits, py::object phrases)
      : settings_{min_score, max_match, spec_factor, key_len, max_candidates, token_bits}, phrases_object_(phrases) {
    if (max_match < 1 || key_len < 1 || max_candidates < 1 || token_bits < 1 || key_len * token_bits > 61)
      throw std::invalid_argument("bad suffix settings");
    phrases_ = phrases.is_none() ? nullptr : phrases.cast<const Phrases*>();
    set_cache(I64(0), I64(0), I64(0));
  }

  // The cache's arrays as ``SuffixCache.snapshot`` holds them (kept alive here until replaced).
  void set_cache(const I64& tokens, const I64& keys, const I64& next) {
    if (length(keys, "keys") != length(next, "next")) throw std::invalid_argument("the cache's keys and positions differ");
    cache_tokens_ = tokens, cache_keys_ = keys, cache_next_ = next;
    cache_ = CacheView{tokens.data(), length(tokens, "tokens"), keys.data(), next.data(), keys.shape(0)};
  }

  void clear() { doc_.clear(); }

  void extend(py::handle ids) {
    const Items items(ids);
    for (int64_t i = 0; i < items.size(); ++i) doc_.push_back(items[i]);
  }

  // ``SuffixDrafter._sync``: extend the document by the context's new tokens, or start it over
  // where the context is not an extension of it.
  void sync(py::handle context) {
    const Items items(context);
    auto known = static_cast<int64_t>(doc_.size());
    if (items.size() < known || (known > 0 && items[known - 1] != doc_.back())) doc_.clear(), known = 0;
    for (int64_t i = known; i < items.size(); ++i) doc_.push_back(items[i]);
  }

  // sync, then the chain (with the phrase table's fallback): (tokens, frequencies, match,
  // count, store); None where k <= 0 or the document is empty (nothing was asked).
  py::object propose(py::handle context, int64_t k) {
    sync(context);
    if (k <= 0 || doc_.empty()) return py::none();
    Found found;
    chain(doc_.data(), static_cast<int64_t>(doc_.size()), cache_, k, settings_, phrases_, found);
    return py::make_tuple(found.tokens, found.frequencies, found.match, found.count, found.store);
  }

  // ``propose`` on the context followed by ``extra`` (tokens drafted, not committed): the
  // document is left as the context has it.
  py::object propose_after(py::handle context, py::handle extra, int64_t k) {
    sync(context);
    const Items more(extra);
    std::vector<int64_t> tail(static_cast<size_t>(more.size()));
    for (int64_t i = 0; i < more.size(); ++i) tail[static_cast<size_t>(i)] = more[i];  // checked first
    if (k <= 0 || doc_.size() + tail.size() == 0) return py::none();
    const size_t known = doc_.size();
    doc_.insert(doc_.end(), tail.begin(), tail.end());
    Found found;
    try {
      chain(doc_.data(), static_cast<int64_t>(doc_.size()), cache_, k, settings_, phrases_, found);
    } catch (...) {
      doc_.resize(known);
      throw;
    }
    doc_.resize(known);
    return py::make_tuple(found.tokens, found.frequencies, found.match, found.count, found.store);
  }

  // The chain alone (``SuffixDrafter.search``), on the document as it is.
  py::tuple search(int64_t k) const {
    Found found;
    if (k > 0 && !doc_.empty()) chain(doc_.data(), static_cast<int64_t>(doc_.size()), cache_, k, settings_, nullptr, found);
    return py::make_tuple(found.tokens, found.frequencies, found.match, found.count, found.store);
  }

  I64 tokens() const {
    I64 out(static_cast<py::ssize_t>(doc_.size()));
    std::copy(doc_.begin(), doc_.end(), out.mutable_data());
    return out;
  }

  int64_t size() const { return static_cast<int64_t>(doc_.size()); }

 private:
  Settings settings_;
  py::object phrases_object_;  // keeps the table alive
  const Phrases* phrases_ = nullptr;
  I64 cache_tokens_, cache_keys_, cache_next_;
  CacheView cache_{};
  std::vector<int64_t> doc_;
};

}  // namespace vsd

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "verispec's drafting helpers (the suffix drafter's request and chain, the phrase table)";
  py::class_<vsd::Phrases>(m, "Phrases")
      .def(py::init<const py::list&>(), py::arg("orders"))
      .def("chain", &vsd::Phrases::chain, py::arg("doc").noconvert(), py::arg("size"), py::arg("k"),
           py::arg("min_score"))
      .def_property_readonly("bytes", &vsd::Phrases::bytes);
  py::class_<vsd::Suffix>(m, "Suffix")
      .def(py::init<double, int64_t, double, int64_t, int64_t, int64_t, py::object>(), py::arg("min_score"),
           py::arg("max_match"), py::arg("spec_factor"), py::arg("key_len"), py::arg("max_candidates"),
           py::arg("token_bits"), py::arg("phrases"))
      .def("set_cache", &vsd::Suffix::set_cache, py::arg("tokens").noconvert(), py::arg("keys").noconvert(),
           py::arg("next").noconvert())
      .def("clear", &vsd::Suffix::clear)
      .def("extend", &vsd::Suffix::extend, py::arg("ids"))
      .def("sync", &vsd::Suffix::sync, py::arg("context"))
      .def("propose", &vsd::Suffix::propose, py::arg("context"), py::arg("k"))
      .def("propose_after", &vsd::Suffix::propose_after, py::arg("context"), py::arg("extra"), py::arg("k"))
      .def("search", &vsd::Suffix::search, py::arg("k"))
      .def("tokens", &vsd::Suffix::tokens)
      .def_property_readonly("size", &vsd::Suffix::size);
}
