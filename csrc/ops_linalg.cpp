// ops_linalg.cpp - tpu ATen kernels for linear algebra: triangular solves,
// Cholesky (+ solve, inverse), LU (factor, solve, unpack), Householder QR
// (geqrf, householder_product, ormqr, qr), the symmetric eigenproblem and the
// SVD, and what PyTorch builds from them (inv, solve, det, slogdet, pinv,
// matrix_rank, matrix norms, cond, ...).
//
// PyTorch writes these ops once for every device: argument checks with the
// CPU's words, output shapes and strides (batched column-major, as LAPACK
// wants), the composition (solve = lu_factor + lu_solve, det from the LU's
// diagonal and pivots, the errors raised from `info`), and per device only
// the LAPACK-shaped kernels behind DispatchStubs (cholesky_stub,
// lu_factor_stub, ...). The tpu registers those device-generic functions for
// PrivateUse1 as they are (the structured ones through their meta + impl,
// below) and fills the stubs with launches of its own kernels (ops.def:
// TRSM, POTRF, POTRI, GETRF, GETRS, LU_PERM, GEQRF, ORGQR, ORMQR, SYEV, GESVD). So the messages, dtypes,
// shapes and info semantics are the CPU's, and every piece runs on the
// device. A stub receives its matrices as PyTorch's CPU kernels hand them to
// LAPACK: the raw memory read column-major with leading dimension rows
// (lapack_view). Each stub only checks the dtype (the CPU's words), describes
// its tensors and launches: no math here.
#include "tpu_glue.h"
#include "complex_route.h"

#include <ATen/TensorIterator.h>
#include <ATen/native/BatchLinearAlgebra.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/LinearAlgebraUtils.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_cholesky_solve_helper_native.h>
#include <ATen/ops/_linalg_eigh_native.h>
#include <ATen/ops/_linalg_svd_native.h>
#include <ATen/ops/_linalg_det_native.h>
#include <ATen/ops/_linalg_slogdet_native.h>
#include <ATen/ops/_linalg_solve_ex_native.h>
#include <ATen/ops/cholesky_inverse_native.h>
#include <ATen/ops/cholesky_native.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/geqrf_native.h>
#include <ATen/ops/linalg_householder_product_native.h>
#include <ATen/ops/linalg_qr_native.h>
#include <ATen/ops/ormqr_native.h>
#include <ATen/ops/linalg_cholesky_ex_native.h>
#include <ATen/ops/linalg_inv_ex_native.h>
#include <ATen/ops/linalg_lu_factor_ex_native.h>
#include <ATen/ops/linalg_lu_native.h>
#include <ATen/ops/linalg_lu_solve_native.h>
#include <ATen/ops/linalg_solve_triangular_native.h>
#include <ATen/ops/lu_unpack_native.h>
#include <ATen/ops/triangular_solve_native.h>
#include <c10/util/accumulate.h>
#include <torch/library.h>

#include <array>
#include <functional>

namespace at::tpu {

// ---------------------------------------------------------------- structured ops, run for PrivateUse1
// What PyTorch's code generator writes per backend for a structured op: the
// meta function sizes the outputs through set_output_*, then impl computes.
// Functional: fresh outputs with the strides meta asks for.
template <class S, size_t N>
struct StructuredFunctional final : S {
  void set_output_strided(int64_t i, IntArrayRef sizes, IntArrayRef strides, TensorOptions options) override {
    outs[i] = strides.empty() ? at::empty(sizes, options) : at::empty_strided(sizes, strides, options);
  }
  void set_output_raw_strided(int64_t i, IntArrayRef sizes, IntArrayRef strides, TensorOptions options) override {
    set_output_strided(i, sizes, strides, options);
  }
  const Tensor& maybe_get_output(int64_t i) override { return outs[i]; }
  std::array<Tensor, N> outs;
};

// out=: the given tensors resized (as the generated resize_out: dtype and
// device checked with its words), with a proxy where meta needs strides the
// out tensor does not have (copied back after impl).
template <class S, size_t N>
struct StructuredOut final : S {
  explicit StructuredOut(std::array<std::reference_wrapper<const Tensor>, N> o) : outs(o) {}
  void resize_out(int64_t i, IntArrayRef sizes, IntArrayRef strides, const TensorOptions& options) {
    const Tensor& out = outs[i].get();
    TORCH_CHECK(options.dtype() == out.dtype(), "Expected out tensor to have dtype ", options.dtype(), ", but got ",
                out.dtype(), " instead");
    TORCH_CHECK(options.device() == out.device(), "Expected out tensor to have device ", options.device(), ", but got ",
                out.device(), " instead");
    if (at::native::resize_output(out, sizes) && !strides.empty()) out.as_strided_(sizes, strides);
  }
  void set_output_strided(int64_t i, IntArrayRef sizes, IntArrayRef strides, TensorOptions options) override {
    resize_out(i, sizes, strides, options);
    if (!strides.empty() && !outs[i].get().strides().equals(strides))
      proxies[i] = at::empty_strided(sizes, strides, options);
  }
  void set_output_raw_strided(int64_t i, IntArrayRef sizes, IntArrayRef strides, TensorOptions options) override {
    resize_out(i, sizes, strides, options);
  }
  const Tensor& maybe_get_output(int64_t i) override { return proxies[i].defined() ? proxies[i] : outs[i].get(); }
  std::array<std::reference_wrapper<const Tensor>, N> outs;
  std::array<Tensor, N> proxies;
};

template <class S, size_t N, class... Args>
static std::array<Tensor, N> structured(const Args&... args) {
  StructuredFunctional<S, N> op;
  op.meta(args...);
  std::apply([&](const auto&... o) { op.impl(args..., o...); }, op.outs);
  return op.outs;
}

template <class S, size_t N, class... Args>
static void structured_out(std::array<std::reference_wrapper<const Tensor>, N> outs, const Args&... args) {
  StructuredOut<S, N> op(outs);
  op.meta(args...);
  std::array<Tensor, N> use;
  for (size_t i = 0; i < N; i++) use[i] = op.maybe_get_output(static_cast<int64_t>(i));
  std::apply([&](const auto&... o) { op.impl(args..., o...); }, use);
  for (size_t i = 0; i < N; i++)
    if (op.proxies[i].defined()) outs[i].get().copy_(op.proxies[i]);
}

// ---------------------------------------------------------------- the stubs: launches of the LINALG kernels
// The CPU's dtype check, in its words (AT_DISPATCH_FLOATING_AND_COMPLEX_TYPES
// names the CPU kernel); complex tensors do not exist on the tpu.
static void check_lapack_dtype(const Tensor& t, const char* cpu_name) {
  TORCH_CHECK_NOT_IMPLEMENTED(t.scalar_type() == kFloat || t.scalar_type() == kDouble, "\"", cpu_name,
                              "\" not implemented for '", toString(t.scalar_type()), "'");
}

// t's matrices as LAPACK reads them: the memory column-major with leading
// dimension max(1, rows). Callers hand LAPACK dense matrices (F-contiguous,
// or C-contiguous square ones meant as their transposes).
static tpu_tensor lapack_view(const Tensor& t) {
  const int64_t r = t.size(-2), c = t.size(-1), ld = std::max<int64_t>(1, r);
  const bool f = (t.stride(-2) == 1 || r <= 1) && (t.stride(-1) == ld || c <= 1);
  const bool csq = r == c && (t.stride(-1) == 1 || c <= 1) && (t.stride(-2) == c || r <= 1);
  TORCH_INTERNAL_ASSERT(f || csq, "linalg: a matrix that is not dense, strides ", t.strides());
  tpu_tensor d = desc(t);
  d.strides[d.ndim - 2] = 1;
  d.strides[d.ndim - 1] = ld;
  return d;
}

static IntArrayRef batch_of(const Tensor& t, int64_t matrix_dims = 2) {
  return t.sizes().slice(0, t.dim() - matrix_dims);
}

// A factorization's int32 info per matrix, as a device tensor of the batch's
// shape: `info` itself where it is one, else a new one copied back by done().
struct BatchInfo {
  BatchInfo(const Tensor& info, IntArrayRef batch, const Tensor& like) : user(info) {
    if (info.device() == like.device() && info.is_contiguous() &&
        info.numel() == c10::multiply_integers(batch.begin(), batch.end()))
      dev = info.view(batch);
    else
      dev = at::empty(batch, like.options().dtype(kInt));
  }
  void done() {
    if (!dev.is_alias_of(user)) user.copy_(dev.reshape(user.sizes()));
  }
  const Tensor& user;
  Tensor dev;
};

static void triangular_solve_tpu(const Tensor& A, const Tensor& B, bool left, bool upper,
                                 at::native::TransposeType transpose, bool unitriangular) {
  check_lapack_dtype(A, "triangular_solve_cpu");
  if (A.numel() == 0 || B.numel() == 0) return;
  std::vector<int64_t> a_size = batch_of(B).vec();
  a_size.insert(a_size.end(), {A.size(-2), A.size(-1)});
  tpu_tensor ts[2] = {lapack_view(B), lapack_view(A.expand(a_size))};
  submit(TPU_OP_TRSM, ts, 2,
         TPU_PARAMS(TRSM, .left = left, .upper = upper, .trans = transpose != at::native::TransposeType::NoTranspose,
                    .unit = unitriangular));
}

static void cholesky_tpu(const Tensor& input, const Tensor& info, bool upper) {
  check_lapack_dtype(input, "cholesky_cpu");
  BatchInfo bi(info, batch_of(input), input);
  if (input.numel() > 0) {
    tpu_tensor ts[2] = {lapack_view(input), desc(bi.dev)};
    submit(TPU_OP_POTRF, ts, 2, TPU_PARAMS(POTRF, .upper = upper));
  } else {
    bi.dev.zero_();
  }
  bi.done();
}

static Tensor& cholesky_inverse_tpu(Tensor& result, Tensor& infos, bool upper) {
  check_lapack_dtype(result, "cholesky_inverse_out_cpu");
  if (result.numel() == 0) return result;
  BatchInfo bi(infos, batch_of(result), result);  // (PyTorch keeps these infos on the CPU, for MAGMA)
  tpu_tensor ts[2] = {lapack_view(result), desc(bi.dev)};
  submit(TPU_OP_POTRI, ts, 2, TPU_PARAMS(POTRI, .upper = upper));
  bi.done();
  return result;
}

static void lu_factor_tpu(const Tensor& input, const Tensor& pivots, const Tensor& infos, bool compute_pivots) {
  TORCH_CHECK(compute_pivots, "linalg.lu_factor: LU without pivoting is not implemented on the CPU");
  check_lapack_dtype(input, "lu_cpu");
  BatchInfo bi(infos, batch_of(input), input);
  if (input.numel() > 0) {
    tpu_tensor ts[3] = {lapack_view(input), desc(pivots), desc(bi.dev)};
    submit(TPU_OP_GETRF, ts, 3, tpu_params{});
  } else {
    bi.dev.zero_();
  }
  bi.done();
}

static void lu_solve_tpu(const Tensor& LU, const Tensor& pivots, const Tensor& B, at::native::TransposeType trans) {
  check_lapack_dtype(LU, "linalg.lu_solve_cpu");
  if (B.numel() == 0 || LU.numel() == 0) return;
  // LU and pivots broadcast over B's batch dims (as the CPU kernel's batch iterator)
  std::vector<int64_t> batch = batch_of(B).vec(), lu_size = batch, piv_size = batch;
  lu_size.insert(lu_size.end(), {LU.size(-2), LU.size(-1)});
  piv_size.push_back(pivots.size(-1));
  tpu_tensor ts[3] = {lapack_view(B), lapack_view(LU.expand(lu_size)), desc(pivots.expand(piv_size))};
  submit(TPU_OP_GETRS, ts, 3, TPU_PARAMS(GETRS, .trans = trans != at::native::TransposeType::NoTranspose));
}

// perm (int64, [.., m], the identity) <- the swaps of pivots (int32, [.., k]) in order.
static void unpack_pivots_tpu(TensorIterator& iter, const int64_t dim_size, const int64_t max_pivot) {
  const Tensor& perm = iter.tensor(0);
  const Tensor& pivots = iter.tensor(1);
  TORCH_INTERNAL_ASSERT(perm.size(-1) == max_pivot && pivots.size(-1) == dim_size);
  if (perm.numel() == 0 || dim_size == 0) return;
  tpu_tensor ts[2] = {desc(perm), desc(pivots)};
  submit(TPU_OP_LU_PERM, ts, 2, tpu_params{});
}

// cholesky_solve's kernel (the CPU's potrs): A = L L^T gives X = L^-T (L^-1 B),
// A = U^T U gives X = U^-1 (U^-T B): two triangular solves in place.
static Tensor cholesky_solve_helper(const Tensor& self, const Tensor& A, bool upper) {
  check_lapack_dtype(self, "cholesky_solve_cpu");
  Tensor x = at::native::cloneBatchedColumnMajor(self);
  if (x.numel() == 0 || A.numel() == 0) return x;
  tpu_tensor ts[2] = {desc(x), desc(A)};
  submit(TPU_OP_TRSM, ts, 2, TPU_PARAMS(TRSM, .left = 1, .upper = upper, .trans = upper, .unit = 0));
  submit(TPU_OP_TRSM, ts, 2, TPU_PARAMS(TRSM, .left = 1, .upper = upper, .trans = !upper, .unit = 0));
  return x;
}

// Householder QR: A (m x n) in place -> R and the reflectors, tau [.., min(m, n)].
static void geqrf_tpu(const Tensor& input, const Tensor& tau) {
  check_lapack_dtype(input, "geqrf_cpu");
  if (input.numel() == 0) return;
  tpu_tensor ts[2] = {lapack_view(input), desc(tau)};
  submit(TPU_OP_GEQRF, ts, 2, tpu_params{});
}

// result (m x n): the reflectors in its first k = tau.size(-1) columns -> Q's first n columns.
static Tensor& orgqr_tpu(Tensor& result, const Tensor& tau) {
  check_lapack_dtype(result, "orgqr_cpu");
  if (result.numel() == 0) return result;
  tpu_tensor ts[2] = {lapack_view(result), desc(tau)};
  submit(TPU_OP_ORGQR, ts, 2, tpu_params{});
  return result;
}

static void ormqr_tpu(const Tensor& input, const Tensor& tau, const Tensor& other, bool left, bool transpose) {
  check_lapack_dtype(input, "ormqr_cpu");
  if (other.numel() == 0) return;
  tpu_tensor ts[3] = {lapack_view(other), lapack_view(input), desc(tau)};
  submit(TPU_OP_ORMQR, ts, 3, TPU_PARAMS(ORMQR, .left = left, .trans = transpose));
}

// eigenvectors (n x n) in place: A (the triangle `upper` names) -> its eigenvectors; eigenvalues ascending.
static void linalg_eigh_tpu(const Tensor& values, const Tensor& vectors, const Tensor& infos, bool upper,
                            bool compute_v) {
  check_lapack_dtype(vectors, "linalg_eigh_cpu");
  BatchInfo bi(infos, batch_of(vectors), vectors);
  if (vectors.numel() > 0) {
    tpu_tensor ts[3] = {lapack_view(vectors), desc(values), desc(bi.dev)};
    submit(TPU_OP_SYEV, ts, 3, TPU_PARAMS(SYEV, .upper = upper, .vectors = compute_v));
  } else {
    bi.dev.zero_();
  }
  bi.done();
}

// A = U diag(S) Vh; U and Vh are empty without compute_uv (the kernel then gets them absent). Unlike the
// other stubs', this one's A comes with any strides and must stay as it is (the CPU's kernel copies it):
// the kernel reads it through its strides.
static void svd_tpu(const Tensor& A, const bool full_matrices, const bool compute_uv,
                    const std::optional<std::string_view>& driver, const Tensor& U, const Tensor& S, const Tensor& Vh,
                    const Tensor& info) {
  check_lapack_dtype(A, "linalg_svd_cpu");
  BatchInfo bi(info, batch_of(A), A);
  if (A.numel() > 0) {
    const tpu_tensor none = tpu_tensor_scalar_f(0, to_tpu_dtype(A.scalar_type()));
    tpu_tensor ts[5] = {desc(S), compute_uv ? lapack_view(U) : none, compute_uv ? lapack_view(Vh) : none, desc(bi.dev),
                        desc(A)};
    submit(TPU_OP_GESVD, ts, 5, tpu_params{});
  } else {
    bi.dev.zero_();
  }
  bi.done();
}

// ---------------------------------------------------------------- the aten rows
using TT = std::tuple<Tensor, Tensor>;
using TT3 = std::tuple<Tensor, Tensor, Tensor>;
using TT4 = std::tuple<Tensor, Tensor, Tensor, Tensor>;
using TR2 = std::tuple<Tensor&, Tensor&>;
using TR3 = std::tuple<Tensor&, Tensor&, Tensor&>;
using TR4 = std::tuple<Tensor&, Tensor&, Tensor&, Tensor&>;
namespace N = at::native;

static TT linalg_cholesky_ex(const Tensor& A, bool upper, bool check) {
  auto o = structured<N::structured_linalg_cholesky_ex_out, 2>(A, upper, check);
  return {o[0], o[1]};
}
static TR2 linalg_cholesky_ex_out(const Tensor& A, bool upper, bool check, Tensor& L, Tensor& info) {
  structured_out<N::structured_linalg_cholesky_ex_out, 2>({L, info}, A, upper, check);
  return {L, info};
}
static TT3 linalg_lu_factor_ex(const Tensor& A, bool pivot, bool check) {
  auto o = structured<N::structured_linalg_lu_factor_ex_out, 3>(A, pivot, check);
  return {o[0], o[1], o[2]};
}
static TR3 linalg_lu_factor_ex_out(const Tensor& A, bool pivot, bool check, Tensor& LU, Tensor& piv, Tensor& info) {
  structured_out<N::structured_linalg_lu_factor_ex_out, 3>({LU, piv, info}, A, pivot, check);
  return {LU, piv, info};
}
static Tensor linalg_lu_solve(const Tensor& LU, const Tensor& piv, const Tensor& B, bool left, bool adjoint) {
  return structured<N::structured_linalg_lu_solve_out, 1>(LU, piv, B, left, adjoint)[0];
}
static Tensor& linalg_lu_solve_out(const Tensor& LU, const Tensor& piv, const Tensor& B, bool left, bool adjoint,
                                   Tensor& out) {
  structured_out<N::structured_linalg_lu_solve_out, 1>({out}, LU, piv, B, left, adjoint);
  return out;
}
static TT3 linalg_lu(const Tensor& A, bool pivot) {
  auto o = structured<N::structured_linalg_lu_out, 3>(A, pivot);
  return {o[0], o[1], o[2]};
}
static TR3 linalg_lu_out(const Tensor& A, bool pivot, Tensor& P, Tensor& L, Tensor& U) {
  structured_out<N::structured_linalg_lu_out, 3>({P, L, U}, A, pivot);
  return {P, L, U};
}
static TT3 lu_unpack(const Tensor& LU, const Tensor& piv, bool unpack_data, bool unpack_pivots) {
  auto o = structured<N::structured_lu_unpack_out, 3>(LU, piv, unpack_data, unpack_pivots);
  return {o[0], o[1], o[2]};
}
static TR3 lu_unpack_out(const Tensor& LU, const Tensor& piv, bool unpack_data, bool unpack_pivots, Tensor& P,
                         Tensor& L, Tensor& U) {
  structured_out<N::structured_lu_unpack_out, 3>({P, L, U}, LU, piv, unpack_data, unpack_pivots);
  return {P, L, U};
}
static TT linalg_inv_ex(const Tensor& A, bool check) {
  auto o = structured<N::structured_linalg_inv_ex_out, 2>(A, check);
  return {o[0], o[1]};
}
static TR2 linalg_inv_ex_out(const Tensor& A, bool check, Tensor& inverse, Tensor& info) {
  structured_out<N::structured_linalg_inv_ex_out, 2>({inverse, info}, A, check);
  return {inverse, info};
}
static TT4 linalg_solve_ex(const Tensor& A, const Tensor& B, bool left, bool check) {
  auto o = structured<N::structured__linalg_solve_ex_out, 4>(A, B, left, check);
  return {o[0], o[1], o[2], o[3]};
}
static TR4 linalg_solve_ex_out(const Tensor& A, const Tensor& B, bool left, bool check, Tensor& result, Tensor& LU,
                               Tensor& piv, Tensor& info) {
  structured_out<N::structured__linalg_solve_ex_out, 4>({result, LU, piv, info}, A, B, left, check);
  return {result, LU, piv, info};
}
static TT3 linalg_det(const Tensor& A) {
  auto o = structured<N::structured__linalg_det_out, 3>(A);
  return {o[0], o[1], o[2]};
}
static TR3 linalg_det_out(const Tensor& A, Tensor& result, Tensor& LU, Tensor& piv) {
  structured_out<N::structured__linalg_det_out, 3>({result, LU, piv}, A);
  return {result, LU, piv};
}
static TT4 linalg_slogdet(const Tensor& A) {
  auto o = structured<N::structured__linalg_slogdet_out, 4>(A);
  return {o[0], o[1], o[2], o[3]};
}
static TR4 linalg_slogdet_out(const Tensor& A, Tensor& sign, Tensor& logabsdet, Tensor& LU, Tensor& piv) {
  structured_out<N::structured__linalg_slogdet_out, 4>({sign, logabsdet, LU, piv}, A);
  return {sign, logabsdet, LU, piv};
}
static TT triangular_solve(const Tensor& self, const Tensor& A, bool upper, bool transpose, bool unitriangular) {
  auto o = structured<N::structured_triangular_solve_out, 2>(self, A, upper, transpose, unitriangular);
  return {o[0], o[1]};
}
static TR2 triangular_solve_out(const Tensor& self, const Tensor& A, bool upper, bool transpose, bool unitriangular,
                                Tensor& X, Tensor& M) {
  structured_out<N::structured_triangular_solve_out, 2>({X, M}, self, A, upper, transpose, unitriangular);
  return {X, M};
}

static TT linalg_qr(const Tensor& A, c10::string_view mode) {
  auto o = structured<N::structured_linalg_qr_out, 2>(A, mode);
  return {o[0], o[1]};
}
static TR2 linalg_qr_out(const Tensor& A, c10::string_view mode, Tensor& Q, Tensor& R) {
  structured_out<N::structured_linalg_qr_out, 2>({Q, R}, A, mode);
  return {Q, R};
}

static TT linalg_eigh(const Tensor& A, c10::string_view uplo, bool compute_v) {
  auto o = structured<N::structured__linalg_eigh_out, 2>(A, uplo, compute_v);
  return {o[0], o[1]};
}
static TR2 linalg_eigh_out(const Tensor& A, c10::string_view uplo, bool compute_v, Tensor& values, Tensor& vectors) {
  structured_out<N::structured__linalg_eigh_out, 2>({values, vectors}, A, uplo, compute_v);
  return {values, vectors};
}
static TT3 linalg_svd(const Tensor& A, bool full, bool compute_uv, std::optional<c10::string_view> driver) {
  auto o = structured<N::structured__linalg_svd_out, 3>(A, full, compute_uv, driver);
  return {o[0], o[1], o[2]};
}
static TR3 linalg_svd_out(const Tensor& A, bool full, bool compute_uv, std::optional<c10::string_view> driver,
                          Tensor& U, Tensor& S, Tensor& Vh) {
  structured_out<N::structured__linalg_svd_out, 3>({U, S, Vh}, A, full, compute_uv, driver);
  return {U, S, Vh};
}

}  // namespace at::tpu

// The stubs' PrivateUse1 entries (the macro names its registrar in at::native).
namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(triangular_solve_stub, &at::tpu::triangular_solve_tpu)
REGISTER_PRIVATEUSE1_DISPATCH(cholesky_stub, &at::tpu::cholesky_tpu)
REGISTER_PRIVATEUSE1_DISPATCH(cholesky_inverse_stub, &at::tpu::cholesky_inverse_tpu)
REGISTER_PRIVATEUSE1_DISPATCH(lu_factor_stub, &at::tpu::lu_factor_tpu)
REGISTER_PRIVATEUSE1_DISPATCH(lu_solve_stub, &at::tpu::lu_solve_tpu)
REGISTER_PRIVATEUSE1_DISPATCH(unpack_pivots_stub, &at::tpu::unpack_pivots_tpu)
REGISTER_PRIVATEUSE1_DISPATCH(geqrf_stub, &at::tpu::geqrf_tpu)
REGISTER_PRIVATEUSE1_DISPATCH(orgqr_stub, &at::tpu::orgqr_tpu)
REGISTER_PRIVATEUSE1_DISPATCH(ormqr_stub, &at::tpu::ormqr_tpu)
REGISTER_PRIVATEUSE1_DISPATCH(linalg_eigh_stub, &at::tpu::linalg_eigh_tpu)
REGISTER_PRIVATEUSE1_DISPATCH(svd_stub, &at::tpu::svd_tpu)
}  // namespace at::native

// This file's rows of the op table.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  using namespace at::tpu;
  TPU_IMPL(m, "linalg_solve_triangular", at::native::linalg_solve_triangular);
  TPU_IMPL(m, "linalg_solve_triangular.out", at::native::linalg_solve_triangular_out);
  TPU_IMPL(m, "triangular_solve", triangular_solve);
  TPU_IMPL(m, "triangular_solve.X", triangular_solve_out);
  TPU_IMPL(m, "linalg_cholesky_ex", linalg_cholesky_ex);
  TPU_IMPL(m, "linalg_cholesky_ex.L", linalg_cholesky_ex_out);
  TPU_IMPL(m, "cholesky", at::native::cholesky);
  TPU_IMPL(m, "cholesky.out", at::native::cholesky_out);
  TPU_IMPL(m, "cholesky_inverse", at::native::cholesky_inverse);
  TPU_IMPL(m, "cholesky_inverse.out", at::native::cholesky_inverse_out);
  TPU_IMPL(m, "_cholesky_solve_helper", cholesky_solve_helper);
  TPU_IMPL(m, "linalg_lu_factor_ex", linalg_lu_factor_ex);
  TPU_IMPL(m, "linalg_lu_factor_ex.out", linalg_lu_factor_ex_out);
  TPU_IMPL(m, "linalg_lu_solve", linalg_lu_solve);
  TPU_IMPL(m, "linalg_lu_solve.out", linalg_lu_solve_out);
  TPU_IMPL(m, "linalg_lu", linalg_lu);
  TPU_IMPL(m, "linalg_lu.P", linalg_lu_out);
  TPU_IMPL(m, "lu_unpack", lu_unpack);
  TPU_IMPL(m, "lu_unpack.out", lu_unpack_out);
  TPU_IMPL(m, "linalg_inv_ex", linalg_inv_ex);
  TPU_IMPL(m, "linalg_inv_ex.inverse", linalg_inv_ex_out);
  TPU_IMPL(m, "_linalg_solve_ex", linalg_solve_ex);
  TPU_IMPL(m, "_linalg_solve_ex.result", linalg_solve_ex_out);
  TPU_IMPL(m, "_linalg_det", linalg_det);
  TPU_IMPL(m, "_linalg_det.result", linalg_det_out);
  TPU_IMPL(m, "_linalg_slogdet", linalg_slogdet);
  TPU_IMPL(m, "_linalg_slogdet.sign", linalg_slogdet_out);
  TPU_IMPL(m, "geqrf", at::native::geqrf);
  TPU_IMPL(m, "geqrf.a", at::native::geqrf_out);
  TPU_IMPL(m, "linalg_householder_product", at::native::linalg_householder_product);
  TPU_IMPL(m, "linalg_householder_product.out", at::native::linalg_householder_product_out);
  TPU_IMPL(m, "ormqr", at::native::ormqr);
  TPU_IMPL(m, "ormqr.out", at::native::ormqr_out);
  TPU_IMPL(m, "linalg_qr", linalg_qr);
  TPU_IMPL(m, "linalg_qr.out", linalg_qr_out);
  TPU_IMPL(m, "_linalg_eigh", linalg_eigh);
  TPU_IMPL(m, "_linalg_eigh.eigenvalues", linalg_eigh_out);
  TPU_IMPL(m, "_linalg_svd", linalg_svd);
  TPU_IMPL(m, "_linalg_svd.U", linalg_svd_out);
}
