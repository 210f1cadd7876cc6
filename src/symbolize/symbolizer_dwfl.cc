// Symbolizer on elfutils' libdwfl.
//
// The module map comes from dl_iterate_phdr (the loader's own list, so it
// agrees with what the process executes, including the vDSO); for another
// process (Symbolizer::ForProcess), from its /proc/PID/maps (ScanProcess). Each loaded
// ELF object gets its own Dwfl session holding exactly one module, opened
// lazily on the first lookup inside it and placed at bias 0, so that lookups
// use file virtual addresses (runtime address minus the load bias). One
// session per object keeps a broken file from affecting the others, lets
// SymbolizeFile() share the code with the live path, and makes unloading a
// module a matter of dropping its session.
//
// The pieces: process_scan_linux.cc lists the loaded objects,
// elf_symbols_dwfl.cc reads one object's symbols and debug info, and
// debug_files_dwfl.cc finds its separate debug files (offline: never
// debuginfod) and keeps the sessions from holding descriptors.

#include "inprof/symbolizer.h"

#include <elfutils/libdwfl.h>
#include <fcntl.h>
#include <libelf.h>
#include <link.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "inprof/base/growth_safe_table.h"
#include "inprof/base/log.h"
#include "inprof/internal/process_maps.h"
#include "src/symbolize/debug_files_dwfl.h"
#include "src/symbolize/elf_symbols_dwfl.h"
#include "src/symbolize/process_scan_linux.h"

namespace inprof {
namespace {

using internal::CannotRead;
using internal::ElfSymbols;
using internal::kDefaultDebugInfoPath;
using internal::LoadedObject;
using internal::LoaderCounters;
using internal::MakeCallbacks;
using internal::ScanCallback;
using internal::ScanProcess;
using internal::ScanResult;

using Caps = Symbolizer::ModuleCapabilities;

// One line on stderr ("inprof: ..."); callers warn once per module.
void Warn(const absl::Status& status) {
  internal::Log(absl::StrReplaceAll(status.message(), {{"\n", " "}}));
}

// Heap bytes one cache entry holds (its node, frames and out-of-line
// strings) plus its place in the hash table (the table's node: a link, the
// key, the pointer and the cached hash; its bucket).
size_t EntryBytes(const SymbolizedAddress& entry) {
  auto string_bytes = [](const std::string& s) {
    // Strings up to the small-string capacity live inside the object.
    return s.capacity() > std::string().capacity() ? s.capacity() + 1 : 0;
  };
  size_t bytes = sizeof(SymbolizedAddress) + 3 * sizeof(void*) + sizeof(uint64_t) +
                 sizeof(std::unique_ptr<SymbolizedAddress>) +
                 entry.frames.capacity() * sizeof(SourceFrame);
  for (const SourceFrame& f : entry.frames) {
    bytes += string_bytes(f.function) + string_bytes(f.system_name) +
             string_bytes(f.file);
  }
  return bytes;
}

// The distribution's libraries, whose debug info comes (if at all) from a
// separate, compressed debug file.
bool IsSystemLibrary(const std::string& path) {
  for (const char* dir : {"/lib/", "/usr/lib/", "/lib64/", "/usr/lib64/"}) {
    if (path.rfind(dir, 0) == 0) return true;
  }
  return false;
}

// The vDSO has no file: copy its image into a memfd for libdwfl.
absl::StatusOr<int> VdsoImageFd(const unsigned char* image, size_t size) {
  int fd = memfd_create("inprof-vdso", MFD_CLOEXEC);
  if (fd < 0) {
    return CannotRead("[vdso]",
                      absl::StrCat("memfd_create: ", std::strerror(errno)));
  }
  size_t done = 0;
  while (done < size) {
    ssize_t n = write(fd, image + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      close(fd);
      return CannotRead("[vdso]", absl::StrCat("write: ", std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  return fd;
}

}  // namespace

struct Symbolizer::Impl {
  struct Object {
    LoadedObject loaded;
    bool open_attempted = false;
    std::unique_ptr<ElfSymbols> symbols;  // null: not opened or unreadable
    Caps caps;
  };
  struct Range {
    uint64_t start;
    uint64_t limit;
    int module;
  };

  Impl() : callbacks(MakeCallbacks(&debuginfo_path_ptr)) {}
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  // Declared before `objects`: the sessions point at them.
  std::string debuginfo_path = kDefaultDebugInfoPath;
  char* debuginfo_path_ptr = debuginfo_path.data();
  const Dwfl_Callbacks callbacks;

  bool symbolize = true;
  bool system_debug_info = true;
  bool scanned = false;
  size_t max_cached_bytes = kDefaultMaxCachedBytes;
  size_t cached_bytes = 0;
  unsigned long long adds = 0;
  unsigned long long subs = 0;
  std::vector<ModuleInfo> modules;
  std::vector<int> module_object;  // module index -> objects index
  std::vector<Object> objects;
  std::vector<Range> ranges;  // sorted by start
  // Keyed by the address looked up (address - 1 for return addresses).
  // unique_ptr keeps references returned by Lookup stable across rehashes.
  internal::ThrowSafeMap<uint64_t, std::unique_ptr<SymbolizedAddress>> cache;
  internal::ThrowSafeSet<std::string> warned;  // paths already warned about
  // Another process's symbolizer (ForProcess): its pid, and the maps text
  // the module list was built from.
  pid_t pid = 0;
  std::string maps_text;

  void Rebuild();
  void Rebuild(ScanResult scan);
  int FindModule(uint64_t address) const;
  ElfSymbols* SymbolsOf(Object& object);
};

void Symbolizer::Impl::Rebuild() {
  ScanResult scan;
  if (pid != 0) {
    std::string text;
    auto maps = internal::ReadProcessMaps(pid, &text);
    // Gone (or unreadable): the modules it had stay, opened or not. A
    // process that exited but was not reaped yet (a zombie) reads as empty
    // maps: gone too (every live process maps at least its program).
    if (!maps.ok() || (scanned && (maps->empty() || text == maps_text))) {
      scanned = true;
      return;
    }
    scan = ScanProcess(pid, *maps);
    if (scanned) {
      // A process exiting while it is read: its maps still list files that
      // it no longer has (map_files and /proc/PID/root say ENOENT). What it
      // had stays; the next Refresh() reads again.
      for (const LoadedObject& o : scan.objects) {
        if (o.file == nullptr && o.vdso_image == nullptr &&
            o.open_error == std::strerror(ENOENT)) {
          return;
        }
      }
    }
    maps_text = std::move(text);
  } else {
    dl_iterate_phdr(ScanCallback, &scan);
  }
  Rebuild(std::move(scan));
}

void Symbolizer::Impl::Rebuild(ScanResult scan) {
  adds = scan.adds;
  subs = scan.subs;
  scanned = true;

  // Carry over opened sessions of objects that are still loaded at the same
  // place with the same contents.
  auto key = [](const LoadedObject& o) {
    return absl::StrCat(o.path, "|", o.bias, "|", o.build_id);
  };
  internal::ThrowSafeMap<std::string, size_t> old_by_key;
  for (size_t i = 0; i < objects.size(); ++i) {
    old_by_key[key(objects[i].loaded)] = i;
  }
  internal::ThrowSafeMap<std::string, int> new_module_by_key;  // key|start
  std::vector<Object> new_objects;
  std::vector<ModuleInfo> new_modules;
  std::vector<int> new_module_object;
  for (LoadedObject& loaded : scan.objects) {
    Object object;
    if (auto it = old_by_key.find(key(loaded)); it != old_by_key.end()) {
      Object& old = objects[it->second];
      object.open_attempted = old.open_attempted;
      object.symbols = std::move(old.symbols);
      object.caps = old.caps;
    }
    for (const ModuleInfo& m : loaded.segments) {
      new_module_by_key[absl::StrCat(key(loaded), "|", m.start)] =
          static_cast<int>(new_modules.size());
      new_modules.push_back(m);
      new_module_object.push_back(static_cast<int>(new_objects.size()));
    }
    object.loaded = std::move(loaded);
    new_objects.push_back(std::move(object));
  }

  // Renumber cached results of modules that are still there; drop those of
  // unloaded modules and of unmapped addresses (a new module may cover them).
  std::vector<int> remap(modules.size(), -1);
  for (size_t i = 0; i < modules.size(); ++i) {
    const Object& old = objects[module_object[i]];
    auto it = new_module_by_key.find(
        absl::StrCat(key(old.loaded), "|", modules[i].start));
    if (it != new_module_by_key.end()) remap[i] = it->second;
  }
  for (auto it = cache.begin(); it != cache.end();) {
    const int old_module = it->second->module;
    const int new_module = old_module >= 0 ? remap[old_module] : -1;
    if (new_module < 0) {
      cached_bytes -= EntryBytes(*it->second);
      cache.erase(it++);
    } else {
      it->second->module = new_module;
      ++it;
    }
  }

  objects = std::move(new_objects);
  modules = std::move(new_modules);
  module_object = std::move(new_module_object);
  ranges.clear();
  for (size_t i = 0; i < modules.size(); ++i) {
    ranges.push_back({modules[i].start, modules[i].limit, static_cast<int>(i)});
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.start < b.start; });
}

int Symbolizer::Impl::FindModule(uint64_t address) const {
  auto it =
      std::upper_bound(ranges.begin(), ranges.end(), address,
                       [](uint64_t a, const Range& r) { return a < r.start; });
  if (it == ranges.begin()) return -1;
  --it;
  return address < it->limit ? it->module : -1;
}

ElfSymbols* Symbolizer::Impl::SymbolsOf(Object& object) {
  if (object.open_attempted) return object.symbols.get();
  object.open_attempted = true;
  const LoadedObject& loaded = object.loaded;
  absl::StatusOr<int> fd;
  if (loaded.vdso_image != nullptr) {
    fd = VdsoImageFd(loaded.vdso_image, loaded.vdso_size);
  } else if (loaded.file != nullptr) {
    const int f = dup(loaded.file->fd);
    if (f >= 0) {
      fd = f;
    } else {
      fd = CannotRead(loaded.path, std::strerror(errno));
    }
  } else if (!loaded.open_error.empty()) {
    fd = CannotRead(loaded.path, loaded.open_error);
  } else if (loaded.open_path.empty()) {
    fd = CannotRead(loaded.path, "no file backs this module");
  } else {
    int f = open(loaded.open_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (f >= 0) {
      fd = f;
    } else {
      fd = CannotRead(loaded.path, std::strerror(errno));
    }
  }
  absl::StatusOr<std::unique_ptr<ElfSymbols>> symbols =
      fd.ok() ? ElfSymbols::Open(*fd, loaded.path, loaded.build_id, &callbacks)
              : absl::StatusOr<std::unique_ptr<ElfSymbols>>(fd.status());
  if (!symbols.ok()) {
    if (warned.insert(loaded.path).second) Warn(symbols.status());
    return nullptr;
  }
  object.symbols = *std::move(symbols);
  if (!system_debug_info && IsSystemLibrary(loaded.path)) {
    object.symbols->set_use_debug_info(false);
  }
  return object.symbols.get();
}

Symbolizer::Symbolizer(bool symbolize) : impl_(std::make_unique<Impl>()) {
  impl_->symbolize = symbolize;
  // libelf refuses to work until the application states its ELF version.
  elf_version(EV_CURRENT);
  impl_->Rebuild();
}

Symbolizer::~Symbolizer() = default;

Symbolizer::Symbolizer(pid_t pid, bool symbolize) : impl_(std::make_unique<Impl>()) {
  impl_->symbolize = symbolize;
  impl_->pid = pid;
  elf_version(EV_CURRENT);
}

absl::StatusOr<std::unique_ptr<Symbolizer>> Symbolizer::ForProcess(pid_t pid,
                                                                   bool symbolize) {
  if (pid <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("symbolizer: pid ", pid, " is not a process"));
  }
  auto maps = internal::ReadProcessMaps(pid);
  if (!maps.ok()) return maps.status();
  auto symbolizer = std::unique_ptr<Symbolizer>(new Symbolizer(pid, symbolize));
  symbolizer->impl_->Rebuild();
  return symbolizer;
}

void Symbolizer::Refresh() {
  if (impl_->cached_bytes > impl_->max_cached_bytes) {
    decltype(impl_->cache)().swap(impl_->cache);  // also gives the table's memory back
    impl_->cached_bytes = 0;
  }
  if (impl_->pid != 0) {
    impl_->Rebuild();  // re-reads the maps; a no-op when they did not change
    return;
  }
  auto [adds, subs] = LoaderCounters();
  if (impl_->scanned && adds == impl_->adds && subs == impl_->subs) return;
  impl_->Rebuild();
}

const std::vector<ModuleInfo>& Symbolizer::modules() const {
  return impl_->modules;
}

void Symbolizer::set_system_debug_info(bool on) {
  impl_->system_debug_info = on;
}

void Symbolizer::SetDebugInfoPath(absl::string_view path) {
  impl_->debuginfo_path = std::string(path);
  impl_->debuginfo_path_ptr = impl_->debuginfo_path.data();
}

size_t Symbolizer::cached_addresses() const { return impl_->cache.size(); }

size_t Symbolizer::cached_bytes() const { return impl_->cached_bytes; }

size_t Symbolizer::max_cached_bytes() const {
  return impl_->max_cached_bytes;
}

void Symbolizer::set_max_cached_bytes(size_t max) {
  impl_->max_cached_bytes = max;
}

const SymbolizedAddress& Symbolizer::Lookup(uint64_t address,
                                            bool is_return_address) {
  // A return address follows its call; address - 1 is inside the call, which
  // names the right function and line even when the call is the last
  // instruction of a function.
  const uint64_t lookup =
      is_return_address && address > 0 ? address - 1 : address;
  std::unique_ptr<SymbolizedAddress>& slot = impl_->cache[lookup];
  if (slot != nullptr) return *slot;
  slot = std::make_unique<SymbolizedAddress>();
  slot->module = impl_->FindModule(lookup);
  if (slot->module >= 0 && impl_->symbolize) {
    Impl::Object& object = impl_->objects[impl_->module_object[slot->module]];
    if (ElfSymbols* symbols = impl_->SymbolsOf(object); symbols != nullptr) {
      slot->frames = symbols->Lookup(lookup - object.loaded.bias, &object.caps);
    }
  }
  impl_->cached_bytes += EntryBytes(*slot);
  return *slot;
}

Symbolizer::ModuleCapabilities Symbolizer::Capabilities(int module) const {
  if (module < 0 || static_cast<size_t>(module) >= impl_->modules.size()) {
    return {};
  }
  return impl_->objects[impl_->module_object[module]].caps;
}

absl::StatusOr<std::vector<std::vector<SourceFrame>>> Symbolizer::SymbolizeFile(
    const std::string& path, const std::vector<uint64_t>& file_addresses) {
  elf_version(EV_CURRENT);
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return CannotRead(path, std::strerror(errno));
  static const Dwfl_Callbacks kCallbacks = MakeCallbacks(nullptr);
  absl::StatusOr<std::unique_ptr<ElfSymbols>> symbols =
      ElfSymbols::Open(fd, path, /*expected_build_id=*/"", &kCallbacks);
  if (!symbols.ok()) return symbols.status();
  std::vector<std::vector<SourceFrame>> result;
  result.reserve(file_addresses.size());
  Caps caps;
  for (uint64_t address : file_addresses) {
    result.push_back((*symbols)->Lookup(address, &caps));
  }
  return result;
}

}  // namespace inprof
