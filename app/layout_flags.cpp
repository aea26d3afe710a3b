// Registers the layout flags (see layout_flags.h). Values are range-checked by the mesh, which
// names the flag in its message, so no CLI11 validators here.
#include "layout_flags.h"

namespace weft::app {

void add_layout_flags(CLI::App* cmd, LayoutConfig* cfg) {
  cmd->add_option("--tensor-model-parallel-size", cfg->tp, "tensor parallel size (tp)")
      ->capture_default_str();
  cmd->add_option("--context-parallel-size", cfg->cp, "context parallel size (cp)")
      ->capture_default_str();
  cmd->add_option("--pipeline-model-parallel-size", cfg->pp, "pipeline parallel size (pp)")
      ->capture_default_str();
  cmd->add_option("--expert-model-parallel-size", cfg->ep, "expert parallel size (ep)")
      ->capture_default_str();
  cmd->add_option("--expert-tensor-parallel-size", cfg->etp,
                  "expert tensor parallel size (etp); -1 means: same as tp")
      ->capture_default_str();
  cmd->add_option("--num-distributed-optimizer-instances", cfg->dp_outer,
                  "HSDP replicas (dp_outer): FSDP shards within dp*cp/N ranks, replicates across N")
      ->capture_default_str();
  cmd->add_flag("--use-tp-pp-dp-mapping", cfg->tp_pp_dp_mapping,
                "rank order tp-cp-ep-pp-dp instead of the default tp-cp-ep-dp-pp");
}

}  // namespace weft::app
