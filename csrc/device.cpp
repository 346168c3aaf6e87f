// device.cpp - PyTorch's PrivateUse1 contracts for the vTPU: device
// allocator, pinned host allocator, device guard (devices, streams, events),
// hooks, the Philox generator, and the small op library the Python package
// calls (torch.ops.torch_tpu.*). Everything forwards to the C runtime.
#include "tpu_glue.h"

#include <ATen/Context.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/ops/empty.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/library.h>

#include <pybind11/pybind11.h>
#include <pthread.h>

#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

namespace at::tpu {

// ---------------------------------------------------------------- interrupts
// The runtime's host waits sleep in slices and ask this check between them.
// On the Python main thread it runs the signal handlers (with the GIL); when
// one raises (SIGINT -> KeyboardInterrupt), the exception is kept here until
// the runtime's TPU_ERROR_INTERRUPTED reaches throw_status, which re-raises it.
namespace {

std::atomic<unsigned long> g_main_thread{0};

struct PendingPyErr {
  PyObject* type = nullptr;
  PyObject* value = nullptr;
  PyObject* tb = nullptr;
};
thread_local PendingPyErr g_pending;

bool python_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

bool python_interrupt_check() {
  if (pthread_self() != g_main_thread.load(std::memory_order_relaxed)) return false;
  if (!Py_IsInitialized() || python_finalizing()) return false;
  bool held = PyGILState_Check();
  PyGILState_STATE st{};
  if (!held) st = PyGILState_Ensure();
  bool hit = PyErr_CheckSignals() < 0;
  if (hit) {
    Py_XDECREF(g_pending.type);
    Py_XDECREF(g_pending.value);
    Py_XDECREF(g_pending.tb);
    PyErr_Fetch(&g_pending.type, &g_pending.value, &g_pending.tb);
  }
  if (!held) PyGILState_Release(st);
  return hit;
}

// ---------------------------------------------------------------- call sites
// A launch's call site is the innermost Python frame's (code object,
// instruction): interned once into an id whose text ("file:line in func") is
// computed then, so a kernel failure found at a later flush or sync can name
// the Python line that made the op, from any thread, without the GIL.
struct SiteKey {
  const void* code;
  int lasti;
  bool operator==(const SiteKey& o) const { return code == o.code && lasti == o.lasti; }
};
struct SiteHash {
  size_t operator()(const SiteKey& k) const {
    return std::hash<const void*>()(k.code) ^ (static_cast<size_t>(k.lasti) * 0x9E3779B97F4A7C15ull);
  }
};
std::mutex g_site_mu;
std::unordered_map<SiteKey, uint32_t, SiteHash> g_site_ids;  // (their code objects: in g_code_is_lib)
std::vector<std::string> g_site_text;                        // id - 1 -> text
constexpr size_t kMaxSites = 1 << 20;

void site_namer(uint32_t site, char* buf, size_t len) {
  std::lock_guard<std::mutex> lock(g_site_mu);
  if (site == 0 || site > g_site_text.size()) return;
  snprintf(buf, len, "%s", g_site_text[site - 1].c_str());
}

}  // namespace

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
// CPython 3.11's _PyInterpreterFrame (Include/internal/pycore_frame.h), its
// leading fields: ops run with the GIL released (PyTorch's bindings drop it),
// and this thread's own frame stack cannot change while it is in C, so it is
// read here without taking the GIL back for every launch.
struct Frame311 {
  PyFunctionObject* f_func;
  PyObject* f_globals;
  PyObject* f_builtins;
  PyObject* f_locals;
  PyCodeObject* f_code;
  PyFrameObject* frame_obj;
  Frame311* previous;
  _Py_CODEUNIT* prev_instr;
};

std::unordered_map<const void*, bool> g_code_is_lib;  // code object -> torch's or ours (kept referenced)
std::string g_lib_dirs[2];

// With the GIL: whether code belongs to torch or torch_tpu (a launch names
// the first frame outside them: the user's line, not F.linear's).
bool code_is_lib_gil(PyCodeObject* code) {
  if (g_lib_dirs[0].empty()) {
    for (int i = 0; i < 2; i++) {
      PyObject* m = PyImport_ImportModule(i ? "torch_tpu" : "torch");
      PyObject* f = m ? PyObject_GetAttrString(m, "__file__") : nullptr;
      const char* s = f ? PyUnicode_AsUTF8(f) : nullptr;
      if (s) {
        std::string d(s);
        g_lib_dirs[i] = d.substr(0, d.rfind('/') + 1);
      } else {
        PyErr_Clear();
        g_lib_dirs[i] = "\x01";  // (never a prefix)
      }
      Py_XDECREF(f);
      Py_XDECREF(m);
    }
  }
  const char* file = PyUnicode_AsUTF8(code->co_filename);
  if (!file) {
    PyErr_Clear();
    return false;
  }
  for (const auto& d : g_lib_dirs)
    if (strncmp(file, d.c_str(), d.size()) == 0) return true;
  return false;
}

// This thread's copies of what the maps above hold, direct-mapped, read
// without the lock: every launch asks, and a loop asks the same few sites.
// An entry is only ever a copy of a map entry, and the maps never change an
// entry nor free a code object they hold, so a hit is what the maps say.
constexpr size_t kTlsWays = 256;
struct TlsLib {
  const void* code;
  bool lib;
};
struct TlsSite {
  const void* code;
  int lasti;
  uint32_t id;
};
thread_local TlsLib t_lib[kTlsWays];
thread_local TlsSite t_site[kTlsWays];
size_t tls_slot(const void* code, int lasti = 0) {
  return ((reinterpret_cast<uintptr_t>(code) >> 4) * 31 + static_cast<unsigned>(lasti)) % kTlsWays;
}

uint32_t python_site_locked(const Frame311* inner);

uint32_t python_site() {
  if (!Py_IsInitialized()) return 0;
  PyThreadState* ts = PyGILState_GetThisThreadState();
  if (!ts || !ts->cframe || !ts->cframe->current_frame) return 0;  // (autograd's backward threads)
  const Frame311* inner = reinterpret_cast<const Frame311*>(ts->cframe->current_frame);
  const Frame311* f = nullptr;
  for (const Frame311* g = inner; g; g = g->previous) {
    const TlsLib& e = t_lib[tls_slot(g->f_code)];
    if (!g->f_code || e.code != g->f_code) return python_site_locked(inner);
    if (!e.lib) {
      f = g;
      break;
    }
  }
  if (!f || !f->prev_instr) return python_site_locked(inner);
  int lasti = static_cast<int>(f->prev_instr - _PyCode_CODE(f->f_code));
  const TlsSite& e = t_site[tls_slot(f->f_code, lasti)];
  if (e.code == f->f_code && e.lasti == lasti) return e.id;
  return python_site_locked(inner);
}

uint32_t python_site_locked(const Frame311* inner) {
  for (int attempt = 0; attempt < 2; attempt++) {
    const Frame311* f = inner;
    bool unknown = false;
    {
      std::lock_guard<std::mutex> lock(g_site_mu);
      for (const Frame311* g = inner; g; g = g->previous) {
        auto it = g_code_is_lib.find(g->f_code);
        if (it == g_code_is_lib.end()) {
          unknown = true;
          break;
        }
        t_lib[tls_slot(g->f_code)] = {g->f_code, it->second};
        if (!it->second) {
          f = g;
          break;
        }
      }
      if (!unknown) {
        if (!f->f_code || !f->prev_instr) return 0;
        SiteKey key{f->f_code, static_cast<int>(f->prev_instr - _PyCode_CODE(f->f_code))};
        auto it = g_site_ids.find(key);
        if (it != g_site_ids.end()) {
          t_site[tls_slot(key.code, key.lasti)] = {key.code, key.lasti, it->second};
          return it->second;
        }
        if (g_site_text.size() >= kMaxSites) return 0;
      }
    }
    // Something new (once per code object and per Python line that
    // launches): classify the frames, name the site, with the GIL.
    PyGILState_STATE st = PyGILState_Ensure();
    if (unknown) {
      for (const Frame311* g = inner; g; g = g->previous) {
        std::lock_guard<std::mutex> lock(g_site_mu);
        if (g->f_code && !g_code_is_lib.count(g->f_code)) {
          bool lib = code_is_lib_gil(g->f_code);
          Py_INCREF(g->f_code);  // the map's key stays this code object's
          g_code_is_lib.emplace(g->f_code, lib);
        }
      }
      PyGILState_Release(st);
      continue;  // look again, every frame known now
    }
    PyCodeObject* code = f->f_code;
    int lasti = static_cast<int>(f->prev_instr - _PyCode_CODE(code));
    const char* file = PyUnicode_AsUTF8(code->co_filename);
    const char* func = PyUnicode_AsUTF8(code->co_name);
    std::string text;
    if (file && func)
      text = std::string(file) + ":" + std::to_string(PyCode_Addr2Line(code, lasti * 2)) + " in " + func;
    else
      PyErr_Clear();
    uint32_t id = 0;
    if (!text.empty()) {
      std::lock_guard<std::mutex> lock(g_site_mu);
      SiteKey key{code, lasti};
      auto it = g_site_ids.find(key);
      if (it != g_site_ids.end()) {
        id = it->second;
      } else {
        g_site_text.push_back(std::move(text));
        id = static_cast<uint32_t>(g_site_text.size());
        g_site_ids.emplace(key, id);
      }
    }
    PyGILState_Release(st);
    return id;
  }
  return 0;
}
#else
uint32_t python_site() { return 0; }  // call sites are read from CPython 3.11's frames only
#endif

namespace {

// Raise what the signal handler raised (KeyboardInterrupt if nothing is kept:
// the wait was interrupted through the C API directly).
[[noreturn]] void throw_interrupted() {
  tpu_interrupt_clear();
  TORCH_CHECK(Py_IsInitialized(), tpu_last_error());
  PyGILState_STATE st = PyGILState_Ensure();
  if (g_pending.type) {
    PyErr_Restore(g_pending.type, g_pending.value, g_pending.tb);
    g_pending = {};
  } else {
    PyErr_SetNone(PyExc_KeyboardInterrupt);
  }
  pybind11::error_already_set err;
  PyGILState_Release(st);
  throw err;
}

}  // namespace

void synchronize_device(int64_t d) {
  TPU_CHECK(tpu_device_synchronize(d < 0 ? tpu_device_current() : static_cast<int>(d)));
}

[[noreturn]] void throw_status(tpu_status s, const char* what) {
  if (s == TPU_ERROR_INTERRUPTED) throw_interrupted();
  std::string msg = tpu_last_error();
  if (s == TPU_ERROR_OUT_OF_MEMORY) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, msg);
  }
  if (s == TPU_ERROR_NOT_SUPPORTED) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, msg);
  }
  // Everything else is RuntimeError, as PyTorch raises for bad views, device
  // mismatches and out-of-bounds storage ("Expected all tensors to be on the
  // same device", "setStorage: ... out of bounds").
  TORCH_CHECK(false, msg);
}

// ---------------------------------------------------------------- streams
// A c10::Stream's id is the runtime's queue id (0 default, 1..64 the pool):
// streams are stateless handles, as CUDA's are, so none is ever leaked.
namespace {

tpu_stream_t lookup_stream(const c10::Stream& s) {
  int dev = s.device_index() < 0 ? tpu_device_current() : s.device_index();
  tpu_stream_t st = tpu_stream_from_id(dev, s.id());
  if (!st) TPU_CHECK(tpu_device_set(dev));  // an invalid index or configuration: the runtime's message
  TORCH_CHECK(st, "unknown tpu stream id ", s.id(), " on device ", dev);
  return st;
}

c10::Stream wrap_stream(tpu_stream_t s) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, tpu_stream_device(s)),
                     tpu_stream_id(s));
}

tpu_stream_t new_stream(int dev, int priority) {
  tpu_stream_t s = nullptr;
  TPU_CHECK(tpu_stream_create(dev, priority, &s));
  return s;
}

}  // namespace

tpu_stream_t current_stream(c10::DeviceIndex dev) {
  tpu_stream_t s = tpu_stream_current(dev < 0 ? tpu_device_current() : dev);
  if (!s) TPU_CHECK(tpu_device_set(dev));  // an invalid index: raise the runtime's message
  TORCH_CHECK(s, "tpu: no stream for device ", int(dev));
  return s;
}

// ---------------------------------------------------------------- allocator
namespace {

void device_deleter(void* p) {
  tpu_free(p);  // errors here cannot be raised from a deleter; the runtime validated the pointer
}

struct TPUAllocator final : public c10::DeviceAllocator {
  c10::DataPtr allocate(size_t nbytes) override {
    int dev = tpu_device_current();
    void* p = nullptr;
    if (nbytes > 0) TPU_CHECK(tpu_malloc(dev, nbytes, nullptr, &p));
    return {p, p, &device_deleter, c10::Device(c10::DeviceType::PrivateUse1, dev)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &device_deleter; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    TPU_CHECK(tpu_memcpy(dest, src, count, TPU_COPY_D2D, nullptr));
  }
  bool initialized() override { return tpu_is_initialized(); }
  void emptyCache(c10::MempoolId_t) override {
    for (int d = 0; d < tpu_device_count(); d++) TPU_CHECK(tpu_mem_empty_cache(d));
  }
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override {
    if (ptr.get()) TPU_CHECK(tpu_mem_record_stream(ptr.get(), lookup_stream(stream)));
  }
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    tpu_mem_stats st;
    TPU_CHECK(tpu_mem_get_stats(device, &st));
    c10::CachingDeviceAllocator::DeviceStats out;
    auto set = [](c10::CachingDeviceAllocator::StatArray& a, int64_t cur, int64_t peak) {
      auto& s = a[static_cast<size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE)];
      s.current = cur;
      s.peak = peak;
    };
    set(out.allocated_bytes, st.allocated, st.peak_allocated);
    set(out.reserved_bytes, st.reserved, st.peak_reserved);
    set(out.active_bytes, st.allocated, st.peak_allocated);
    set(out.requested_bytes, st.allocated, st.peak_allocated);
    auto& al = out.allocation[0];
    al.allocated = st.num_allocs;
    al.freed = st.num_frees;
    al.current = st.num_allocs - st.num_frees;
    out.num_ooms = st.num_ooms;
    out.num_alloc_retries = st.num_cache_flushes;
    return out;
  }
  void resetAccumulatedStats(c10::DeviceIndex) override {}
  void resetPeakStats(c10::DeviceIndex device) override { TPU_CHECK(tpu_mem_reset_peak(device)); }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    size_t f = 0, t = 0;
    TPU_CHECK(tpu_mem_get_info(device, &f, &t));
    return {f, t};
  }
};

TPUAllocator g_allocator;

void host_deleter(void* p) { tpu_host_free(p); }

struct TPUHostAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* p = nullptr;
    if (nbytes > 0) TPU_CHECK(tpu_host_alloc(nbytes, &p));
    return {p, p, &host_deleter, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &host_deleter; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
};

TPUHostAllocator g_host_allocator;

}  // namespace

c10::Allocator* device_allocator() { return &g_allocator; }

void resize_storage_bytes(c10::StorageImpl* st, size_t nbytes) {
  c10::DataPtr nd = g_allocator.allocate(nbytes);
  size_t keep = std::min(nbytes, st->nbytes());
  if (keep && st->data()) TPU_CHECK(tpu_memcpy(nd.get(), st->data(), keep, TPU_COPY_D2D, nullptr));
  st->set_data_ptr_noswap(std::move(nd));
  st->set_nbytes(nbytes);
}
void device_allocator_record(const c10::DataPtr& p, c10::Stream s) { g_allocator.recordStream(p, s); }
c10::Allocator* host_allocator() { return &g_host_allocator; }

// ---------------------------------------------------------------- generator
namespace {

constexpr uint64_t kDefaultSeed = 67280421310721ULL;  // PyTorch's default_rng_seed_val

struct TPUGenerator final : public c10::GeneratorImpl {
  explicit TPUGenerator(c10::DeviceIndex idx)
      : c10::GeneratorImpl{c10::Device(c10::DeviceType::PrivateUse1, idx),
                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)} {}
  void set_current_seed(uint64_t seed) override {
    seed_ = seed;
    offset_ = 0;
  }
  void set_offset(uint64_t offset) override { offset_ = offset; }
  uint64_t get_offset() const override { return offset_; }
  uint64_t current_seed() const override { return seed_; }
  uint64_t seed() override {
    uint64_t s = std::random_device{}() | (uint64_t(std::random_device{}()) << 32);
    set_current_seed(s);
    return s;
  }
  void set_state(const c10::TensorImpl& st) override {
    TORCH_CHECK(st.numel() == 16 && st.dtype() == caffe2::TypeMeta::Make<uint8_t>(),
                "RNG state must be a torch.ByteTensor of 16 bytes");
    const uint8_t* p = static_cast<const uint8_t*>(st.data());
    std::memcpy(&seed_, p, 8);
    std::memcpy(&offset_, p + 8, 8);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    auto t = at::empty({16}, at::TensorOptions().dtype(at::kByte));
    std::memcpy(t.data_ptr(), &seed_, 8);
    std::memcpy(static_cast<uint8_t*>(t.data_ptr()) + 8, &offset_, 8);
    return t.getIntrusivePtr();
  }
  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }
  // (seed, offset) for one random op; each op gets its own Philox counter space.
  std::pair<uint64_t, uint64_t> next() { return {seed_, offset_++}; }

 private:
  TPUGenerator* clone_impl() const override {
    auto g = new TPUGenerator(device().index());
    g->seed_ = seed_;
    g->offset_ = offset_;
    return g;
  }
  uint64_t seed_ = kDefaultSeed;
  uint64_t offset_ = 0;
};

std::once_flag g_gen_once[16];
std::array<at::Generator, 16> g_default_gens;

}  // namespace

const at::Generator& default_generator(c10::DeviceIndex idx) {
  if (idx < 0) idx = tpu_device_current();
  int n = tpu_device_count();
  TORCH_CHECK(idx >= 0 && idx < n, "Invalid device index ", int(idx), ": there ", n == 1 ? "is " : "are ", n,
              " tpu device", n == 1 ? "" : "s");
  std::call_once(g_gen_once[idx], [idx] { g_default_gens[idx] = at::make_generator<TPUGenerator>(idx); });
  return g_default_gens[idx];
}

std::pair<uint64_t, uint64_t> philox_next(const std::optional<at::Generator>& gen, c10::DeviceIndex idx) {
  at::Generator g = gen.has_value() && gen->defined() ? *gen : default_generator(idx);
  auto* impl = g.get<TPUGenerator>();
  TORCH_CHECK(impl, "expected a tpu generator");
  std::lock_guard<std::mutex> lock(g.mutex());
  return impl->next();
}

// ---------------------------------------------------------------- guard
namespace {

struct TPUGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType static_type = c10::DeviceType::PrivateUse1;
  c10::DeviceType type() const override { return static_type; }
  c10::Device exchangeDevice(c10::Device d) const override {
    auto old = getDevice();
    if (d.index() != old.index()) setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(static_type, tpu_device_current()); }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == static_type, "expected a tpu device, got ", d);
    if (d.index() >= 0) TPU_CHECK(tpu_device_set(d.index()));
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0) tpu_device_set(d.index());
  }
  c10::Stream getStream(c10::Device d) const override { return wrap_stream(current_stream(d.index())); }
  c10::Stream getDefaultStream(c10::Device d) const override {
    int dev = d.index() < 0 ? tpu_device_current() : d.index();
    tpu_stream_t s = tpu_stream_default(dev);
    if (!s) TPU_CHECK(tpu_device_set(dev));
    return wrap_stream(s);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool high) const override {
    int dev = d.index() < 0 ? tpu_device_current() : d.index();
    return wrap_stream(new_stream(dev, high ? -1 : 0));
  }
  c10::Stream getNewStream(c10::Device d, int priority) const override {
    int dev = d.index() < 0 ? tpu_device_current() : d.index();
    return wrap_stream(new_stream(dev, priority));
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    tpu_stream_t ns = lookup_stream(s);
    tpu_stream_t old = tpu_stream_current(tpu_stream_device(ns));
    TPU_CHECK(tpu_stream_set_current(ns));
    return wrap_stream(old);
  }
  c10::DeviceIndex deviceCount() const noexcept override { return tpu_device_count(); }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    tpu_event_destroy(static_cast<tpu_event_t>(event));
  }
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex,
              const c10::EventFlag flag) const override {
    if (!*event) {
      tpu_event_t e = nullptr;
      TPU_CHECK(tpu_event_create(flag == c10::EventFlag::BACKEND_DEFAULT, &e));
      *event = e;
    }
    TPU_CHECK(tpu_event_record(static_cast<tpu_event_t>(*event), lookup_stream(stream)));
  }
  void block(void* event, const c10::Stream& stream) const override {
    if (event) TPU_CHECK(tpu_stream_wait_event(lookup_stream(stream), static_cast<tpu_event_t>(event)));
  }
  bool queryEvent(void* event) const override {
    return !event || tpu_event_query(static_cast<tpu_event_t>(event)) == TPU_OK;
  }
  bool queryStream(const c10::Stream& s) const override { return tpu_stream_query(lookup_stream(s)) == TPU_OK; }
  void synchronizeStream(const c10::Stream& s) const override { TPU_CHECK(tpu_stream_synchronize(lookup_stream(s))); }
  void synchronizeEvent(void* event) const override {
    if (event) TPU_CHECK(tpu_event_synchronize(static_cast<tpu_event_t>(event)));
  }
  void synchronizeDevice(const c10::DeviceIndex idx) const override {
    TPU_CHECK(tpu_device_synchronize(idx < 0 ? tpu_device_current() : idx));
  }
  void recordDataPtrOnStream(const c10::DataPtr& p, const c10::Stream& s) const override {
    if (p.get()) TPU_CHECK(tpu_mem_record_stream(p.get(), lookup_stream(s)));
  }
  double elapsedTime(void* e1, void* e2, const c10::DeviceIndex) const override {
    TORCH_CHECK(e1 && e2, "Both events must be recorded before calculating elapsed time.");
    float ms = 0;
    TPU_CHECK(tpu_event_elapsed_ms(static_cast<tpu_event_t>(e1), static_cast<tpu_event_t>(e2), &ms));
    return ms;
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, TPUGuardImpl);

// ---------------------------------------------------------------- hooks
struct TPUHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return tpu_device_count() > 0; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex idx) const override { return default_generator(idx); }
  at::Generator getNewGenerator(c10::DeviceIndex idx) const override {
    return at::make_generator<TPUGenerator>(idx < 0 ? tpu_device_current() : idx);
  }
  at::Device getDeviceFromPtr(void* data) const override {
    return c10::Device(c10::DeviceType::PrivateUse1, tpu_mem_device_of(data));
  }
  bool isPinnedPtr(const void* data) const override { return tpu_host_is_pinned(data); }
  c10::Allocator* getPinnedMemoryAllocator() const override { return &g_host_allocator; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return tpu_is_initialized(); }
  c10::DeviceIndex deviceCount() const override { return tpu_device_count(); }
  void setCurrentDevice(c10::DeviceIndex d) const override { TPU_CHECK(tpu_device_set(d)); }
  c10::DeviceIndex getCurrentDevice() const override { return tpu_device_current(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    int old = tpu_device_current();
    TPU_CHECK(tpu_device_set(d));
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    resize_storage_bytes(storage.unsafeGetStorageImpl(), newsize);
  }
};

bool register_all() {
  tpu_set_site_namer(&site_namer);
  c10::SetAllocator(c10::DeviceType::PrivateUse1, &g_allocator);
  at::RegisterPrivateUse1HooksInterface(new TPUHooks());
  return true;
}
const bool g_registered = register_all();

// ---------------------------------------------------------------- op library for Python
int64_t py_device_count() {
  TPU_CHECK(tpu_init());  // a bad environment raises here, not as "0 devices"
  return tpu_device_count();
}
void py_init() { TPU_CHECK(tpu_init()); }
void py_install_interrupt_check(int64_t main_thread) {
  g_main_thread.store(static_cast<unsigned long>(main_thread), std::memory_order_relaxed);
  tpu_set_interrupt_check(&python_interrupt_check);
}
int64_t py_stream_priority(int64_t d, int64_t id) {
  tpu_stream_t s = tpu_stream_from_id(static_cast<int>(d), id);
  if (!s) TPU_CHECK(tpu_device_set(static_cast<int>(d)));
  TORCH_CHECK(s, "unknown tpu stream id ", id, " on device ", d);
  return tpu_stream_priority(s);
}
bool py_is_initialized() { return tpu_is_initialized(); }
bool py_is_forked() { return tpu_is_forked_child(); }

std::tuple<std::string, int64_t, std::string, int64_t> py_props(int64_t d) {
  tpu_device_props p;
  TPU_CHECK(tpu_device_get_props(static_cast<int>(d), &p));
  return {p.name, static_cast<int64_t>(p.hbm_bytes), tpu_mxu_name(p.mxu), p.num_workers};
}

std::vector<int64_t> py_mem_stats(int64_t d) {
  tpu_mem_stats s;
  TPU_CHECK(tpu_mem_get_stats(static_cast<int>(d), &s));
  return {int64_t(s.allocated),     int64_t(s.peak_allocated),    int64_t(s.reserved),
          int64_t(s.peak_reserved), int64_t(s.num_allocs),        int64_t(s.num_frees),
          int64_t(s.num_ooms),      int64_t(s.num_cache_flushes), int64_t(s.capacity)};
}
void py_reset_peak(int64_t d) { TPU_CHECK(tpu_mem_reset_peak(static_cast<int>(d))); }
void py_empty_cache() {
  for (int d = 0; d < tpu_device_count(); d++)
    if (tpu_is_initialized()) TPU_CHECK(tpu_mem_empty_cache(d));
}
std::vector<int64_t> py_mem_info(int64_t d) {
  size_t f = 0, t = 0;
  TPU_CHECK(tpu_mem_get_info(static_cast<int>(d), &f, &t));
  return {int64_t(f), int64_t(t)};
}
// d < 0: the current device (torch.tpu.synchronize() without an argument, one call from Python).
void py_synchronize(int64_t d) { synchronize_device(d); }
void py_set_device(int64_t d) { TPU_CHECK(tpu_device_set(static_cast<int>(d))); }
int64_t py_current_device() { return tpu_device_current(); }

void py_manual_seed(int64_t d, int64_t seed) {
  auto g = default_generator(d);
  std::lock_guard<std::mutex> lock(g.mutex());
  g.set_current_seed(static_cast<uint64_t>(seed));
}
int64_t py_seed(int64_t d) {
  auto g = default_generator(d);
  std::lock_guard<std::mutex> lock(g.mutex());
  return static_cast<int64_t>(g.seed());
}
int64_t py_initial_seed(int64_t d) { return static_cast<int64_t>(default_generator(d).current_seed()); }
at::Tensor py_get_rng_state(int64_t d) {
  auto g = default_generator(d);
  std::lock_guard<std::mutex> lock(g.mutex());
  return g.get_state();
}
void py_set_rng_state(int64_t d, const at::Tensor& s) {
  auto g = default_generator(d);
  std::lock_guard<std::mutex> lock(g.mutex());
  g.set_state(s);
}
// The eager mode is the runtime's (tpu_eager_mode): its names and messages come from there.
void py_set_eager_mode(const std::string& name) {
  tpu_eager_mode m;
  TORCH_CHECK_VALUE(tpu_eager_mode_from_name(name.c_str(), &m) == TPU_OK, tpu_last_error());
  tpu_status s = tpu_set_eager_mode(m);
  if (s != TPU_OK) throw_status(s, "set_eager_mode");
}
std::string py_get_eager_mode() { return tpu_eager_mode_name(tpu_get_eager_mode()); }
// This thread's override of the eager mode ("" to follow the process's again);
// returns the override it replaced ("" for none). Leaving Fused Eager flushes.
std::string py_set_thread_eager_mode(const std::string& name) {
  int m = -1, prev = -1;
  if (!name.empty()) {
    tpu_eager_mode e;
    TORCH_CHECK_VALUE(tpu_eager_mode_from_name(name.c_str(), &e) == TPU_OK, tpu_last_error());
    m = static_cast<int>(e);
  }
  tpu_status s = tpu_set_thread_eager_mode(m, &prev);
  if (s != TPU_OK) throw_status(s, "set_thread_eager_mode");
  return prev < 0 ? std::string() : std::string(tpu_eager_mode_name(static_cast<tpu_eager_mode>(prev)));
}
bool py_is_pinned_ptr(int64_t p) { return tpu_host_is_pinned(reinterpret_cast<void*>(p)); }

// Fused Eager (graph.h): counters, flush, materialization.
std::vector<std::string> py_flush_causes() {
  std::vector<std::string> v;
  for (int c = 0; c < TPU_FLUSH_CAUSE_COUNT; c++) v.emplace_back(tpu_flush_cause_name(static_cast<tpu_flush_cause>(c)));
  return v;
}
// Flushes by cause (in py_flush_causes' order), then ops recorded, ops fused,
// groups run, kernels run, results never stored, bytes never materialized,
// plan-cache hits and misses, groups run as lookup tables, operands read from
// a recomputed copy, launches recorded again to recompute them, launches
// recorded as a cheaper one, kernel nodes dropped.
std::vector<int64_t> py_fused_stats() {
  tpu_fused_stats s;
  tpu_fused_get_stats(&s);
  std::vector<int64_t> v(s.flushes, s.flushes + TPU_FLUSH_CAUSE_COUNT);
  for (uint64_t x : {s.ops_recorded, s.ops_fused, s.groups_run, s.kernels_run, s.results_never_stored,
                     s.bytes_never_materialized, s.plan_cache_hits, s.plan_cache_misses, s.groups_by_table,
                     s.remat_reads, s.remat_ops, s.ops_rewritten, s.kernels_dropped})
    v.push_back(static_cast<int64_t>(x));
  return v;
}
void py_reset_fused_stats() { tpu_fused_reset_stats(); }
void py_flush() { TPU_CHECK(tpu_flush(nullptr)); }
bool py_is_materialized(const at::Tensor& t) {
  TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1, "is_materialized: expected a tpu tensor, got ",
              t.device());
  const void* p = t.storage().data();
  return p == nullptr || tpu_mem_is_materialized(p);
}

}  // namespace

}  // namespace at::tpu

TORCH_LIBRARY(torch_tpu, m) {
  using namespace at::tpu;
  m.def("device_count() -> int", &py_device_count);
  m.def("init() -> ()", &py_init);
  m.def("install_interrupt_check(int main_thread) -> ()", &py_install_interrupt_check);
  m.def("stream_priority(int d, int id) -> int", &py_stream_priority);
  m.def("is_initialized() -> bool", &py_is_initialized);
  m.def("is_forked() -> bool", &py_is_forked);
  m.def("device_props(int d) -> (str, int, str, int)", &py_props);
  m.def("mem_stats(int d) -> int[]", &py_mem_stats);
  m.def("reset_peak(int d) -> ()", &py_reset_peak);
  m.def("empty_cache() -> ()", &py_empty_cache);
  m.def("mem_get_info(int d) -> int[]", &py_mem_info);
  m.def("synchronize(int d) -> ()", &py_synchronize);
  m.def("set_device(int d) -> ()", &py_set_device);
  m.def("current_device() -> int", &py_current_device);
  m.def("manual_seed(int d, int seed) -> ()", &py_manual_seed);
  m.def("seed(int d) -> int", &py_seed);
  m.def("initial_seed(int d) -> int", &py_initial_seed);
  m.def("get_rng_state(int d) -> Tensor", &py_get_rng_state);
  m.def("set_rng_state(int d, Tensor state) -> ()", &py_set_rng_state);
  m.def("set_eager_mode(str mode) -> ()", &py_set_eager_mode);
  m.def("get_eager_mode() -> str", &py_get_eager_mode);
  m.def("set_thread_eager_mode(str mode) -> str", &py_set_thread_eager_mode);
  m.def("fallback_counts() -> (str[], int[])", &fallback_counts);
  m.def("reset_fallback_counts() -> ()", &reset_fallback_counts);
  m.def("set_fallback_enabled(bool on) -> ()", &set_fallback_enabled);
  m.def("fallback_enabled() -> bool", &fallback_enabled);
  m.def("note_cpu_fallback(str op) -> ()", [](std::string op) { note_cpu_fallback(op); });
  m.def("is_pinned_ptr(int p) -> bool", &py_is_pinned_ptr);
  m.def("flush_causes() -> str[]", &py_flush_causes);
  m.def("fused_stats() -> int[]", &py_fused_stats);
  m.def("reset_fused_stats() -> ()", &py_reset_fused_stats);
  m.def("flush() -> ()", &py_flush);
  m.def("is_materialized(Tensor t) -> bool", &py_is_materialized);
  m.def("set_allow_excess_precision(bool on) -> ()", &tpu_set_allow_excess_precision);
  m.def("set_fused_remat(int distance) -> ()", [](int64_t d) { tpu_set_fused_remat(static_cast<int>(d)); });
  m.def("get_fused_remat() -> int", []() -> int64_t { return tpu_get_fused_remat(); });
  m.def("get_allow_excess_precision() -> bool", &tpu_get_allow_excess_precision);
}
