// 1F1B schedule (see schedule.h). Each in-flight microbatch keeps its stage input (to read the
// input gradient after backward) and its stage output (to start backward from).
#include "weft/parallel/schedule.h"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>

#include <deque>

#include "weft/core/error.h"

namespace weft {
namespace {

struct InFlight {
  int mb;
  at::Tensor input;   // received activation (leaf requiring grad); undefined on the first stage
  at::Tensor output;  // activation sent on, or the loss on the last stage
};

class Runner {
 public:
  Runner(PipelineStage& stage, Communicator& pp, int mbs,
         const std::function<Microbatch(int)>& batch, double loss_scale)
      : stage_(stage), pp_(pp), batch_(batch), loss_scale_(loss_scale),
        shape_(stage.activation_shape(mbs)),
        opts_(at::TensorOptions().dtype(stage.options().dtype).device(stage.options().device)) {}

  at::Tensor new_activation() const { return at::empty(shape_, opts_); }

  // Forward of microbatch mb, given the received activation (undefined on the first stage).
  InFlight forward(int mb, at::Tensor input) {
    // Every stage asks: the middle ones get no data, only the LossOptions their aux losses need.
    const Microbatch b = batch_(mb);
    at::Tensor in = input;
    if (!stage_.is_first()) {
      if (at::GradMode::is_enabled()) in.requires_grad_(true);
    } else {
      in = b.tokens;
    }
    at::Tensor out = stage_.forward(mb, in, b.labels, loss_scale_, b.loss);
    return InFlight{mb, stage_.is_first() ? at::Tensor() : input, out};
  }

  // Backward of `f` given the gradient of its output (undefined on the last stage); returns the
  // gradient of its input (undefined on the first stage).
  at::Tensor backward(InFlight& f, const at::Tensor& grad_out) {
    stage_.backward(f.mb, f.output, grad_out);
    at::Tensor g;
    if (f.input.defined()) {
      g = f.input.grad();
      WEFT_CHECK(g.defined(), "stage {}: no gradient for the input of microbatch {}",
                 stage_.stage(), f.mb);
      g = g.contiguous();
    }
    f = InFlight{};
    return g;
  }

  // Point-to-point helpers; each posts its operations as one batch.
  at::Tensor recv_forward() {
    if (stage_.is_first()) return {};
    at::Tensor t = new_activation();
    pp_.batch_p2p({{P2POp::kRecv, t, stage_.stage() - 1}});
    return t;
  }
  at::Tensor recv_backward() {
    if (stage_.is_last()) return {};
    at::Tensor t = new_activation();
    pp_.batch_p2p({{P2POp::kRecv, t, stage_.stage() + 1}});
    return t;
  }
  void send_forward(const at::Tensor& out) {
    if (stage_.is_last()) return;
    pp_.batch_p2p({{P2POp::kSend, out.detach().contiguous(), stage_.stage() + 1}});
  }
  void send_backward(const at::Tensor& g) {
    if (stage_.is_first()) return;
    pp_.batch_p2p({{P2POp::kSend, g, stage_.stage() - 1}});
  }
  at::Tensor send_forward_recv_backward(const at::Tensor& out) {
    if (stage_.is_last()) return {};
    at::Tensor t = new_activation();
    pp_.batch_p2p({{P2POp::kSend, out.detach().contiguous(), stage_.stage() + 1},
                   {P2POp::kRecv, t, stage_.stage() + 1}});
    return t;
  }
  at::Tensor send_backward_recv_forward(const at::Tensor& g) {
    if (stage_.is_first()) return {};
    at::Tensor t = new_activation();
    pp_.batch_p2p({{P2POp::kSend, g, stage_.stage() - 1}, {P2POp::kRecv, t, stage_.stage() - 1}});
    return t;
  }

 private:
  PipelineStage& stage_;
  Communicator& pp_;
  const std::function<Microbatch(int)>& batch_;
  double loss_scale_;
  std::vector<int64_t> shape_;
  at::TensorOptions opts_;
};

}  // namespace

at::Tensor run_1f1b(PipelineStage& stage, Communicator& pp, int num_microbatches,
                int micro_batch_size, const std::function<Microbatch(int)>& batch,
                double loss_scale) {
  WEFT_CHECK(pp.size() == stage.num_stages(), "pp communicator has {} members, stages {}",
             pp.size(), stage.num_stages());
  Runner r(stage, pp, micro_batch_size, batch, loss_scale);
  stage.reset_losses();
  const int M = num_microbatches;
  const int warmup = std::min(stage.num_stages() - stage.stage() - 1, M);
  const int steady = M - warmup;
  std::deque<InFlight> inflight;
  int next_fwd = 0;

  for (int i = 0; i < warmup; ++i) {
    at::Tensor in = r.recv_forward();
    inflight.push_back(r.forward(next_fwd++, in));
    r.send_forward(inflight.back().output);
  }
  at::Tensor in;
  if (steady > 0) in = r.recv_forward();
  for (int i = 0; i < steady; ++i) {
    const bool last = i == steady - 1;
    inflight.push_back(r.forward(next_fwd++, in));
    at::Tensor grad_out = r.send_forward_recv_backward(inflight.back().output);
    at::Tensor grad_in = r.backward(inflight.front(), grad_out);
    inflight.pop_front();
    if (last) {
      r.send_backward(grad_in);
    } else {
      in = r.send_backward_recv_forward(grad_in);
    }
  }
  for (int i = 0; i < warmup; ++i) {
    at::Tensor grad_out = r.recv_backward();
    at::Tensor grad_in = r.backward(inflight.front(), grad_out);
    inflight.pop_front();
    r.send_backward(grad_in);
  }
  WEFT_CHECK(inflight.empty(), "1F1B left {} microbatches in flight", inflight.size());
  return stage.losses();
}

at::Tensor run_forward_only(PipelineStage& stage, Communicator& pp, int num_microbatches,
                            int micro_batch_size, const std::function<Microbatch(int)>& batch,
                            double loss_scale) {
  WEFT_CHECK(pp.size() == stage.num_stages(), "pp communicator has {} members, stages {}",
             pp.size(), stage.num_stages());
  at::NoGradGuard no_grad;
  Runner r(stage, pp, micro_batch_size, batch, loss_scale);
  stage.reset_losses();
  for (int m = 0; m < num_microbatches; ++m) {
    at::Tensor in = r.recv_forward();
    r.send_forward(r.forward(m, in).output);
  }
  return stage.losses();
}

}  // namespace weft
