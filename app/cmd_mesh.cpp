// `weft mesh --world-size N <layout flags> [--json]`: the layout as a readable table (per rank:
// coordinates and the members of each of its groups) or as JSON with every group of every kind.
// Needs no MPI: the mesh is pure arithmetic.
#include "cmd_mesh.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "layout_flags.h"
#include "weft/mesh/mesh.h"

namespace weft::app {
namespace {

struct MeshArgs {
  LayoutConfig layout;
  bool json = false;
};

nlohmann::ordered_json mesh_json(const Mesh& m) {
  nlohmann::ordered_json j;
  j["world"] = m.world_size();
  j["order"] = m.order();
  j["sizes"] = {{"tp", m.tp()}, {"cp", m.cp()},   {"ep", m.ep()},   {"etp", m.etp()},
                {"pp", m.pp()}, {"dp", m.dp()},   {"edp", m.edp()}, {"dp_outer", m.dp_outer()}};
  nlohmann::ordered_json groups = nlohmann::ordered_json::object();
  for (const auto& kind : mesh_group_kinds()) groups[kind] = m.groups(kind);
  j["groups"] = groups;
  return j;
}

void print_table(const Mesh& m) {
  fmt::print("world {}  order {}  tp {} cp {} pp {} dp {}  ep {} etp {} edp {}  dp_outer {}\n",
             m.world_size(), m.order(), m.tp(), m.cp(), m.pp(), m.dp(), m.ep(), m.etp(), m.edp(),
             m.dp_outer());
  const char* axes[] = {"tp", "cp", "dp", "pp", "etp", "ep", "edp"};
  for (int r = 0; r < m.world_size(); ++r) {
    fmt::print("rank {:>4}:", r);
    for (const char* a : axes) fmt::print(" {}={}", a, m.coord(r, a));
    fmt::print("\n");
    for (const auto& kind : mesh_group_kinds()) {
      if (!m.has_group(kind, r)) continue;
      fmt::print("    {:<22} {}\n", kind, m.group_of(kind, r));
    }
  }
}

}  // namespace

void add_mesh_command(CLI::App* app) {
  auto args = std::make_shared<MeshArgs>();
  CLI::App* cmd = app->add_subcommand("mesh", "print every rank's coordinates and groups");
  cmd->add_option("--world-size", args->layout.world_size, "number of ranks")
      ->capture_default_str();
  add_layout_flags(cmd, &args->layout);
  cmd->add_flag("--json", args->json, "print JSON instead of a table");
  cmd->callback([args] {
    Mesh m(args->layout);
    if (args->json)
      std::cout << mesh_json(m).dump() << "\n";
    else
      print_table(m);
  });
}

}  // namespace weft::app
