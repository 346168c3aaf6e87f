// dist.cpp - the `tpu_dist` c10d backend: PyTorch's Backend contract over the
// runtime's collectives (runtime/include/tpu/coll.h), and the Python module
// torch_tpu._C that hands the backend to torch.distributed
// (torch_tpu/_dist.py registers it).
//
// Thin on purpose: check arguments in PyTorch's words, turn list forms into
// one flat device buffer (copies in and out are device ops, stream-ordered),
// call the runtime. The collective runs on the current stream of the
// tensors' chip, like a kernel; its Work is complete in stream order, so
// wait() costs the host nothing (barrier() waits on the host, as NCCL's
// does). An error found while it runs (a peer gone, a timeout, mismatched
// collectives) is raised by the next synchronizing call on that stream.
//
// The ranks find each other through the process group's store: rank 0 picks
// a key for the shared segment and publishes it. When the ranks are on more
// than one host, torch_tpu/_dist.py passes a Gloo process group instead and
// every call moves host copies through it (synchronous, TCP: correct, not
// fast; Gloo's own errors and timeouts apply, without our mismatch checks).
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/utils/pybind.h>
#include <ATen/core/ivalue.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <unistd.h>
#include <map>
#include <mutex>
#include <random>
#include "tpu_glue.h"

namespace at::tpu {
namespace {

tpu_reduce_op to_reduce_op(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return TPU_REDUCE_SUM;
    case c10d::ReduceOp::AVG:
      return TPU_REDUCE_AVG;
    case c10d::ReduceOp::PRODUCT:
      return TPU_REDUCE_PRODUCT;
    case c10d::ReduceOp::MIN:
      return TPU_REDUCE_MIN;
    case c10d::ReduceOp::MAX:
      return TPU_REDUCE_MAX;
    case c10d::ReduceOp::BAND:
      return TPU_REDUCE_BAND;
    case c10d::ReduceOp::BOR:
      return TPU_REDUCE_BOR;
    case c10d::ReduceOp::BXOR:
      return TPU_REDUCE_BXOR;
    default:
      TORCH_CHECK_NOT_IMPLEMENTED(false, "tpu_dist does not support ReduceOp.PREMUL_SUM");
  }
}

// Work of one call: complete in stream order (an event after it).
class TpuWork : public c10d::Work {
 public:
  TpuWork(int rank, c10d::OpType type, c10::DeviceIndex dev, std::vector<at::Tensor> outputs, bool host_wait,
          tpu_stream_t stream = nullptr)
      : Work(rank, type),
        dev_(dev),
        stream_(stream ? stream : current_stream(dev)),
        outputs_(std::move(outputs)),
        host_wait_(host_wait) {
    TPU_CHECK(tpu_event_create(false, &ev_));
    TPU_CHECK(tpu_event_record(ev_, stream_));
    std::vector<c10::Device> devs{c10::Device(c10::DeviceType::PrivateUse1, dev)};
    future_ = c10::make_intrusive<at::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), devs);
    future_->markCompleted(at::IValue(outputs_));
  }
  ~TpuWork() override { tpu_event_destroy(ev_); }
  bool isCompleted() override { return tpu_event_query(ev_) == TPU_OK; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds) override {
    tpu_stream_t cur = current_stream(dev_);
    if (cur != stream_) TPU_CHECK(tpu_stream_wait_event(cur, ev_));
    if (host_wait_) TPU_CHECK(tpu_stream_synchronize(stream_));  // raises what the collective met
    return true;
  }
  void synchronize() override { wait(std::chrono::milliseconds(0)); }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  c10::DeviceIndex dev_;
  tpu_stream_t stream_;
  tpu_event_t ev_ = nullptr;
  std::vector<at::Tensor> outputs_;
  bool host_wait_;
  c10::intrusive_ptr<at::ivalue::Future> future_;
};

// Work of a send / recv over Gloo (ranks on different hosts): Gloo's work on a
// host copy; a recv's wait() copies it into the tpu tensor.
class HostWork : public c10d::Work {
 public:
  HostWork(int rank, c10d::OpType type, c10::intrusive_ptr<c10d::Work> inner, at::Tensor host, at::Tensor dst)
      : Work(rank, type), inner_(std::move(inner)), host_(std::move(host)), dst_(std::move(dst)) {}
  bool isCompleted() override { return inner_->isCompleted(); }
  bool isSuccess() const override { return inner_->isSuccess(); }
  bool wait(std::chrono::milliseconds timeout) override {
    inner_->wait(timeout);
    if (dst_.defined() && !copied_) {
      dst_.copy_(host_.to(dst_.scalar_type()).view(dst_.sizes()));
      copied_ = true;
    }
    return true;
  }
  void synchronize() override { wait(std::chrono::milliseconds(0)); }
  std::vector<at::Tensor> result() override { return {dst_.defined() ? dst_ : host_}; }

 private:
  c10::intrusive_ptr<c10d::Work> inner_;
  at::Tensor host_, dst_;
  bool copied_ = false;
};

class TpuBackend : public c10d::Backend {
 public:
  // `gloo`: the ranks are on more than one host (torch_tpu/_dist.py found out through the store), and
  // that Gloo process group moves the data; otherwise the runtime's shared-memory communicator does.
  TpuBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout,
             c10::intrusive_ptr<c10d::Backend> gloo)
      : Backend(rank, size), timeout_(timeout), gloo_(std::move(gloo)) {
    if (gloo_) return;
    TORCH_CHECK_VALUE(size <= TPU_COMM_MAX_RANKS, "tpu_dist supports at most ", TPU_COMM_MAX_RANKS,
                      " ranks on one host, not ", size);
    std::string key;
    if (rank == 0) {
      std::random_device rd;
      key = std::to_string(getpid()) + "." + std::to_string(rd()) + std::to_string(rd());
      store->set("tpu_dist/key", std::vector<uint8_t>(key.begin(), key.end()));
    } else {
      auto v = store->get("tpu_dist/key");
      key.assign(v.begin(), v.end());
    }
    key_ = key;
    TPU_CHECK(tpu_comm_init_shm(key.c_str(), rank, size, std::max<int64_t>(timeout.count(), 1), &comm_));
  }
  ~TpuBackend() override { shutdown(); }

  const std::string getBackendName() const override { return "tpu_dist"; }
  void shutdown() override {
    std::lock_guard<std::mutex> g(p2p_mu_);
    for (auto& [k, e] : p2p_) tpu_comm_destroy(e.comm);
    p2p_.clear();
    if (comm_) tpu_comm_destroy(comm_);
    comm_ = nullptr;
    if (gloo_) gloo_->shutdown();
  }
  void abort() override {
    std::lock_guard<std::mutex> g(p2p_mu_);
    for (auto& [k, e] : p2p_) tpu_comm_abort(e.comm, "ProcessGroup abort()");
    if (comm_) tpu_comm_abort(comm_, "ProcessGroup abort()");
    if (gloo_) gloo_->abort();
  }
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return tpu_comm_count(comm_); }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& ts, const c10d::AllreduceOptions& o) override {
    auto t = one(ts, "allreduce");
    dense_inplace(t, [&](const at::Tensor& x) { x_all_reduce(x, o.reduceOp); });
    return work(c10d::OpType::ALLREDUCE, t, {t});
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& ts,
                                                     const c10d::AllreduceCoalescedOptions& o) override {
    TORCH_CHECK_VALUE(!ts.empty(), "allreduce_coalesced: requires at least one tensor");
    for (auto& t : ts) {
      check_tensor(t, "allreduce_coalesced");
      dense_inplace(t, [&](const at::Tensor& x) { x_all_reduce(x, o.reduceOp); });
    }
    return work(c10d::OpType::ALLREDUCE_COALESCED, ts[0], ts);
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& ts, const c10d::BroadcastOptions& o) override {
    auto t = one(ts, "broadcast");
    check_root(o.rootRank);
    dense_inplace(t, [&](const at::Tensor& x) { x_broadcast(x, static_cast<int>(o.rootRank)); });
    return work(c10d::OpType::BROADCAST, t, {t});
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& ts, const c10d::ReduceOptions& o) override {
    auto t = one(ts, "reduce");
    check_root(o.rootRank);
    dense_inplace(t, [&](const at::Tensor& x) { x_reduce(x, o.reduceOp, static_cast<int>(o.rootRank)); });
    return work(c10d::OpType::REDUCE, t, {t});
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& out, at::Tensor& in,
                                                 const c10d::AllgatherOptions&) override {
    check_tensor(in, "all_gather_into_tensor");
    check_tensor(out, "all_gather_into_tensor");
    check_same(in, out, "all_gather_into_tensor");
    TORCH_CHECK_VALUE(out.numel() == in.numel() * getSize(),
                      "output tensor size must be equal to world_size times input tensor size");
    TORCH_CHECK_VALUE(out.is_contiguous(), "Tensors must be contiguous");
    x_all_gather(in.contiguous(), out);
    return work(c10d::OpType::_ALLGATHER_BASE, out, {out});
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outs,
                                                                 std::vector<at::Tensor>& ins,
                                                                 const c10d::AllgatherOptions& o) override {
    TORCH_CHECK_VALUE(outs.size() == ins.size() && !ins.empty(),
                      "allgather_into_tensor_coalesced: as many outputs as inputs are required");
    for (size_t i = 0; i < ins.size(); i++) _allgather_base(outs[i], ins[i], o);
    return work(c10d::OpType::COALESCED, outs[0], outs);
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outs, std::vector<at::Tensor>& ins,
                                           const c10d::AllgatherOptions&) override {
    auto in = one(ins, "allgather");
    TORCH_CHECK_VALUE(outs.size() == 1, "allgather: requires a single list of output tensors");
    auto& list = outs[0];
    TORCH_CHECK_VALUE(static_cast<int>(list.size()) == getSize(), "allgather: the output list must have world size (",
                      getSize(), ") tensors, not ", list.size());
    for (auto& t : list) {
      check_tensor(t, "allgather");
      check_same(in, t, "allgather");
      TORCH_CHECK_VALUE(t.numel() == in.numel(), "allgather: every output tensor must have the input's size");
    }
    auto flat = at::empty({in.numel() * getSize()}, in.options());
    x_all_gather(in.contiguous(), flat);
    for (int r = 0; r < getSize(); r++) list[r].copy_(flat.narrow(0, r * in.numel(), in.numel()).view(list[r].sizes()));
    return work(c10d::OpType::ALLGATHER, in, list);
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outs, std::vector<at::Tensor>& ins,
                                        const c10d::GatherOptions& o) override {
    auto in = one(ins, "gather");
    check_root(o.rootRank);
    bool root = getRank() == o.rootRank;
    if (root) {
      TORCH_CHECK_VALUE(outs.size() == 1 && static_cast<int>(outs[0].size()) == getSize(),
                        "gather: requires a list of world size (", getSize(), ") output tensors on the root");
      for (auto& t : outs[0]) {
        check_tensor(t, "gather");
        check_same(in, t, "gather");
        TORCH_CHECK_VALUE(t.numel() == in.numel(), "gather: every output tensor must have the input's size");
      }
    } else {
      TORCH_CHECK_VALUE(outs.empty() || outs[0].empty(), "gather: Requires empty output on non-root");
    }
    at::Tensor flat;
    if (root) flat = at::empty({in.numel() * getSize()}, in.options());
    x_gather(in.contiguous(), flat, static_cast<int>(o.rootRank));
    std::vector<at::Tensor> res;
    if (root) {
      for (int r = 0; r < getSize(); r++)
        outs[0][r].copy_(flat.narrow(0, r * in.numel(), in.numel()).view(outs[0][r].sizes()));
      res = outs[0];
    }
    return work(c10d::OpType::GATHER, in, res);
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outs, std::vector<std::vector<at::Tensor>>& ins,
                                         const c10d::ScatterOptions& o) override {
    auto out = one(outs, "scatter");
    check_root(o.rootRank);
    bool root = getRank() == o.rootRank;
    at::Tensor flat;
    if (root) {
      TORCH_CHECK_VALUE(ins.size() == 1 && static_cast<int>(ins[0].size()) == getSize(),
                        "scatter: requires a list of world size (", getSize(), ") input tensors on the root");
      for (auto& t : ins[0]) {
        check_tensor(t, "scatter");
        check_same(out, t, "scatter");
        TORCH_CHECK_VALUE(t.numel() == out.numel(), "scatter: every input tensor must have the output's size");
      }
      flat = at::empty({out.numel() * getSize()}, out.options());
      for (int r = 0; r < getSize(); r++) flat.narrow(0, r * out.numel(), out.numel()).copy_(ins[0][r].reshape(-1));
    } else {
      TORCH_CHECK_VALUE(ins.empty() || ins[0].empty(), "scatter: Requires empty input on non-root");
    }
    dense_inplace(out, [&](const at::Tensor& x) { x_scatter(flat, x, static_cast<int>(o.rootRank)); });
    return work(c10d::OpType::SCATTER, out, {out});
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& out, at::Tensor& in,
                                                      const c10d::ReduceScatterOptions& o) override {
    check_tensor(in, "reduce_scatter_tensor");
    check_tensor(out, "reduce_scatter_tensor");
    check_same(in, out, "reduce_scatter_tensor");
    TORCH_CHECK_VALUE(in.numel() == out.numel() * getSize(),
                      "input tensor must be the same size as output size times world size");
    auto src = in.contiguous();
    dense_inplace(out, [&](const at::Tensor& x) { x_reduce_scatter(src, x, o.reduceOp); });
    return work(c10d::OpType::_REDUCE_SCATTER_BASE, out, {out});
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outs,
                                                                 std::vector<at::Tensor>& ins,
                                                                 const c10d::ReduceScatterOptions& o) override {
    TORCH_CHECK_VALUE(outs.size() == ins.size() && !ins.empty(),
                      "reduce_scatter_tensor_coalesced: as many outputs as inputs are required");
    for (size_t i = 0; i < ins.size(); i++) _reduce_scatter_base(outs[i], ins[i], o);
    return work(c10d::OpType::COALESCED, outs[0], outs);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outs,
                                                std::vector<std::vector<at::Tensor>>& ins,
                                                const c10d::ReduceScatterOptions& o) override {
    auto out = one(outs, "reduce_scatter");
    TORCH_CHECK_VALUE(ins.size() == 1 && static_cast<int>(ins[0].size()) == getSize(),
                      "reduce_scatter: requires a list of world size (", getSize(), ") input tensors");
    for (auto& t : ins[0]) {
      check_tensor(t, "reduce_scatter");
      check_same(out, t, "reduce_scatter");
      TORCH_CHECK_VALUE(t.numel() == out.numel(), "reduce_scatter: every input tensor must have the output's size");
    }
    auto flat = at::empty({out.numel() * getSize()}, out.options());
    for (int r = 0; r < getSize(); r++) flat.narrow(0, r * out.numel(), out.numel()).copy_(ins[0][r].reshape(-1));
    dense_inplace(out, [&](const at::Tensor& x) { x_reduce_scatter(flat, x, o.reduceOp); });
    return work(c10d::OpType::REDUCE_SCATTER, out, {out});
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& out, at::Tensor& in, std::vector<int64_t>& out_splits,
                                               std::vector<int64_t>& in_splits, const c10d::AllToAllOptions&) override {
    check_tensor(in, "all_to_all_single");
    check_tensor(out, "all_to_all_single");
    check_same(in, out, "all_to_all_single");
    int P = getSize();
    std::vector<int64_t> sc(P), rc(P);
    auto counts = [&](const at::Tensor& t, const std::vector<int64_t>& splits, std::vector<int64_t>& c) {
      int64_t rows = t.dim() ? t.size(0) : 1, per = rows ? t.numel() / rows : 0;
      if (splits.empty()) {
        TORCH_CHECK_VALUE(rows % P == 0, "Tensor's dim 0 does not divide equally across group size");
        for (int r = 0; r < P; r++) c[r] = rows / P * per;
      } else {
        TORCH_CHECK_VALUE(static_cast<int>(splits.size()) == P, "Number of tensor splits not equal to group size");
        int64_t sum = 0;
        for (int r = 0; r < P; r++) {
          TORCH_CHECK_VALUE(splits[r] >= 0, "Split sizes must be non-negative");
          sum += splits[r];
          c[r] = splits[r] * per;
        }
        TORCH_CHECK_VALUE(sum == rows, "Split sizes doesn't match total dim 0 size");
      }
    };
    counts(in, in_splits, sc);
    counts(out, out_splits, rc);
    auto src = in.contiguous();
    dense_inplace(out, [&](const at::Tensor& x) { x_all_to_all(src, sc, x, rc); });
    return work(c10d::OpType::ALLTOALL_BASE, out, {out});
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins,
                                          const c10d::AllToAllOptions&) override {
    int P = getSize();
    TORCH_CHECK_VALUE(static_cast<int>(outs.size()) == P && static_cast<int>(ins.size()) == P,
                      "all_to_all: requires world size (", P, ") input and output tensors");
    std::vector<int64_t> sc(P), rc(P);
    int64_t ts = 0, tr = 0;
    for (int r = 0; r < P; r++) {
      check_tensor(ins[r], "all_to_all");
      check_tensor(outs[r], "all_to_all");
      check_same(ins[0], ins[r], "all_to_all");
      check_same(ins[0], outs[r], "all_to_all");
      sc[r] = ins[r].numel();
      rc[r] = outs[r].numel();
      ts += sc[r];
      tr += rc[r];
    }
    auto fin = at::empty({ts}, ins[0].options()), fout = at::empty({tr}, ins[0].options());
    for (int64_t r = 0, o = 0; r < P; o += sc[r], r++)
      if (sc[r]) fin.narrow(0, o, sc[r]).copy_(ins[r].reshape(-1));
    x_all_to_all(fin, sc, fout, rc);
    for (int64_t r = 0, o = 0; r < P; o += rc[r], r++)
      if (rc[r]) outs[r].copy_(fout.narrow(0, o, rc[r]).view(outs[r].sizes()));
    return work(c10d::OpType::ALLTOALL, outs[0], outs);
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& o) override {
    c10::DeviceIndex dev = o.device_ids.empty() ? static_cast<c10::DeviceIndex>(tpu_device_current())
                                                : static_cast<c10::DeviceIndex>(o.device_ids[0]);
    if (gloo_) {
      gloo_->barrier(const_cast<c10d::BarrierOptions&>(o))->wait();
    } else {
      TPU_CHECK(tpu_comm_barrier(comm(), dev, current_stream(dev)));
    }
    return c10::make_intrusive<TpuWork>(getRank(), c10d::OpType::BARRIER, dev, std::vector<at::Tensor>{}, true);
  }

  // Point-to-point. Each direction between two ranks has its own 2-rank
  // communicator, opened on first use (tpu_comm_open_shm: the lower rank
  // never waits to open, so ranks opening pairs in any order cannot
  // deadlock), and its own stream per chip, which starts after the work
  // queued so far on the current stream: sends and recvs to one peer pair
  // up in issue order, and an exchange (both ranks send, then both recv)
  // runs both directions at once. Tags are not matched (ignored), as
  // NCCL's; a recv from any source is not supported.
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& ts, int dst, int tag) override {
    return p2p_op(one(ts, "send"), dst, true, tag);
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& ts, int src, int tag) override {
    return p2p_op(one(ts, "recv"), src, false, tag);
  }
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>&, int) override {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "tpu_dist: recv without a source (from any rank) is not supported; pass src=");
  }

 private:
  tpu_comm_t comm() {
    TORCH_CHECK(comm_, "tpu_dist: the process group was shut down");
    return comm_;
  }
  void check_root(int64_t root) {
    TORCH_CHECK_VALUE(root >= 0 && root < getSize(), "Invalid rootRank: ", root, " (world size ", getSize(), ")");
  }
  static void check_tensor(const at::Tensor& t, const char* what) {
    TORCH_CHECK_VALUE(t.defined(), what, ": tensors must be defined");
    TORCH_CHECK_VALUE(t.device().type() == c10::DeviceType::PrivateUse1, what,
                      ": tpu_dist takes tensors on a tpu device, not ", t.device());
    TORCH_CHECK_VALUE(t.layout() == c10::Layout::Strided, what, ": Tensors must be dense (strided), not ", t.layout());
    // (complex tensors: not yet; their real views would serve every op but MAX / MIN / PRODUCT)
    TORCH_CHECK_VALUE(dtype_supported(t.scalar_type()) && !t.is_complex(), what, ": dtype ", t.scalar_type(),
                      " is not supported by tpu_dist");
  }
  static void check_same(const at::Tensor& a, const at::Tensor& b, const char* what) {
    TORCH_CHECK_VALUE(a.scalar_type() == b.scalar_type(), what, ": tensors must all have the same dtype (found ",
                      a.scalar_type(), " and ", b.scalar_type(), ")");
    TORCH_CHECK_VALUE(a.device() == b.device(), what, ": tensors must all be on the same device (found ", a.device(),
                      " and ", b.device(), ")");
  }
  at::Tensor one(std::vector<at::Tensor>& ts, const char* what) {
    TORCH_CHECK_VALUE(ts.size() == 1, what, ": tpu_dist takes one tensor per call (got ", ts.size(), ")");
    check_tensor(ts[0], what);
    return ts[0];
  }
  // Run `f` on t if it is contiguous, else on a contiguous copy written back after.
  template <class F>
  static void dense_inplace(const at::Tensor& t, F&& f) {
    if (t.is_contiguous()) {
      f(t);
      return;
    }
    auto tmp = t.contiguous();
    f(tmp);
    const_cast<at::Tensor&>(t).copy_(tmp);
  }
  c10::intrusive_ptr<c10d::Work> work(c10d::OpType type, const at::Tensor& like, std::vector<at::Tensor> outs) {
    return c10::make_intrusive<TpuWork>(getRank(), type, like.device().index(), std::move(outs), false);
  }

  // --- the transport of each collective: the runtime's communicator or, across hosts, Gloo. Over Gloo a
  // tpu tensor is staged in host memory (the copy out waits for the current stream) and the call returns
  // once Gloo is done: correct, not fast (the runtime has no network of its own). ---
  static c10::ScalarType wire(c10::ScalarType t) { return t == at::kShort ? at::kInt : t; }  // Gloo lacks int16
  static at::Tensor host(const at::Tensor& t) { return t.to(at::kCPU).to(wire(t.scalar_type())); }
  static void put(const at::Tensor& dst, const at::Tensor& h) {
    const_cast<at::Tensor&>(dst).copy_(h.to(dst.scalar_type()).view(dst.sizes()));
  }
  static at::Tensor host_empty(at::IntArrayRef sizes, const at::Tensor& like) {
    return at::empty(sizes, like.options().device(at::kCPU).dtype(wire(like.scalar_type())));
  }
  static c10d::ReduceOp gloo_op(const c10d::ReduceOp& op) {  // Gloo has no AVG: a sum, divided by gloo_avg
    return op.op_ == c10d::ReduceOp::AVG ? c10d::ReduceOp(c10d::ReduceOp::SUM) : op;
  }
  void gloo_avg(const c10d::ReduceOp& op, at::Tensor& h) {
    if (op.op_ != c10d::ReduceOp::AVG) return;
    if (at::isFloatingType(h.scalar_type()))
      h.div_(getSize());
    else
      h.div_(getSize(), "trunc");
  }
  void gloo_all_reduce(at::Tensor& h, const c10d::ReduceOp& op) {
    std::vector<at::Tensor> v{h};
    c10d::AllreduceOptions opts;
    opts.reduceOp = gloo_op(op);
    gloo_->allreduce(v, opts)->wait();
    gloo_avg(op, h);
  }
  void x_all_reduce(const at::Tensor& x, const c10d::ReduceOp& op) {
    tpu_reduce_op rop = to_reduce_op(op);
    if (!gloo_) {
      auto d = desc(x);
      TPU_CHECK(tpu_all_reduce(comm(), &d, &d, rop, nullptr));
      return;
    }
    auto h = host(x);
    gloo_all_reduce(h, op);
    put(x, h);
  }
  void x_broadcast(const at::Tensor& x, int root) {
    if (!gloo_) {
      auto d = desc(x);
      TPU_CHECK(tpu_broadcast(comm(), &d, root, nullptr));
      return;
    }
    std::vector<at::Tensor> h{host(x)};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    gloo_->broadcast(h, opts)->wait();
    if (getRank() != root) put(x, h[0]);
  }
  void x_reduce(const at::Tensor& x, const c10d::ReduceOp& op, int root) {
    tpu_reduce_op rop = to_reduce_op(op);
    if (!gloo_) {
      auto d = desc(x);
      TPU_CHECK(tpu_reduce(comm(), &d, &d, rop, root, nullptr));
      return;
    }
    std::vector<at::Tensor> h{host(x)};
    c10d::ReduceOptions opts;
    opts.reduceOp = gloo_op(op);
    opts.rootRank = root;
    gloo_->reduce(h, opts)->wait();
    if (getRank() != root) return;
    gloo_avg(op, h[0]);
    put(x, h[0]);
  }
  std::vector<at::Tensor> host_chunks(const at::Tensor& like, int64_t n) {
    std::vector<at::Tensor> v;
    for (int r = 0; r < getSize(); r++) v.push_back(host_empty({n}, like));
    return v;
  }
  void x_all_gather(const at::Tensor& src, const at::Tensor& out) {
    if (!gloo_) {
      auto di = desc(src), dout = desc(out);
      TPU_CHECK(tpu_all_gather(comm(), &di, &dout, nullptr));
      return;
    }
    std::vector<at::Tensor> in{host(src).reshape(-1)};
    std::vector<std::vector<at::Tensor>> outs{host_chunks(src, src.numel())};
    gloo_->allgather(outs, in)->wait();
    put(out, at::cat(outs[0]));
  }
  void x_gather(const at::Tensor& src, const at::Tensor& flat, int root) {  // flat: defined on the root
    if (!gloo_) {
      auto di = desc(src);
      tpu_tensor dout{};
      if (flat.defined()) dout = desc(flat);
      TPU_CHECK(tpu_gather(comm(), &di, flat.defined() ? &dout : nullptr, root, nullptr));
      return;
    }
    std::vector<at::Tensor> in{host(src).reshape(-1)};
    std::vector<std::vector<at::Tensor>> outs;
    if (getRank() == root) outs.push_back(host_chunks(src, src.numel()));
    c10d::GatherOptions opts;
    opts.rootRank = root;
    gloo_->gather(outs, in, opts)->wait();
    if (getRank() == root) put(flat, at::cat(outs[0]));
  }
  void x_scatter(const at::Tensor& flat, const at::Tensor& out, int root) {  // flat: defined on the root
    if (!gloo_) {
      tpu_tensor din{}, dout = desc(out);
      if (flat.defined()) din = desc(flat);
      TPU_CHECK(tpu_scatter(comm(), flat.defined() ? &din : nullptr, &dout, root, nullptr));
      return;
    }
    std::vector<at::Tensor> outs{host_empty({out.numel()}, out)};
    std::vector<std::vector<at::Tensor>> ins;
    if (getRank() == root) {
      auto h = host(flat);
      ins.emplace_back();
      for (int r = 0; r < getSize(); r++) ins[0].push_back(h.narrow(0, r * out.numel(), out.numel()).contiguous());
    }
    c10d::ScatterOptions opts;
    opts.rootRank = root;
    gloo_->scatter(outs, ins, opts)->wait();
    put(out, outs[0]);
  }
  void x_reduce_scatter(const at::Tensor& src, const at::Tensor& out, const c10d::ReduceOp& op) {
    tpu_reduce_op rop = to_reduce_op(op);
    if (!gloo_) {
      auto di = desc(src), dout = desc(out);
      TPU_CHECK(tpu_reduce_scatter(comm(), &di, &dout, rop, nullptr));
      return;
    }
    auto h = host(src).reshape(-1);  // an all_reduce, of which this rank keeps its chunk
    gloo_all_reduce(h, op);
    put(out, h.narrow(0, getRank() * out.numel(), out.numel()));
  }
  void x_all_to_all(const at::Tensor& src, std::vector<int64_t>& sc, const at::Tensor& out,
                    std::vector<int64_t>& rc) {  // counts in elements
    if (!gloo_) {
      auto di = desc(src), dout = desc(out);
      TPU_CHECK(tpu_all_to_all(comm(), &di, sc.data(), &dout, rc.data(), nullptr));
      return;
    }
    auto hi = host(src).reshape(-1);
    auto ho = host_empty({out.numel()}, out);
    std::vector<int64_t> r = rc, q = sc;  // Gloo moves from the split vectors it is given
    gloo_->alltoall_base(ho, hi, r, q, c10d::AllToAllOptions())->wait();
    put(out, ho);
  }

  struct Pair {  // one direction between this rank and a peer
    tpu_comm_t comm = nullptr;
    std::map<c10::DeviceIndex, tpu_stream_t> streams;
  };

  c10::intrusive_ptr<c10d::Work> p2p_op(const at::Tensor& t, int peer, bool sending, int tag) {
    const char* what = sending ? "send" : "recv";
    TORCH_CHECK_VALUE(peer >= 0 && peer < getSize(), what, ": invalid ", sending ? "destination" : "source", " rank ",
                      peer, " (world size ", getSize(), ")");
    TORCH_CHECK_VALUE(peer != getRank(), what, ": Invalid ", sending ? "destination" : "source",
                      " rank: should not be the same as the rank of the current process.");
    if (gloo_) {  // across hosts: Gloo's send / recv of a host copy (tags are matched)
      std::vector<at::Tensor> h{sending ? host(t).contiguous() : host_empty(t.sizes(), t)};
      auto inner = sending ? gloo_->send(h, peer, tag) : gloo_->recv(h, peer, tag);
      return c10::make_intrusive<HostWork>(getRank(), sending ? c10d::OpType::SEND : c10d::OpType::RECV,
                                           std::move(inner), h[0], sending ? at::Tensor() : t);
    }
    comm();  // not shut down
    c10::DeviceIndex dev = t.device().index();
    tpu_stream_t cur = current_stream(dev), s;
    tpu_comm_t pc;
    {
      std::lock_guard<std::mutex> g(p2p_mu_);
      Pair& e = p2p_[{peer, sending}];
      if (!e.comm) {
        int me = getRank(), src = sending ? me : peer, dst = sending ? peer : me;
        std::string k = key_ + ".p" + std::to_string(src) + "-" + std::to_string(dst);
        TPU_CHECK(tpu_comm_open_shm(k.c_str(), me < peer ? 0 : 1, 2, std::max<int64_t>(timeout_.count(), 1), &e.comm));
      }
      tpu_stream_t& st = e.streams[dev];
      if (!st) TPU_CHECK(tpu_stream_create(dev, 0, &st));
      s = st;
      pc = e.comm;
    }
    at::Tensor buf = t.is_contiguous() ? t : (sending ? t.contiguous() : at::empty(t.sizes(), t.options()));
    tpu_event_t ev;
    TPU_CHECK(tpu_event_create(false, &ev));
    tpu_status st = tpu_event_record(ev, cur);  // s starts after what cur has queued (buf's contents)
    if (!st) st = tpu_stream_wait_event(s, ev);
    tpu_event_destroy(ev);
    TPU_CHECK(st);
    auto d = desc(buf);
    TPU_CHECK(sending ? tpu_send(pc, &d, s) : tpu_recv(pc, &d, s));
    auto keep = [&](const at::Tensor& x) {  // s still uses x's memory if it is freed before s is done
      if (void* p = x.storage().data_ptr().get()) TPU_CHECK(tpu_mem_record_stream(p, s));
    };
    keep(buf);
    if (!buf.is_same(t)) {  // a strided recv: copy into place on s, still off the current stream
      TPU_CHECK(tpu_stream_set_current(s));
      try {
        const_cast<at::Tensor&>(t).copy_(buf);
      } catch (...) {
        tpu_stream_set_current(cur);
        throw;
      }
      TPU_CHECK(tpu_stream_set_current(cur));
    }
    if (!sending) keep(t);
    return c10::make_intrusive<TpuWork>(getRank(), sending ? c10d::OpType::SEND : c10d::OpType::RECV, dev,
                                        std::vector<at::Tensor>{t}, tpu_get_eager_mode() == TPU_EAGER_DEBUG, s);
  }

  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::Backend> gloo_;  // ranks on several hosts
  std::string key_;
  tpu_comm_t comm_ = nullptr;
  std::mutex p2p_mu_;
  std::map<std::pair<int, bool>, Pair> p2p_;  // (peer, this rank sends)
};

}  // namespace
}  // namespace at::tpu

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch_tpu._C: the tpu_dist c10d backend (the ATen kernels load through torch.ops.load_library)";
  m.def(
      "_create_tpu_dist",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, int64_t timeout_ms, py::object gloo) {
        c10::intrusive_ptr<c10d::Backend> g;
        if (!gloo.is_none()) g = gloo.cast<c10::intrusive_ptr<c10d::Backend>>();
        py::gil_scoped_release nogil;
        return c10::intrusive_ptr<c10d::Backend>(
            c10::make_intrusive<at::tpu::TpuBackend>(store, rank, size, std::chrono::milliseconds(timeout_ms), g));
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout_ms"), py::arg("gloo") = py::none());
  // torch.tpu.synchronize's entry: torch.ops.torch_tpu.synchronize without the dispatcher's boxing. The GIL is
  // released while it waits, as a torch.ops call releases it: other Python threads (a timer sending SIGINT)
  // keep running; the interrupt check takes it back to run the signal handlers.
  m.def("_synchronize", &at::tpu::synchronize_device, py::call_guard<py::gil_scoped_release>());
}
