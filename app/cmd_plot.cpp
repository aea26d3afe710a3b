// `weft plot`: the lm loss (with the validation loss as points), grad norm, learning rate and
// throughput of one or more --log-jsonl files against the iteration, in 2x2 panels of one PNG,
// the runs overlaid in one colour each with their file names as the legend. gnuplot draws it
// (pngcairo terminal), driven through a pipe with the data inline as datablocks; weft only
// reads the JSONL and writes the script. Needs no MPI and no torch.
//
// Input: the lines `weft train --log-jsonl` writes (train/trainer.cpp): iteration lines with
// "iteration", "lm_loss", "grad_norm", "lr", "tokens_per_sec", and validation lines with
// "iteration" and "valid_lm_loss" (one curve per "valid_set" of --multiple-validation-sets; a
// test line, "test_lm_loss", is skipped). Every line must be
// a JSON object with "iteration"; a file must hold at least one iteration line. Non-finite or null values (a skipped iteration) are
// gaps; a panel where no run has a value says so instead of failing.
#include "cmd_plot.h"

#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <algorithm>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "weft/core/error.h"

namespace weft::app {
namespace {

struct PlotArgs {
  std::vector<std::string> files;
  std::string output = "plot.png";
  int width = 1200, height = 800;
  std::string title;
};

struct Run {
  std::string name;
  std::string train;  // "iteration lm_loss grad_norm lr tokens_per_sec" rows
  struct Valid {
    std::string set;   // "valid_set" (--multiple-validation-sets), "" for the one validation
    std::string rows;  // "iteration valid_lm_loss" rows
    bool has = false;  // some row has a value
  };
  std::vector<Valid> valid;  // in the order the sets first appear
  bool has[6] = {};   // has[c]: some train row has a value in column c (2..5)
};

// A number for gnuplot; '?' (set datafile missing) for a non-finite or absent value.
std::string num(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return "?";
  const double v = it->get<double>();
  return std::isfinite(v) ? fmt::format("{:.9g}", v) : "?";
}

Run read_run(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail_usage("{}: cannot open", path);
  Run run{path, "", {}};
  std::string line;
  int n = 0, iterations = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception& e) {
      fail_usage("{}: line {} is not JSON ({})", path, n, e.what());
    }
    if (!j.is_object() || !j.contains("iteration") || !j["iteration"].is_number_integer())
      fail_usage("{}: line {} has no integer \"iteration\" (not a weft train "
                 "--log-jsonl file?)", path, n);
    const std::string it = std::to_string(j["iteration"].get<int64_t>());
    if (j.contains("test_lm_loss")) continue;  // the one test-split loss at the end: not drawn
    if (j.contains("valid_lm_loss")) {
      const std::string v = num(j, "valid_lm_loss");
      const std::string set = j.value("valid_set", std::string());
      auto s = std::find_if(run.valid.begin(), run.valid.end(),
                            [&](const Run::Valid& x) { return x.set == set; });
      if (s == run.valid.end()) s = run.valid.insert(run.valid.end(), Run::Valid{set, "", false});
      s->has = s->has || v != "?";
      s->rows += fmt::format("{} {}\n", it, v);
    } else {
      ++iterations;
      const std::string v[4] = {num(j, "lm_loss"), num(j, "grad_norm"), num(j, "lr"),
                                num(j, "tokens_per_sec")};
      for (int c = 0; c < 4; ++c) run.has[c + 2] = run.has[c + 2] || v[c] != "?";
      run.train += fmt::format("{} {} {} {} {}\n", it, v[0], v[1], v[2], v[3]);
    }
  }
  if (iterations == 0) fail_usage("{}: no iteration lines", path);
  return run;
}

// A gnuplot single-quoted string ('' is a quote inside one).
std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

std::string find_gnuplot() {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string exe = (std::filesystem::path(dir.empty() ? "." : dir) / "gnuplot").string();
    if (::access(exe.c_str(), X_OK) == 0) return exe;
  }
  fail_usage("gnuplot was not found on PATH (install it: apt-get install gnuplot-nox)");
}

std::string script(const PlotArgs& a, const std::vector<Run>& runs) {
  std::string s = fmt::format(
      "set terminal pngcairo noenhanced size {},{} font ',10'\nset output {}\n"
      "set datafile missing '?'\n",
      a.width, a.height, quoted(a.output));
  for (size_t r = 0; r < runs.size(); ++r) {
    s += fmt::format("$train{} << EOD\n{}EOD\n", r, runs[r].train);
    for (size_t k = 0; k < runs[r].valid.size(); ++k)
      s += fmt::format("$valid{}_{} << EOD\n{}EOD\n", r, k, runs[r].valid[k].rows);
  }
  s += fmt::format("set multiplot layout 2,2 title {}\nset grid\nset xlabel 'iteration'\n",
                   quoted(a.title));
  struct Panel {
    const char* title;
    int column;
    const char* format;
  };
  const Panel panels[] = {{"lm loss", 2, "% h"},
                          {"grad norm", 3, "% h"},
                          {"learning rate", 4, "%.1e"},
                          {"throughput (tokens/s)", 5, "% h"}};
  for (const Panel& p : panels) {
    s += fmt::format("set title {}\nset format y '{}'\n", quoted(p.title), p.format);
    // The legend (file names) once, in the loss panel.
    s += p.column == 2 ? "set key top right opaque box samplen 2\n" : "unset key\n";
    std::vector<std::string> curves;
    int with_points = 0;  // gnuplot refuses a plot whose curves have no point at all
    for (size_t r = 0; r < runs.size(); ++r) {
      if (runs[r].has[p.column]) {
        curves.push_back(fmt::format("$train{} using 1:{} with lines lw 1.5 lc {} title {}", r,
                                     p.column, r + 1, quoted(runs[r].name)));
        ++with_points;
      } else if (p.column == 2) {  // no loss values: the run's name stays in the legend
        curves.push_back(fmt::format("NaN with lines lw 1.5 lc {} title {}", r + 1,
                                     quoted(runs[r].name)));
      }
      for (size_t k = 0; p.column == 2 && k < runs[r].valid.size(); ++k) {
        const Run::Valid& v = runs[r].valid[k];
        if (!v.has) continue;
        curves.push_back(fmt::format(
            "$valid{}_{} using 1:2 with linespoints lw 2 dt 2 pt {} ps 1.3 lc {} title {}", r, k,
            7 + k, r + 1,
            quoted(runs[r].name + (v.set.empty() ? " (validation)" : " (validation-" + v.set + ")"))));
        ++with_points;
      }
    }
    if (with_points == 0) {  // every run's values are null here (e.g. only skipped iterations)
      s += "unset key\nset label 1 'no values' at graph 0.5, graph 0.5 center\n"
           "plot [0:1] [0:1] NaN notitle\n"
           "unset label 1\n";
      continue;
    }
    s += "plot ";
    for (size_t i = 0; i < curves.size(); ++i) s += (i ? ", \\\n     " : "") + curves[i];
    s += "\n";
  }
  return s + "unset multiplot\nset output\n";
}

void plot(const PlotArgs& a) {
  if (a.width < 100 || a.width > 10000)
    fail_usage("--width must be in [100, 10000] (got {})", a.width);
  if (a.height < 100 || a.height > 10000)
    fail_usage("--height must be in [100, 10000] (got {})", a.height);
  std::vector<Run> runs;
  for (const std::string& f : a.files) runs.push_back(read_run(f));
  const std::string gnuplot = find_gnuplot();
  // The output must be writable before gnuplot starts: where its `set output` fails, gnuplot
  // writes the PNG to its standard output. A stale file goes first, so that it cannot pass for
  // a result (and a read-only one in a writable directory is replaced, not refused).
  std::error_code ec;
  std::filesystem::remove(a.output, ec);
  if (FILE* probe = std::fopen(a.output.c_str(), "wb"))
    std::fclose(probe);
  else
    fail_usage("--output {}: cannot write ({})", a.output, std::strerror(errno));
  std::filesystem::remove(a.output, ec);
  // gnuplot's standard output is discarded (never image bytes on the terminal); its errors
  // stay on standard error.
  FILE* pipe = ::popen(fmt::format("'{}' > /dev/null", gnuplot).c_str(), "w");
  if (pipe == nullptr) fail("cannot start {}", gnuplot);
  const std::string text = script(a, runs);
  const bool wrote = std::fwrite(text.data(), 1, text.size(), pipe) == text.size();
  const int status = ::pclose(pipe);
  if (!wrote || status != 0 || !std::filesystem::exists(a.output)) {
    std::filesystem::remove(a.output, ec);  // a partial image is no result either
    fail("gnuplot failed writing {} (exit status {})", a.output,
         WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  }
  fmt::print("weft plot: wrote {} ({} run{})\n", a.output, runs.size(), runs.size() > 1 ? "s" : "");
}

}  // namespace

void add_plot_command(CLI::App* app) {
  auto a = std::make_shared<PlotArgs>();
  CLI::App* c = app->add_subcommand(
      "plot", "plot loss, grad norm, learning rate and throughput of --log-jsonl files (gnuplot)");
  c->add_option("FILES", a->files, "weft train --log-jsonl files, overlaid")->required();
  c->add_option("-o,--output", a->output, "the PNG to write")->capture_default_str();
  c->add_option("--width", a->width, "image width in pixels")->capture_default_str();
  c->add_option("--height", a->height, "image height in pixels")->capture_default_str();
  c->add_option("--title", a->title, "a title above the panels");
  c->callback([a] { plot(*a); });
}

}  // namespace weft::app
