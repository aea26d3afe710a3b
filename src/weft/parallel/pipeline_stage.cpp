// Pipeline stage (see pipeline_stage.h): builds the stage's units from the layer split and runs
// one microbatch through them, resharding each unit right after its forward.
#include "weft/parallel/pipeline_stage.h"

#include <ATen/Functions.h>
#include <torch/csrc/autograd/autograd.h>

#include "weft/core/error.h"

namespace weft {

std::vector<int> split_layers(int num_layers, int pp, int first, int last) {
  if (num_layers < 1) fail_usage("--num-layers must be >= 1 (got {})", num_layers);
  std::vector<int> out(pp, 0);
  if (first < 0 && last < 0) {
    if (num_layers % pp != 0)
      fail_usage(
          "--num-layers {} is not divisible by --pipeline-model-parallel-size {}; use "
          "--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers for an "
          "uneven split",
          num_layers, pp);
    std::fill(out.begin(), out.end(), num_layers / pp);
    return out;
  }
  if (pp == 1)
    fail_usage("--decoder-first/last-pipeline-num-layers need --pipeline-model-parallel-size > 1");
  int rest = num_layers, middle = pp;
  if (first >= 0) {
    if (first < 1) fail_usage("--decoder-first-pipeline-num-layers must be >= 1 (got {})", first);
    out[0] = first;
    rest -= first;
    --middle;
  }
  if (last >= 0) {
    if (last < 1) fail_usage("--decoder-last-pipeline-num-layers must be >= 1 (got {})", last);
    out[pp - 1] = last;
    rest -= last;
    --middle;
  }
  if (rest < 0 || (middle == 0 && rest != 0) || (middle > 0 && (rest % middle != 0 || rest == 0)))
    fail_usage(
        "--num-layers {} minus the first/last stage layers ({}, {}) leaves {} layers, which do "
        "not split evenly over the {} other stage(s) (each needs at least one)",
        num_layers, first, last, rest, middle);
  for (int s = 0; s < pp; ++s)
    if ((s == 0 && first >= 0) || (s == pp - 1 && last >= 0)) continue;
    else out[s] = rest / middle;
  return out;
}

PipelineStage::PipelineStage(const ModelConfig& cfg, const ProcessGroups& groups,
                             const StageOptions& opt)
    : cfg_(cfg), opt_(opt) {
  const Mesh& mesh = groups.mesh();
  stage_ = mesh.coord(groups.rank(), "pp");
  num_stages_ = mesh.pp();
  auto split = split_layers(cfg.num_layers, num_stages_, opt.first_stage_layers,
                            opt.last_stage_layers);
  for (int s = 0; s < stage_; ++s) first_layer_ += split[s];
  num_layers_ = split[stage_];

  Communicator* shard = groups.get("fsdp_shard");
  auto add = [&](std::string name, std::vector<ParamSpec> specs) {
    units_.push_back(std::make_unique<FsdpUnit>(std::move(name), std::move(specs), shard,
                                                opt.dtype, opt.device));
    return units_.back().get();
  };
  if (is_first()) embedding_ = add("embedding", {embedding_param_spec(cfg)});
  for (int l = first_layer_; l < first_layer_ + num_layers_; ++l)
    layers_.push_back(add("decoder.layers." + std::to_string(l), layer_param_specs(cfg, l)));
  if (is_last()) {
    final_norm_ = add("decoder.final_layernorm", {final_norm_param_spec(cfg)});
    if (!cfg.tied())
      output_ = add("output_layer", {output_param_spec(cfg)});
    else if (num_stages_ == 1)
      output_ = embedding_;
    else
      output_ = tied_output_ = add("output_layer.tied_copy", {embedding_param_spec(cfg)});
  }
  rope_ = make_rotary_tables(cfg, opt.device, opt.dtype);
  if (embedding_) forward_order_.push_back(embedding_);
  for (FsdpUnit* u : layers_) forward_order_.push_back(u);
  if (is_last()) {
    forward_order_.push_back(final_norm_);
    forward_order_.push_back(output_);
  }
  if (opt.overlap_grad_reduce)
    for (auto& u : units_) u->set_grad_reduction_queue(&reduce_queue_);
  // Backward walks forward order in reverse; the embedding's backward needs no weight.
  if (opt.prefetch)
    for (size_t k = 1; k < forward_order_.size(); ++k)
      if (forward_order_[k - 1] != embedding_ && forward_order_[k] != forward_order_[k - 1])
        forward_order_[k]->set_backward_prefetch(forward_order_[k - 1]);
}

PipelineStage::~PipelineStage() = default;

void PipelineStage::init_parameters(uint64_t seed) {
  for (auto& u : units_)
    u->load_full([&](const ParamSpec& s) { return init_param(s, cfg_, seed); });
}

std::vector<int64_t> PipelineStage::activation_shape(int micro_batch_size) const {
  return {micro_batch_size, cfg_.seq_length, cfg_.hidden_size};
}

void PipelineStage::set_microbatch(int mb) {
  for (auto& u : units_) u->set_microbatch(mb);
}

at::Tensor PipelineStage::forward(int mb, const at::Tensor& input, const at::Tensor& labels,
                                  double loss_scale) {
  set_microbatch(mb);
  size_t k = 0;  // position in forward_order_
  // Issues the next unit's gather before the current unit computes.
  auto next = [&] {
    ++k;
    if (opt_.prefetch && k < forward_order_.size()) forward_order_[k]->unshard();
  };
  if (opt_.prefetch && !forward_order_.empty()) forward_order_[0]->unshard();
  at::Tensor x = input;
  if (is_first()) {
    next();
    x = embed_tokens(input, embedding_->handle(0));
    embedding_->reshard();
  }
  for (FsdpUnit* u : layers_) {
    next();
    LayerHandles h{u->handle(0), u->handle(1), u->handle(2),
                   u->handle(3), u->handle(4), u->handle(5)};
    x = decoder_layer(x, h, rope_, cfg_);
    u->reshard();
  }
  if (!is_last()) return x;
  next();
  x = final_norm(x, final_norm_->handle(0), cfg_);
  final_norm_->reshard();
  at::Tensor logits = output_logits(x, output_->handle(0));
  output_->reshard();
  return lm_loss_sum(logits, labels).mul(loss_scale);
}

void PipelineStage::backward(int mb, const at::Tensor& output, const at::Tensor& grad) {
  set_microbatch(mb);
  if (grad.defined())
    torch::autograd::backward({output}, {grad});
  else
    torch::autograd::backward({output});
  reduce_queue_.drain();
  for (auto& u : units_)
    WEFT_CHECK(!u->has_pending_grads(mb), "unit {}: a forward use of microbatch {} got no gradient",
               u->name(), mb);
}

}  // namespace weft
