// Pipeline stage (see pipeline_stage.h): builds the stage's units from the layer split and runs
// one microbatch through them, resharding each unit right after its forward.
#include "weft/comm/process_groups.h"
#include "weft/parallel/pipeline_stage.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>

#include "weft/core/error.h"
#include "weft/model/recompute.h"

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
    : cfg_(cfg), opt_(opt), groups_(groups) {
  const Mesh& mesh = groups.mesh();
  stage_ = mesh.coord(groups.rank(), "pp");
  num_stages_ = mesh.pp();
  auto split = cfg.hybrid_stage_layers.empty()
                   ? split_layers(cfg.num_layers, num_stages_, opt.first_stage_layers,
                                  opt.last_stage_layers)
                   : cfg.hybrid_stage_layers;
  WEFT_CHECK(static_cast<int>(split.size()) == num_stages_, "{} stage sizes for pp {}",
             split.size(), num_stages_);
  for (int s = 0; s < stage_; ++s) first_layer_ += split[s];
  num_layers_ = split[stage_];

  Communicator* shard = groups.get("fsdp_shard");
  Communicator* replicate = groups.get("fsdp_replicate");
  auto add = [&](std::string name, std::vector<ParamSpec> specs) {
    units_.push_back(std::make_unique<FsdpUnit>(std::move(name), std::move(specs), shard,
                                                opt.dtype, opt.device, replicate));
    forward_order_.push_back(units_.back().get());
    return units_.back().get();
  };
  if (is_first()) embedding_ = add("embedding", {embedding_param_spec(cfg)});
  for (int l = first_layer_; l < first_layer_ + num_layers_; ++l) {
    const std::vector<ParamSpec> specs = layer_param_specs(cfg, l);
    std::vector<std::string> moe;
    if (cfg.is_moe_layer(l)) moe.push_back(layer_prefix(l));
    layers_.push_back(make_block("decoder.layers." + std::to_string(l), specs, moe));
    Block& b = layers_.back();
    b.layer = layer_handles(b.dense, 0, specs, layer_prefix(l),
                            b.dispatch.empty() ? nullptr : b.dispatch[0].get());
    if (!b.biases.empty()) b.layer.router_bias = b.biases[0].get();
  }
  if (is_last()) {
    final_norm_ = add("decoder.final_layernorm", {final_norm_param_spec(cfg)});
    if (has_embedding_copy())
      embedding_copy_ = add("embedding.copy", {embedding_param_spec(cfg)});
    FsdpUnit* embedding = num_stages_ == 1 ? embedding_ : embedding_copy_;
    output_ = cfg.tied() ? embedding : add("output_layer", {output_param_spec(cfg)});
    mtp_embedding_ = embedding;
    const std::string symbols = cfg.mtp_symbols();
    for (int k = 0; k < cfg.mtp_num_layers; ++k) {
      std::vector<std::string> moe;
      for (size_t j = 0; j < symbols.size(); ++j)
        if (cfg.mtp_layer_is_moe(j)) moe.push_back(mtp_layer_prefix(cfg, k, static_cast<int>(j)));
      mtp_.push_back(make_block("mtp.layers." + std::to_string(k), mtp_param_specs(cfg, k), moe));
      Block& b = mtp_.back();
      std::vector<MoeExperts*> experts;
      for (size_t j = 0, e = 0; j < symbols.size(); ++j)
        experts.push_back(cfg.mtp_layer_is_moe(j) ? b.dispatch[e++].get() : nullptr);
      b.mtp = mtp_handles(b.dense, 0, cfg, k, experts);
      for (size_t j = 0, e = 0; j < symbols.size() && !b.biases.empty(); ++j)
        if (cfg.mtp_layer_is_moe(j)) b.mtp.layers[j].router_bias = b.biases[e++].get();
    }
  }
  rope_ = make_rotary_tables(cfg, opt.device, opt.dtype);
  losses_ = at::zeros({4}, at::TensorOptions().dtype(at::kDouble).device(opt.device));
  if (opt.overlap_grad_reduce)
    for (auto& u : units_) u->set_grad_reduction_queue(&reduce_queue_);
  // Backward walks forward order in reverse; the embedding's backward needs no weight.
  if (opt.overlap_param_gather)
    for (size_t k = 1; k < forward_order_.size(); ++k)
      if (forward_order_[k - 1] != embedding_)
        forward_order_[k]->set_backward_prefetch(forward_order_[k - 1]);
}

PipelineStage::Block PipelineStage::make_block(const std::string& name,
                                               const std::vector<ParamSpec>& specs,
                                               const std::vector<std::string>& moe_prefixes) {
  Block b;
  units_.push_back(std::make_unique<FsdpUnit>(name, specs, groups_.get("fsdp_shard"), opt_.dtype,
                                              opt_.device, groups_.get("fsdp_replicate")));
  b.dense = units_.back().get();
  forward_order_.push_back(b.dense);
  for (const std::string& prefix : moe_prefixes) {
    Communicator* ep = groups_.get("ep");
    const int local = cfg_.num_experts / ep->size();
    std::string unit = prefix + "mlp.experts";  // e.g. decoder.layers.3.mlp.experts
    units_.push_back(std::make_unique<FsdpUnit>(
        unit, expert_param_specs(cfg_, prefix, ep->rank() * local, local),
        groups_.get("expert_fsdp_shard"), opt_.dtype, opt_.device,
        groups_.get("expert_fsdp_replicate")));
    b.experts.push_back(units_.back().get());
    forward_order_.push_back(units_.back().get());
    b.dispatch.push_back(std::make_unique<ExpertParallel>(
        units_.back().get(), ep, cfg_.num_experts, cfg_.expert_mlp(), cfg_.moe_grouped_gemm));
    if (cfg_.moe_router_enable_expert_bias) {
      b.biases.push_back(std::make_unique<RouterBias>(make_router_bias(at::zeros(
          {cfg_.num_experts}, at::TensorOptions().dtype(at::kFloat).device(opt_.device)))));
      router_biases_.emplace_back(router_bias_name(prefix), b.biases.back().get());
    }
  }
  return b;
}

void PipelineStage::update_router_biases() {
  if (router_biases_.empty()) return;
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> pairs, bias;
  for (const auto& [name, b] : router_biases_) {
    pairs.push_back(b->pairs);
    bias.push_back(b->bias);
  }
  const at::Tensor total = at::stack(pairs);
  groups_.get("tp_dp_cp")->all_reduce(total, ReduceOp::kSum);
  const at::Tensor updated =
      updated_expert_bias(total, at::stack(bias), cfg_.moe_router_bias_update_rate);
  for (size_t i = 0; i < router_biases_.size(); ++i) {
    router_biases_[i].second->bias.copy_(updated[static_cast<int64_t>(i)]);
    router_biases_[i].second->pairs.zero_();
  }
}

bool PipelineStage::writes_router_biases() const {
  return !router_biases_.empty() && groups_.get("tp_dp_cp")->rank() == 0;
}

PipelineStage::~PipelineStage() = default;

bool PipelineStage::is_expert_unit(const FsdpUnit* u) const {
  for (const auto* blocks : {&layers_, &mtp_})
    for (const Block& b : *blocks)
      for (const FsdpUnit* e : b.experts)
        if (e == u) return true;
  return false;
}

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

void PipelineStage::reset_losses() { losses_.zero_(); }

at::Tensor PipelineStage::account_aux(const at::Tensor& aux, double weight, double objective_weight) {
  if (!aux.defined()) return {};
  const at::Tensor logged = aux.detach().to(at::kDouble) * (weight / cfg_.num_moe_layers());
  losses_.select(0, 1).add_(logged[0]);
  losses_.select(0, 3).add_(logged[1]);
  at::Tensor objective;
  if (cfg_.moe_router_load_balancing_type != "none" && cfg_.moe_aux_loss_coeff != 0)
    objective = aux[0] * (cfg_.moe_aux_loss_coeff * objective_weight);
  if (cfg_.moe_z_loss_coeff != 0) {
    const at::Tensor z = aux[1] * (cfg_.moe_z_loss_coeff * objective_weight);
    objective = objective.defined() ? objective + z : z;
  }
  return objective;
}

void PipelineStage::for_units(const Block& b, void (FsdpUnit::*f)()) {
  (b.dense->*f)();
  for (FsdpUnit* e : b.experts) (e->*f)();
}

at::Tensor PipelineStage::forward(int mb, const at::Tensor& input, const at::Tensor& labels,
                                  double loss_scale, const LossOptions& loss) {
  set_microbatch(mb);
  size_t k = 0;  // units of forward_order_ started so far
  // Starts the next unit of forward order and issues the gather of the one after it.
  auto next = [&] {
    ++k;
    if (opt_.overlap_param_gather && k < forward_order_.size()) forward_order_[k]->unshard();
  };
  if (opt_.overlap_param_gather && !forward_order_.empty()) forward_order_[0]->unshard();
  auto start = [&](const Block& b) {
    for (size_t i = 0; i <= b.experts.size(); ++i) next();
  };
  auto done = [](const Block& b) { for_units(b, &FsdpUnit::reshard); };
  // Each layer leaves its last residual add to the next norm (transformer.h, Residual).
  Residual x{input, {}};
  at::Tensor aux;  // this microbatch's unweighted [aux, z] losses, summed over MoE layers
  if (is_first()) {
    next();
    x.x = embed_tokens(input, embedding_->handle(0));
    embedding_->reshard();
  }
  // Layers in chunks (one unless --recompute-granularity full); a recomputed chunk keeps only
  // its inputs, and its start/done bookkeeping runs in the forward's own run only (the rerun in
  // the backward gathers through forward_weight, and the last gradient frees).
  for (const RecomputeChunk& c : recompute_chunks(static_cast<int>(layers_.size()), cfg_.recompute)) {
    auto run = [this, c](Residual r, at::Tensor* aux_sum, const auto& before, const auto& after) {
      for (int i = c.begin; i < c.end; ++i) {
        before(layers_[i]);
        r = decoder_layer(std::move(r), layers_[i].layer, rope_, cfg_, aux_sum);
        after(layers_[i]);
      }
      return r;
    };
    if (!c.recompute || !at::GradMode::is_enabled()) {
      x = run(std::move(x), &aux, start, done);
      continue;
    }
    // The chunk keeps one tensor: the pending add is done first (the same bits as inside the
    // next norm). `start` and `done` are this call's: the piece uses them only when `first`
    // (inside this forward), never in the backward's rerun.
    if (x.delta.defined()) x = Residual{x.hidden(), {}};
    auto out = recomputed(
        [this, c, run, &start, &done](const std::vector<at::Tensor>& in, bool first) {
          at::Tensor sum = in[2];
          const auto nothing = [](const Block&) {};
          // In the rerun a layer's weights are freed after its forward, as in the first run,
          // except the chunk's last layer, whose backward comes next: a chunk's rerun holds one
          // layer's gathered weights at a time, as the plain schedule does.
          const Block* last = &layers_[c.end - 1];
          const auto free_but_last = [last](const Block& b) {
            if (&b != last) for_units(b, &FsdpUnit::reshard);
          };
          // The backward's next layer is the one before this chunk, whose units have no pending
          // use to prefetch them by (FsdpUnit::on_backward_touch) until they rerun: with
          // --overlap-param-gather their gather starts now, beside this chunk's rerun.
          if (!first && opt_.overlap_param_gather && c.begin > 0)
            for_units(layers_[c.begin - 1], &FsdpUnit::unshard);
          const Residual r = first ? run(Residual{in[0], in[1]}, &sum, start, done)
                                   : run(Residual{in[0], in[1]}, &sum, nothing, free_but_last);
          return std::vector<at::Tensor>{r.x, r.delta, sum};
        },
        {x.x, x.delta, aux});
    x = Residual{out[0], out[1]};
    aux = out[2];
  }
  // This microbatch's share of the step: micro batch / global batch.
  const double share = loss_scale * static_cast<double>(input.size(0)) * cfg_.seq_length;
  const bool masked = loss.mask.defined();
  // --calculate-per-token-loss: 1 / the step's counted positions (log_scale with a mask; a
  // middle stage gets log_scale without the mask itself).
  const double per_position = loss.log_scale > 0 ? loss.log_scale : loss_scale;
  const double aux_weight =
      loss.per_token ? per_position * static_cast<double>(input.size(0)) * cfg_.seq_length : share;
  if (!is_last()) {
    at::Tensor obj = account_aux(aux, share, aux_weight);
    if (obj.defined() && at::GradMode::is_enabled()) aux_objective_[mb] = obj;
    return x.hidden();
  }
  next();
  at::Tensor h = final_norm(x, final_norm_->handle(0), cfg_);  // the last add inside
  final_norm_->reshard();
  if (embedding_copy_) next();
  if (!cfg_.tied()) next();
  const int64_t s = cfg_.seq_length;
  const int depths = cfg_.mtp_num_layers;
  // --eod-mask-loss: the masked positions' labels become -100, which the cross entropy skips
  // (the MTP inputs below still embed the real labels).
  const at::Tensor loss_labels = masked ? labels.masked_fill(loss.mask.eq(0), -100) : labels;
  // Megatron's per-microbatch mean over the unmasked positions of [d, s): share / count.
  auto masked_mean = [&](int64_t d) {
    return loss.mask.narrow(1, d, s - d).sum().clamp_min(1).reciprocal().mul(share);
  };
  const at::Tensor lm_sum = lm_loss_sum(output_logits(h, output_->handle(0)), loss_labels);
  if (cfg_.mtp_num_layers == 0) output_->reshard();  // MTP reuses it below
  const at::Tensor lm = masked && !loss.per_token ? lm_sum * masked_mean(0) : lm_sum.mul(per_position);
  losses_.select(0, 0).add_((masked ? lm_sum * loss.log_scale : lm).detach().to(at::kDouble));
  at::Tensor objective = lm;

  for (int d = 1; d <= depths; ++d) {
    const Block& b = mtp_[d - 1];
    // The embedding and the output layer stay gathered through the depths (one gather each).
    at::Tensor emb = embed_tokens(mtp_input_tokens(labels, d), mtp_embedding_->handle(0));
    // Megatron recomputes each depth with the uniform method (as one layer), none with block.
    if (cfg_.recompute.mtp_depths() && at::GradMode::is_enabled()) {
      auto out = recomputed(
          [this, &b, &start, &done](const std::vector<at::Tensor>& in, bool first) {
            at::Tensor sum = in[2];
            if (first) start(b);  // this call's bookkeeping, in the forward's own run only
            at::Tensor y = mtp_layer(in[0], in[1], b.mtp, rope_, cfg_, &sum);
            if (first) done(b);
            return std::vector<at::Tensor>{y, sum};
          },
          {h, emb, aux});
      h = out[0];
      aux = out[1];
    } else {
      start(b);
      h = mtp_layer(h, emb, b.mtp, rope_, cfg_, &aux);
      done(b);
    }
    // Position t predicts label t+d; the last d positions have none. Mean over the step's
    // valid positions, averaged over depths.
    const at::Tensor logits = output_logits(h, output_->handle(0));
    const at::Tensor ce_sum =
        lm_loss_sum(logits.narrow(1, 0, s - d), loss_labels.narrow(1, d, s - d));
    const at::Tensor ce =
        masked ? ce_sum * masked_mean(d) / depths
               : ce_sum.mul(loss_scale * static_cast<double>(s) / static_cast<double>(s - d) / depths);
    losses_.select(0, 2).add_(ce.detach().to(at::kDouble));
    const at::Tensor weighed = loss.per_token ? ce_sum.mul(per_position / depths) : ce;
    objective = objective + weighed * cfg_.mtp_loss_scaling_factor;
  }
  if (depths > 0) {
    mtp_embedding_->reshard();
    output_->reshard();
  }
  if (at::Tensor obj = account_aux(aux, share, aux_weight); obj.defined())
    objective = objective + obj;
  return objective;
}

void PipelineStage::backward(int mb, const at::Tensor& output, const at::Tensor& grad) {
  set_microbatch(mb);
  auto aux = aux_objective_.find(mb);
  if (grad.defined() && aux != aux_objective_.end()) {
    torch::autograd::backward({output, aux->second}, {grad, at::ones_like(aux->second)});
  } else if (grad.defined()) {
    torch::autograd::backward({output}, {grad});
  } else {
    torch::autograd::backward({output});
  }
  if (aux != aux_objective_.end()) aux_objective_.erase(aux);
  reduce_queue_.drain();
  for (auto& u : units_) u->zero_unwritten_grads();
  for (auto& u : units_)
    WEFT_CHECK(!u->has_pending_grads(mb), "unit {}: a forward use of microbatch {} got no gradient",
               u->name(), mb);
}

}  // namespace weft
