// DwarfUnwinder's module tracking (dwarf_unwinder.h): finds the loaded
// modules with dl_iterate_phdr, builds or reuses each one's CfiModuleTable,
// and publishes snapshots for the signal handler.
//
// Publication is RCU-like. The handler pins a snapshot with CfiReadGuard:
// it increments g_cfi_state.readers, then loads g_cfi_state.current, and
// decrements the count when its walk is done. A refresh swaps in the new
// snapshot and keeps the old one on a retired list; retired snapshots are
// freed when a later check (this refresh or a following one) reads the
// count as zero. With sequentially consistent increments, loads and swaps,
// a reader that could have loaded a retired pointer incremented the count
// before the swap, so seeing zero after the swap means it has finished.
// Retired snapshots only hold pointers (the module tables are shared), and
// the list grows only while modules keep changing and handlers are always
// mid-walk at the 50 ms collector checks.
#include "inprof/dwarf_unwinder.h"

#include <elf.h>
#include <link.h>
#include <sys/auxv.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "inprof/base/growth_safe_table.h"
#include "inprof/internal/cfi_table.h"
#include "inprof/internal/cfi_walk.h"
#include "inprof/base/contained.h"
#include "inprof/base/elf_notes.h"
#include "inprof/base/fork_guard.h"

namespace inprof {
namespace {

using internal::CfiModuleTable;
using internal::CfiSnapshot;
using internal::g_cfi_state;

// Tables of unloaded modules kept for a module that comes back (a plugin
// dlopen()ed and dlclose()d in a loop): the most recently used ones.
constexpr size_t kKeptUnloadedTables = 16;

struct LoadedModule {
  std::string open_path;  // what to open ("/proc/self/exe" for the program)
  std::string path;       // its name, for keys and stats
  uintptr_t bias = 0;
  uint64_t text_lo = 0;   // link-time range of the executable segments
  uint64_t text_hi = 0;
  std::string build_id;   // raw bytes from the loaded notes; may be empty
  std::vector<uint8_t> image;  // the vDSO's bytes (it has no file)
};

struct CacheEntry {
  std::shared_ptr<const CfiModuleTable> table;  // no rows: no usable CFI
  uint64_t last_used = 0;                       // refresh generation
};

struct CurrentModule {
  std::string path;
  uintptr_t load_address = 0;
  std::shared_ptr<const CfiModuleTable> table;
};

struct State {
  std::mutex mutex;
  bool initialized = false;
  unsigned long long adds = 0, subs = 0;
  uint64_t generation = 0;
  internal::ThrowSafeMap<std::string, CacheEntry> cache;
  // Loaded modules whose table is not built yet (on demand), by cache key.
  internal::ThrowSafeMap<std::string, std::shared_ptr<const CfiModuleTable>>
      pending;
  // Builds a stop interrupted, resumed by the next refresh (by cache key):
  // a profiler started and stopped every few milliseconds still completes
  // its tables, and no Stop pays for a build's start again.
  internal::ThrowSafeMap<std::string, std::unique_ptr<internal::CfiPartialBuild>>
      partial;
  std::vector<CurrentModule> current;
  size_t modules_without_cfi = 0;
  std::vector<const CfiSnapshot*> retired;
  uint64_t refreshes = 0, rebuilds = 0, tables_built = 0;
  double last_rebuild_seconds = 0;
};

// Never destroyed: a late signal may still read the published snapshot.
State& GlobalState() {
  static State* state = [] {
    auto* st = new State;
    internal::RegisterForkLock(&st->mutex, internal::kForkRankModules);
    return st;
  }();
  return *state;
}

// Created at static initialisation, so that its lock joins the fork guard
// while no lock is held (base/fork_guard.h).
[[maybe_unused]] const bool g_state_created = (GlobalState(), true);

void ReadLoaderCounters(unsigned long long* adds, unsigned long long* subs) {
  struct Counters {
    unsigned long long adds = 0, subs = 0;
  } c;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t size, void* data) {
        auto* out = static_cast<Counters*>(data);
        if (size >= offsetof(dl_phdr_info, dlpi_subs) + sizeof(info->dlpi_subs)) {
          out->adds = info->dlpi_adds;
          out->subs = info->dlpi_subs;
        }
        return 1;  // the counters are the same in every entry
      },
      &c);
  *adds = c.adds;
  *subs = c.subs;
}

std::string ExecutablePath() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "[exe]";
}

// dl_iterate_phdr callback: runs with the loader lock held, so the module
// cannot be unmapped while its notes (and the vDSO's image) are read.
int CollectModule(dl_phdr_info* info, size_t, void* data) {
  auto* modules = static_cast<std::vector<LoadedModule>*>(data);
  const bool first = modules->empty();
  LoadedModule m;
  m.bias = info->dlpi_addr;
  uint64_t lo = UINT64_MAX, hi = 0;
  uintptr_t header_address = 0;
  uint64_t image_size = 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type == PT_LOAD) {
      if (ph.p_offset == 0) header_address = m.bias + ph.p_vaddr;
      image_size = std::max<uint64_t>(image_size, ph.p_offset + ph.p_filesz);
      if (ph.p_flags & PF_X) {
        lo = std::min<uint64_t>(lo, ph.p_vaddr);
        hi = std::max<uint64_t>(hi, ph.p_vaddr + ph.p_memsz);
      }
    } else if (ph.p_type == PT_NOTE && m.build_id.empty()) {
      m.build_id = internal::GnuBuildIdFromNotes(
          reinterpret_cast<const uint8_t*>(m.bias + ph.p_vaddr), ph.p_filesz,
          ph.p_align);
    }
  }
  const char* name = info->dlpi_name != nullptr ? info->dlpi_name : "";
  const uintptr_t vdso = getauxval(AT_SYSINFO_EHDR);
  if (vdso != 0 && header_address == vdso) {
    // The whole vDSO image is mapped, section headers included.
    const auto* ehdr = reinterpret_cast<const ElfW(Ehdr)*>(vdso);
    image_size = std::max<uint64_t>(
        image_size, ehdr->e_shoff + uint64_t{ehdr->e_shnum} * ehdr->e_shentsize);
    if (image_size > (1u << 20)) return 0;  // not a vDSO after all
    const auto* bytes = reinterpret_cast<const uint8_t*>(vdso);
    m.image.assign(bytes, bytes + image_size);
    m.path = name[0] != '\0' ? name : "[vdso]";
  } else if (name[0] == '\0') {
    if (!first) return 0;  // only the main program has no name
    m.open_path = "/proc/self/exe";
    m.path = ExecutablePath();
  } else {
    m.open_path = name;
    m.path = name;
  }
  if (hi <= lo) {
    modules->push_back(LoadedModule());  // keep `first` meaningful
    modules->back().path = m.path;
    return 0;
  }
  m.text_lo = lo;
  m.text_hi = hi;
  modules->push_back(std::move(m));
  return 0;
}

std::string CacheKey(const LoadedModule& m) {
  // The same file at another address reuses the table (it holds link-time
  // offsets); a file rebuilt under the same name has another build-id.
  return absl::StrCat(m.path, "|", m.build_id, "|", m.text_lo, "-", m.text_hi,
                      "|", m.image.size());
}

// Null if `progress` abandoned the build (its work stays in `partial`).
std::shared_ptr<const CfiModuleTable> BuildTable(
    const LoadedModule& m, absl::FunctionRef<bool()> progress,
    internal::CfiPartialBuild* partial) {
  absl::StatusOr<std::shared_ptr<const CfiModuleTable>> table =
      m.image.empty()
          ? internal::BuildCfiTableFromFile(m.open_path, m.text_lo, m.text_hi,
                                            m.build_id, progress, partial)
          : internal::BuildCfiTableFromImage(m.image, m.path, m.text_lo,
                                             m.text_hi, progress, partial);
  if (table.ok()) return *std::move(table);
  if (absl::IsCancelled(table.status())) return nullptr;
  // No usable CFI: an empty table still tells the walk that the range is
  // code (its frame-pointer fallback accepts return addresses there).
  return std::make_shared<const CfiModuleTable>(
      m.text_lo, m.text_hi, std::vector<internal::CfiRow>(), m.path);
}

// Frees retired snapshots if no handler is reading one. Lock held.
void ReclaimLocked(State& s) {
  if (s.retired.empty()) return;
  if (g_cfi_state.readers.load(std::memory_order_seq_cst) != 0) return;
  for (const CfiSnapshot* old : s.retired) delete old;
  s.retired.clear();
}

// Where samples are first: the program, a sanitizer's runtime (its
// interceptors sit between the program and libc), the C runtime and the
// vDSO: built first, and built at once even on demand unless walks can
// answer from their .eh_frame meanwhile (CfiModuleTable::PendingFromFile:
// the files; the vDSO, an image in memory, is built: 0.02 ms). libstdc++ and
// libgcc_s come next in order but are built on demand like any library: a
// C program under `inprof run` loads them only for inprof's own sake, and
// a program whose samples never pass through them (start_stop_cost) paid
// 6 ms and 270 KB for libstdc++'s table; where a walk meets them (a
// std::thread's first frame), the collector builds them: right after the
// pass during which they were met (RefreshLocked), else at its next pass.
int Rank(const LoadedModule& m) {
  if (m.open_path == "/proc/self/exe") return 0;
  if (!m.image.empty()) return 1;  // the vDSO: clock_gettime, gettimeofday
  const std::string& p = m.path;
  const size_t slash = p.rfind('/');
  const std::string base = slash == std::string::npos ? p : p.substr(slash + 1);
  for (const char* san : {"libasan.so", "libtsan.so", "libubsan.so",
                          "liblsan.so", "libhwasan.so"}) {
    if (base.rfind(san, 0) == 0) return 1;
  }
  if (base.rfind("libc.so", 0) == 0) return 2;
  if (base.rfind("libstdc++.so", 0) == 0) return 3;
  if (base.rfind("libgcc_s.so", 0) == 0) return 4;
  return 5;
}
constexpr int kLastEagerRank = 2;

void Publish(State& s, CfiSnapshot* snapshot) {
  const CfiSnapshot* old =
      g_cfi_state.current.exchange(snapshot, std::memory_order_seq_cst);
  if (old != nullptr) s.retired.push_back(old);
}

// Builds the tables the snapshot needs: every module's, or with
// `on_demand` those of the modules Rank() names and of those a walk has
// met (CfiModuleTable::wanted); the others get a pending table. A snapshot
// is published after each table, so each module unwinds by its CFI as soon
// as its table exists. Returns false if `between_tables` asked to stop: the
// tables built so far stay published and cached, and the next refresh
// resumes.
bool RebuildLocked(State& s, absl::FunctionRef<bool()> between_tables,
                   bool on_demand) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<LoadedModule> modules;
  // CollectModule allocates: under memory pressure it throws, which must
  // not unwind through the loader (its lock held); the rebuild is given up
  // and the collector's pass skipped (base/contained.h).
  internal::ForEachLoadedObject([&](dl_phdr_info* info, size_t size) {
    return CollectModule(info, size, &modules);
  });
  modules.erase(std::remove_if(modules.begin(), modules.end(),
                               [](const LoadedModule& m) {
                                 return m.text_hi <= m.text_lo;  // no code
                               }),
                modules.end());
  std::stable_sort(modules.begin(), modules.end(),
                   [](const LoadedModule& a, const LoadedModule& b) {
                     return Rank(a) < Rank(b);
                   });
  ++s.generation;
  // What each module has now: its cached table, or a pending one.
  std::vector<std::pair<uintptr_t, std::shared_ptr<const CfiModuleTable>>>
      entries;
  std::vector<size_t> to_build;
  internal::ThrowSafeMap<std::string, std::shared_ptr<const CfiModuleTable>>
      pending;
  for (size_t i = 0; i < modules.size(); ++i) {
    const LoadedModule& m = modules[i];
    const std::string key = CacheKey(m);
    auto it = s.cache.find(key);
    if (it != s.cache.end()) {
      it->second.last_used = s.generation;
      entries.emplace_back(m.bias + it->second.table->text_lo(),
                           it->second.table);
      continue;
    }
    auto p = s.pending.find(key);
    std::shared_ptr<const CfiModuleTable> pending_table =
        p != s.pending.end() ? p->second
        : m.image.empty()
            ? CfiModuleTable::PendingFromFile(m.text_lo, m.text_hi, m.path,
                                              m.open_path, m.build_id)
            : CfiModuleTable::Pending(m.text_lo, m.text_hi, m.path);
    // A module answered from its .eh_frame meanwhile is built only when
    // wanted (a form that needs the table, or many lookups).
    const bool eager = Rank(m) <= kLastEagerRank && !pending_table->direct();
    if (!on_demand || eager || pending_table->wanted()) {
      to_build.push_back(i);
    }
    entries.emplace_back(m.bias + m.text_lo, pending_table);
    pending.emplace(key, std::move(pending_table));
  }
  s.pending = std::move(pending);  // forgets unloaded modules' pending tables
  for (auto it = s.partial.begin(); it != s.partial.end();) {
    if (s.pending.contains(it->first)) {
      ++it;
    } else {
      s.partial.erase(it++);  // unloaded meanwhile
    }
  }

  // Inside a table too, the caller gets a turn every few milliseconds: a
  // large library's table takes a second under a sanitizer.
  auto last_turn = std::chrono::steady_clock::now();
  auto progress = [&] {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_turn < std::chrono::milliseconds(5)) return true;
    last_turn = now;
    return between_tables();
  };
  for (size_t n = 0; n < to_build.size(); ++n) {
    const size_t i = to_build[n];
    const LoadedModule& m = modules[i];
    const std::string key = CacheKey(m);
    std::unique_ptr<internal::CfiPartialBuild>& partial = s.partial[key];
    if (partial == nullptr) partial = std::make_unique<internal::CfiPartialBuild>();
    std::shared_ptr<const CfiModuleTable> table = BuildTable(m, progress, partial.get());
    if (table == nullptr) return false;  // abandoned: resumed next refresh
    s.partial.erase(key);
    ++s.tables_built;
    s.cache.emplace(key, CacheEntry{table, s.generation});
    s.pending.erase(key);
    entries[i] = {m.bias + table->text_lo(), std::move(table)};
    if (n + 1 < to_build.size()) {
      auto* partial = new CfiSnapshot(entries, s.generation);
      partial->partial = true;
      Publish(s, partial);
      // The caller drains the sample rings meanwhile, which would otherwise
      // fill while tables are built.
      last_turn = std::chrono::steady_clock::now();
      if (!between_tables()) return false;
    }
  }
  Publish(s, new CfiSnapshot(entries, s.generation));

  std::vector<CurrentModule> current;
  size_t without_cfi = 0;
  for (size_t i = 0; i < modules.size(); ++i) {
    const std::shared_ptr<const CfiModuleTable>& table = entries[i].second;
    if (table->pending()) continue;
    if (table->rows() == 0) {
      ++without_cfi;
      continue;
    }
    current.push_back({modules[i].path, entries[i].first, table});
  }
  std::sort(current.begin(), current.end(),
            [](const CurrentModule& a, const CurrentModule& b) {
              return a.load_address < b.load_address;
            });
  s.current = std::move(current);
  s.modules_without_cfi = without_cfi;

  // Keep the tables of loaded modules and a few recently unloaded ones.
  std::vector<std::pair<uint64_t, std::string>> unused;
  for (const auto& [key, entry] : s.cache) {
    if (entry.last_used != s.generation) unused.emplace_back(entry.last_used, key);
  }
  if (unused.size() > kKeptUnloadedTables) {
    std::sort(unused.begin(), unused.end());
    for (size_t i = 0; i + kKeptUnloadedTables < unused.size(); ++i) {
      s.cache.erase(unused[i].second);
    }
  }
  ++s.rebuilds;
  s.last_rebuild_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  return true;
}

bool AnyWantedLocked(const State& s) {
  for (const auto& [key, table] : s.pending) {
    if (table->wanted()) return true;
  }
  return false;
}

void RefreshLocked(State& s, absl::FunctionRef<bool()> between_tables,
                   bool on_demand) {
  ++s.refreshes;
  unsigned long long adds = 0, subs = 0;
  ReadLoaderCounters(&adds, &subs);
  // Pending tables not yet built of an earlier full refresh are built now.
  const bool upgrade = !on_demand && !s.pending.empty();
  if (!s.initialized || adds != s.adds || subs != s.subs || upgrade ||
      (on_demand && AnyWantedLocked(s))) {
    s.adds = adds;
    s.subs = subs;
    s.initialized = RebuildLocked(s, between_tables, on_demand);
    // Walks during that build that met a module still pending (a
    // std::thread's first frame in libstdc++, while the first pass built
    // the program's and libc's tables) get its table now, not a collector
    // period later. Bounded: each pass builds what was wanted before it.
    for (int again = 0; again < 2 && s.initialized && on_demand &&
                        AnyWantedLocked(s);
         ++again) {
      s.initialized = RebuildLocked(s, between_tables, on_demand);
    }
  }
  ReclaimLocked(s);
}

}  // namespace

void DwarfUnwinder::RefreshModules() {
  if (!Supported()) return;
  State& s = GlobalState();
  std::lock_guard<std::mutex> lock(s.mutex);
  RefreshLocked(s, [] { return true; }, /*on_demand=*/false);
}

void DwarfUnwinder::RefreshModules(absl::FunctionRef<bool()> between_tables,
                                   bool on_demand) {
  if (!Supported()) return;
  State& s = GlobalState();
  std::lock_guard<std::mutex> lock(s.mutex);
  RefreshLocked(s, between_tables, on_demand);
}

DwarfUnwinderStats DwarfUnwinder::Stats() {
  State& s = GlobalState();
  std::lock_guard<std::mutex> lock(s.mutex);
  DwarfUnwinderStats stats;
  for (const CurrentModule& m : s.current) {
    DwarfUnwinderStats::Module out;
    out.path = m.path;
    out.load_address = m.load_address;
    out.text_bytes = m.table->text_hi() - m.table->text_lo();
    out.rows = m.table->rows();
    out.rules = m.table->distinct_rules();
    out.table_bytes = m.table->MemoryBytes();
    stats.rows += out.rows;
    stats.table_bytes += out.table_bytes;
    stats.modules.push_back(std::move(out));
  }
  stats.modules_without_cfi = s.modules_without_cfi;
  stats.modules_pending = s.pending.size();
  for (const auto& [key, table] : s.pending) {
    if (table->direct()) stats.pending_from_eh_frame.push_back(table->path());
  }
  stats.eh_frame_lookups =
      internal::g_cfi_state.direct_lookups.load(std::memory_order_relaxed);
  for (const auto& [key, entry] : s.cache) {
    ++stats.cached_tables;
    stats.cached_bytes += entry.table->MemoryBytes();
  }
  stats.retired_snapshots = s.retired.size();
  stats.refreshes = s.refreshes;
  stats.rebuilds = s.rebuilds;
  stats.tables_built = s.tables_built;
  stats.last_rebuild_seconds = s.last_rebuild_seconds;
  return stats;
}

}  // namespace inprof
