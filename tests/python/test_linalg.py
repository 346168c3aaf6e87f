"""Linear algebra on the tpu (csrc/ops_linalg.cpp, runtime/src/kernels/linalg.c): triangular solves,
Cholesky (+ solve, inverse), LU (factor, solve, unpack, lu), inv / solve / det / slogdet and what reaches
them, Householder QR (geqrf, householder_product, ormqr, qr), eigh and the SVD (Jacobi; vectors compared
up to sign, as PyTorch's own tests do) and what reaches them (pinv, matrix_rank, norms, cond). Native (the
CPU fallback off), forward and backward, float32 and float64, batches (broadcast too) and strided views,
against PyTorch CPU on the same inputs; singular and indefinite inputs give the CPU's info, errors and
messages. Every eager mode (conftest)."""
import pytest
import torch
import torch_tpu

from conftest import assert_close

D = "tpu"
pytestmark = [pytest.mark.usefixtures("native_only"),
              pytest.mark.filterwarnings("ignore:torch.(triangular_solve|cholesky) is deprecated")]
DTYPES = [torch.float32, torch.float64]
# The CPU runs LAPACK's blocked algorithms, ours the unblocked ones: the same math in another order, so
# results agree to rounding amplified by the conditioning of the (well-conditioned, n <= 9) test matrices;
# gradients go through a further solve or two (PyTorch's formulas), hence ten times that.
TOL = {torch.float32: dict(rtol=2e-4, atol=2e-4), torch.float64: dict(rtol=1e-9, atol=1e-9)}
GTOL = {torch.float32: dict(rtol=2e-3, atol=2e-3), torch.float64: dict(rtol=1e-8, atol=1e-8)}


@pytest.fixture(autouse=True)
def no_fallback_counted():
    torch_tpu.reset_fallback_counts()
    yield
    assert torch_tpu.fallback_counts() == {}


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def tri(shape, dtype, seed=0):
    """Matrices whose triangles are well conditioned (a strong diagonal)."""
    a = torch.randn(shape, generator=_gen(seed), dtype=torch.float64)
    a.diagonal(dim1=-2, dim2=-1).copy_(a.diagonal(dim1=-2, dim2=-1).sign() * (2 + a.diagonal(dim1=-2, dim2=-1).abs()))
    return a.to(dtype)


def spd(shape, dtype, seed=0):
    m = torch.randn(shape, generator=_gen(seed), dtype=torch.float64)
    return (m @ m.mT + shape[-1] * torch.eye(shape[-1], dtype=torch.float64)).to(dtype)


def gen(shape, dtype, seed=0):
    """Plain random matrices (pivoting happens), kept away from singular."""
    a = torch.randn(shape, generator=_gen(seed), dtype=torch.float64)
    if shape[-1] == shape[-2]:
        a = a + 0.5 * torch.eye(shape[-1], dtype=torch.float64)
    return a.to(dtype)


def rand(shape, dtype, seed=1):
    return torch.randn(shape, generator=_gen(seed), dtype=torch.float64).to(dtype)


def _floats(out):
    out = out if isinstance(out, (tuple, list)) else (out,)
    return [o for o in out if isinstance(o, torch.Tensor) and o.is_floating_point()]


def check(fn, *inputs, grad=True, dtype=None):
    """fn on the CPU and on the tpu with the same inputs (tpu copies keep the inputs' strides): outputs equal,
    then the gradients of sum(out * cotangent) with respect to every floating input."""
    dtype = dtype or next(x.dtype for x in inputs if isinstance(x, torch.Tensor) and x.is_floating_point())
    cpu = [x.detach().clone().requires_grad_(grad and x.is_floating_point()) if isinstance(x, torch.Tensor) else x
           for x in inputs]
    dev = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            y = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=D)
            y.copy_(x)
            dev.append(y.detach().requires_grad_(grad and x.is_floating_point()))
        else:
            dev.append(x)
    want, got = fn(*cpu), fn(*dev)
    assert_close(got, want, **TOL[dtype])
    if not grad:
        return got
    wf, gf = _floats(want), _floats(got)
    cots = [torch.randn(w.shape, generator=_gen(7 + i), dtype=w.dtype) for i, w in enumerate(wf)]
    leaves_c = [x for x in cpu if isinstance(x, torch.Tensor) and x.requires_grad]
    leaves_d = [x for x in dev if isinstance(x, torch.Tensor) and x.requires_grad]
    gc = torch.autograd.grad(sum((wf[i] * cots[i]).sum() for i in range(len(wf))), leaves_c)
    gd = torch.autograd.grad(sum((gf[i] * cots[i].to(D)).sum() for i in range(len(wf))), leaves_d)
    for a, b in zip(gd, gc):
        assert_close(a, b, check_layout=False, **GTOL[dtype])
    return got


def same_error(fn, a):
    """fn raises on the tpu what it raises on the CPU: the type and the message. Returns the type."""
    with pytest.raises(Exception) as cpu_err:
        fn(a)
    with pytest.raises(Exception) as tpu_err:
        fn(a.to(D))
    assert type(tpu_err.value) is type(cpu_err.value)
    assert str(tpu_err.value).split("\n")[0] == str(cpu_err.value).split("\n")[0]
    return type(cpu_err.value)


# ---------------------------------------------------------------- triangular solves
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("left", [True, False])
def test_solve_triangular(dtype, left):
    A = tri((2, 1, 4, 4), dtype)                         # broadcast over B's batch
    B = rand((3, 4, 5) if left else (3, 5, 4), dtype)
    for upper in (False, True):
        for unit in (False, True):
            check(lambda a, b: torch.linalg.solve_triangular(a, b, upper=upper, left=left, unitriangular=unit), A, B)


@pytest.mark.parametrize("dtype", DTYPES)
def test_solve_triangular_strided(dtype):
    A = tri((3, 6, 6), dtype).mT                          # row-major A seen transposed: the upper flag flips inside
    B = rand((3, 9, 6), dtype)[:, ::2].mT                 # a non-contiguous B
    check(lambda a, b: torch.linalg.solve_triangular(a, b, upper=True), A, B)
    check(lambda a, b: torch.linalg.solve_triangular(a, b, upper=False, left=False), A, B.mT)
    out = torch.empty(0, dtype=dtype, device=D)
    torch.linalg.solve_triangular(A.to(D), B.to(D), upper=True, out=out)
    assert_close(out, torch.linalg.solve_triangular(A, B, upper=True), check_layout=False, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_triangular_solve(dtype):
    A, b = tri((2, 5, 5), dtype), rand((5, 3), dtype)
    for transpose in (False, True):
        check(lambda b_, a_: torch.triangular_solve(b_, a_, upper=False, transpose=transpose), b, A)


# ---------------------------------------------------------------- Cholesky
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("upper", [False, True])
def test_cholesky(dtype, upper):
    A = spd((2, 3, 5, 5), dtype)
    check(lambda a: torch.linalg.cholesky_ex(a, upper=upper), A)
    check(lambda a: torch.linalg.cholesky(a, upper=upper), A.mT)   # the other layout
    check(lambda a: torch.cholesky(a, upper=upper), A[0, 0])
    L = torch.linalg.cholesky(spd((2, 4, 4), dtype), upper=upper)
    check(lambda b, l: torch.cholesky_solve(b, l, upper=upper), rand((3, 1, 4, 2), dtype), L)
    check(lambda l: torch.cholesky_inverse(l, upper=upper), L)
    check(lambda l: torch.cholesky_inverse(l, upper=upper), L[0])


def test_cholesky_not_positive_definite():
    A = torch.stack([spd((3, 3), torch.float64), -torch.eye(3, dtype=torch.float64), spd((3, 3), torch.float64)])
    A[2, 1, 1] = -5
    L, info = torch.linalg.cholesky_ex(A.to(D))
    Lc, infoc = torch.linalg.cholesky_ex(A)
    assert info.device.type == D and info.dtype == torch.int32
    assert info.cpu().tolist() == infoc.tolist() == [0, 1, 2]
    assert_close(L[0], Lc[0])
    for a in (A, A[1]):
        assert same_error(torch.linalg.cholesky, a) is torch.linalg.LinAlgError
    nan = spd((3, 3), torch.float32)
    nan[0, 0] = float("nan")
    assert torch.linalg.cholesky_ex(nan.to(D)).info.item() == torch.linalg.cholesky_ex(nan).info.item() == 1


# ---------------------------------------------------------------- LU
@pytest.mark.parametrize("dtype", DTYPES)
def test_lu_factor(dtype):
    for shape in [(5, 5), (2, 3, 4, 4), (4, 6), (6, 3), (0, 3, 3)]:
        A = gen(shape, dtype)
        LU, piv, info = check(torch.linalg.lu_factor_ex, A, grad=(shape[-1] == shape[-2]))
        assert piv.dtype == torch.int32 and info.dtype == torch.int32
        check(torch.linalg.lu, A)
        check(lambda a: torch.lu_unpack(*torch.linalg.lu_factor(a)), A, grad=False)


def test_lu_pivots_and_singular_info():
    # equal to the CPU bit for bit: LAPACK's pivot choice (the first largest |a|) and its info
    A = torch.tensor([[[1., 2, 3], [2, 4, 6], [1, 1, 1]], [[0., 0, 0], [0, 0, 0], [0, 0, 0]],
                      [[0., 1, 0], [1, 0, 0], [0, 0, 1]]])
    got, want = torch.linalg.lu_factor_ex(A.to(D)), torch.linalg.lu_factor_ex(A)
    for g, w in zip(got, want):
        assert torch.equal(g.cpu(), w)
    assert want.pivots.tolist()[0] == [2, 3, 3] and want.info.tolist() == [3, 1, 0]
    for fn in (torch.linalg.inv, lambda a: torch.linalg.solve(a, torch.ones(3, device=a.device)),
               torch.linalg.lu_factor):
        for a in (A[0], A):
            same_error(fn, a)
    # det factors A^T, where the singular A[0] leaves a rounding residue whose size depends on
    # how the host's LAPACK rounds the rank-1 update (MKL with FMA: 1.8e-07; without: -0.0)
    torch.testing.assert_close(torch.linalg.det(A.to(D)).cpu(), torch.linalg.det(A), atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_lu_solve(dtype):
    LU, piv = torch.linalg.lu_factor(gen((2, 4, 4), dtype))
    for left in (True, False):
        for adjoint in (False, True):
            B = rand((3, 1, 4, 2) if left else (3, 1, 2, 4), dtype)   # B's batch broadcast with LU's
            check(lambda lu, b: torch.linalg.lu_solve(lu, piv.to(lu.device), b, left=left, adjoint=adjoint), LU, B)


@pytest.mark.parametrize("dtype", DTYPES)
def test_inv_solve_det(dtype):
    A, B = gen((2, 4, 4), dtype), rand((2, 4, 3), dtype)
    check(torch.linalg.inv, A)
    check(torch.linalg.inv_ex, A)
    check(torch.linalg.solve, A, B)
    check(lambda a, b: torch.linalg.solve(a, b, left=False), A, B.mT)
    check(lambda a, b: torch.linalg.solve(a, b), A, B[..., 0])            # vector right-hand sides
    check(torch.linalg.solve_ex, A, B)
    check(torch.linalg.det, A)
    check(torch.linalg.slogdet, A)
    check(torch.logdet, spd((2, 4, 4), dtype))
    check(lambda a: torch.linalg.matrix_power(a, -2), A)
    check(lambda a: torch.linalg.tensorinv(a, ind=1), gen((6, 2, 3), dtype))
    check(torch.linalg.tensorsolve, gen((6, 2, 3), dtype), rand((6,), dtype))
    check(torch.linalg.det, A.mT[..., ::1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_matrix_exp(dtype):
    # the 1x1 shortcut, small and large norms (no squaring; several), a zero matrix, a batch mixing them,
    # a transposed view; torch.matrix_exp is the same op
    check(torch.linalg.matrix_exp, rand((1, 1), dtype))
    check(torch.linalg.matrix_exp, rand((2, 2), dtype))
    check(torch.linalg.matrix_exp, 0.01 * rand((5, 5), dtype))
    check(torch.linalg.matrix_exp, 3 * rand((6, 6), dtype))
    check(torch.linalg.matrix_exp, torch.zeros((4, 4), dtype=dtype))
    check(torch.linalg.matrix_exp, torch.stack([0.05 * rand((4, 4), dtype), 2 * rand((4, 4), dtype, seed=2)]))
    check(torch.matrix_exp, rand((3, 3), dtype).mT)


def test_matrix_exp_errors_and_non_finite():
    assert same_error(torch.linalg.matrix_exp, rand((2, 3), torch.float32)) is RuntimeError
    assert same_error(torch.linalg.matrix_exp, torch.ones((3, 3), dtype=torch.int64)) is RuntimeError
    assert same_error(torch.linalg.matrix_exp, rand((3,), torch.float32)) is RuntimeError
    for v in (float("nan"), float("inf")):
        a = torch.full((3, 3), v)
        assert_close(torch.linalg.matrix_exp(a.to(D)), torch.linalg.matrix_exp(a))   # NaN positions compared


# ---------------------------------------------------------------- Householder QR
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (2, 4, 4)])
def test_qr(dtype, shape):
    # R and the reflectors carry LAPACK's signs, so Q and R equal the CPU's, not just up to signs
    A = gen(shape, dtype)
    for mode in ("reduced", "complete", "r"):
        grad = mode == "reduced" or shape[-2] == shape[-1] or (mode == "complete" and shape[-2] < shape[-1])
        check(lambda a: torch.linalg.qr(a, mode=mode), A, grad=grad and mode != "r")


@pytest.mark.parametrize("dtype", DTYPES)
def test_geqrf_householder_ormqr(dtype):
    A = gen((2, 5, 3), dtype)
    check(torch.geqrf, A, grad=False)
    a, tau = torch.geqrf(A)
    check(torch.linalg.householder_product, a, tau)
    for left in (True, False):
        for tr in (False, True):
            C = rand((2, 5, 2) if left else (2, 2, 5), dtype)
            check(lambda a_, t_, c_: torch.ormqr(a_, t_, c_, left=left, transpose=tr), a, tau, C)


# ---------------------------------------------------------------- eigh and SVD (Jacobi): vectors up to a sign each
def _abs_vectors(fn):
    """fn's outputs with every vector's sign removed (|V|): what PyTorch's own tests compare, as the
    decompositions define their vectors up to sign only."""
    def g(*args):
        out = fn(*args)
        return tuple(o.abs() if i != 1 else o for i, o in enumerate(out)) if len(out) == 3 else (out[0], out[1].abs())
    return g


@pytest.mark.parametrize("dtype", DTYPES)
def test_eigh(dtype):
    A = rand((2, 5, 5), dtype)                          # not symmetric: the triangle UPLO names is read
    for uplo in ("L", "U"):
        check(lambda a: torch.linalg.eigvalsh(a, UPLO=uplo), A)
        check(_abs_vectors(lambda a: torch.linalg.eigh(a, UPLO=uplo)), A)
    S = spd((3, 4, 4), dtype)
    check(lambda a: (lambda w, v: v @ torch.diag_embed(w.exp()) @ v.mT)(*torch.linalg.eigh(a)), S)
    w, v = torch.linalg.eigh(S.to(D))
    assert_close(v @ torch.diag_embed(w) @ v.mT, S, **GTOL[dtype])
    check(lambda a: torch.linalg.matrix_rank(a, hermitian=True), S, grad=False)


@pytest.mark.parametrize("dtype", DTYPES)
def test_svd(dtype):
    for shape in [(2, 5, 3), (3, 5), (4, 4)]:
        A = gen(shape, dtype)
        check(_abs_vectors(lambda a: torch.linalg.svd(a, full_matrices=False)), A)
        check(torch.linalg.svdvals, A)
        check(lambda a: (lambda u, s, vh: u @ vh)(*torch.linalg.svd(a, full_matrices=False)), A)
        U, S, Vh = torch.linalg.svd(A.to(D))                # full matrices: U, Vh orthogonal, A = U S Vh
        k = S.shape[-1]
        assert_close(S, torch.linalg.svdvals(A), **TOL[dtype])
        eye = torch.eye(U.shape[-1], dtype=dtype)
        assert_close(U.mT @ U, eye.expand(U.shape), **GTOL[dtype])
        assert_close(Vh @ Vh.mT, torch.eye(Vh.shape[-1], dtype=dtype).expand(Vh.shape), **GTOL[dtype])
        assert_close(((U[..., :k] * S.unsqueeze(-2)) @ Vh[..., :k, :]), A, **GTOL[dtype])
        check(torch.linalg.pinv, A)
        check(lambda a: torch.linalg.matrix_norm(a, "nuc"), A)
        check(lambda a: torch.linalg.matrix_rank(a), A, grad=False)
    check(lambda a: torch.linalg.cond(a), gen((3, 3), dtype))


def test_eigh_svd_non_finite():
    a = spd((3, 3), torch.float32)
    a[0, 0] = float("nan")
    for fn in (torch.linalg.svd, torch.linalg.eigh):
        assert same_error(fn, a) is torch.linalg.LinAlgError


# ---------------------------------------------------------------- out= (resized, or a proxy where the layout differs)
def test_out_variants():
    A, P = gen((2, 3, 3), torch.float64), spd((2, 3, 3), torch.float64)
    inv = torch.empty(0, dtype=torch.float64, device=D)
    torch.linalg.inv(A.to(D), out=inv)
    assert_close(inv, torch.linalg.inv(A), check_layout=False)
    L = torch.full((2, 3, 3), 7.0, dtype=torch.float64, device=D)       # row-major: meta wants column-major
    torch.linalg.cholesky(P.to(D), out=L)
    assert_close(L, torch.linalg.cholesky(P), check_layout=False)
    LU, piv = torch.empty(0, dtype=torch.float64, device=D), torch.empty(0, dtype=torch.int32, device=D)
    torch.linalg.lu_factor(A.to(D), out=(LU, piv))
    assert_close((LU, piv), torch.linalg.lu_factor(A), check_layout=False)
    Q, R = torch.empty(0, dtype=torch.float64, device=D), torch.empty(0, dtype=torch.float64, device=D)
    torch.linalg.qr(A.to(D), out=(Q, R))
    assert_close((Q, R), torch.linalg.qr(A), check_layout=False)
    same_error(lambda a: torch.linalg.inv(a, out=torch.empty(0, dtype=torch.int32, device=a.device)), A)
    same_error(lambda a: torch.linalg.lu_factor(a, out=(torch.empty(0, dtype=a.dtype, device=a.device),
                                                        torch.empty(0, device=a.device))), A)


# ---------------------------------------------------------------- dtypes and argument errors: the CPU's words
ERROR_CASES = [
    lambda a: torch.linalg.cholesky(a), lambda a: torch.linalg.solve_triangular(a, a, upper=True),
    lambda a: torch.linalg.lu_factor(a), lambda a: torch.linalg.inv(a), lambda a: torch.linalg.det(a),
    lambda a: torch.cholesky_inverse(a), lambda a: torch.cholesky_solve(a, a), lambda a: torch.linalg.qr(a),
    lambda a: torch.linalg.householder_product(a, a[0]), lambda a: torch.linalg.cholesky(a.int()),
    lambda a: torch.linalg.cholesky(a[0]), lambda a: torch.linalg.solve(a, a[:2]),
    lambda a: torch.linalg.lu_factor_ex(a.float(), pivot=False), lambda a: torch.linalg.eigh(a),
    lambda a: torch.linalg.svd(a), lambda a: torch.linalg.eigh(a[0].float()),
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_errors_match_cpu(dtype):
    for fn in ERROR_CASES:
        same_error(fn, torch.eye(3, dtype=dtype) * 2)
