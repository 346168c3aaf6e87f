// tpu_glue.h - what the C++ translation units share: turning runtime status
// codes into PyTorch exceptions, describing tensors to the runtime, the one
// dispatch point every ATen kernel hands its work to, and the few helpers
// every op file launches through.
//
//   device.cpp         allocator, guard, hooks, generator, streams, interrupts,
//                      the torch.ops.torch_tpu functions
//   ops_core.cpp       descriptors, dispatch, memory and views, fills, copies and
//                      device moves, cat, the CPU fallback (+ their registrations)
//   ops_pointwise.cpp  elementwise (unary, binary, ternary) and reductions/scans
//   ops_nn.cpp         matrix unit, softmax, losses, layer norm, indexing, random,
//                      convolution and pooling, rnn cells
//   ops_linalg.cpp     linear algebra: PyTorch's device-generic linalg functions
//                      with their DispatchStubs filled by the LINALG kernels
//   ops_spectral.cpp   complex views, conj_physical, the FFT primitives
//   ops_attention.cpp  scaled_dot_product_attention (its backend choice, forward, backward)
// Each ops_*.cpp registers its own rows (one TORCH_LIBRARY_IMPL block per file);
// ops.cpp compiles them as one translation unit (compile time on two cores).
// Batch norm and mse_loss have no kernel here: torch_tpu/_decomp.py registers
// PyTorch's own decompositions for them.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/Stream.h>
#include <c10/util/Exception.h>
#include "tpu/tpu.h"

#include <initializer_list>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace at::tpu {

// Raise the PyTorch exception matching a runtime failure (OOM ->
// torch.OutOfMemoryError; unsupported -> NotImplementedError; else RuntimeError).
[[noreturn]] void throw_status(tpu_status s, const char* what);
// Finish device d's work (d < 0: the current device); its errors raise as throw_status does.
void synchronize_device(int64_t d);

#define TPU_CHECK(expr)                                                           \
  do {                                                                            \
    tpu_status tpu_s__ = (expr);                                                  \
    if (C10_UNLIKELY(tpu_s__ != TPU_OK)) ::at::tpu::throw_status(tpu_s__, #expr); \
  } while (0)

tpu_dtype to_tpu_dtype(c10::ScalarType st);  // TORCH_CHECKs unsupported dtypes
bool dtype_supported(c10::ScalarType st);

// Descriptor of a tpu tensor (borrowed storage) or of a host scalar.
tpu_tensor desc(const at::Tensor& t);
tpu_tensor desc_scalar(const c10::Scalar& s, c10::ScalarType compute);
// A complex tpu tensor's real view (view_as_real: float32 / float64 with a
// last dim of 2, whatever its conjugate bit); other tensors as desc().
tpu_tensor desc_real(const at::Tensor& t);
tpu_tensor real_view(tpu_tensor d);  // the same for a descriptor
// A 0-dim tensor seen as 1-d of size 1 (for kernels that take a dim).
tpu_tensor desc1d(const at::Tensor& t);
// An operand of an elementwise op: a CPU 0-dim tensor becomes a host scalar;
// a tpu tensor is broadcast (stride 0) to the output's shape.
tpu_tensor operand(const at::Tensor& t, const at::Tensor& out, c10::ScalarType compute);

// The dispatch point: every ATen kernel's work goes through here. The eager
// mode decides what happens: Strict Eager queues on the current stream,
// Debug Eager runs and waits (errors raised at the op). Fused Eager will
// record here.
void submit(tpu_op op, const tpu_tensor* operands, int n, const tpu_params& p);
// The calling Python line as a runtime call-site id (0 if none: no Python
// frame on this thread); device.cpp.
uint32_t python_site();

// The elementwise launch every op file uses (ops_core.cpp): out = op(ins...)
// computed in `compute`, inputs broadcast to out's shape; nothing for an empty out.
void ew(tpu_op op, const at::Tensor& out, std::initializer_list<at::Tensor> ins, c10::ScalarType compute,
        tpu_params p = {});
// Device copy with dtype conversion and broadcasting of src to dst's shape;
// complex tensors and conjugate / negative bits on either side included.
void device_copy(const at::Tensor& dst, const at::Tensor& src);
// A complex tensor's data (bits not applied) set to z.
void fill_complex(const at::Tensor& self, c10::complex<double> z);
// Complex arithmetic (ops_spectral.cpp), as real launches on the operands'
// real and imaginary parts; the kernels of these ops call it when an
// argument is complex. op: ADD, SUB (out = a -+ alpha * b), MUL, DIV.
at::Tensor& complex_binary_out(tpu_op op, const at::Tensor& a, const at::Tensor& b, const c10::Scalar& alpha,
                               at::Tensor& out);
at::Tensor& complex_unary_out(tpu_op op, const at::Tensor& self, at::Tensor& out);      // NEG, ABS, RECIPROCAL
at::Tensor& complex_mm_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out);  // mm (2-d), bmm (3-d)
// A host Scalar as a wrapped-number CPU tensor (takes part in type promotion as a Python number).
at::Tensor wrap(const c10::Scalar& s);
// torch.get_default_dtype() as a ScalarType.
c10::ScalarType default_float();

// Device of the tensors an op runs on / the current stream for it.
tpu_stream_t current_stream(c10::DeviceIndex dev);

c10::Allocator* device_allocator();
// Give a tpu storage a new allocation of `nbytes` on the current device,
// keeping its first min(old, new) bytes.
void resize_storage_bytes(c10::StorageImpl* st, size_t nbytes);
c10::Allocator* host_allocator();
// Keep a block alive until the work queued on `s` so far has run.
void device_allocator_record(const c10::DataPtr& p, c10::Stream s);

const at::Generator& default_generator(c10::DeviceIndex idx);
// (seed, offset) for the next random op, advancing the generator.
std::pair<uint64_t, uint64_t> philox_next(const std::optional<at::Generator>& gen, c10::DeviceIndex idx);

// CPU fallback (ops_core.cpp). Count a CPU fallback of `op` (warned once per
// op); raises NotImplementedError if the fallback is disabled
// (TORCH_TPU_CPU_FALLBACK=0).
void note_cpu_fallback(const std::string& op);
std::tuple<std::vector<std::string>, std::vector<int64_t>> fallback_counts();
void reset_fallback_counts();
void set_fallback_enabled(bool on);
bool fallback_enabled();

}  // namespace at::tpu
