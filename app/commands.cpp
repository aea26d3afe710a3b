// Registry of every subcommand (see commands.h).
#include "commands.h"

#include "cmd_ckpt.h"
#include "cmd_data.h"
#include "cmd_generate.h"
#include "cmd_mesh.h"
#include "cmd_plan.h"
#include "cmd_plot.h"
#include "cmd_train.h"
#include "cmd_verify_resume.h"

namespace weft::app {

void add_subcommands(CLI::App* app, int argc, char** argv) {
  static int s_argc;
  static char** s_argv;
  s_argc = argc;
  s_argv = argv;
  add_mesh_command(app);
  add_train_command(app, &s_argc, &s_argv);
  add_ckpt_command(app);
  add_data_command(app);
  add_generate_command(app);
  add_plan_command(app);
  add_verify_resume_command(app, &s_argc, &s_argv);
  add_plot_command(app);
}

}  // namespace weft::app
