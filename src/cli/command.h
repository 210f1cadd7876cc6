// internal: not part of the public API.
//
// The `inprof` tool's subcommands. Each is a name, a one-line summary for
// `inprof --help`, its own help text and an entry point taking the arguments
// after its name. Exit codes: 0 success, 1 failure, 2 usage error (a
// command that runs a program, like `inprof run`, exits with the program's
// status instead).
#ifndef INPROF_CLI_COMMAND_H_
#define INPROF_CLI_COMMAND_H_

#include <span>
#include <string>

namespace inprof::cli {

struct Command {
  const char* name;
  const char* summary;
  const char* help;  // shown by `inprof help NAME` and `inprof NAME --help`
  int (*main)(int argc, char** argv);  // argv[0] is the command's name
};

// Every command, in the order `inprof --help` lists them.
std::span<const Command> Commands();

// The commands' entry points and help texts: run_command.cc, and the
// report commands in report_commands.cc.
int RunMain(int argc, char** argv);
extern const char kRunHelp[];
int TopMain(int argc, char** argv);
extern const char kTopHelp[];
int CollapsedMain(int argc, char** argv);
extern const char kCollapsedHelp[];
int SpeedscopeMain(int argc, char** argv);
extern const char kSpeedscopeHelp[];
int FlamegraphMain(int argc, char** argv);
extern const char kFlamegraphHelp[];
int DiffMain(int argc, char** argv);
extern const char kDiffHelp[];
int AgentMain(int argc, char** argv);  // agent_command.cc
extern const char kAgentHelp[];
int StacksMain(int argc, char** argv);  // stacks_command.cc
extern const char kStacksHelp[];

// Prints "inprof COMMAND: MESSAGE" on stderr (one line).
void PrintError(const char* command, const std::string& message);

}  // namespace inprof::cli

#endif  // INPROF_CLI_COMMAND_H_
