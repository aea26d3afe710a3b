// Registry of the runtime subcommands (see commands.h).
#include "commands.h"

namespace weft::app {

void add_more_commands(CLI::App* app, int argc, char** argv) {
  (void)app;
  (void)argc;
  (void)argv;
}

}  // namespace weft::app
