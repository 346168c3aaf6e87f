// complex_route.h - complex tensors to the CPU fallback, op by op, for the
// kernels that compute in real dtypes only.
//
// A tpu kernel of ops_pointwise / ops_nn / ops_linalg registered with
// TPU_IMPL(m, "add.out", add_out) checks its tensor arguments first: if one
// is complex it hands the call to the CPU fallback (counted, warned once,
// refused under TORCH_TPU_CPU_FALLBACK=0) instead of launching a kernel the
// runtime would refuse; otherwise it is the kernel itself. The check costs a
// dtype read per tensor argument. Complex tensors run natively where a kernel
// takes them: copies, fills, views and cat (ops_core.cpp), conj_physical, the
// FFT primitives, and add / sub / mul / div / neg / abs / reciprocal / sum /
// mean / mm / bmm (ops_spectral.cpp and ops_pointwise.cpp, reached from
// kernels marked TPU_HANDLES_COMPLEX).
#pragma once

#include <ATen/core/boxing/impl/boxing.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <cstddef>
#include <optional>
#include <string_view>

namespace at::tpu {

// The CPU fallback (ops_core.cpp): runs `op` on CPU copies of its arguments.
void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

inline bool is_complex_arg(const at::Tensor& t) { return t.defined() && t.is_complex(); }
inline bool is_complex_arg(const std::optional<at::Tensor>& t) { return t && is_complex_arg(*t); }
inline bool is_complex_arg(const at::TensorList& ts) {
  for (const auto& t : ts)
    if (is_complex_arg(t)) return true;
  return false;
}
template <class T>
inline bool is_complex_arg(const T&) {
  return false;
}

// An op name as a template argument ("add.out").
template <size_t N>
struct op_name {
  char s[N];
  constexpr op_name(const char (&x)[N]) {
    for (size_t i = 0; i < N; i++) s[i] = x[i];
  }
};

// Kernels that take complex arguments themselves (ops_spectral.cpp's complex
// arithmetic behind them) say so: TPU_HANDLES_COMPLEX(add_out).
template <auto F>
inline constexpr bool handles_complex = false;
#define TPU_HANDLES_COMPLEX(fn)                      \
  namespace at::tpu {                                \
  template <>                                        \
  inline constexpr bool handles_complex<&fn> = true; \
  }                                                  \
  static_assert(true)

template <auto F, op_name Name>
struct complex_routed;
template <class R, class... A, R (*F)(A...), op_name Name>
struct complex_routed<F, Name> {
  static R call(A... a) {
    if (!handles_complex<F> && C10_UNLIKELY((is_complex_arg(a) || ...))) {
      static const c10::OperatorHandle op = [] {
        std::string_view full(Name.s), base = full, overload;
        if (auto dot = full.find('.'); dot != std::string_view::npos) {
          base = full.substr(0, dot);
          overload = full.substr(dot + 1);
        }
        return c10::Dispatcher::singleton().findSchemaOrThrow(("aten::" + std::string(base)).c_str(),
                                                              std::string(overload).c_str());
      }();
      return c10::impl::BoxedKernelWrapper<R(A...)>::call(c10::BoxedKernel::makeFromFunction<&cpu_fallback>(), op,
                                                          c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                          std::forward<A>(a)...);
    }
    return F(std::forward<A>(a)...);
  }
};

}  // namespace at::tpu

#define TPU_IMPL(m, name, fn) m.impl(name, TORCH_FN((::at::tpu::complex_routed<&fn, name>::call)))
