// tpu_glue.h - what the two C++ translation units share: turning runtime
// status codes into PyTorch exceptions, describing tensors to the runtime,
// and the one dispatch point every ATen kernel hands its work to.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/util/Exception.h>
#include "tpu/tpu.h"

namespace at::tpu {

// Raise the PyTorch exception matching a runtime failure (OOM ->
// torch.OutOfMemoryError; unsupported -> NotImplementedError; else RuntimeError).
[[noreturn]] void throw_status(tpu_status s, const char* what);

#define TPU_CHECK(expr)                                 \
  do {                                                  \
    tpu_status tpu_s__ = (expr);                        \
    if (C10_UNLIKELY(tpu_s__ != TPU_OK))                \
      ::at::tpu::throw_status(tpu_s__, #expr);          \
  } while (0)

tpu_dtype to_tpu_dtype(c10::ScalarType st);   // TORCH_CHECKs unsupported dtypes
bool dtype_supported(c10::ScalarType st);

// Descriptor of a tpu tensor (borrowed storage) or of a host scalar.
tpu_tensor desc(const at::Tensor& t);
tpu_tensor desc_scalar(const c10::Scalar& s, c10::ScalarType compute);

// The dispatch point: every ATen kernel's work goes through here. The eager
// mode decides what happens: Strict Eager queues on the current stream,
// Debug Eager runs and waits (errors raised at the op). Fused Eager will
// record here.
void submit(tpu_op op, const tpu_tensor* operands, int n, const tpu_params& p);

// Device of the tensors an op runs on / the current stream for it.
tpu_stream_t current_stream(c10::DeviceIndex dev);

c10::Allocator* device_allocator();
// Give a tpu storage a new allocation of `nbytes` on the current device,
// keeping its first min(old, new) bytes.
void resize_storage_bytes(c10::StorageImpl* st, size_t nbytes);
c10::Allocator* host_allocator();

// Eager modes (Debug / Strict).
enum class EagerMode { Debug = 0, Strict = 1 };
EagerMode eager_mode();
void set_eager_mode(EagerMode m);

} // namespace at::tpu
