// Multi-rank tests of the communicator layer (run with 2, 4 and 8 ranks; any count works).
//
// Oracle: every rank can compute every other rank's input from that rank's number alone
// (make_input), so each collective is compared with the same arithmetic done locally. Values
// are small integers, exact in fp32 and bf16 and in every reduction of them, so results must
// match bitwise. Every check runs on the world and on a parity subgroup (ranks with the same
// rank % 2: group ranks differ from global ranks, and with 2 ranks it is the one-member case).
// The same checks run on CUDA tensors (MPI staging, and NCCL when built) where GPUs exist.
#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <numeric>
#include <thread>

#include "weft/comm/communicator.h"
#include "weft/comm/mpi_communicator.h"
#include "weft/comm/mpi_runtime.h"
#include "weft/comm/process_groups.h"
#include "weft/core/error.h"

namespace weft {
namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// The world (parity = false) or the ranks of this rank's parity, as an MPI communicator.
std::unique_ptr<Communicator> make_comm(bool parity) {
  const int r = world_rank(), n = world_size();
  Group members;
  for (int i = 0; i < n; ++i)
    if (!parity || i % 2 == r % 2) members.push_back(i);
  MPI_Comm c = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, parity ? r % 2 : 0, r, &c);
  return std::make_unique<MpiCommunicator>(parity ? "parity" : "world", members, c);
}

// Rank g's input of n elements: integers in [0, 10], so a sum over 8 ranks fits even int8.
at::Tensor make_input(int g, int64_t n, at::ScalarType dtype, int salt = 0) {
  return ((at::arange(n, at::kLong) * 3 + g * 5 + salt) % 11).to(dtype);
}

// The reference reduction over all ranks' inputs, in fp32 (fp64 for fp64), cast back: what the
// MPI backend computes, exactly, for these values.
at::Tensor reference_reduce(int size, int64_t n, at::ScalarType dtype, ReduceOp op,
                            int salt = 0) {
  const auto acc = dtype == at::kDouble ? at::kDouble : at::kFloat;
  std::vector<at::Tensor> all;
  for (int g = 0; g < size; ++g) all.push_back(make_input(g, n, acc, salt));
  at::Tensor s = at::stack(all);
  at::Tensor r = op == ReduceOp::kMax ? std::get<0>(s.max(0)) : s.sum(0);
  if (op == ReduceOp::kAvg) r = r.div(size);
  return r.to(dtype);
}

void expect_same(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  at::Tensor g = got.cpu().reshape({-1}), w = want.cpu().reshape({-1});
  ASSERT_EQ(g.scalar_type(), w.scalar_type()) << what;
  ASSERT_EQ(g.numel(), w.numel()) << what;
  EXPECT_TRUE(at::equal(g, w)) << what << "\n got " << g.to(at::kFloat) << "\n want "
                               << w.to(at::kFloat);
}

const std::vector<ReduceOp> kOps = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax};

// ---- one checker per collective, shared by the CPU and the CUDA tests -----------------------

void check_all_gather(Communicator& c, at::Device dev, at::ScalarType dt) {
  for (int64_t n : {0, 1, 7, 1000}) {
    at::Tensor in = make_input(c.rank(), n, dt).to(dev);
    at::Tensor out = at::full({c.size(), n}, -1, at::TensorOptions().dtype(dt).device(dev));
    c.all_gather(in, out);
    std::vector<at::Tensor> parts;
    for (int g = 0; g < c.size(); ++g) parts.push_back(make_input(g, n, dt));
    expect_same(out, at::cat(parts), fmt::format("all_gather n={}", n));

    // In place: the input is this rank's slot of the output.
    at::Tensor flat = at::full({c.size() * n}, -1, at::TensorOptions().dtype(dt).device(dev));
    at::Tensor slot = flat.narrow(0, c.rank() * n, n);
    slot.copy_(in);
    c.all_gather(slot, flat);
    expect_same(flat, at::cat(parts), fmt::format("all_gather in place n={}", n));
  }
}

void check_reduce_scatter(Communicator& c, at::Device dev, at::ScalarType dt) {
  for (int64_t n : {0, 3, 257})
    for (ReduceOp op : kOps) {
      at::Tensor in = make_input(c.rank(), c.size() * n, dt).to(dev);
      at::Tensor out = at::full({n}, -1, at::TensorOptions().dtype(dt).device(dev));
      c.reduce_scatter(in, out, op);
      at::Tensor want = reference_reduce(c.size(), c.size() * n, dt, op).narrow(0, c.rank() * n, n);
      expect_same(out, want, fmt::format("reduce_scatter n={} op={}", n, static_cast<int>(op)));

      // In place: the output is this rank's slot of the input.
      at::Tensor flat = make_input(c.rank(), c.size() * n, dt).to(dev);
      at::Tensor slot = flat.narrow(0, c.rank() * n, n);
      c.reduce_scatter(flat, slot, op);
      expect_same(slot, want, fmt::format("reduce_scatter in place n={} op={}", n,
                                          static_cast<int>(op)));

      // Asynchronous: two in flight at once, waited for in start order.
      at::Tensor out1 = at::full({n}, -1, at::TensorOptions().dtype(dt).device(dev));
      at::Tensor out2 = at::full({n}, -1, at::TensorOptions().dtype(dt).device(dev));
      at::Tensor in2 = in.clone();
      auto w1 = c.reduce_scatter_async(in, out1, op);
      auto w2 = c.reduce_scatter_async(in2, out2, op);
      w1->wait();
      w2->wait();
      expect_same(out1, want, fmt::format("reduce_scatter_async n={} op={}", n,
                                          static_cast<int>(op)));
      expect_same(out2, want, fmt::format("reduce_scatter_async (second) n={} op={}", n,
                                          static_cast<int>(op)));
    }
}

void check_all_reduce(Communicator& c, at::Device dev, at::ScalarType dt) {
  for (int64_t n : {0, 1, 1000})
    for (ReduceOp op : kOps) {
      if (op == ReduceOp::kAvg && !at::isFloatingType(dt)) continue;
      at::Tensor t = make_input(c.rank(), n, dt).to(dev).reshape({n, 1});
      c.all_reduce(t, op);
      expect_same(t, reference_reduce(c.size(), n, dt, op),
                  fmt::format("all_reduce {} n={} op={}", c10::toString(dt), n,
                              static_cast<int>(op)));
    }
}

void check_broadcast(Communicator& c, at::Device dev, at::ScalarType dt) {
  for (int root : {c.size() - 1, 0})
    for (int64_t n : {0, 33}) {
      at::Tensor t = c.rank() == root
                         ? make_input(root, n, dt).to(dev)
                         : at::full({n}, -1, at::TensorOptions().dtype(dt).device(dev));
      c.broadcast(t, root);
      expect_same(t, make_input(root, n, dt), fmt::format("broadcast root={} n={}", root, n));
    }
}

// A ring of blocking send/recv: rank r sends 5 + r elements to r+1. Rank 0 sends first and
// everyone else receives first, so the ring never deadlocks.
void check_send_recv_ring(Communicator& c, at::Device dev, at::ScalarType dt) {
  if (c.size() == 1) return;
  const int next = (c.rank() + 1) % c.size(), prev = (c.rank() + c.size() - 1) % c.size();
  at::Tensor mine = make_input(c.rank(), 5 + c.rank(), dt).to(dev);
  at::Tensor got = at::full({5 + prev}, -1, at::TensorOptions().dtype(dt).device(dev));
  if (c.rank() == 0) {
    c.send(mine, next);
    c.recv(got, prev);
  } else {
    c.recv(got, prev);
    c.send(mine, next);
  }
  expect_same(got, make_input(prev, 5 + prev, dt), "send/recv ring");
}

// Simultaneous sends and receives between pairs (r, r^1) and around the ring, several messages
// to one peer in a batch (one of them empty), and a message to itself: the k-th send to a peer
// must land in that peer's k-th receive from this rank.
void check_batch_p2p(Communicator& c, at::Device dev, at::ScalarType dt) {
  const int r = c.rank(), n = c.size();
  const auto opts = at::TensorOptions().dtype(dt).device(dev);
  std::vector<P2POp> ops;
  std::vector<std::pair<at::Tensor, at::Tensor>> expect;  // received tensor, its expected value
  auto post_recv = [&](int peer, int salt, int64_t len) {
    at::Tensor t = at::full({len}, -1, opts);
    ops.push_back({P2POp::kRecv, t, peer});
    expect.emplace_back(t, make_input(peer, len, dt, salt));
  };
  auto post_send = [&](int peer, int salt, int64_t len) {
    ops.push_back({P2POp::kSend, make_input(r, len, dt, salt).to(dev), peer});
  };
  const int partner = r ^ 1;
  if (partner < n) {
    post_recv(partner, 1, 3);
    post_send(partner, 1, 3);
    post_send(partner, 2, 0);
    post_recv(partner, 2, 0);
    post_send(partner, 3, 6);
    post_recv(partner, 3, 6);
  }
  post_send((r + 1) % n, 4, 9);
  post_recv((r + n - 1) % n, 4, 9);
  post_recv(r, 5, 4);
  post_send(r, 5, 4);
  c.batch_p2p(ops);
  for (size_t i = 0; i < expect.size(); ++i)
    expect_same(expect[i].first, expect[i].second, fmt::format("batch_p2p receive #{}", i));
}

// Uneven all-to-all: rank i sends ((i + 2j) % 3) * m elements to rank j (zero for itself and
// for some peers), each equal to i*16 + j*2 + k%2 (exact in bf16).
void check_all_to_all(Communicator& c, at::Device dev, at::ScalarType dt) {
  const int i = c.rank(), n = c.size();
  auto count = [](int src, int dst, int64_t m) { return static_cast<int64_t>((src + 2 * dst) % 3) * m; };
  auto block = [&](int src, int dst, int64_t m) {
    return (at::arange(count(src, dst, m), at::kLong) % 2 + src * 16 + dst * 2).to(dt);
  };
  for (int64_t m : {0, 1, 50}) {
    std::vector<int64_t> sc, rc;
    std::vector<at::Tensor> send_parts, want_parts;
    for (int j = 0; j < n; ++j) {
      sc.push_back(count(i, j, m));
      rc.push_back(count(j, i, m));
      send_parts.push_back(block(i, j, m));
      want_parts.push_back(block(j, i, m));
    }
    at::Tensor in = at::cat(send_parts).to(dev);
    at::Tensor want = at::cat(want_parts);
    at::Tensor out = at::full({want.numel()}, -1, at::TensorOptions().dtype(dt).device(dev));
    c.all_to_all(in, sc, out, rc);
    expect_same(out, want, fmt::format("all_to_all m={}", m));
  }
}

void check_barrier(Communicator& c, at::Device dev, at::ScalarType dt) {
  for (int k = 0; k < 3; ++k) c.barrier();
  at::Tensor t = at::ones({1}, at::TensorOptions().dtype(dt).device(dev));
  c.all_reduce(t, ReduceOp::kSum);  // still in step after the barriers
  expect_same(t, at::full({1}, c.size(), at::TensorOptions().dtype(dt)), "after barrier");
}

// ---- CPU tensors on the MPI backend, fp32 and bf16, world and parity subgroup ---------------

struct Case {
  at::ScalarType dtype;
  bool parity;
};

class Collectives : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { comm_ = make_comm(GetParam().parity); }
  at::ScalarType dt() const { return GetParam().dtype; }
  std::unique_ptr<Communicator> comm_;
  const at::Device cpu_{at::kCPU};
};

TEST_P(Collectives, AllGather) { check_all_gather(*comm_, cpu_, dt()); }
TEST_P(Collectives, ReduceScatter) { check_reduce_scatter(*comm_, cpu_, dt()); }
TEST_P(Collectives, AllReduce) { check_all_reduce(*comm_, cpu_, dt()); }
TEST_P(Collectives, Broadcast) { check_broadcast(*comm_, cpu_, dt()); }
TEST_P(Collectives, SendRecvRing) { check_send_recv_ring(*comm_, cpu_, dt()); }
TEST_P(Collectives, BatchP2P) { check_batch_p2p(*comm_, cpu_, dt()); }
TEST_P(Collectives, AllToAll) { check_all_to_all(*comm_, cpu_, dt()); }
TEST_P(Collectives, Barrier) { check_barrier(*comm_, cpu_, dt()); }

INSTANTIATE_TEST_SUITE_P(Mpi, Collectives,
                         ::testing::Values(Case{at::kFloat, false}, Case{at::kBFloat16, false},
                                           Case{at::kFloat, true}, Case{at::kBFloat16, true}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(info.param.dtype == at::kFloat ? "fp32" : "bf16") +
                                  (info.param.parity ? "_parity" : "_world");
                         });

TEST(CollectivesDtypes, ReduceAndGatherEveryDtype) {
  auto comm = make_comm(false);
  for (at::ScalarType dt : {at::kDouble, at::kHalf, at::kInt, at::kLong, at::kByte, at::kChar}) {
    check_all_reduce(*comm, at::kCPU, dt);
    check_all_gather(*comm, at::kCPU, dt);
  }
}

// Wrong arguments are found locally: every rank throws, nobody enters MPI, and the
// communicator stays usable (checked by the barrier at the end).
TEST(CommunicatorErrors, BadArgumentsThrowBeforeCommunicating) {
  auto c = make_comm(false);
  const int n = c->size();
  at::Tensor four = at::zeros({4});
  EXPECT_THROW(c->all_gather(four, at::zeros({4 * n + 1})), Error);
  EXPECT_THROW(c->all_gather(four, at::zeros({4 * n}, at::kDouble)), Error);
  EXPECT_THROW(c->all_gather(at::zeros({4, 4}).t(), at::zeros({16 * n})), Error);
  EXPECT_THROW(c->reduce_scatter(at::zeros({4 * n + 1}), four, ReduceOp::kSum), Error);
  EXPECT_THROW(c->all_reduce(at::zeros({4}, at::kLong), ReduceOp::kAvg), Error);
  EXPECT_THROW(c->all_reduce(at::zeros({4}, at::kBool), ReduceOp::kSum), Error);
  EXPECT_THROW(c->broadcast(four, n), Error);
  EXPECT_THROW(c->broadcast(four, -1), Error);
  EXPECT_THROW(c->send(four, c->rank()), Error);
  EXPECT_THROW(c->recv(four, n), Error);
  EXPECT_THROW(c->batch_p2p({{P2POp::kSend, four, n}}), Error);
  std::vector<int64_t> ones(static_cast<size_t>(n), 1);
  EXPECT_THROW(c->all_to_all(at::zeros({n}), ones, at::zeros({n + 1}), ones), Error);
  std::vector<int64_t> too_many(static_cast<size_t>(n) + 1, 0);
  EXPECT_THROW(c->all_to_all(at::zeros({0}), too_many, at::zeros({0}), too_many), Error);
  try {
    c->all_gather(four, at::zeros({3}));
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("all_gather"), std::string::npos) << what;
    EXPECT_NE(what.find("'world'"), std::string::npos) << what;
    EXPECT_NE(what.find("out.numel() 3"), std::string::npos) << what;
  }
  c->barrier();
}

// MPI_THREAD_MULTIPLE: two threads drive two communicators at once (each communicator's calls
// stay in one thread, so their order is the same on every rank).
TEST(CommunicatorThreads, TwoCommunicatorsFromTwoThreads) {
  auto world = make_comm(false);
  auto parity = make_comm(true);
  auto loop = [](Communicator* c) {
    for (int k = 0; k < 50; ++k) {
      at::Tensor t = make_input(c->rank(), 64, at::kFloat, k);
      c->all_reduce(t, ReduceOp::kSum);
      expect_same(t, reference_reduce(c->size(), 64, at::kFloat, ReduceOp::kSum, k),
                  fmt::format("all_reduce #{} on '{}' in its own thread", k, c->name()));
    }
  };
  std::thread a(loop, world.get()), b(loop, parity.get());
  a.join();
  b.join();
}

TEST(MpiRuntime, LibraryVersionIsOneLine) {
  const std::string v = MpiRuntime::library_version();
  EXPECT_FALSE(v.empty());
  EXPECT_EQ(v.find('\n'), std::string::npos) << v;
}

// ---- ProcessGroups --------------------------------------------------------------------------

std::vector<Mesh> meshes_for_world(int w) {
  std::vector<LayoutConfig> cands = {
      {.world_size = w},
      {.world_size = w, .pp = 2, .ep = 2},
      {.world_size = w, .pp = 2, .dp_outer = 2},
      {.world_size = w, .tp = 2, .pp = 2},
      {.world_size = w, .pp = 4},
      {.world_size = w, .cp = 2, .ep = 2},
      {.world_size = w, .tp = 2, .ep = 2, .etp = 1, .tp_pp_dp_mapping = true},
      {.world_size = w, .pp = 2, .ep = 2, .dp_outer = 2},
  };
  std::vector<Mesh> out;
  for (const auto& c : cands) {
    try {
      out.emplace_back(c);
    } catch (const UsageError&) {  // not a valid layout for this world size
    }
  }
  return out;
}

TEST(ProcessGroups, EveryGroupMatchesTheMesh) {
  const int me = world_rank(), w = world_size();
  for (const Mesh& mesh : meshes_for_world(w)) {
    const auto& cfg = mesh.config();
    SCOPED_TRACE(fmt::format("tp {} cp {} pp {} ep {} etp {} dp_outer {} order {}", cfg.tp,
                             cfg.cp, cfg.pp, cfg.ep, cfg.etp, cfg.dp_outer, mesh.order()));
    ProcessGroups pg(mesh, Backend::kMpi);
    EXPECT_EQ(pg.rank(), me);
    EXPECT_EQ(pg.world().size(), w);
    EXPECT_EQ(pg.world().rank(), me);
    for (const std::string& kind : mesh_group_kinds()) {
      Communicator* c = pg.get(kind);
      if (!mesh.has_group(kind, me)) {
        EXPECT_EQ(c, nullptr) << kind;
        continue;
      }
      ASSERT_NE(c, nullptr) << kind;
      const Group& want = mesh.group_of(kind, me);
      EXPECT_EQ(c->members(), want) << kind;
      EXPECT_EQ(c->rank(), mesh.group_rank(kind, me)) << kind;
      EXPECT_EQ(c->name(), kind);
      EXPECT_EQ(c->backend(), "mpi");
      at::Tensor t = at::full({1}, me, at::kLong);
      c->all_reduce(t, ReduceOp::kSum);
      EXPECT_EQ(t.item<int64_t>(), std::accumulate(want.begin(), want.end(), int64_t{0})) << kind;
      at::Tensor ranks = at::empty({c->size()}, at::kInt);
      c->all_gather(at::full({1}, me, at::kInt), ranks);
      EXPECT_EQ(std::vector<int>(ranks.data_ptr<int>(), ranks.data_ptr<int>() + c->size()), want)
          << kind;
    }
  }
}

TEST(ProcessGroups, EmbeddingIsNullOnMiddleStages) {
  const int me = world_rank(), w = world_size();
  if (w % 4 != 0) GTEST_SKIP() << "needs pp 4";
  Mesh mesh(LayoutConfig{.world_size = w, .pp = 4});
  ProcessGroups pg(mesh, Backend::kMpi);
  const int stage = mesh.coord(me, "pp");
  Communicator* emb = pg.get("embedding");
  if (stage == 1 || stage == 2) {
    EXPECT_EQ(emb, nullptr) << "stage " << stage;
  } else {
    ASSERT_NE(emb, nullptr);
    const Group& pp = mesh.group_of("pp", me);
    EXPECT_EQ(emb->members(), (Group{pp.front(), pp.back()}));
  }
}

TEST(ProcessGroups, WorldSizeMismatchThrows) {
  const int w = world_size();
  Mesh bigger(LayoutConfig{.world_size = 2 * w});
  try {
    ProcessGroups pg(bigger, Backend::kMpi);
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--world-size"), std::string::npos) << what;
    EXPECT_NE(what.find("mpirun -np"), std::string::npos) << what;
  }
}

TEST(ProcessGroups, NcclWithoutCudaThrowsAndUnknownKindThrows) {
  Mesh mesh(LayoutConfig{.world_size = world_size()});
  if (!nccl_available()) {
    EXPECT_THROW({ ProcessGroups pg(mesh, Backend::kNccl); }, Error);
    EXPECT_EQ(nccl_version(), "");
  }
  ProcessGroups pg(mesh, Backend::kMpi);
  EXPECT_THROW(pg.get("not_a_kind"), Error);
}

// ---- CUDA tensors: MPI staging and NCCL against the same oracle ------------------------------

// Selects GPU local_rank % count for this rank. `exclusive`: fails (false) unless every local
// rank gets a GPU of its own (NCCL refuses two ranks on one GPU; MPI staging does not care).
bool select_cuda_device(bool exclusive) {
  if (!at::hasCUDA()) return false;
  MPI_Comm local = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank(), MPI_INFO_NULL, &local);
  int lr = 0, ln = 0;
  MPI_Comm_rank(local, &lr);
  MPI_Comm_size(local, &ln);
  MPI_Comm_free(&local);
  const auto* impl = c10::impl::getDeviceGuardImpl(at::kCUDA);
  const int count = impl->deviceCount();
  if (count == 0 || (exclusive && count < ln)) return false;
  impl->setDevice(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(lr % count)));
  return true;
}

void check_everything(Communicator& c, at::ScalarType dt) {
  SCOPED_TRACE(fmt::format("{} backend, group '{}', {}", c.backend(), c.name(), c10::toString(dt)));
  const auto* impl = c10::impl::getDeviceGuardImpl(at::kCUDA);
  const at::Device dev = impl->getDevice();
  check_all_gather(c, dev, dt);
  check_reduce_scatter(c, dev, dt);
  check_all_reduce(c, dev, dt);
  check_broadcast(c, dev, dt);
  check_send_recv_ring(c, dev, dt);
  check_batch_p2p(c, dev, dt);
  check_all_to_all(c, dev, dt);
  check_barrier(c, dev, dt);
}

TEST(CudaTensors, MpiBackendStagesThroughHost) {
  const bool ok = select_cuda_device(/*exclusive=*/false);
  int all_ok = ok ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all_ok) GTEST_SKIP() << "no CUDA device";
  for (bool parity : {false, true}) {
    auto c = make_comm(parity);
    for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) check_everything(*c, dt);
  }
}

TEST(CudaTensors, NcclBackendMatchesTheOracle) {
  int all_ok = nccl_available() && select_cuda_device(/*exclusive=*/true) ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all_ok) GTEST_SKIP() << "weft built without NCCL, or no CUDA device for every local rank";
  const int w = world_size();
  Mesh mesh(LayoutConfig{.world_size = w, .pp = w % 2 == 0 ? 2 : 1});
  ProcessGroups pg(mesh, Backend::kNccl);
  EXPECT_FALSE(nccl_version().empty());
  for (Communicator* c : {&pg.world(), pg.get("pp"), pg.get("dp")}) {
    ASSERT_EQ(c->backend(), "nccl");
    for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) check_everything(*c, dt);
  }
  // CPU tensors are refused with a clear error, before communicating.
  EXPECT_THROW(pg.world().all_reduce(at::zeros({2}), ReduceOp::kSum), Error);
}

}  // namespace
}  // namespace weft
