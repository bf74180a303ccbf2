// extern "C" shim over libmlx for bun:ffi.
//
// Contract, for every entry point:
// - Arrays cross as opaque `Arr*` handles. A handle carries a magic tag so a disposed or
//   foreign handle is reported as an error instead of being dereferenced blindly.
// - No C++ exception ever crosses the boundary: each entry catches everything, stores the
//   message in a thread-local last error, and returns NULL (handle results) or -1 (status).
// - Results come back as return values, never through out-parameters; multi-output ops
//   return a `Vec*` whose items are read one call at a time.
// - Scalars combine with arrays as Python scalars do (mlx python/src/utils.cpp `to_array`):
//   see weak_scalar() below, the one place this rule lives.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "mlx/backend/cuda/cuda.h"
#include "mlx/backend/gpu/device_info.h"
#include "mlx/backend/metal/metal.h"
#include "mlx/compile_impl.h"
#include "mlx/primitives.h"
#include "mlx/mlx.h"

namespace mx = mlx::core;
using mx::array;

namespace {

constexpr uint32_t kLive = 0x4d4c5841;  // "MLXA"
constexpr uint32_t kDead = 0xdeadbeef;
constexpr uint32_t kVecLive = 0x4d4c5856;  // "MLXV"

// Array handles live in slots of a pool the shim owns (chunks are never returned to the OS).
// A pointer is accepted only if it is a slot of one of our chunks whose tag says live, so a
// disposed, double-freed or foreign handle is rejected without dereferencing foreign memory.
struct Arr {
  uint32_t magic = kDead;
  std::optional<array> a;
  Arr* next_free = nullptr;
};

struct Vec {
  uint32_t magic = kVecLive;
  std::vector<array> items;
};

thread_local std::string g_error;
int64_t g_live_handles = 0;

class HandlePool {
 public:
  Arr* acquire(array x) {
    if (free_ == nullptr) grow();
    Arr* h = free_;
    free_ = h->next_free;
    h->next_free = nullptr;
    h->a.emplace(std::move(x));
    h->magic = kLive;
    return h;
  }
  // True if p is a slot of this pool (it may be live or free).
  bool owns(const void* p) const {
    auto u = reinterpret_cast<std::uintptr_t>(p);
    // chunks_ is sorted by start address: find the last chunk starting at or before u
    size_t lo = 0, hi = chunks_.size();
    while (lo < hi) {
      size_t mid = (lo + hi) / 2;
      if (chunks_[mid].first <= u) lo = mid + 1;
      else hi = mid;
    }
    if (lo == 0) return false;
    const auto& [begin, end] = chunks_[lo - 1];
    return u < end && (u - begin) % sizeof(Arr) == 0;
  }
  bool live(const Arr* h) const { return h != nullptr && owns(h) && h->magic == kLive; }
  void release(Arr* h) {
    h->magic = kDead;
    h->a.reset();
    h->next_free = free_;
    free_ = h;
  }

 private:
  static constexpr size_t kChunk = 4096;
  void grow() {
    Arr* chunk = new Arr[kChunk];
    auto begin = reinterpret_cast<std::uintptr_t>(chunk);
    chunks_.insert(std::upper_bound(chunks_.begin(), chunks_.end(), std::make_pair(begin, std::uintptr_t{0})),
                   {begin, begin + kChunk * sizeof(Arr)});
    for (size_t i = kChunk; i-- > 0;) {
      chunk[i].next_free = free_;
      free_ = &chunk[i];
    }
  }
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> chunks_;
  Arr* free_ = nullptr;
};

// Handles are created and freed on the JS thread only. Leaked on purpose: never destroyed
// during static teardown (a late finalizer may still free a handle).
HandlePool& pool() {
  static auto* p = new HandlePool();
  return *p;
}

void set_error(const char* where, const char* what) {
  g_error = std::string(where) + ": " + what;
}

Arr* wrap(array x) {
  Arr* h = pool().acquire(std::move(x));
  ++g_live_handles;
  return h;
}

const array& A(const Arr* h, const char* role = "array") {
  if (h == nullptr) {
    throw std::invalid_argument(std::string("null ") + role + " handle");
  }
  if (!pool().live(h)) {
    throw std::invalid_argument(std::string("invalid ") + role + " handle (disposed or foreign)");
  }
  return *h->a;
}

std::optional<array> opt(const Arr* h) {
  if (h == nullptr) return std::nullopt;
  return A(h);
}

Vec& V(Vec* v) {
  if (v == nullptr || v->magic != kVecLive) throw std::invalid_argument("invalid vector handle");
  return *v;
}

mx::Shape shape_of(const int32_t* p, int n) {
  if (n < 0) throw std::invalid_argument("negative shape length");
  return n == 0 ? mx::Shape{} : mx::Shape(p, p + n);
}

std::vector<int> ints_of(const int32_t* p, int n) {
  if (n < 0) throw std::invalid_argument("negative axes length");
  return n == 0 ? std::vector<int>{} : std::vector<int>(p, p + n);
}

std::vector<array> arrays_of(const double* handles, int n) {
  if (n < 0) throw std::invalid_argument("negative array count");
  std::vector<array> out;
  out.reserve(n);
  for (int i = 0; i < n; ++i) {
    out.push_back(A(reinterpret_cast<const Arr*>(static_cast<uintptr_t>(handles[i]))));
  }
  return out;
}

mx::Dtype dtype_of(int code) {
  using V = mx::Dtype::Val;
  switch (static_cast<V>(code)) {
    case V::bool_: return mx::bool_;
    case V::uint8: return mx::uint8;
    case V::uint16: return mx::uint16;
    case V::uint32: return mx::uint32;
    case V::uint64: return mx::uint64;
    case V::int8: return mx::int8;
    case V::int16: return mx::int16;
    case V::int32: return mx::int32;
    case V::int64: return mx::int64;
    case V::float16: return mx::float16;
    case V::float32: return mx::float32;
    case V::float64: return mx::float64;
    case V::bfloat16: return mx::bfloat16;
    case V::complex64: return mx::complex64;
  }
  throw std::invalid_argument("unknown dtype code " + std::to_string(code));
}

// Scalar kinds, as Python sees them.
enum ScalarKind : int { kFloat = 0, kInt = 1, kBool = 2 };

const char* int_dtype_name(mx::Dtype t) {
  switch (t.val()) {
    case mx::Dtype::Val::int8: return "int8";
    case mx::Dtype::Val::int16: return "int16";
    case mx::Dtype::Val::int32: return "int32";
    case mx::Dtype::Val::int64: return "int64";
    case mx::Dtype::Val::uint8: return "uint8";
    case mx::Dtype::Val::uint16: return "uint16";
    case mx::Dtype::Val::uint32: return "uint32";
    case mx::Dtype::Val::uint64: return "uint64";
    default: return "integer";
  }
}

// Python's to_array overflow check for an int scalar meeting an integer array.
void check_int_range(double v, mx::Dtype t) {
  double lo = 0, hi = 0;
  switch (t.val()) {
    case mx::Dtype::Val::int8: lo = -128.0; hi = 127.0; break;
    case mx::Dtype::Val::int16: lo = -32768.0; hi = 32767.0; break;
    case mx::Dtype::Val::int32: lo = -2147483648.0; hi = 2147483647.0; break;
    case mx::Dtype::Val::int64: lo = -9223372036854775808.0; hi = 9223372036854775807.0; break;
    case mx::Dtype::Val::uint8: hi = 255.0; break;
    case mx::Dtype::Val::uint16: hi = 65535.0; break;
    case mx::Dtype::Val::uint32: hi = 4294967295.0; break;
    case mx::Dtype::Val::uint64: hi = 18446744073709551615.0; break;
    default: return;
  }
  if (v < lo || v > hi) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.0f", v);
    throw std::invalid_argument(std::string("Converting ") + buf + " to " + int_dtype_name(t) + " would result in overflow.");
  }
}

// Python's weak scalar rule (mlx python/src/utils.cpp to_array):
// - float: rounded to float32 first, then to the array's dtype if that is floating
//   (float64 keeps the double), else the scalar stays float32 and promotion decides.
// - int: takes the array's dtype (bool arrays take int32).
// - bool: a bool scalar.
array weak_scalar(double v, int kind, mx::Dtype like) {
  switch (kind) {
    case kFloat:
      if (like == mx::float64) return array(v, mx::float64);
      if (mx::issubdtype(like, mx::floating)) return array(static_cast<float>(v), like);
      if (like == mx::complex64) return array(static_cast<float>(v), mx::complex64);
      return array(static_cast<float>(v), mx::float32);
    case kInt: {
      mx::Dtype t = like == mx::bool_ ? mx::int32 : like;
      // Python checks the range for integer arrays (not for bool, which wraps into int32).
      if (like != mx::bool_ && mx::issubdtype(t, mx::integer)) check_int_range(v, t);
      return array(static_cast<int64_t>(v), t);
    }
    case kBool:
      return array(v != 0.0);
  }
  throw std::invalid_argument("unknown scalar kind " + std::to_string(kind));
}

// Index checks (defined in the reliability section): MLX's CPU kernels address memory with
// index values unchecked, so an out-of-range index read or wrote outside the array.
void check_indices(const array& idx, int64_t size, const char* what);
void check_batch_indices(const std::optional<array>& idx, const array& operand, const char* what);
void check_dynamic_start(const array& start, const std::vector<int>& axes, const array& src, const mx::Shape& window);

// Quantization group size / bits: negative means "the mode's default"; 0 is refused (MLX divides
// by it: SIGFPE, in Python too).
std::optional<int> opt_int(int v, const char* what = "group_size and bits") {
  if (v == 0) throw std::invalid_argument(std::string(what) + " must be positive");
  return v < 0 ? std::nullopt : std::optional<int>(v);
}

// Op tables: names are the single source of truth; the TS side reads them at load time.
using Unary = array (*)(const array&, mx::StreamOrDevice);
using Binary = array (*)(const array&, const array&, mx::StreamOrDevice);

struct UnaryOp { const char* name; Unary fn; };
struct BinaryOp { const char* name; Binary fn; };

#define U(n) {#n, [](const array& a, mx::StreamOrDevice s) { return mx::n(a, s); }}
const UnaryOp kUnary[] = {
    U(abs), U(negative), U(sign), U(exp), U(expm1), U(log), U(log1p), U(log2), U(log10),
    U(sqrt), U(rsqrt), U(square), U(reciprocal), U(sin), U(cos), U(tan), U(tanh),
    U(sinh), U(cosh), U(arcsin), U(arccos), U(arctan), U(erf), U(erfinv), U(sigmoid),
    U(floor), U(ceil), U(logical_not), U(isnan), U(isinf), U(isfinite), U(stop_gradient),
    U(bitwise_invert), U(copy), U(zeros_like), U(ones_like), U(arcsinh), U(arccosh), U(arctanh),
    U(degrees), U(radians), U(isposinf), U(isneginf),
};
#undef U

#define B(n) {#n, [](const array& a, const array& b, mx::StreamOrDevice s) { return mx::n(a, b, s); }}
const BinaryOp kBinary[] = {
    B(add), B(subtract), B(multiply), B(divide), B(power), B(floor_divide), B(remainder),
    B(maximum), B(minimum), B(equal), B(not_equal), B(greater), B(greater_equal), B(less),
    B(less_equal), B(logical_and), B(logical_or), B(bitwise_and), B(bitwise_or),
    B(bitwise_xor), B(left_shift), B(right_shift), B(logaddexp), B(arctan2), B(matmul),
    B(logical_xor), B(outer), B(inner), B(kron),
};
#undef B

enum ReduceOp : int { kSum, kMean, kMax, kMin, kProd, kAll, kAny, kLogsumexp, kVar, kStd };
const char* kReduceNames[] = {"sum", "mean", "max", "min", "prod", "all", "any", "logsumexp", "var", "std"};

array reduce(int op, const array& a, const std::vector<int>& axes, bool keepdims, int ddof) {
  switch (op) {
    case kSum: return mx::sum(a, axes, keepdims);
    case kMean: return mx::mean(a, axes, keepdims);
    case kMax: return mx::max(a, axes, keepdims);
    case kMin: return mx::min(a, axes, keepdims);
    case kProd: return mx::prod(a, axes, keepdims);
    case kAll: return mx::all(a, axes, keepdims);
    case kAny: return mx::any(a, axes, keepdims);
    case kLogsumexp: return mx::logsumexp(a, axes, keepdims);
    case kVar: return mx::var(a, axes, keepdims, ddof);
    case kStd: return mx::std(a, axes, keepdims, ddof);
  }
  throw std::invalid_argument("unknown reduction " + std::to_string(op));
}

array reduce_all(int op, const array& a, bool keepdims, int ddof) {
  switch (op) {
    case kSum: return mx::sum(a, keepdims);
    case kMean: return mx::mean(a, keepdims);
    case kMax: return mx::max(a, keepdims);
    case kMin: return mx::min(a, keepdims);
    case kProd: return mx::prod(a, keepdims);
    case kAll: return mx::all(a, keepdims);
    case kAny: return mx::any(a, keepdims);
    case kLogsumexp: return mx::logsumexp(a, keepdims);
    case kVar: return mx::var(a, keepdims, ddof);
    case kStd: return mx::std(a, keepdims, ddof);
  }
  throw std::invalid_argument("unknown reduction " + std::to_string(op));
}

// The arrays a JS callback returned (a vector it built with mlxb_vec_new, freed here); NULL
// means the JS function threw (the TS side holds the exception).
std::vector<array> take_js_outputs(Vec* out) {
  if (out == nullptr) throw std::runtime_error("the traced JS function failed");
  if (out->magic != kVecLive) throw std::runtime_error("the traced JS function returned an invalid vector");
  std::vector<array> result = std::move(out->items);
  out->magic = kDead;
  delete out;
  return result;
}

// Compiled closures: a JS trace callback wrapped into the std::function MLX compiles.
using TraceFn = Vec* (*)(Vec* inputs);

struct Compiled {
  uint32_t magic = 0x4d4c5843;  // "MLXC"
  std::function<std::vector<array>(const std::vector<array>&)> fn;
  std::uintptr_t id = 0;
};

}  // namespace

#define GUARD_PTR(where, ...)                                         \
  try {                                                                \
    __VA_ARGS__                                                        \
  } catch (const std::exception& e) {                                  \
    set_error(where, e.what());                                        \
  } catch (...) {                                                      \
    set_error(where, "unknown C++ exception");                         \
  }                                                                    \
  return nullptr;

#define GUARD_INT(where, ...)                                         \
  try {                                                                \
    __VA_ARGS__                                                        \
  } catch (const std::exception& e) {                                  \
    set_error(where, e.what());                                        \
  } catch (...) {                                                      \
    set_error(where, "unknown C++ exception");                         \
  }                                                                    \
  return -1;

extern "C" {

// ---------------------------------------------------------------- errors, handles, info

const char* mlxb_last_error() { return g_error.c_str(); }
void mlxb_clear_error() { g_error.clear(); }
double mlxb_live_handles() { return static_cast<double>(g_live_handles); }

int mlxb_free(Arr* h) {
  if (h == nullptr) return 0;
  GUARD_INT("free", {
    if (!pool().live(h)) throw std::invalid_argument("double free or foreign handle");
    pool().release(h);
    --g_live_handles;
    return 0;
  })
}

// A second owned handle to the same array (shares the graph node; freed independently).
Arr* mlxb_retain(const Arr* h) { GUARD_PTR("retain", { return wrap(A(h)); }) }

int mlxb_is_live(const Arr* h) { return pool().live(h) ? 1 : 0; }

const char* mlxb_version() { return mx::version(); }

int mlxb_ndim(const Arr* h) { GUARD_INT("ndim", { return static_cast<int>(A(h).ndim()); }) }
int mlxb_dim(const Arr* h, int i) { GUARD_INT("shape", { return A(h).shape(i); }) }
int mlxb_dtype(const Arr* h) { GUARD_INT("dtype", { return static_cast<int>(A(h).dtype().val()); }) }
double mlxb_size(const Arr* h) {
  try { return static_cast<double>(A(h).size()); } catch (const std::exception& e) { set_error("size", e.what()); }
  return -1;
}
double mlxb_nbytes(const Arr* h) {
  try { return static_cast<double>(A(h).nbytes()); } catch (const std::exception& e) { set_error("nbytes", e.what()); }
  return -1;
}

int mlxb_unary_count() { return sizeof(kUnary) / sizeof(kUnary[0]); }
const char* mlxb_unary_name(int i) { return i >= 0 && i < mlxb_unary_count() ? kUnary[i].name : nullptr; }
int mlxb_binary_count() { return sizeof(kBinary) / sizeof(kBinary[0]); }
const char* mlxb_binary_name(int i) { return i >= 0 && i < mlxb_binary_count() ? kBinary[i].name : nullptr; }
int mlxb_reduce_count() { return sizeof(kReduceNames) / sizeof(kReduceNames[0]); }
const char* mlxb_reduce_name(int i) { return i >= 0 && i < mlxb_reduce_count() ? kReduceNames[i] : nullptr; }

// ---------------------------------------------------------------- vectors (multi-output)

Vec* mlxb_vec_new(const double* handles, int n) {
  GUARD_PTR("vec_new", {
    auto* v = new Vec();
    v->items = arrays_of(handles, n);
    return v;
  })
}
int mlxb_vec_size(Vec* v) { GUARD_INT("vec_size", { return static_cast<int>(V(v).items.size()); }) }
Arr* mlxb_vec_get(Vec* v, int i) {
  GUARD_PTR("vec_get", {
    auto& items = V(v).items;
    if (i < 0 || i >= static_cast<int>(items.size())) throw std::out_of_range("vector index out of range");
    return wrap(items[i]);
  })
}
int mlxb_vec_free(Vec* v) {
  if (v == nullptr) return 0;
  GUARD_INT("vec_free", {
    V(v).magic = kDead;
    delete v;
    return 0;
  })
}

// ---------------------------------------------------------------- creation and data

Arr* mlxb_from_bytes(const void* data, double nbytes, const int32_t* shape, int ndim, int dtype) {
  GUARD_PTR("array", {
    mx::Dtype dt = dtype_of(dtype);
    mx::Shape sh = shape_of(shape, ndim);
    size_t count = 1;
    for (auto d : sh) {
      if (d < 0) throw std::invalid_argument("negative dimension in shape");
      count *= static_cast<size_t>(d);
    }
    size_t want = count * mx::size_of(dt);
    if (static_cast<size_t>(nbytes) != want) {
      throw std::invalid_argument("byte length " + std::to_string(static_cast<size_t>(nbytes)) +
                                  " does not match shape and dtype (" + std::to_string(want) + " bytes)");
    }
    // The void* constructor copies raw bytes with no value conversion (bf16/f16 bits stay bits).
    array out(const_cast<void*>(data), sh, dt, [](void*) {});
    // On CPU the buffer is copied at construction (allocator::make_buffer returns null);
    // force a private copy regardless, so JS memory is never referenced after the call.
    if (count > 0) {
      out = mx::copy(out);
      out.eval();
    }
    return wrap(out);
  })
}

Arr* mlxb_scalar(double v, int kind, int dtype) {
  GUARD_PTR("scalar", {
    mx::Dtype dt = dtype_of(dtype);
    switch (kind) {
      case kFloat: return wrap(dt == mx::float64 ? array(v, dt) : array(static_cast<float>(v), dt));
      case kInt: return wrap(array(static_cast<int64_t>(v), dt));
      case kBool: return wrap(array(v != 0.0, dt));
    }
    throw std::invalid_argument("unknown scalar kind");
  })
}

// Copies the array, packed row-major, into dst (nbytes must equal the array's nbytes).
int mlxb_copy_out(const Arr* h, void* dst, double nbytes) {
  GUARD_INT("copy_out", {
    // Evaluate; only views that are not row-contiguous need a packed copy.
    array c = A(h);
    if (!c.is_available()) c.eval();
    c.wait();
    if (!c.flags().row_contiguous) {
      c = mx::contiguous(c);
      c.eval();
    }
    if (static_cast<size_t>(nbytes) != c.nbytes()) throw std::invalid_argument("destination size mismatch");
    if (!c.flags().row_contiguous) throw std::runtime_error("array is not row contiguous after contiguous()");
    if (c.nbytes() > 0) std::memcpy(dst, c.data<uint8_t>(), c.nbytes());
    return 0;
  })
}

Arr* mlxb_arange(double start, double stop, double step, int dtype) {
  GUARD_PTR("arange", { return wrap(mx::arange(start, stop, step, dtype_of(dtype))); })
}
Arr* mlxb_linspace(double start, double stop, int num, int dtype) {
  GUARD_PTR("linspace", { return wrap(mx::linspace(start, stop, num, dtype_of(dtype))); })
}
Arr* mlxb_eye(int n, int m, int k, int dtype) {
  GUARD_PTR("eye", { return wrap(mx::eye(n, m, k, dtype_of(dtype))); })
}
Arr* mlxb_zeros(const int32_t* shape, int ndim, int dtype) {
  GUARD_PTR("zeros", { return wrap(mx::zeros(shape_of(shape, ndim), dtype_of(dtype))); })
}
Arr* mlxb_ones(const int32_t* shape, int ndim, int dtype) {
  GUARD_PTR("ones", { return wrap(mx::ones(shape_of(shape, ndim), dtype_of(dtype))); })
}
// full(shape, vals): dtype < 0 keeps vals' dtype.
Arr* mlxb_full(const int32_t* shape, int ndim, const Arr* vals, int dtype) {
  GUARD_PTR("full", {
    if (dtype < 0) return wrap(mx::full(shape_of(shape, ndim), A(vals)));
    return wrap(mx::full(shape_of(shape, ndim), A(vals), dtype_of(dtype)));
  })
}
Arr* mlxb_astype(const Arr* a, int dtype) {
  GUARD_PTR("astype", { return wrap(mx::astype(A(a), dtype_of(dtype))); })
}
Arr* mlxb_view(const Arr* a, int dtype) {
  GUARD_PTR("view", { return wrap(mx::view(A(a), dtype_of(dtype))); })
}

// ---------------------------------------------------------------- elementwise

Arr* mlxb_unary(int op, const Arr* a) {
  GUARD_PTR(op >= 0 && op < mlxb_unary_count() ? kUnary[op].name : "unary", {
    if (op < 0 || op >= mlxb_unary_count()) throw std::invalid_argument("unknown unary op");
    return wrap(kUnary[op].fn(A(a), {}));
  })
}

Arr* mlxb_binary(int op, const Arr* a, const Arr* b) {
  GUARD_PTR(op >= 0 && op < mlxb_binary_count() ? kBinary[op].name : "binary", {
    if (op < 0 || op >= mlxb_binary_count()) throw std::invalid_argument("unknown binary op");
    return wrap(kBinary[op].fn(A(a), A(b), {}));
  })
}

// op(array, scalar), or op(scalar, array) when scalar_first: the scalar is weak (Python rule).
Arr* mlxb_binary_scalar(int op, const Arr* a, double v, int kind, int scalar_first) {
  GUARD_PTR(op >= 0 && op < mlxb_binary_count() ? kBinary[op].name : "binary", {
    if (op < 0 || op >= mlxb_binary_count()) throw std::invalid_argument("unknown binary op");
    const array& x = A(a);
    array s = weak_scalar(v, kind, x.dtype());
    return wrap(scalar_first ? kBinary[op].fn(s, x, {}) : kBinary[op].fn(x, s, {}));
  })
}

// where(cond, x, y); a null x or y is replaced by a weak scalar taking the other's dtype.
Arr* mlxb_where(const Arr* c, const Arr* x, const Arr* y, double sv, int kind) {
  GUARD_PTR("where", {
    if (x == nullptr && y == nullptr) throw std::invalid_argument("where needs at least one array operand");
    array xa = x ? A(x) : weak_scalar(sv, kind, A(y).dtype());
    array ya = y ? A(y) : weak_scalar(sv, kind, A(x).dtype());
    return wrap(mx::where(A(c), xa, ya));
  })
}

Arr* mlxb_clip(const Arr* a, const Arr* lo, const Arr* hi) {
  GUARD_PTR("clip", { return wrap(mx::clip(A(a), opt(lo), opt(hi))); })
}

// clip with weak-scalar bounds (Python mx.clip(a, lo, hi) with Python scalars): kind < 0 means
// that bound is absent; a non-null array bound takes precedence over its scalar.
Arr* mlxb_clip_scalar(const Arr* a, const Arr* lo, double lov, int lokind, const Arr* hi, double hiv, int hikind) {
  GUARD_PTR("clip", {
    const array& x = A(a);
    std::optional<array> l = lo ? std::optional<array>(A(lo)) : lokind < 0 ? std::nullopt : std::optional<array>(weak_scalar(lov, lokind, x.dtype()));
    std::optional<array> h = hi ? std::optional<array>(A(hi)) : hikind < 0 ? std::nullopt : std::optional<array>(weak_scalar(hiv, hikind, x.dtype()));
    return wrap(mx::clip(x, l, h));
  })
}

Arr* mlxb_round(const Arr* a, int decimals) {
  GUARD_PTR("round", { return wrap(mx::round(A(a), decimals)); })
}

// ---------------------------------------------------------------- reductions

// all_axes != 0 reduces over every axis (axes ignored).
Arr* mlxb_reduce(int op, const Arr* a, const int32_t* axes, int naxes, int all_axes, int keepdims, int ddof) {
  GUARD_PTR(op >= 0 && op < mlxb_reduce_count() ? kReduceNames[op] : "reduce", {
    if (all_axes) return wrap(reduce_all(op, A(a), keepdims != 0, ddof));
    return wrap(reduce(op, A(a), ints_of(axes, naxes), keepdims != 0, ddof));
  })
}

// which: 0 argmax, 1 argmin. has_axis == 0 reduces the flattened array.
Arr* mlxb_argreduce(int which, const Arr* a, int axis, int has_axis, int keepdims) {
  GUARD_PTR(which == 0 ? "argmax" : "argmin", {
    bool k = keepdims != 0;
    if (which == 0) return wrap(has_axis ? mx::argmax(A(a), axis, k) : mx::argmax(A(a), k));
    return wrap(has_axis ? mx::argmin(A(a), axis, k) : mx::argmin(A(a), k));
  })
}

Arr* mlxb_softmax(const Arr* a, const int32_t* axes, int naxes, int all_axes, int precise) {
  GUARD_PTR("softmax", {
    if (all_axes) return wrap(mx::softmax(A(a), precise != 0));
    return wrap(mx::softmax(A(a), ints_of(axes, naxes), precise != 0));
  })
}

// which: 0 cumsum, 1 cumprod, 2 cummax, 3 cummin, 4 logcumsumexp.
Arr* mlxb_cumulative(int which, const Arr* a, int axis, int reverse, int inclusive) {
  GUARD_PTR("cumulative", {
    bool r = reverse != 0, inc = inclusive != 0;
    switch (which) {
      case 0: return wrap(mx::cumsum(A(a), axis, r, inc));
      case 1: return wrap(mx::cumprod(A(a), axis, r, inc));
      case 2: return wrap(mx::cummax(A(a), axis, r, inc));
      case 3: return wrap(mx::cummin(A(a), axis, r, inc));
      case 4: return wrap(mx::logcumsumexp(A(a), axis, r, inc));
    }
    throw std::invalid_argument("unknown cumulative op");
  })
}

// which: 0 sort, 1 argsort, 2 partition, 3 argpartition, 4 topk. has_axis == 0: flattened.
Arr* mlxb_sortlike(int which, const Arr* a, int kth, int axis, int has_axis) {
  static const char* names[] = {"sort", "argsort", "partition", "argpartition", "topk"};
  GUARD_PTR(which >= 0 && which < 5 ? names[which] : "sort", {
    const array& x = A(a);
    switch (which) {
      case 0: return wrap(has_axis ? mx::sort(x, axis) : mx::sort(x));
      case 1: return wrap(has_axis ? mx::argsort(x, axis) : mx::argsort(x));
      case 2: return wrap(has_axis ? mx::partition(x, kth, axis) : mx::partition(x, kth));
      case 3: return wrap(has_axis ? mx::argpartition(x, kth, axis) : mx::argpartition(x, kth));
      case 4: return wrap(has_axis ? mx::topk(x, kth, axis) : mx::topk(x, kth));
    }
    throw std::invalid_argument("unknown sort op");
  })
}

// ---------------------------------------------------------------- shapes and indexing

Arr* mlxb_reshape(const Arr* a, const int32_t* shape, int ndim) {
  GUARD_PTR("reshape", { return wrap(mx::reshape(A(a), shape_of(shape, ndim))); })
}
Arr* mlxb_flatten(const Arr* a, int start, int end) {
  GUARD_PTR("flatten", { return wrap(mx::flatten(A(a), start, end)); })
}
Arr* mlxb_unflatten(const Arr* a, int axis, const int32_t* shape, int ndim) {
  GUARD_PTR("unflatten", { return wrap(mx::unflatten(A(a), axis, shape_of(shape, ndim))); })
}
// naxes < 0: reverse all axes.
Arr* mlxb_transpose(const Arr* a, const int32_t* axes, int naxes) {
  GUARD_PTR("transpose", {
    if (naxes < 0) return wrap(mx::transpose(A(a)));
    return wrap(mx::transpose(A(a), ints_of(axes, naxes)));
  })
}
Arr* mlxb_swapaxes(const Arr* a, int x, int y) {
  GUARD_PTR("swapaxes", { return wrap(mx::swapaxes(A(a), x, y)); })
}
Arr* mlxb_moveaxis(const Arr* a, int src, int dst) {
  GUARD_PTR("moveaxis", { return wrap(mx::moveaxis(A(a), src, dst)); })
}
Arr* mlxb_expand_dims(const Arr* a, const int32_t* axes, int naxes) {
  GUARD_PTR("expand_dims", { return wrap(mx::expand_dims(A(a), ints_of(axes, naxes))); })
}
// naxes < 0: squeeze every singleton axis.
Arr* mlxb_squeeze(const Arr* a, const int32_t* axes, int naxes) {
  GUARD_PTR("squeeze", {
    if (naxes < 0) return wrap(mx::squeeze(A(a)));
    return wrap(mx::squeeze(A(a), ints_of(axes, naxes)));
  })
}
Arr* mlxb_broadcast_to(const Arr* a, const int32_t* shape, int ndim) {
  GUARD_PTR("broadcast_to", { return wrap(mx::broadcast_to(A(a), shape_of(shape, ndim))); })
}
Arr* mlxb_concatenate(const double* hs, int n, int axis) {
  GUARD_PTR("concatenate", { return wrap(mx::concatenate(arrays_of(hs, n), axis)); })
}
Arr* mlxb_stack(const double* hs, int n, int axis) {
  GUARD_PTR("stack", { return wrap(mx::stack(arrays_of(hs, n), axis)); })
}
// nindices < 0: split into `num` equal parts; else at the given indices.
Vec* mlxb_split(const Arr* a, int num, const int32_t* indices, int nindices, int axis) {
  GUARD_PTR("split", {
    auto* v = new Vec();
    v->items = nindices < 0 ? mx::split(A(a), num, axis) : mx::split(A(a), shape_of(indices, nindices), axis);
    return v;
  })
}
Arr* mlxb_slice(const Arr* a, const int32_t* start, const int32_t* stop, const int32_t* strides, int n) {
  GUARD_PTR("slice", {
    return wrap(mx::slice(A(a), shape_of(start, n), shape_of(stop, n), shape_of(strides, n)));
  })
}
Arr* mlxb_slice_dynamic(const Arr* a, const Arr* start, const int32_t* axes, int naxes, const int32_t* sizes, int nsizes) {
  GUARD_PTR("slice", {
    auto ax = ints_of(axes, naxes);
    auto sz = shape_of(sizes, nsizes);
    array out = mx::slice(A(a), A(start), ax, sz);
    check_dynamic_start(A(start), ax, A(a), sz);
    return wrap(out);
  })
}
Arr* mlxb_slice_update(const Arr* src, const Arr* upd, const int32_t* start, const int32_t* stop, const int32_t* strides, int n) {
  GUARD_PTR("slice_update", {
    return wrap(mx::slice_update(A(src), A(upd), shape_of(start, n), shape_of(stop, n), shape_of(strides, n)));
  })
}
Arr* mlxb_slice_update_dynamic(const Arr* src, const Arr* upd, const Arr* start, const int32_t* axes, int naxes) {
  GUARD_PTR("slice_update", {
    auto ax = ints_of(axes, naxes);
    array out = mx::slice_update(A(src), A(upd), A(start), ax);
    // the window is the update as MLX broadcast it (the primitive's second input)
    check_dynamic_start(A(start), ax, A(src), out.inputs()[1].shape());
    return wrap(out);
  })
}
// has_axis == 0: index the flattened array.
Arr* mlxb_take(const Arr* a, const Arr* idx, int axis, int has_axis) {
  GUARD_PTR("take", {
    const array& x = A(a);
    array out = has_axis ? mx::take(x, A(idx), axis) : mx::take(x, A(idx));
    check_indices(A(idx), has_axis ? x.shape(axis < 0 ? axis + x.ndim() : axis) : static_cast<int64_t>(x.size()), "take");
    return wrap(out);
  })
}
Arr* mlxb_take_along_axis(const Arr* a, const Arr* idx, int axis) {
  GUARD_PTR("take_along_axis", {
    array out = mx::take_along_axis(A(a), A(idx), axis);
    check_indices(A(idx), A(a).shape(axis < 0 ? axis + A(a).ndim() : axis), "take_along_axis");
    return wrap(out);
  })
}
Arr* mlxb_put_along_axis(const Arr* a, const Arr* idx, const Arr* vals, int axis) {
  GUARD_PTR("put_along_axis", {
    array out = mx::put_along_axis(A(a), A(idx), A(vals), axis);
    check_indices(A(idx), A(a).shape(axis < 0 ? axis + A(a).ndim() : axis), "put_along_axis");
    return wrap(out);
  })
}
// has_axis == 0: roll the flattened array.
Arr* mlxb_roll(const Arr* a, int shift, int axis, int has_axis) {
  GUARD_PTR("roll", { return wrap(has_axis ? mx::roll(A(a), shift, axis) : mx::roll(A(a), shift)); })
}
Arr* mlxb_contiguous(const Arr* a, int allow_col_major) {
  GUARD_PTR("contiguous", { return wrap(mx::contiguous(A(a), allow_col_major != 0)); })
}
Arr* mlxb_repeat(const Arr* a, int repeats, int axis, int has_axis) {
  GUARD_PTR("repeat", { return wrap(has_axis ? mx::repeat(A(a), repeats, axis) : mx::repeat(A(a), repeats)); })
}
Arr* mlxb_tile(const Arr* a, const int32_t* reps, int n) {
  GUARD_PTR("tile", { return wrap(mx::tile(A(a), ints_of(reps, n))); })
}
Arr* mlxb_pad(const Arr* a, const int32_t* axes, int naxes, const int32_t* lo, const int32_t* hi, const Arr* value) {
  GUARD_PTR("pad", {
    return wrap(mx::pad(A(a), ints_of(axes, naxes), shape_of(lo, naxes), shape_of(hi, naxes), A(value)));
  })
}
Arr* mlxb_tri(int n, int m, int k, int dtype) {
  GUARD_PTR("tri", { return wrap(mx::tri(n, m, k, dtype_of(dtype))); })
}
Arr* mlxb_trilu(const Arr* a, int k, int upper) {
  GUARD_PTR(upper ? "triu" : "tril", { return wrap(upper ? mx::triu(A(a), k) : mx::tril(A(a), k)); })
}

// ---------------------------------------------------------------- matmul and quantization

// mx.depends(inputs, dependencies): the inputs, made to depend on the dependencies.
Vec* mlxb_depends(const double* inputs, int n, const double* deps, int ndeps) {
  GUARD_PTR("depends", {
    // MLX indexes the first input unchecked (Python's mx.depends([], deps) segfaults).
    if (n <= 0) throw std::invalid_argument("depends needs at least one input array");
    auto* v = new Vec();
    v->items = mx::depends(arrays_of(inputs, n), arrays_of(deps, ndeps));
    return v;
  })
}

Arr* mlxb_addmm(const Arr* c, const Arr* a, const Arr* b, float alpha, float beta) {
  GUARD_PTR("addmm", { return wrap(mx::addmm(A(c), A(a), A(b), alpha, beta)); })
}

Vec* mlxb_quantize(const Arr* w, int group_size, int bits, const char* mode, const Arr* global_scale) {
  GUARD_PTR("quantize", {
    auto* v = new Vec();
    v->items = mx::quantize(A(w), opt_int(group_size), opt_int(bits), mode, opt(global_scale));
    return v;
  })
}

// dtype < 0: the default output dtype.
Arr* mlxb_dequantize(const Arr* w, const Arr* scales, const Arr* biases, int group_size, int bits, const char* mode,
                     const Arr* global_scale, int dtype) {
  GUARD_PTR("dequantize", {
    std::optional<mx::Dtype> dt = dtype < 0 ? std::nullopt : std::optional<mx::Dtype>(dtype_of(dtype));
    return wrap(mx::dequantize(A(w), A(scales, "scales"), opt(biases), opt_int(group_size), opt_int(bits), mode, opt(global_scale), dt));
  })
}

Arr* mlxb_quantized_matmul(const Arr* x, const Arr* w, const Arr* scales, const Arr* biases, int transpose,
                           int group_size, int bits, const char* mode) {
  GUARD_PTR("quantized_matmul", {
    return wrap(mx::quantized_matmul(A(x), A(w), A(scales, "scales"), opt(biases), transpose != 0, opt_int(group_size),
                                     opt_int(bits), mode));
  })
}

Arr* mlxb_gather_mm(const Arr* a, const Arr* b, const Arr* lhs, const Arr* rhs, int sorted) {
  GUARD_PTR("gather_mm", {
    array out = mx::gather_mm(A(a), A(b), opt(lhs), opt(rhs), sorted != 0);
    check_batch_indices(opt(lhs), A(a), "lhs_indices");
    check_batch_indices(opt(rhs), A(b), "rhs_indices");
    return wrap(out);
  })
}

Arr* mlxb_gather_qmm(const Arr* x, const Arr* w, const Arr* scales, const Arr* biases, const Arr* lhs, const Arr* rhs,
                     int transpose, int group_size, int bits, const char* mode, const Arr* global_scale, int sorted) {
  GUARD_PTR("gather_qmm", {
    array out = mx::gather_qmm(A(x), A(w), A(scales, "scales"), opt(biases), opt(lhs), opt(rhs), transpose != 0,
                               opt_int(group_size), opt_int(bits), mode, opt(global_scale), sorted != 0);
    check_batch_indices(opt(lhs), A(x), "lhs_indices");
    check_batch_indices(opt(rhs), A(w), "rhs_indices");
    return wrap(out);
  })
}

// ---------------------------------------------------------------- fast

Arr* mlxb_rms_norm(const Arr* x, const Arr* weight, float eps) {
  GUARD_PTR("fast.rms_norm", { return wrap(mx::fast::rms_norm(A(x), opt(weight), eps)); })
}

Arr* mlxb_layer_norm(const Arr* x, const Arr* weight, const Arr* bias, float eps) {
  GUARD_PTR("fast.layer_norm", { return wrap(mx::fast::layer_norm(A(x), opt(weight), opt(bias), eps)); })
}

// offset_arr null: integer offset. has_base == 0 uses freqs.
Arr* mlxb_rope(const Arr* x, int dims, int traditional, float base, int has_base, float scale, int offset,
               const Arr* offset_arr, const Arr* freqs) {
  GUARD_PTR("fast.rope", {
    std::optional<float> b = has_base ? std::optional<float>(base) : std::nullopt;
    if (offset_arr != nullptr) return wrap(mx::fast::rope(A(x), dims, traditional != 0, b, scale, A(offset_arr), opt(freqs)));
    return wrap(mx::fast::rope(A(x), dims, traditional != 0, b, scale, offset, opt(freqs)));
  })
}

Arr* mlxb_sdpa(const Arr* q, const Arr* k, const Arr* v, float scale, const char* mask_mode, const Arr* mask,
               const Arr* sinks) {
  GUARD_PTR("fast.scaled_dot_product_attention", {
    return wrap(mx::fast::scaled_dot_product_attention(A(q), A(k), A(v), scale, mask_mode, opt(mask), opt(sinks)));
  })
}

// ---------------------------------------------------------------- evaluation

int mlxb_eval(const double* hs, int n) {
  GUARD_INT("eval", {
    mx::eval(arrays_of(hs, n));
    return 0;
  })
}
int mlxb_async_eval(const double* hs, int n) {
  GUARD_INT("async_eval", {
    mx::async_eval(arrays_of(hs, n));
    return 0;
  })
}

// ---------------------------------------------------------------- random

Arr* mlxb_random_key(double seed) {
  GUARD_PTR("random.key", { return wrap(mx::random::key(static_cast<uint64_t>(seed))); })
}
Vec* mlxb_random_split(const Arr* key, int num) {
  GUARD_PTR("random.split", {
    auto* v = new Vec();
    v->items.push_back(mx::random::split(A(key), num));
    return v;
  })
}
Arr* mlxb_random_uniform(const Arr* lo, const Arr* hi, const int32_t* shape, int ndim, int dtype, const Arr* key) {
  GUARD_PTR("random.uniform", {
    return wrap(mx::random::uniform(A(lo), A(hi), shape_of(shape, ndim), dtype_of(dtype), opt(key)));
  })
}
Arr* mlxb_random_normal(const int32_t* shape, int ndim, int dtype, const Arr* loc, const Arr* scale, const Arr* key) {
  GUARD_PTR("random.normal", {
    return wrap(mx::random::normal(shape_of(shape, ndim), dtype_of(dtype), opt(loc), opt(scale), opt(key)));
  })
}
// ndim < 0: no explicit shape. num_samples <= 0: none.
Arr* mlxb_random_categorical(const Arr* logits, int axis, const int32_t* shape, int ndim, int num_samples, const Arr* key) {
  GUARD_PTR("random.categorical", {
    if (ndim >= 0) return wrap(mx::random::categorical(A(logits), axis, shape_of(shape, ndim), opt(key)));
    if (num_samples > 0) return wrap(mx::random::categorical(A(logits), axis, num_samples, opt(key)));
    return wrap(mx::random::categorical(A(logits), axis, opt(key)));
  })
}
Arr* mlxb_random_bits(const int32_t* shape, int ndim, int width, const Arr* key) {
  GUARD_PTR("random.bits", { return wrap(mx::random::bits(shape_of(shape, ndim), width, opt(key))); })
}

// ---------------------------------------------------------------- safetensors

struct Loaded {
  std::vector<std::pair<std::string, array>> arrays;
  std::vector<std::pair<std::string, std::string>> meta;
};

Loaded* mlxb_load_safetensors(const char* path) {
  GUARD_PTR("load_safetensors", {
    auto [arrays, meta] = mx::load_safetensors(path);
    auto* out = new Loaded();
    // Sorted by key so iteration order never depends on hash-map layout.
    std::map<std::string, array> sorted(arrays.begin(), arrays.end());
    for (auto& [k, v] : sorted) out->arrays.emplace_back(k, v);
    std::map<std::string, std::string> msorted(meta.begin(), meta.end());
    for (auto& [k, v] : msorted) out->meta.emplace_back(k, v);
    return out;
  })
}
int mlxb_loaded_count(const Loaded* l, int which) {
  GUARD_INT("load_safetensors", {
    if (!l) throw std::invalid_argument("null load handle");
    return static_cast<int>(which == 0 ? l->arrays.size() : l->meta.size());
  })
}
const char* mlxb_loaded_key(const Loaded* l, int which, int i) {
  if (!l) return nullptr;
  if (which == 0) return i >= 0 && i < static_cast<int>(l->arrays.size()) ? l->arrays[i].first.c_str() : nullptr;
  return i >= 0 && i < static_cast<int>(l->meta.size()) ? l->meta[i].first.c_str() : nullptr;
}
const char* mlxb_loaded_meta_value(const Loaded* l, int i) {
  if (!l) return nullptr;
  return i >= 0 && i < static_cast<int>(l->meta.size()) ? l->meta[i].second.c_str() : nullptr;
}
Arr* mlxb_loaded_array(const Loaded* l, int i) {
  GUARD_PTR("load_safetensors", {
    if (!l || i < 0 || i >= static_cast<int>(l->arrays.size())) throw std::out_of_range("loaded index out of range");
    return wrap(l->arrays[i].second);
  })
}
void mlxb_loaded_free(Loaded* l) { delete l; }

// keys/values are NUL-separated strings with counts.
int mlxb_save_safetensors(const char* path, const char* keys, const double* hs, int n, const char* meta_keys,
                          const char* meta_vals, int nmeta) {
  GUARD_INT("save_safetensors", {
    std::unordered_map<std::string, array> arrays;
    auto list = arrays_of(hs, n);
    const char* k = keys;
    for (int i = 0; i < n; ++i) {
      arrays.insert_or_assign(std::string(k), list[i]);
      k += std::strlen(k) + 1;
    }
    std::unordered_map<std::string, std::string> meta;
    const char* mk = meta_keys;
    const char* mv = meta_vals;
    for (int i = 0; i < nmeta; ++i) {
      meta.insert_or_assign(std::string(mk), std::string(mv));
      mk += std::strlen(mk) + 1;
      mv += std::strlen(mv) + 1;
    }
    mx::save_safetensors(path, arrays, meta);
    return 0;
  })
}

// ---------------------------------------------------------------- compile

// A compiled function whose body is traced through a JS callback. The id keys MLX's
// compile cache exactly as Python's function id does.
Compiled* mlxb_compile(TraceFn trace, int shapeless) {
  GUARD_PTR("compile", {
    if (trace == nullptr) throw std::invalid_argument("null trace callback");
    auto* c = new Compiled();
    c->id = reinterpret_cast<std::uintptr_t>(c);
    auto body = [trace](const std::vector<array>& inputs) {
      auto* in = new Vec();
      in->items = inputs;
      Vec* out = trace(in);
      in->magic = kDead;
      delete in;
      return take_js_outputs(out);
    };
    c->fn = mx::detail::compile(body, c->id, shapeless != 0);
    return c;
  })
}

Vec* mlxb_compiled_call(Compiled* c, const double* hs, int n) {
  GUARD_PTR("compiled call", {
    if (c == nullptr || c->magic != 0x4d4c5843) throw std::invalid_argument("invalid compiled function handle");
    auto* v = new Vec();
    try {
      v->items = c->fn(arrays_of(hs, n));
    } catch (...) {
      delete v;
      throw;
    }
    return v;
  })
}

int mlxb_compiled_free(Compiled* c) {
  if (c == nullptr) return 0;
  GUARD_INT("compiled free", {
    if (c->magic != 0x4d4c5843) throw std::invalid_argument("invalid compiled function handle");
    mx::detail::compile_erase(mx::detail::compile_cache(), c->id);
    c->magic = kDead;
    delete c;
    return 0;
  })
}

// ---------------------------------------------------------------- convolution and einsum (multimodal towers)

// mx.conv2d(input, weight, stride, padding, dilation, groups): each pair as Python's binding
// passes it to C++ (an int there means (v, v)).
Arr* mlxb_conv2d(const Arr* x, const Arr* w, int s0, int s1, int p0, int p1, int d0, int d1, int groups) {
  GUARD_PTR("conv2d", { return wrap(mx::conv2d(A(x), A(w, "weight"), {s0, s1}, {p0, p1}, {d0, d1}, groups)); })
}

// mx.conv_general(input, weight, stride, padding, kernel_dilation, input_dilation, groups, flip):
// the vectors as Python's binding builds them (an int there is a one-element vector).
Arr* mlxb_conv_general(const Arr* x, const Arr* w, const int32_t* stride, int ns, const int32_t* pad_lo, int npl,
                       const int32_t* pad_hi, int nph, const int32_t* kdil, int nkd, const int32_t* idil, int nid, int groups,
                       int flip) {
  GUARD_PTR("conv_general", {
    return wrap(mx::conv_general(A(x), A(w, "weight"), ints_of(stride, ns), ints_of(pad_lo, npl), ints_of(pad_hi, nph),
                                 ints_of(kdil, nkd), ints_of(idil, nid), groups, flip != 0));
  })
}

// mx.einsum(subscripts, *operands).
Arr* mlxb_einsum(const char* subscripts, const double* operands, int n) {
  GUARD_PTR("einsum", { return wrap(mx::einsum(subscripts, arrays_of(operands, n))); })
}

// ---------------------------------------------------------------- autodiff

}  // extern "C"

namespace {

// JS functions enter the transforms (vjp, jvp, value_and_grad, checkpoint) through one
// trampoline the TS side registers once: trampoline(fn_id, inputs) -> outputs, NULL when the JS
// function threw (the TS side keeps that error and rethrows it after the native call fails).
// A closure owns its function id through a shared JsFn. When MLX drops the closure (vjp and
// value_and_grad at the end of the call; a checkpoint when its graph node is freed, possibly on
// the stream's worker thread) the id is queued for the TS side to release, without calling JS.
using Trampoline = Vec* (*)(double fn_id, Vec* inputs);
Trampoline g_trampoline = nullptr;
std::mutex g_released_mutex;
std::vector<double> g_released;

struct JsFn {
  double id;
  explicit JsFn(double i) : id(i) {}
  JsFn(const JsFn&) = delete;
  JsFn& operator=(const JsFn&) = delete;
  ~JsFn() {
    std::lock_guard<std::mutex> lock(g_released_mutex);
    g_released.push_back(id);
  }
};

using ArrayFn = std::function<std::vector<array>(const std::vector<array>&)>;

ArrayFn js_function(double id) {
  auto fn = std::make_shared<JsFn>(id);
  return [fn](const std::vector<array>& inputs) {
    if (g_trampoline == nullptr) throw std::runtime_error("no JS trampoline registered");
    auto in = std::make_unique<Vec>();
    in->items = inputs;
    Vec* out = g_trampoline(fn->id, in.get());
    in->magic = kDead;
    return take_js_outputs(out);
  };
}

Vec* vec_of(std::vector<array> a, const std::vector<array>& b) {
  auto* v = new Vec();
  v->items = std::move(a);
  v->items.insert(v->items.end(), b.begin(), b.end());
  return v;
}

}  // namespace

extern "C" {

int mlxb_set_trampoline(Trampoline t) {
  g_trampoline = t;
  return 0;
}

// The id of a closure MLX has dropped since the last call, or -1 when there is none.
double mlxb_next_released() {
  std::lock_guard<std::mutex> lock(g_released_mutex);
  if (g_released.empty()) return -1;
  double id = g_released.back();
  g_released.pop_back();
  return id;
}

// mx.vjp(fun, primals, cotangents): the outputs, then one vjp per primal.
Vec* mlxb_vjp(double fn, const double* primals, int np, const double* cotans, int nc) {
  GUARD_PTR("vjp", {
    auto [outs, vjps] = mx::vjp(js_function(fn), arrays_of(primals, np), arrays_of(cotans, nc));
    return vec_of(std::move(outs), vjps);
  })
}

// mx.jvp(fun, primals, tangents): the outputs, then one jvp per output.
Vec* mlxb_jvp(double fn, const double* primals, int np, const double* tangents, int nt) {
  GUARD_PTR("jvp", {
    auto [outs, jvps] = mx::jvp(js_function(fn), arrays_of(primals, np), arrays_of(tangents, nt));
    return vec_of(std::move(outs), jvps);
  })
}

// value_and_grad(fun, argnums)(inputs), the call Python's mx.value_and_grad makes with every
// array of every argument as an input and the flat positions of the differentiated ones as
// argnums: the values (outputs after the first under stop_gradient), then one gradient per argnum.
Vec* mlxb_value_and_grad(double fn, const int32_t* argnums, int nargnums, const double* inputs, int n) {
  GUARD_PTR("value_and_grad", {
    auto [values, grads] = mx::value_and_grad(js_function(fn), ints_of(argnums, nargnums))(arrays_of(inputs, n));
    return vec_of(std::move(values), grads);
  })
}

// mx.checkpoint(fun)(inputs): the outputs; the closure stays in their graph for the recompute.
Vec* mlxb_checkpoint(double fn, const double* inputs, int n) {
  GUARD_PTR("checkpoint", {
    return vec_of(mx::checkpoint(js_function(fn))(arrays_of(inputs, n)), {});
  })
}

// ---------------------------------------------------------------- reliability (issue 15)

}  // extern "C"

namespace {

// The values of an evaluated integer array as int64 (uint64 beyond INT64_MAX saturates).
std::vector<int64_t> int_values(const array& x) {
  array c = x.flags().row_contiguous ? x : mx::contiguous(x);
  c.eval();
  std::vector<int64_t> out(c.size());
  auto read = [&](auto* p) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<int64_t>(p[i]);
  };
  switch (c.dtype().val()) {
    case mx::Dtype::Val::int8: read(c.data<int8_t>()); break;
    case mx::Dtype::Val::int16: read(c.data<int16_t>()); break;
    case mx::Dtype::Val::int32: read(c.data<int32_t>()); break;
    case mx::Dtype::Val::int64: read(c.data<int64_t>()); break;
    case mx::Dtype::Val::uint8: read(c.data<uint8_t>()); break;
    case mx::Dtype::Val::uint16: read(c.data<uint16_t>()); break;
    case mx::Dtype::Val::uint32: read(c.data<uint32_t>()); break;
    case mx::Dtype::Val::uint64: {
      const uint64_t* p = c.data<uint64_t>();
      for (size_t i = 0; i < out.size(); ++i) out[i] = p[i] > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(p[i]);
      break;
    }
    default: out.clear();
  }
  return out;
}

// Indices already evaluated (they came from outside the graph: token ids, user data) must lie in
// [-size, size) (negative ones count from the end, unsigned ones from 0). Indices computed inside
// the graph (argmax, topk) are not evaluated yet and are in range by construction: not checked,
// so the graph keeps its laziness and compiled tracing is unaffected.
void check_indices(const array& idx, int64_t size, const char* what) {
  if (!idx.is_available() || idx.size() == 0 || !mx::issubdtype(idx.dtype(), mx::integer)) return;
  bool is_signed = mx::issubdtype(idx.dtype(), mx::signedinteger);
  for (int64_t v : int_values(idx)) {
    if (v >= size || (is_signed ? v < -size : v < 0)) {
      throw std::out_of_range(std::string(what) + ": index " + std::to_string(v) + " is out of range for an axis of size " + std::to_string(size));
    }
  }
}

// gather_mm / gather_qmm: an index selects one matrix of the operand's batch (its leading axes).
void check_batch_indices(const std::optional<array>& idx, const array& operand, const char* what) {
  if (!idx) return;
  int64_t batch = 1;
  for (int i = 0; i + 2 < static_cast<int>(operand.ndim()); ++i) batch *= operand.shape(i);
  if (!idx->is_available() || idx->size() == 0) return;
  for (int64_t v : int_values(*idx)) {
    if (v < 0 || v >= batch) throw std::out_of_range(std::string(what) + ": index " + std::to_string(v) + " is out of range for a batch of " + std::to_string(batch));
  }
}

// Dynamic slice / slice update: start[i] on axes[i] must leave room for the window there.
void check_dynamic_start(const array& start, const std::vector<int>& axes, const array& src, const mx::Shape& window) {
  if (!start.is_available()) return;
  auto v = int_values(start);
  for (size_t i = 0; i < axes.size() && i < v.size(); ++i) {
    int ax = axes[i] < 0 ? axes[i] + static_cast<int>(src.ndim()) : axes[i];
    int64_t room = static_cast<int64_t>(src.shape(ax)) - window[ax];
    if (v[i] < 0 || v[i] > room) {
      throw std::out_of_range("start " + std::to_string(v[i]) + " on axis " + std::to_string(ax) + " leaves no room for a window of " +
                              std::to_string(window[ax]) + " in an axis of size " + std::to_string(src.shape(ax)));
    }
  }
}

}  // namespace

extern "C" {

// Byte length of a loaded tensor or metadata key: a key with an embedded NUL byte would otherwise
// be read back cut short (and could collide with another key). -1 for a bad index.
int mlxb_loaded_key_length(const Loaded* l, int which, int i) {
  if (!l) return -1;
  if (which == 0) return i >= 0 && i < static_cast<int>(l->arrays.size()) ? static_cast<int>(l->arrays[i].first.size()) : -1;
  return i >= 0 && i < static_cast<int>(l->meta.size()) ? static_cast<int>(l->meta[i].first.size()) : -1;
}

// ---------------------------------------------------------------- tuner (mlx_lm/tuner)

// mx.random.bernoulli(p, shape, key) (nn.Dropout's mask): bits(shape) < p * nextafter(2^32 - 1).
Arr* mlxb_random_bernoulli(const Arr* p, const int32_t* shape, int ndim, const Arr* key) {
  GUARD_PTR("random.bernoulli", { return wrap(mx::random::bernoulli(A(p), shape_of(shape, ndim), opt(key))); })
}

// mx.fast.cross_entropy(logits, targets): nn.losses.cross_entropy's GPU path.
Arr* mlxb_fast_cross_entropy(const Arr* logits, const Arr* targets) {
  GUARD_PTR("fast.cross_entropy", { return wrap(mx::fast::cross_entropy(A(logits), A(targets))); })
}

// ---------------------------------------------------------------- benchmark support

// The bench/ffi.ts chain built natively (the floor both bindings pay: MLX's own graph
// construction): x = x * c / x + c alternating (scalar_mode: weak scalars 1.0001 / 0.5 instead
// of c), n ops, built and dropped, never evaluated. Returns the elapsed nanoseconds.
double mlxb_bench_chain(const Arr* x0, const Arr* c, int n, int scalar_mode) {
  try {
    const array& xa = A(x0);
    const array& ca = A(c);
    auto t0 = std::chrono::steady_clock::now();
    {
      array x = xa;
      for (int i = 0; i < n; ++i) {
        if (scalar_mode) {
          x = (i & 1) ? mx::add(x, weak_scalar(0.5, kFloat, x.dtype())) : mx::multiply(x, weak_scalar(1.0001, kFloat, x.dtype()));
        } else {
          x = (i & 1) ? mx::add(x, ca) : mx::multiply(x, ca);
        }
      }
    }
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  } catch (const std::exception& e) {
    set_error("bench_chain", e.what());
  }
  return -1;
}

// mode: 0 disabled, 1 no_simplify, 2 no_fuse, 3 enabled.
int mlxb_set_compile_mode(int mode) {
  GUARD_INT("set_compile_mode", {
    if (mode < 0 || mode > 3) throw std::invalid_argument("unknown compile mode");
    mx::set_compile_mode(static_cast<mx::CompileMode>(mode));
    return 0;
  })
}

// ---------------------------------------------------------------- memory, devices, streams

double mlxb_memory(int which) {
  try {
    switch (which) {
      case 0: return static_cast<double>(mx::get_active_memory());
      case 1: return static_cast<double>(mx::get_peak_memory());
      case 2: return static_cast<double>(mx::get_cache_memory());
      case 3: return static_cast<double>(mx::get_memory_limit());
    }
    set_error("memory", "unknown memory statistic");
  } catch (const std::exception& e) {
    set_error("memory", e.what());
  }
  return -1;
}
int mlxb_reset_peak_memory() { GUARD_INT("reset_peak_memory", { mx::reset_peak_memory(); return 0; }) }
int mlxb_clear_cache() { GUARD_INT("clear_cache", { mx::clear_cache(); return 0; }) }
double mlxb_set_limit(int which, double bytes) {
  try {
    size_t b = static_cast<size_t>(bytes);
    if (which == 0) return static_cast<double>(mx::set_memory_limit(b));
    if (which == 1) return static_cast<double>(mx::set_cache_limit(b));
    set_error("set_limit", "unknown limit");
  } catch (const std::exception& e) {
    set_error("set_limit", e.what());
  }
  return -1;
}

// The GPU backend this libmlx was built with and can use here: 0 none (CPU only), 1 Metal, 2 CUDA.
// A CUDA wheel on a machine without a usable NVIDIA GPU answers 0.
int mlxb_gpu_backend() {
  GUARD_INT("gpu_backend", {
    if (mx::metal::is_available()) return 1;
    if (mx::cu::is_available()) return 2;
    return 0;
  })
}
// The GPU's name (gpu::device_info "device_name"), or "" when there is none.
const char* mlxb_gpu_name() {
  static std::string name;
  try {
    name.clear();
    if (mx::gpu::is_available()) {
      const auto& info = mx::gpu::device_info(0);
      auto it = info.find("device_name");
      if (it != info.end() && std::holds_alternative<std::string>(it->second)) name = std::get<std::string>(it->second);
    }
  } catch (const std::exception& e) {
    set_error("gpu_name", e.what());
    return nullptr;
  }
  return name.c_str();
}

// device type: 0 cpu, 1 gpu.
int mlxb_default_device() { GUARD_INT("default_device", { return static_cast<int>(mx::default_device().type); }) }
int mlxb_set_default_device(int type) {
  GUARD_INT("set_default_device", {
    mx::Device d(type == 0 ? mx::Device::cpu : mx::Device::gpu, 0);
    if (!mx::is_available(d)) throw std::invalid_argument(type == 0 ? "cpu device is not available" : "gpu device is not available");
    mx::set_default_device(d);
    return 0;
  })
}
int mlxb_is_available(int type) {
  GUARD_INT("is_available", { return mx::is_available(mx::Device(type == 0 ? mx::Device::cpu : mx::Device::gpu, 0)) ? 1 : 0; })
}
int mlxb_new_stream(int type) {
  GUARD_INT("new_stream", { return mx::new_stream(mx::Device(type == 0 ? mx::Device::cpu : mx::Device::gpu, 0)).index; })
}
int mlxb_default_stream_index(int type) {
  GUARD_INT("default_stream", { return mx::default_stream(mx::Device(type == 0 ? mx::Device::cpu : mx::Device::gpu, 0)).index; })
}
int mlxb_synchronize() { GUARD_INT("synchronize", { mx::synchronize(); return 0; }) }
// Makes stream `index` of the device the default stream of this thread (mx.set_default_stream).
int mlxb_set_default_stream(int type, int index) {
  GUARD_INT("set_default_stream", {
    mx::Device d(type == 0 ? mx::Device::cpu : mx::Device::gpu, 0);
    bool found = false;
    for (auto& s : mx::get_streams()) {
      if (s.index == index && s.device == d) found = true;
    }
    if (!found) throw std::invalid_argument("no stream with index " + std::to_string(index) + " on that device");
    mx::set_default_stream(mx::Stream(index, d));
    return 0;
  })
}
int mlxb_synchronize_stream(int type, int index) {
  GUARD_INT("synchronize", {
    mx::synchronize(mx::Stream(index, mx::Device(type == 0 ? mx::Device::cpu : mx::Device::gpu, 0)));
    return 0;
  })
}
double mlxb_set_wired_limit(double bytes) {
  try {
    return static_cast<double>(mx::set_wired_limit(static_cast<size_t>(bytes)));
  } catch (const std::exception& e) {
    set_error("set_wired_limit", e.what());
  }
  return -1;
}

// ---------------------------------------------------------------- graph inspection (bisect)

// The primitive that produces `h`, or "" for a leaf (no primitive).
const char* mlxb_primitive_name(const Arr* h) {
  try {
    const array& a = A(h);
    return a.has_primitive() ? a.primitive().name() : "";
  } catch (const std::exception& e) {
    set_error("primitive_name", e.what());
  }
  return nullptr;
}
int mlxb_is_evaluated(const Arr* h) { GUARD_INT("is_evaluated", { return A(h).is_available() ? 1 : 0; }) }
int mlxb_num_inputs(const Arr* h) {
  GUARD_INT("num_inputs", {
    const array& a = A(h);
    return a.has_primitive() ? static_cast<int>(a.inputs().size()) : 0;
  })
}
Arr* mlxb_input(const Arr* h, int i) {
  GUARD_PTR("input", {
    const array& a = A(h);
    if (!a.has_primitive() || i < 0 || i >= static_cast<int>(a.inputs().size())) throw std::out_of_range("input index out of range");
    return wrap(a.inputs()[i]);
  })
}
// Identity of the underlying array (shared by every handle to it).
double mlxb_array_id(const Arr* h) {
  try {
    return static_cast<double>(A(h).id());
  } catch (const std::exception& e) {
    set_error("array_id", e.what());
  }
  return -1;
}

}  // extern "C"

namespace {
// The unevaluated nodes behind `out` in topological order (inputs first); evaluated arrays and
// arrays without a primitive are leaves and are not listed.
std::vector<array> graph_nodes(const array& out) {
  std::vector<array> order;
  std::unordered_map<std::uintptr_t, bool> seen;
  std::vector<std::pair<array, bool>> stack{{out, false}};
  while (!stack.empty()) {
    auto [a, expanded] = stack.back();
    stack.pop_back();
    if (expanded) {
      order.push_back(a);
      continue;
    }
    if (seen.count(a.id())) continue;
    seen[a.id()] = true;
    if (!a.has_primitive() || a.is_available()) continue;
    stack.emplace_back(a, true);
    for (auto it = a.inputs().rbegin(); it != a.inputs().rend(); ++it) stack.emplace_back(*it, false);
  }
  return order;
}
}  // namespace

extern "C" {

// The graph behind `out` (see graph_nodes), as a vector of arrays.
Vec* mlxb_graph_nodes(const Arr* out) {
  GUARD_PTR("graph_nodes", {
    auto* v = new Vec();
    v->items = graph_nodes(A(out));
    return v;
  })
}

// Re-applies every primitive of the graph behind `out` with leaves `from[i]` replaced by `to[i]`;
// returns the new nodes aligned with mlxb_graph_nodes(out). Nothing is evaluated.
Vec* mlxb_graph_replay(const Arr* out, const double* from, const double* to, int n) {
  GUARD_PTR("graph_replay", {
    auto olds = arrays_of(from, n);
    auto news = arrays_of(to, n);
    std::unordered_map<std::uintptr_t, array> map;
    for (int i = 0; i < n; ++i) {
      if (olds[i].shape() != news[i].shape()) throw std::invalid_argument("replacement leaf has a different shape");
      map.insert_or_assign(olds[i].id(), news[i]);
    }
    auto get = [&](const array& a) {
      auto it = map.find(a.id());
      return it == map.end() ? a : it->second;
    };
    auto nodes = graph_nodes(A(out));
    for (auto& node : nodes) {
      if (map.count(node.id())) continue;  // produced together with a sibling
      std::vector<array> ins;
      for (auto& in : node.inputs()) ins.push_back(get(in));
      auto outs = node.outputs();
      std::vector<mx::Shape> shapes;
      std::vector<mx::Dtype> dtypes;
      for (auto& o : outs) {
        shapes.push_back(o.shape());
        dtypes.push_back(o.dtype());
      }
      auto fresh = array::make_arrays(std::move(shapes), dtypes, node.primitive_ptr(), ins);
      for (size_t i = 0; i < outs.size(); ++i) map.insert_or_assign(outs[i].id(), fresh[i]);
    }
    auto* v = new Vec();
    for (auto& node : nodes) v->items.push_back(get(node));
    return v;
  })
}

// ---------------------------------------------------------------- custom kernels
// mx.fast.metal_kernel / mx.fast.cuda_kernel: the kernel object is MLX's own CustomKernelFunction,
// built here and called with the same arguments as Python's call (inputs, output shapes and
// dtypes, grid, threadgroup, template, init_value, verbose). Off its back-end MLX raises its own
// error at call time ("[metal_kernel] No Metal back-end."), which the GUARD passes on verbatim.

struct Kernel {
  uint32_t magic = 0x4d4c584b;  // "MLXK"
  mx::fast::CustomKernelFunction fn;
};

static std::vector<std::string> names_of(const char* packed, int n) {
  if (n < 0) throw std::invalid_argument("negative name count");
  std::vector<std::string> out;
  const char* p = packed;
  for (int i = 0; i < n; ++i) {
    out.emplace_back(p);
    p += std::strlen(p) + 1;
  }
  return out;
}

static Kernel& K(Kernel* k) {
  if (k == nullptr || k->magic != 0x4d4c584b) throw std::invalid_argument("invalid kernel handle");
  return *k;
}

// backend: 0 metal_kernel, 1 cuda_kernel. Names are NUL-separated with counts.
Kernel* mlxb_kernel_new(int backend, const char* name, const char* input_names, int n_in, const char* output_names, int n_out,
                        const char* source, const char* header, int ensure_row_contiguous, int atomic_outputs, int shared_memory) {
  GUARD_PTR(backend == 1 ? "fast.cuda_kernel" : "fast.metal_kernel", {
    if (backend != 0 && backend != 1) throw std::invalid_argument("backend must be 0 (metal) or 1 (cuda)");
    auto ins = names_of(input_names, n_in);
    auto outs = names_of(output_names, n_out);
    auto* k = new Kernel();
    try {
      k->fn = backend == 0 ? mx::fast::metal_kernel(name, ins, outs, source, header, ensure_row_contiguous != 0, atomic_outputs != 0)
                           : mx::fast::cuda_kernel(name, ins, outs, source, header, ensure_row_contiguous != 0, shared_memory);
    } catch (...) {
      delete k;
      throw;
    }
    return k;
  })
}

// Output shapes are flattened (out_ndims[i] dims each); template args are NUL-separated names
// with kinds (0 int, 1 bool, 2 dtype code) and values.
Vec* mlxb_kernel_call(Kernel* k, const double* inputs, int n_in, const int32_t* out_shapes, const int32_t* out_ndims,
                      const int32_t* out_dtypes, int n_out, const int32_t* grid, const int32_t* threadgroup,
                      const char* tmpl_names, const int32_t* tmpl_kinds, const int32_t* tmpl_vals, int n_tmpl,
                      double init_value, int has_init, int verbose) {
  GUARD_PTR("fast.kernel call", {
    auto& fn = K(k).fn;
    if (n_out < 0) throw std::invalid_argument("negative output count");
    std::vector<mx::Shape> shapes;
    std::vector<mx::Dtype> dtypes;
    const int32_t* sp = out_shapes;
    for (int i = 0; i < n_out; ++i) {
      shapes.push_back(shape_of(sp, out_ndims[i]));
      sp += out_ndims[i];
      dtypes.push_back(dtype_of(out_dtypes[i]));
    }
    auto tnames = names_of(tmpl_names, n_tmpl);
    std::vector<std::pair<std::string, mx::fast::TemplateArg>> tmpl;
    for (int i = 0; i < n_tmpl; ++i) {
      switch (tmpl_kinds[i]) {
        case 0: tmpl.emplace_back(tnames[i], mx::fast::TemplateArg(static_cast<int>(tmpl_vals[i]))); break;
        case 1: tmpl.emplace_back(tnames[i], mx::fast::TemplateArg(tmpl_vals[i] != 0)); break;
        case 2: tmpl.emplace_back(tnames[i], mx::fast::TemplateArg(dtype_of(tmpl_vals[i]))); break;
        default: throw std::invalid_argument("unknown template argument kind " + std::to_string(tmpl_kinds[i]));
      }
    }
    std::optional<float> init = has_init != 0 ? std::optional<float>(static_cast<float>(init_value)) : std::nullopt;
    auto* v = new Vec();
    try {
      v->items = fn(arrays_of(inputs, n_in), shapes, dtypes, {grid[0], grid[1], grid[2]},
                    {threadgroup[0], threadgroup[1], threadgroup[2]}, tmpl, init, verbose != 0, {});
    } catch (...) {
      delete v;
      throw;
    }
    return v;
  })
}

int mlxb_kernel_free(Kernel* k) {
  if (k == nullptr) return 0;
  GUARD_INT("fast.kernel free", {
    K(k).magic = kDead;
    delete k;
    return 0;
  })
}

}  // extern "C"
