// The `inprof` tool: `inprof COMMAND [OPTIONS] [ARGS]`, `inprof help
// COMMAND`, `inprof --help`, `inprof --version`. Adding a command is one
// entry in Commands() and one file with its entry point.
#include <cstdio>
#include <cstring>
#include <string>

#include "src/cli/command.h"

#ifndef INPROF_VERSION
#define INPROF_VERSION "unknown"
#endif

namespace inprof::cli {

std::span<const Command> Commands() {
  static const Command kCommands[] = {
      {"run", "profile an unmodified program: inprof run [OPTIONS] -- CMD [ARGS]",
       kRunHelp, &RunMain},
      {"top", "top functions (or threads, labels): inprof top PROFILE",
       kTopHelp, &TopMain},
      {"collapsed", "folded stacks for flamegraph.pl: inprof collapsed PROFILE",
       kCollapsedHelp, &CollapsedMain},
      {"speedscope", "speedscope's JSON: inprof speedscope PROFILE -o out.json",
       kSpeedscopeHelp, &SpeedscopeMain},
      {"flamegraph", "interactive flame graph page: inprof flamegraph PROFILE -o out.html",
       kFlamegraphHelp, &FlamegraphMain},
      {"diff", "differential flame graph: inprof diff BASE NEW -o diff.html",
       kDiffHelp, &DiffMain},
      {"agent", "the out-of-process agent: profiles processes that forward to it",
       kAgentHelp, &AgentMain},
      {"stacks", "every thread's stack of a running process now: inprof stacks PID",
       kStacksHelp, &StacksMain},
  };
  return kCommands;
}

void PrintError(const char* command, const std::string& message) {
  std::string line = command == nullptr ? std::string("inprof: ")
                                        : std::string("inprof ") + command + ": ";
  line += message;
  line += '\n';
  fputs(line.c_str(), stderr);
}

namespace {

void PrintUsage(FILE* out) {
  fputs(
      "usage: inprof COMMAND [OPTIONS] [ARGS]\n"
      "\n"
      "inprof is an in-process CPU and wall-time profiler writing pprof files.\n"
      "\n"
      "Commands:\n",
      out);
  for (const Command& c : Commands()) {
    fprintf(out, "  %-10s %s\n", c.name, c.summary);
  }
  fputs(
      "  help       inprof help COMMAND: a command's options\n"
      "\n"
      "Options: -h/--help (this text; COMMAND --help for a command's),\n"
      "         --version\n",
      out);
}

const Command* Find(const char* name) {
  for (const Command& c : Commands()) {
    if (std::strcmp(c.name, name) == 0) return &c;
  }
  return nullptr;
}

}  // namespace
}  // namespace inprof::cli

int main(int argc, char** argv) {
  using namespace inprof::cli;
  if (argc < 2) {
    PrintUsage(stderr);
    return 2;
  }
  const char* name = argv[1];
  if (std::strcmp(name, "-h") == 0 || std::strcmp(name, "--help") == 0) {
    PrintUsage(stdout);
    return 0;
  }
  if (std::strcmp(name, "--version") == 0) {
    printf("inprof %s\n", INPROF_VERSION);
    return 0;
  }
  if (std::strcmp(name, "help") == 0) {
    if (argc < 3) {
      PrintUsage(stdout);
      return 0;
    }
    const Command* c = Find(argv[2]);
    if (c == nullptr) {
      PrintError(nullptr, std::string("unknown command '") + argv[2] +
                              "' (inprof --help lists them)");
      return 2;
    }
    fputs(c->help, stdout);
    return 0;
  }
  const Command* c = Find(name);
  if (c == nullptr) {
    PrintError(nullptr, std::string("unknown command '") + name +
                            "' (inprof --help lists them)");
    return 2;
  }
  return c->main(argc - 1, argv + 1);
}
