// A C++ autograd node for the eager backward of a tensor product recorded under create_graph
// (force training). Its own backward, the fused double backward, launches the generated Triton
// kernels straight through the CUDA driver: no Python, so no GIL on the autograd engine's device
// thread. On an H200 a Python node plus Triton's Python launch cost ~40 us more host time per
// double backward than OpenEquivariance's C++ node.
//
// The recipes (kernel, launch shape, arguments, allocations) come from Python (ops/native.py), which
// works them out with ops.tp's direct double backward the first time a case is met. Anything without
// a recipe (higher orders being recorded, a new dtype, an int class Triton compiled no kernel for,
// CPU tensors, misaligned pointers) calls the Python fallback, which is ops.tp's own double backward.
#include <torch/extension.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace py = pybind11;
using torch::autograd::Node;
using torch::autograd::SavedVariable;
using torch::autograd::variable_list;
using at::Tensor;

namespace {

// torch holds autograd nodes in std::shared_ptr (2.11) or c10::intrusive_ptr (2.13): whichever an Edge has
using NodePtr = std::decay_t<decltype(std::declval<torch::autograd::Edge>().function)>;

template <typename T>
auto make_node() {
  if constexpr (std::is_same_v<NodePtr, std::shared_ptr<Node>>) {
    return std::make_shared<T>();
  } else {
    return c10::make_intrusive<T>();
  }
}

// --- the CUDA driver, looked up at run time (libcuda is loaded by torch when CUDA is in use) -----
using cu_launch_t = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            void*, void**, void**);
using cu_ctx_t = int (*)(void**);

struct Driver {
  cu_launch_t launch = nullptr;
  cu_ctx_t ctx_current = nullptr;
  Driver() {
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h) h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) return;
    launch = reinterpret_cast<cu_launch_t>(dlsym(h, "cuLaunchKernel"));
    ctx_current = reinterpret_cast<cu_ctx_t>(dlsym(h, "cuCtxGetCurrent"));
  }
};

const Driver& driver() {
  static Driver d;
  return d;
}

std::atomic<bool> g_enabled{true};
std::atomic<long long> g_native{0}, g_fallback{0};

// What Triton's specialisation keeps of an int argument (as launch.int_class): 1 (compiled as a
// constexpr), divisible by 16, wider than 32 bits.
int int_class(int64_t v) {
  if (v == 1) return 1;
  int c = v % 16 == 0 ? 2 : 0;
  if (v < -0x80000000LL || v > 0x7FFFFFFFLL) c |= 4;
  return c;
}

// One compiled kernel for one int class of (N, NBLK) on one device (key: N's class | NBLK's << 4 | device << 8).
struct Variant {
  int key;
  uint64_t function;
  int warps, shared;
  std::string kinds;  // per kernel argument: 'p' pointer, 'i' int32, 'l' int64, 'c' constexpr (skipped)
};

struct Launch {
  int rows;
  std::vector<int> args;                     // pointer arguments: indexes into (x, y, w, g, a, b, c, outputs...)
  std::vector<std::pair<int, bool>> allocs;  // outputs allocated before it: (operand x 0 .. g 3, zero-filled)
  std::vector<Variant> variants;
};

struct Plan {
  std::vector<Launch> launches;
  int res[4];  // per x, y, w, g: its result's index, -1 zeros (no term contributes)
};

// One backward (problem, its need, dtypes, math dtype): plans per (cotangents present, results needed).
struct Entry {
  int cneed;              // the backward's need bits: which of its outputs (gx, gy, gw) are real
  PyObject* fallback;     // callable(x, y, w, g, a, b, c, need) -> 4 tensors or None; kept alive forever
  std::mutex mu;          // plans are added from Python while the engine's threads may read them
  std::unordered_map<int, std::shared_ptr<Plan>> plans;

  std::shared_ptr<Plan> plan(int key) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = plans.find(key);
    return it == plans.end() ? nullptr : it->second;
  }
};

bool env_one(const char* name) {
  const char* v = std::getenv(name);
  return v && std::strcmp(v, "1") == 0;
}

// The double backward through recipes; false: the caller falls back (nothing launched or allocated
// that anyone sees).
bool run_native(Entry& e, int have, int need, const Tensor& x, const Tensor& y, const Tensor& w, const Tensor& g,
                const Tensor& a, const Tensor& b, const Tensor& c, variable_list& out) {
  const Driver& drv = driver();
  if (!g_enabled.load(std::memory_order_relaxed) || !drv.launch || !x.is_cuda() || x.dim() != 2 || x.size(0) == 0)
    return false;
  if (env_one("EQUIKERNELS_AUTOTUNE") || env_one("EQUIKERNELS_POISON")) return false;
  auto plan = e.plan(have | (need << 3));
  if (!plan) return false;
  std::vector<Tensor> t = {x, y, w, g, a, b, c};
  uint64_t acc = 0;
  for (const Tensor& v : t) {
    if (!v.defined()) continue;
    // (autograd's batched cotangents have no storage: they take the Python fallback)
    if (!v.has_storage() || !v.is_contiguous() || !v.is_cuda()) return false;
    acc |= reinterpret_cast<uint64_t>(v.data_ptr());
  }
  if (acc & 15) return false;
  const int64_t n = x.size(0);
  std::vector<const Variant*> chosen;
  for (const Launch& l : plan->launches) {
    const int64_t nblk = (n + l.rows - 1) / l.rows;
    const int key = int_class(n) | (int_class(nblk) << 4) | (x.get_device() << 8);  // kernels load per device
    const Variant* v = nullptr;
    for (const Variant& cand : l.variants)
      if (cand.key == key) v = &cand;
    if (!v) return false;  // Python compiles it and adds the variant
    chosen.push_back(v);
  }
  void* ctx = nullptr;
  if (!drv.ctx_current || drv.ctx_current(&ctx) != 0 || !ctx) return false;
  c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
  void* stream = impl.getStream(x.device()).native_handle();
  const Tensor* ops[4] = {&x, &y, &w, &g};
  std::vector<uint64_t> slots;
  std::vector<void*> params;
  for (size_t k = 0; k < plan->launches.size(); ++k) {
    const Launch& l = plan->launches[k];
    const Variant& v = *chosen[k];
    for (const auto& al : l.allocs)  // operands are contiguous: so are these
      t.push_back(al.second ? at::zeros_like(*ops[al.first]) : at::empty_like(*ops[al.first]));
    const int64_t nblk = (n + l.rows - 1) / l.rows;
    const int64_t ints[2] = {n, nblk};
    slots.assign(v.kinds.size() + 2, 0);
    params.clear();
    for (size_t j = 0; j < v.kinds.size(); ++j) {
      const char kind = v.kinds[j];
      if (kind == 'c') continue;
      if (kind == 'p') {
        slots[j] = reinterpret_cast<uint64_t>(t[l.args[j]].data_ptr());
      } else {
        const int64_t val = ints[j - l.args.size()];
        if (kind == 'i') {
          const int32_t v32 = static_cast<int32_t>(val);
          std::memcpy(&slots[j], &v32, sizeof v32);
        } else {
          std::memcpy(&slots[j], &val, sizeof val);
        }
      }
      params.push_back(&slots[j]);
    }
    params.push_back(&slots[v.kinds.size()]);      // global scratch (none: recipes require size 0)
    params.push_back(&slots[v.kinds.size() + 1]);  // profile scratch
    const int err = drv.launch(reinterpret_cast<void*>(v.function), static_cast<unsigned>(nblk), 1, 1,
                               32u * v.warps, 1, 1, v.shared, stream, params.data(), nullptr);
    TORCH_CHECK(err == 0, "equikernels: cuLaunchKernel failed with CUresult ", err);
  }
  out.assign(4, Tensor());
  for (int i = 0; i < 4; ++i) {
    if (!(need & (1 << i))) continue;
    out[i] = plan->res[i] >= 0 ? t[plan->res[i]] : at::zeros_like(*ops[i]);
  }
  g_native.fetch_add(1, std::memory_order_relaxed);
  return true;
}

py::object none_or(const Tensor& t) { return t.defined() ? py::cast(t) : py::none(); }

struct TPBackwardNode : public Node {
  std::shared_ptr<Entry> entry;
  SavedVariable x_, y_, w_, g_;

  std::string name() const override { return "EquikernelsTPBackwardBackward"; }

  void release_variables() override {
    x_.reset_data();
    y_.reset_data();
    w_.reset_data();
    g_.reset_data();
  }

  variable_list apply(variable_list&& grads) override {
    Tensor x = x_.unpack(), y = y_.unpack(), w = w_.unpack(), g = g_.unpack();
    int need = 0;
    for (int i = 0; i < 4; ++i)
      if (task_should_compute_output(i)) need |= 1 << i;
    if (!need) return variable_list(4);
    // a usable cotangent: present, and for an output that is a real gradient (not a placeholder)
    auto cot = [&](int i) { return (entry->cneed >> i & 1) && grads[i].defined() ? grads[i].contiguous() : Tensor(); };
    Tensor a = cot(0), b = cot(1), c = cot(2);
    const int have = (a.defined() ? 1 : 0) | (b.defined() ? 2 : 0) | (c.defined() ? 4 : 0);
    variable_list out;
    if (!at::GradMode::is_enabled() && run_native(*entry, have, need, x, y, w, g, a, b, c, out)) return out;
    g_fallback.fetch_add(1, std::memory_order_relaxed);
    py::gil_scoped_acquire gil;
    py::object res = py::reinterpret_borrow<py::object>(entry->fallback)(
        x, y, w, g, none_or(a), none_or(b), none_or(c), need);
    auto tup = res.cast<py::tuple>();
    TORCH_CHECK(tup.size() == 4, "equikernels: the double-backward fallback returned ", tup.size(), " results, not 4");
    out.assign(4, Tensor());
    for (int i = 0; i < 4; ++i)
      if ((need >> i & 1) && !tup[i].is_none()) out[i] = tup[i].cast<Tensor>();
    return out;
  }
};

std::shared_ptr<Entry> make_entry(int cneed, py::object fallback) {
  auto e = std::make_shared<Entry>();
  e->cneed = cneed;
  e->fallback = fallback.release().ptr();  // never released: entries live as long as the process
  return e;
}

// Records (gx, gy, gw) = backward(x, y, w, g) as computed by the caller, with a TPBackwardNode as
// their grad_fn. None stays None (a gradient not asked for).
py::tuple attach(const std::shared_ptr<Entry>& e, const Tensor& x, const Tensor& y, const Tensor& w,
                 const Tensor& g, py::object gx, py::object gy, py::object gw) {
  py::object outs[3] = {gx, gy, gw};
  auto edges = torch::autograd::collect_next_edges(x, y, w, g);
  bool any = false;
  for (const auto& ed : edges) any = any || ed.is_valid();
  if (!any || !at::GradMode::is_enabled()) return py::make_tuple(gx, gy, gw);
  auto node = make_node<TPBackwardNode>();
  node->entry = e;
  node->set_next_edges(std::move(edges));
  node->x_ = SavedVariable(x, false);
  node->y_ = SavedVariable(y, false);
  node->w_ = SavedVariable(w, false);
  node->g_ = SavedVariable(g, false);
  py::tuple res(3);
  for (int i = 0; i < 3; ++i) {
    if (outs[i].is_none()) {
      node->add_input_metadata(Node::undefined_input());
      res[i] = py::none();
      continue;
    }
    Tensor o = outs[i].cast<Tensor>();
    TORCH_CHECK(!o.requires_grad() && !o.is_view(), "equikernels: attach needs fresh gradient tensors");
    torch::autograd::set_history(o, NodePtr(node));
    res[i] = py::cast(o);
  }
  return res;
}

void add_plan(const std::shared_ptr<Entry>& e, int have, int need, const std::vector<py::tuple>& launches,
              const std::vector<int>& res) {
  TORCH_CHECK(res.size() == 4, "equikernels: a plan needs 4 result indexes");
  auto p = std::make_shared<Plan>();
  for (const py::tuple& l : launches) {
    Launch L;
    L.rows = l[0].cast<int>();
    L.args = l[1].cast<std::vector<int>>();
    L.allocs = l[2].cast<std::vector<std::pair<int, bool>>>();
    p->launches.push_back(std::move(L));
  }
  for (int i = 0; i < 4; ++i) p->res[i] = res[i];
  std::lock_guard<std::mutex> lock(e->mu);  // sent once per (have, need): ops/native.py's _SENT
  e->plans[have | (need << 3)] = p;
}

bool has_variant(const std::shared_ptr<Entry>& e, int have, int need, int launch, int key) {
  std::lock_guard<std::mutex> lock(e->mu);
  auto it = e->plans.find(have | (need << 3));
  if (it == e->plans.end() || launch >= static_cast<int>(it->second->launches.size())) return false;
  for (const Variant& v : it->second->launches[launch].variants)
    if (v.key == key) return true;
  return false;
}

void add_variant(const std::shared_ptr<Entry>& e, int have, int need, int launch, int key, uint64_t function,
                 int warps, int shared, const std::string& kinds) {
  std::lock_guard<std::mutex> lock(e->mu);
  auto it = e->plans.find(have | (need << 3));
  TORCH_CHECK(it != e->plans.end() && launch < static_cast<int>(it->second->launches.size()),
              "equikernels: add_variant for a plan that does not exist");
  // copy-on-write: a reader on another thread may hold the old plan
  auto p = std::make_shared<Plan>(*it->second);
  Launch& l = p->launches[launch];
  // the kernel's parameters: its pointers, then N and NBLK (int32, int64, or constexpr when 1), then constexprs
  const size_t np = l.args.size();
  bool ok = kinds.size() >= np + 2;
  for (size_t j = 0; ok && j < kinds.size(); ++j) {
    const char k = kinds[j];
    ok = j < np ? k == 'p' : j < np + 2 ? (k == 'i' || k == 'l' || k == 'c') : k == 'c';
  }
  TORCH_CHECK(ok, "equikernels: argument kinds ", kinds, " do not fit a launch with ", np, " pointers");
  l.variants.push_back(Variant{key, function, warps, shared, kinds});
  it->second = p;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<Entry, std::shared_ptr<Entry>>(m, "Entry");
  m.def("make_entry", &make_entry);
  m.def("attach", &attach);
  m.def("add_plan", &add_plan);
  m.def("has_variant", &has_variant);
  m.def("add_variant", &add_variant);
  m.def("int_class", &int_class);
  m.def("set_enabled", [](bool on) { return g_enabled.exchange(on); });
  m.def("counts", []() { return py::make_tuple(g_native.load(), g_fallback.load()); });
  m.def("reset_counts", []() { g_native = 0; g_fallback = 0; });
}
