// src/symbolize/process_scan_linux.h: the loaded ELF objects the Linux
// symbolizer (symbolizer_dwfl.cc) builds its module map from: this
// process's, as dl_iterate_phdr reports them (ScanCallback,
// LoaderCounters), or another process's, from its /proc/PID/maps
// (ScanProcess).
//
// Thread-safety: the functions are reentrant; a ScanResult is its
// caller's.
#ifndef INPROF_SRC_SYMBOLIZE_PROCESS_SCAN_LINUX_H_
#define INPROF_SRC_SYMBOLIZE_PROCESS_SCAN_LINUX_H_

#include <link.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "inprof/internal/process_maps.h"
#include "inprof/symbolizer.h"

namespace inprof::internal {

// A descriptor shared by the module maps that name the same object.
struct OpenFile {
  explicit OpenFile(int f) : fd(f) {}
  ~OpenFile() { close(fd); }
  OpenFile(const OpenFile&) = delete;
  OpenFile& operator=(const OpenFile&) = delete;
  int fd;
};

// One loaded ELF object as dl_iterate_phdr reports it (or, for another
// process, as its /proc/PID/maps shows it).
struct LoadedObject {
  std::string path;       // ModuleInfo::path
  std::string open_path;  // file to read; empty for the vDSO
  // Another process's object: the file it mapped, opened while it ran (so
  // that it can be read after the process exited or the file was replaced).
  std::shared_ptr<OpenFile> file;
  std::string open_error;  // why it could not be opened (another process)
  uint64_t bias = 0;      // dlpi_addr
  std::string build_id;
  const unsigned char* vdso_image = nullptr;  // set for the vDSO
  size_t vdso_size = 0;
  std::vector<ModuleInfo> segments;  // executable PT_LOADs
};

// What one scan found; for this process, with the loader's add/remove
// counters at the time (dl_phdr_info's dlpi_adds and dlpi_subs).
struct ScanResult {
  std::vector<LoadedObject> objects;
  unsigned long long adds = 0;
  unsigned long long subs = 0;
};

// dl_iterate_phdr's callback (`arg`: a ScanResult): appends the object it
// reports when that has executable segments, and records the loader's
// counters.
int ScanCallback(dl_phdr_info* info, size_t size, void* arg);

// The loader's add/remove counters, read by stopping at the first object.
std::pair<unsigned long long, unsigned long long> LoaderCounters();

// Another process's objects, from its /proc/PID/maps: every file mapped
// executable (and its vDSO), grouped by file. Each file is opened through
// /proc/PID/map_files/ -- the very inode the process mapped, even when the
// path now names another file -- or, where that is refused, by its path
// under /proc/PID/root with its device and inode checked against the maps
// line: a file replaced on disk is never read for the code it replaced.
ScanResult ScanProcess(pid_t pid, const std::vector<internal::MapsEntry>& maps);

}  // namespace inprof::internal

#endif  // INPROF_SRC_SYMBOLIZE_PROCESS_SCAN_LINUX_H_
