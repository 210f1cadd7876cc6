// Output targets (safety): every writer of inprof (the library's
// INPROF_OUTPUT through WriteFileAtomically, `inprof run -o`, the report
// commands' -o) writes into a FIFO or character device as what it is and
// never replaces it, refuses a symbolic link at the path, is not fooled by a
// link planted under its temporary name, treats `-` as standard output where
// a command writes one file, and a process tree whose output pattern has no
// %p loses no profile.
//
// A check that could damage the machine before its fix uses a FIFO or a
// character device made with mknod in a scratch directory; the real
// /dev/null is written only after such a copy survived the same write.
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inprof/pprof_reader.h"
#include "inprof/sink.h"
#include "safety/safety_util.h"
#include "util/test_util.h"

namespace inprof {
namespace {

using ::inprof::testing::CommandOutput;
using ::inprof::testing::EnvOrEmpty;
using ::inprof::testing::RunCommandSeparately;
using ::inprof::testing::ShellQuote;
using ::inprof::testing::TestTmpDir;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr uid_t kNobody = 65534;

// `inprof run` preloads libinprof_preload.so into a program: built with a
// sanitizer, it needs that sanitizer's runtime loaded first (ASan refuses
// to start), and TSan does not support the fork() of a multi-threaded
// process (scripts/sanitizers.sh runs the run suite in the plain build only).
constexpr const char* kNoPreloadUnderSanitizers =
    "inprof run's preload cannot run under a sanitizer (see scripts/sanitizers.sh)";

std::string Cli() { return EnvOrEmpty("INPROF_CLI"); }
std::string Input() { return EnvOrEmpty("INPROF_REPORT_DATA") + "/go_cpu.pb.gz"; }

// A fresh directory for one test.
std::string FreshDir(const std::string& name) {
  const std::string dir = absl::StrCat(TestTmpDir(), "/safety_output_", name);
  (void)RunCommandSeparately(absl::StrCat("rm -rf ", ShellQuote(dir)));
  mkdir(dir.c_str(), 0755);
  return dir;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

mode_t TypeOf(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return 0;
  return st.st_mode & S_IFMT;
}

std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> out;
  auto r = RunCommandSeparately(absl::StrCat("ls -A ", ShellQuote(dir)));
  if (r.ok()) {
    for (absl::string_view line : absl::StrSplit(r->out, '\n', absl::SkipEmpty())) {
      out.emplace_back(line);
    }
  }
  return out;
}

CommandOutput Shell(const std::string& cmd) {
  auto r = RunCommandSeparately(cmd);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : CommandOutput{};
}

// Makes each of `links` -> `target`, as user nobody when root (another
// user who may write the directory), else as this user.
void PlantSymlinks(const std::string& target, const std::vector<std::string>& links) {
  auto plant = [&] {
    for (const std::string& link : links) {
      if (symlink(target.c_str(), link.c_str()) != 0) return false;
    }
    return true;
  };
  if (geteuid() != 0) {
    ASSERT_TRUE(plant()) << links[0];
    return;
  }
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (setgroups(0, nullptr) != 0 || setresgid(kNobody, kNobody, kNobody) != 0 ||
        setresuid(kNobody, kNobody, kNobody) != 0) {
      _exit(2);
    }
    _exit(plant() ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << links[0];
}

void PlantSymlink(const std::string& target, const std::string& link) {
  PlantSymlinks(target, {link});
}

// A directory another user may write (no sticky bit: the kernel's
// protected_symlinks does not shield what follows links there).
std::string SharedDir(const std::string& name) {
  const std::string dir = FreshDir(name);
  chmod(dir.c_str(), 0777);
  return dir;
}

// A FIFO with a reader opened (non-blocking, so nothing waits): what a
// writer writes stays in the pipe until ReadAll().
struct FifoWithReader {
  explicit FifoWithReader(const std::string& path) : path(path) {
    EXPECT_EQ(mkfifo(path.c_str(), 0644), 0) << path;
    fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    EXPECT_GE(fd, 0) << path;
  }
  ~FifoWithReader() {
    if (fd >= 0) close(fd);
  }
  // What writers wrote and closed so far.
  std::string ReadAll() {
    std::string out;
    char buf[65536];
    for (;;) {
      const ssize_t n = read(fd, buf, sizeof buf);
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
    return out;
  }
  std::string path;
  int fd = -1;
};

TEST(SafetyOutputTest, AFifoIsWrittenIntoNeverReplaced) {
  const std::string dir = FreshDir("fifo");
  FifoWithReader fifo(dir + "/out.pb.gz");
  ASSERT_GE(fifo.fd, 0);
  const std::string bytes(1000, 'x');
  absl::Status st = WriteFileAtomically(fifo.path, bytes);
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(TypeOf(fifo.path), S_IFIFO);
  EXPECT_EQ(fifo.ReadAll(), bytes);
  EXPECT_THAT(Entries(dir), ::testing::ElementsAre("out.pb.gz"));
}

// More than a pipe holds: the writer waits for its reader, which drains.
TEST(SafetyOutputTest, AFifoTakesMoreThanAPipeHoldsFromAReaderThatReads) {
  const std::string dir = FreshDir("fifo_large");
  FifoWithReader fifo(dir + "/out");
  ASSERT_GE(fifo.fd, 0);
  std::string bytes(4 << 20, 'y');
  std::string got;
  std::atomic<bool> done{false};
  std::thread reader([&] {
    while (got.size() < bytes.size() && !done.load()) {
      pollfd p{fifo.fd, POLLIN, 0};
      poll(&p, 1, 100);
      got += fifo.ReadAll();
    }
    got += fifo.ReadAll();
  });
  absl::Status st = WriteFileAtomically(fifo.path, bytes);
  done.store(true);
  reader.join();
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(got.size(), bytes.size());
  EXPECT_EQ(TypeOf(fifo.path), S_IFIFO);
}

TEST(SafetyOutputTest, AFifoNobodyReadsIsRefusedAtOnce) {
  const std::string dir = FreshDir("fifo_no_reader");
  const std::string path = dir + "/out.pb.gz";
  ASSERT_EQ(mkfifo(path.c_str(), 0644), 0);
  const auto start = std::chrono::steady_clock::now();
  absl::Status st = WriteFileAtomically(path, "bytes");
  EXPECT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("'" + path + "' is a FIFO that no process reads"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(TypeOf(path), S_IFIFO);
  EXPECT_THAT(Entries(dir), ::testing::ElementsAre("out.pb.gz"));
}

// A reader that opened the FIFO and never reads: the writer gives up after
// its 10 s bound instead of holding the exporter (or Stop()) forever.
TEST(SafetyOutputTest, AFifoWhoseReaderStallsIsGivenUpAfterTheBound) {
  const std::string dir = FreshDir("fifo_stall");
  FifoWithReader fifo(dir + "/out");
  ASSERT_GE(fifo.fd, 0);
  const auto start = std::chrono::steady_clock::now();
  absl::Status st = WriteFileAtomically(fifo.path, std::string(4 << 20, 'z'));
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_TRUE(absl::IsDeadlineExceeded(st)) << st;
  EXPECT_THAT(st.message(), HasSubstr("its reader took nothing for 10 s"));
  EXPECT_GE(took, std::chrono::seconds(9));
  EXPECT_LT(took, std::chrono::seconds(60));
  EXPECT_EQ(TypeOf(fifo.path), S_IFIFO);
}

// A character device: a copy of /dev/null made with mknod (root only),
// then, once that copy survived, the real /dev/null.
TEST(SafetyOutputTest, ACharacterDeviceIsWrittenIntoNeverReplaced) {
  if (geteuid() != 0) GTEST_SKIP() << "mknod needs root";
  const std::string dir = FreshDir("chardev");
  const std::string null_copy = dir + "/null";
  ASSERT_EQ(mknod(null_copy.c_str(), S_IFCHR | 0666, makedev(1, 3)), 0);
  absl::Status st = WriteFileAtomically(null_copy, "profile bytes");
  EXPECT_TRUE(st.ok()) << st;
  struct stat after;
  ASSERT_EQ(lstat(null_copy.c_str(), &after), 0);
  ASSERT_TRUE(S_ISCHR(after.st_mode)) << "the device was replaced";
  EXPECT_EQ(after.st_rdev, makedev(1, 3));
  EXPECT_THAT(Entries(dir), ::testing::ElementsAre("null"));

  // The report commands and `inprof run -o`, on the same copy.
  CommandOutput r = Shell(absl::StrCat(ShellQuote(Cli()), " flamegraph ",
                                     ShellQuote(Input()), " -o ", ShellQuote(null_copy)));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(TypeOf(null_copy), S_IFCHR) << "inprof flamegraph replaced the device";
  if (!safety::kSanitized) {
    r = Shell(absl::StrCat(ShellQuote(Cli()), " run -o ", ShellQuote(null_copy), " -- ",
                           ShellQuote(EnvOrEmpty("INPROF_RUN_TARGET")), " children"));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    ASSERT_EQ(TypeOf(null_copy), S_IFCHR) << "inprof run replaced the device";
    // Every process wrote into the device: no null_<pid> beside it.
    EXPECT_THAT(Entries(dir), ::testing::ElementsAre("null")) << r.err;
  }

  // The real one, now that the same writes left a copy alone.
  st = WriteFileAtomically("/dev/null", "profile bytes");
  EXPECT_TRUE(st.ok()) << st;
  struct stat dev_null;
  ASSERT_EQ(lstat("/dev/null", &dev_null), 0);
  EXPECT_TRUE(S_ISCHR(dev_null.st_mode));
  r = Shell(absl::StrCat(ShellQuote(Cli()), " flamegraph ", ShellQuote(Input()),
                       " -o /dev/null"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(lstat("/dev/null", &dev_null), 0);
  EXPECT_TRUE(S_ISCHR(dev_null.st_mode));
}

TEST(SafetyOutputTest, ADirectoryAtThePathIsRefused) {
  const std::string dir = FreshDir("directory");
  const std::string path = dir + "/out.pb.gz";
  ASSERT_EQ(mkdir(path.c_str(), 0755), 0);
  absl::Status st = WriteFileAtomically(path, "bytes");
  EXPECT_THAT(st.message(), HasSubstr("'" + path + "' is a directory, not a regular file"));
  EXPECT_EQ(TypeOf(path), S_IFDIR);
}

// A link at the path is neither followed (its target stays as it was) nor
// replaced (the link stays): the write is refused in one line.
TEST(SafetyOutputTest, ASymlinkAtThePathIsRefusedAndItsTargetKept) {
  const std::string dir = SharedDir("symlink_path");
  const std::string victim_dir = FreshDir("symlink_path_victim");
  const std::string victim = victim_dir + "/precious";
  WriteFile(victim, "precious");
  const std::string path = dir + "/out.pb.gz";
  PlantSymlink(victim, path);

  absl::Status st = WriteFileAtomically(path, "profile bytes");
  EXPECT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("'" + path + "' is a symbolic link"));
  EXPECT_EQ(TypeOf(path), S_IFLNK);
  EXPECT_EQ(ReadFile(victim), "precious");

  const std::string html = dir + "/out.html";
  PlantSymlink(victim, html);
  CommandOutput r = Shell(absl::StrCat(ShellQuote(Cli()), " flamegraph ",
                                     ShellQuote(Input()), " -o ", ShellQuote(html)));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("'" + html + "' is a symbolic link"));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(TypeOf(html), S_IFLNK);
  EXPECT_EQ(ReadFile(victim), "precious");

  // `inprof run` says so before the program runs.
  r = Shell(absl::StrCat(ShellQuote(Cli()), " run -o ", ShellQuote(path), " -- ",
                         ShellQuote(EnvOrEmpty("INPROF_RUN_TARGET")), " spin 10"));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("'" + path + "': it is a symbolic link"));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(ReadFile(victim), "precious");
}

// A link as a *directory* of the path, put by another user (nobody) in a
// directory others can write: not followed (before, the profile went into
// the directory the link named, one of that user's choosing), refused in
// one line; the same in a sticky directory when the link is another
// user's. A link in a directory only this user (or root) can write, and
// this user's own link in a sticky one, are followed as before.
TEST(SafetyOutputTest, ALinkedDirectoryThatOthersCouldPlantIsNotFollowed) {
  const std::string victim = FreshDir("symlink_dir_victim");
  for (const mode_t mode : {0777, 01777}) {
    SCOPED_TRACE(mode);
    const std::string dir = SharedDir(absl::StrCat("symlink_dir_", mode));
    chmod(dir.c_str(), mode);
    PlantSymlink(victim, dir + "/sub");
    const std::string path = dir + "/sub/out.pb.gz";
    absl::Status st = WriteFileAtomically(path, "profile bytes");
    EXPECT_FALSE(st.ok());
    EXPECT_THAT(st.message(),
                HasSubstr(absl::StrCat("'", dir, "/sub' is a symbolic link in a directory "
                                       "that other users can write")));
    EXPECT_EQ(Entries(victim), std::vector<std::string>{});

    const std::string html = dir + "/sub/out.html";
    CommandOutput r = Shell(absl::StrCat(ShellQuote(Cli()), " flamegraph ",
                                         ShellQuote(Input()), " -o ", ShellQuote(html)));
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_THAT(r.err, HasSubstr("is a symbolic link in a directory that other users can write"));
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(Entries(victim), std::vector<std::string>{});
  }
  // This user's own links: followed, relative and absolute, also through a
  // sticky shared directory.
  const std::string own = FreshDir("symlink_dir_own");
  ASSERT_EQ(symlink(victim.c_str(), (own + "/abs").c_str()), 0);
  ASSERT_EQ(symlink("../safety_output_symlink_dir_victim", (own + "/rel").c_str()), 0);
  const std::string sticky = SharedDir("symlink_dir_sticky_own");
  chmod(sticky.c_str(), 01777);
  ASSERT_EQ(symlink(victim.c_str(), (sticky + "/mine").c_str()), 0);
  EXPECT_TRUE(WriteFileAtomically(own + "/abs/a.pb.gz", "a").ok());
  EXPECT_TRUE(WriteFileAtomically(own + "/rel/b.pb.gz", "b").ok());
  EXPECT_TRUE(WriteFileAtomically(sticky + "/mine/c.pb.gz", "c").ok());
  EXPECT_EQ(ReadFile(victim + "/a.pb.gz"), "a");
  EXPECT_EQ(ReadFile(victim + "/b.pb.gz"), "b");
  EXPECT_EQ(ReadFile(victim + "/c.pb.gz"), "c");
}

// `inprof run -o` under /proc, or under a file, is refused before the
// program runs, in one line that says why (before, root passed access()
// and learnt it only when each process failed to write at its end).
TEST(SafetyOutputTest, AnOutputUnderProcOrUnderAFileIsRefusedBeforeTheRun) {
  const std::string dir = FreshDir("output_under");
  WriteFile(dir + "/file", "a file");
  struct Case {
    std::string output, says;
  };
  for (const Case& c : {Case{"/proc/p.pb.gz", "'/proc' is in /proc, where no file can be created"},
                        Case{dir + "/file/p.pb.gz", absl::StrCat("'", dir, "/file' is not a directory")}}) {
    SCOPED_TRACE(c.output);
    CommandOutput r = Shell(absl::StrCat(ShellQuote(Cli()), " run -o ", ShellQuote(c.output),
                                         " -- ", ShellQuote(EnvOrEmpty("INPROF_RUN_TARGET")),
                                         " spin 10"));
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_EQ(r.err, absl::StrCat("inprof run: cannot write profiles to '", c.output, "': ",
                                  c.says, "\n"));
  }
}

// Links planted under the names the library's writer used to take
// (PATH.tmp.PID.N): it still writes, and follows none of them.
TEST(SafetyOutputTest, LinksPlantedAtTemporaryNamesAreNeverFollowed) {
  const std::string dir = SharedDir("symlink_tmp_library");
  const std::string victim_dir = FreshDir("symlink_tmp_library_victim");
  const std::string victim = victim_dir + "/precious";
  WriteFile(victim, "precious");
  const std::string path = dir + "/out.pb.gz";
  // Every counter value this process could have reached (the tests before
  // this one wrote a few files).
  std::vector<std::string> links;
  for (int i = 0; i < 256; ++i) {
    links.push_back(absl::StrCat(path, ".tmp.", getpid(), ".", i));
  }
  PlantSymlinks(victim, links);
  for (int i = 0; i < 4; ++i) {
    absl::Status st = WriteFileAtomically(path, absl::StrCat("profile ", i));
    EXPECT_TRUE(st.ok()) << st;
  }
  EXPECT_EQ(ReadFile(path), "profile 3");
  EXPECT_EQ(TypeOf(path), S_IFREG);
  EXPECT_EQ(ReadFile(victim), "precious");
}

// `inprof flamegraph -o PATH` used to open PATH.tmp.<its pid> with
// fopen("wb"): a link planted there by a user who may write the directory
// made it overwrite the link's target. The command is started held on a
// pipe, so the link is planted under its pid before it writes.
TEST(SafetyOutputTest, AReportCommandFollowsNoLinkPlantedAtItsTemporaryName) {
  const std::string dir = SharedDir("symlink_tmp_cli");
  const std::string victim_dir = FreshDir("symlink_tmp_cli_victim");
  const std::string victim = victim_dir + "/precious";
  WriteFile(victim, "precious");
  const std::string out = dir + "/out.html";
  int gate[2];
  ASSERT_EQ(pipe(gate), 0);
  const std::string cli = Cli();
  const std::string input = Input();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(gate[1]);
    char b;
    if (read(gate[0], &b, 1) != 1) _exit(3);
    execl(cli.c_str(), cli.c_str(), "flamegraph", input.c_str(), "-o", out.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(gate[0]);
  PlantSymlink(victim, absl::StrCat(out, ".tmp.", pid));
  ASSERT_EQ(write(gate[1], "x", 1), 1);
  close(gate[1]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(ReadFile(victim), "precious");
  EXPECT_EQ(TypeOf(out), S_IFREG);
  EXPECT_THAT(ReadFile(out), HasSubstr("<html"));
}

// Files the writers create are 0644 (less the umask), never wider.
TEST(SafetyOutputTest, WrittenFilesAreNotWritableByOthers) {
  const std::string dir = FreshDir("mode");
  const std::string path = dir + "/out.pb.gz";
  const mode_t old = umask(0);
  absl::Status st = WriteFileAtomically(path, "bytes");
  umask(old);
  ASSERT_TRUE(st.ok()) << st;
  struct stat s;
  ASSERT_EQ(stat(path.c_str(), &s), 0);
  EXPECT_EQ(s.st_mode & 07777, 0644u);
}

// `-` is standard output for a command that writes one file; `inprof run`,
// whose processes each write a profile, refuses it in one line and creates
// no file called "-".
TEST(SafetyOutputTest, DashIsStandardOutputWhereACommandWritesOneFile) {
  const std::string dir = FreshDir("dash");
  CommandOutput r = Shell(absl::StrCat("cd ", ShellQuote(dir), " && ", ShellQuote(Cli()),
                                     " flamegraph ", ShellQuote(Input()), " -o -"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("<html"));
  r = Shell(absl::StrCat("cd ", ShellQuote(dir), " && ", ShellQuote(Cli()), " collapsed ",
                       ShellQuote(Input()), " -o -"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(r.out.empty());
  r = Shell(absl::StrCat("cd ", ShellQuote(dir), " && ", ShellQuote(Cli()), " run -o - -- ",
                       ShellQuote(EnvOrEmpty("INPROF_RUN_TARGET")), " spin 10"));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--output '-'"));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  r = Shell(absl::StrCat("cd ", ShellQuote(dir), " && INPROF_OUTPUT=- ", ShellQuote(Cli()),
                         " run -- ", ShellQuote(EnvOrEmpty("INPROF_RUN_TARGET")), " spin 10"));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("INPROF_OUTPUT='-'"));
  EXPECT_TRUE(Entries(dir).empty());
}

// The "wrote" lines of `inprof run`: path, pid.
std::vector<std::pair<std::string, std::string>> WroteLines(const std::string& err) {
  std::vector<std::pair<std::string, std::string>> out;
  for (absl::string_view line : absl::StrSplit(err, '\n')) {
    if (!absl::ConsumePrefix(&line, "inprof run: wrote ")) continue;
    const size_t paren = line.find(" (pid ");
    if (paren == absl::string_view::npos) continue;
    absl::string_view pid = line.substr(paren + 6);
    pid = pid.substr(0, pid.find_first_of(",)"));
    out.emplace_back(std::string(line.substr(0, paren)), std::string(pid));
  }
  return out;
}

// run_target children: the command, a forked child and an exec'd one, with
// an output pattern without %p: the command writes the path as given, each
// other process PATH_<pid>, and each "wrote" line names a file that holds
// that process's profile.
TEST(SafetyOutputTest, APatternWithoutPidLosesNoProfileWhenTheProgramForks) {
  if (safety::kSanitized) GTEST_SKIP() << kNoPreloadUnderSanitizers;
  const std::string dir = FreshDir("fork_no_pid");
  const std::string path = dir + "/p.pb.gz";
  CommandOutput r = Shell(absl::StrCat(ShellQuote(Cli()), " run -o ", ShellQuote(path),
                                     " -- ", ShellQuote(EnvOrEmpty("INPROF_RUN_TARGET")),
                                     " children"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto wrote = WroteLines(r.err);
  ASSERT_EQ(wrote.size(), 3u) << r.err;
  std::set<std::string> paths;
  for (const auto& [file, pid] : wrote) {
    paths.insert(file);
    if (file != path) {
      EXPECT_EQ(file, absl::StrCat(path, "_", pid)) << r.err;
    }
    auto p = ReadPprofFile(file);
    EXPECT_TRUE(p.ok()) << p.status();
  }
  EXPECT_EQ(paths.size(), 3u) << r.err;
  EXPECT_TRUE(paths.count(path)) << r.err;
  EXPECT_EQ(Entries(dir).size(), 3u) << r.err;
  // The command's own profile kept its name.
  auto root = ReadPprofFile(path);
  ASSERT_TRUE(root.ok()) << root.status();
  bool parent = false;
  for (const auto& [fn, v] : root->CumulativeByFunction(root->ValueIndex("cpu-time"))) {
    parent |= absl::StrContains(fn, "ParentWork") && v > 0;
  }
  EXPECT_TRUE(parent) << r.err;
}

// Windows exported into one file (no %t): one "wrote" line that says the
// file holds the last of them.
TEST(SafetyOutputTest, WindowsWithoutTimeInThePatternAreListedOnceTruthfully) {
  if (safety::kSanitized) GTEST_SKIP() << kNoPreloadUnderSanitizers;
  const std::string dir = FreshDir("windows_no_t");
  const std::string path = dir + "/w.pb.gz";
  CommandOutput r = Shell(absl::StrCat(ShellQuote(Cli()), " run --export-period 100ms -o ",
                                     ShellQuote(path), " -- ",
                                     ShellQuote(EnvOrEmpty("INPROF_RUN_TARGET")),
                                     " spin 600"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto wrote = WroteLines(r.err);
  ASSERT_EQ(wrote.size(), 1u) << r.err;
  EXPECT_EQ(wrote[0].first, path);
  EXPECT_THAT(r.err, HasSubstr("windows, each replacing the one before"));
  EXPECT_EQ(Entries(dir).size(), 1u);
}

}  // namespace
}  // namespace inprof
