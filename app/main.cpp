// The `weft` command: parses the subcommand and maps errors to exit codes. Bad input
// (weft::UsageError, CLI parse errors) exits 2 with one line on stderr naming the flag; any
// other error exits 1.
#include <fmt/format.h>
#include <torch/version.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "commands.h"
#include "weft/comm/communicator.h"
#include "weft/comm/mpi_runtime.h"
#include "weft/comm/process_groups.h"
#include "weft/core/error.h"

namespace {

// Under a launcher every rank parses the same command line, so a bad flag is found by every
// rank before MPI starts; rank 0 alone prints it, so that the user reads one line. (Known
// limit: a rank > 0 started with other flags by an MPMD mpirun line, failing alone, stays
// silent; mpirun reports its exit code 2.)
bool this_rank_prints_parse_errors() {
  static const char* const kRankVars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK",
                                          "SLURM_PROCID"};
  for (const char* v : kRankVars)
    if (const char* r = std::getenv(v)) return std::string(r) == "0";
  return true;
}

// A rank that stays silent exits a moment later than the one that prints: a launcher kills
// the other ranks as soon as one exits with an error, and would take the printing rank's line
// with it when that rank is slower to reach the same error (a loaded machine). Errors found
// after MPI started go through the commands' own agreement instead (cmd_train.cpp).
int silent_exit(int code) {
  if (!this_rank_prints_parse_errors()) std::this_thread::sleep_for(std::chrono::seconds(1));
  return code;
}

std::string version_string() {
  std::string nccl = weft::nccl_available() ? weft::nccl_version() : "not built";
  return fmt::format("weft {}\n  libtorch {}\n  MPI {}\n  NCCL {}", WEFT_VERSION, TORCH_VERSION,
                     weft::MpiRuntime::library_version(), nccl);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"weft: hybrid-parallel LLM training (FSDP/HSDP x pipeline x experts)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", version_string);
  weft::app::add_subcommands(&app, argc, argv);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::RuntimeError& e) {
    return e.get_exit_code();  // a command's own non-zero result (e.g. ckpt diff: differences)
  } catch (const CLI::ParseError& e) {
    if (this_rank_prints_parse_errors()) std::cerr << "weft: error: " << e.what() << " (see weft --help)\n";
    return silent_exit(2);
  } catch (const weft::UsageError& e) {
    if (this_rank_prints_parse_errors()) std::cerr << "weft: error: " << e.what() << "\n";
    return silent_exit(2);
  } catch (const std::exception& e) {
    std::cerr << "weft: fatal: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
