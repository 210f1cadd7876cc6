// The wall ticker's visits (internal::WallTicker) against a fake provider
// and a fake profiler: which threads a wake-up visits, and what each of the
// provider's decisions becomes. Deterministic: no clock, no signal, no
// thread; the host records every call in order.
#include "inprof/internal/wall_ticker.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace inprof {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

std::vector<std::string>* g_log = nullptr;

// A ticking provider whose every visit's decision is set by the test.
struct FakeProvider {
  struct ThreadData {
    int id = 0;
    TickDecision decision = TickDecision::kSkip;
    bool awaits_stack = false;
    bool steady = false;
    bool following = false;
    // What the last visit was told.
    bool saw_episode_stack = false;
    bool saw_running_sample = false;
    int64_t round_ns = 0;
    bool round_weights = false;
    // What a visit does with the round's weight (ReportsRoundWeight).
    RoundWeight use = RoundWeight::kTaken;
    int64_t weight_taken = 0;  // summed over the visits that took it
  };
  static constexpr const char* kName = "fake";
  static constexpr std::array<SampleTypeSpec, 2> kSampleTypes{
      {{"wall", "nanoseconds"}, {"wall_samples", "count"}}};
  static constexpr size_t kPeriodTypeIndex = 0;
  static constexpr const char* kSigwaitFrame = "[fake: in sigwait]";

  absl::Status Configure(const Options&) { return absl::OkStatus(); }
  int64_t Period() const { return 10'000'000; }
  absl::Status ArmThread(ThreadContext&, ThreadData&, int) { return absl::OkStatus(); }
  void DisarmThread(ThreadContext&, ThreadData&) noexcept {}
  static bool OnSignal(ThreadContext&, ThreadData&, const siginfo_t&,
                       std::span<int64_t>) noexcept {
    return false;
  }
  absl::Duration TickPeriod() const { return period; }
  size_t ThreadsPerTick() const { return per_tick; }
  TickDecision VisitThread(ThreadContext&, ThreadData& data, TickTime when,
                           bool has_episode_stack, bool has_running_sample,
                           std::span<int64_t> values) {
    g_log->push_back(absl::StrCat("visit ", data.id, " at ", when.scheduled_ns,
                                  when.out_of_round ? " ahead" : ""));
    if (on_visit) on_visit(when);
    data.round_ns = when.round_ns;
    data.round_weights = when.round_weights;
    if (when.round_weights && data.use == RoundWeight::kTaken) data.weight_taken += when.round_ns;
    data.saw_episode_stack = has_episode_stack;
    data.saw_running_sample = has_running_sample;
    values[0] = 7'000'000;
    values[1] = 1;
    return data.decision;
  }
  bool AwaitsEpisodeStack(const ThreadData& data) { return data.awaits_stack; }
  static bool SteadyVisit(const ThreadData& data) { return data.steady; }
  static RoundWeight RoundWeightUse(const ThreadData& data) { return data.use; }
  static bool OwnAccount(const ThreadData& data) { return data.use == RoundWeight::kOwnAccount; }
  static bool FollowRunningSample(ThreadData&, int64_t, std::span<int64_t>) {
    return false;
  }

  absl::Duration period = absl::Milliseconds(10);
  size_t per_tick = 1;
  std::function<void(TickTime)> on_visit;
};
static_assert(TicksThreads<FakeProvider>);
static_assert(NamesSigwaitFrame<FakeProvider> && ReportsSteadyVisits<FakeProvider> &&
              FollowsRunningThreads<FakeProvider> && ReportsRoundWeight<FakeProvider> &&
              KeepsOwnAccounts<FakeProvider>);

struct FakeSlot : internal::SlotBase {
  FakeProvider::ThreadData data;
  uint32_t running_samples_at_visit = 0;
};

// The profiler's side: records each call as "what id [values]".
struct FakeHost {
  static constexpr bool kCountsRunningSamples = true;

  static FakeSlot& Of(internal::SlotBase& slot) { return static_cast<FakeSlot&>(slot); }
  static int Id(internal::SlotBase& slot) { return Of(slot).data.id; }
  FakeProvider::ThreadData& Data(internal::SlotBase& slot) { return Of(slot).data; }
  uint32_t& RunningSamplesAtVisit(internal::SlotBase& slot) {
    return Of(slot).running_samples_at_visit;
  }
  void DrainSlot(internal::SlotBase& slot) { g_log->push_back(absl::StrCat("drain ", Id(slot))); }
  bool ReadBlockedStack(internal::SlotBase& slot) {
    g_log->push_back(absl::StrCat("read ", Id(slot), slot.blocked_stack.empty() ? "" : " (old stack kept)"));
    return stacks_readable;
  }
  void Signal(internal::SlotBase& slot) { g_log->push_back(absl::StrCat("signal ", Id(slot))); }
  void CreditBlocked(internal::SlotBase& slot, std::span<const int64_t> v) {
    if (credit_throws) throw std::bad_alloc();  // the heap full (aggregation allocates)
    g_log->push_back(absl::StrCat("blocked ", Id(slot), " ", v[0], " ", v[1]));
  }
  void CreditRunning(internal::SlotBase& slot, std::span<const int64_t> v) {
    g_log->push_back(absl::StrCat("running ", Id(slot), " ", v[0], " ", v[1]));
  }
  void CreditSynthetic(internal::SlotBase& slot, std::span<const int64_t> v,
                       const char* frame) {
    g_log->push_back(absl::StrCat("synthetic ", Id(slot), " ", frame, " ", v[0]));
  }
  bool TablesReady() { return tables_ready; }
  uint64_t TablesGeneration() { return generation; }

  bool stacks_readable = false;
  bool credit_throws = false;
  bool tables_ready = true;
  uint64_t generation = 0;
};
static_assert(internal::WallTickerHost<FakeHost, FakeProvider>);

class WallTickerTest : public ::testing::Test {
 protected:
  void SetUp() override { g_log = &log_; }
  void TearDown() override { g_log = nullptr; }

  void AddThreads(int n) {
    for (int i = 0; i < n; ++i) {
      auto slot = std::make_unique<FakeSlot>();
      slot->data.id = static_cast<int>(slots_.size());
      pointers_.push_back(slot.get());
      slots_.push_back(std::move(slot));
    }
  }
  FakeSlot& slot(int i) { return *slots_[i]; }

  // One wake-up standing for `batch` ticks; returns the log it wrote.
  std::vector<std::string> Wake(size_t batch = 1, int64_t at = 0) {
    log_.clear();
    next_ = 10;
    counts_ = ticker_.VisitNext(provider_, host_, pointers_, TickTime::At(at), batch,
                                /*max_batch=*/10, next_, steady_);
    return log_;
  }

  std::vector<std::string> log_;
  std::vector<std::unique_ptr<FakeSlot>> slots_;
  std::vector<internal::SlotBase*> pointers_;
  FakeProvider provider_;
  FakeHost host_;
  internal::WallTicker<FakeProvider> ticker_;
  internal::WallVisitCounts counts_;
  size_t next_ = 10;
  size_t steady_ = 0;
};

TEST_F(WallTickerTest, WakeUpsVisitThreadsPerTickTimesBatchRoundRobin) {
  AddThreads(5);
  provider_.per_tick = 2;
  EXPECT_THAT(Wake(), ElementsAre("visit 0 at 0", "visit 1 at 0"));
  EXPECT_EQ(counts_.visits, 2u);
  // A full round of 5 threads at 2 a tick takes 2 ticks: the next wake-up
  // may stand for 2.
  EXPECT_EQ(next_, 2u);
  EXPECT_THAT(Wake(1, 5), ElementsAre("visit 2 at 5", "visit 3 at 5"));
  // Two ticks at once: 4 visits, from where it stopped, each thread once.
  EXPECT_THAT(Wake(2, 9), ElementsAre("visit 4 at 9", "visit 0 at 9", "visit 1 at 9",
                                      "visit 2 at 9"));
  // More than a round: each thread once.
  EXPECT_THAT(Wake(10), ElementsAre("visit 3 at 0", "visit 4 at 0", "visit 0 at 0",
                                    "visit 1 at 0", "visit 2 at 0"));
}

TEST_F(WallTickerTest, VisitsGrowWithTheThreadCountSoThatARoundTakesTwoSecondsAtMost) {
  using Ticker = internal::WallTicker<FakeProvider>;
  constexpr int64_t kPeriod = 10'000'000;  // 10 ms
  EXPECT_EQ(Ticker::VisitsPerTick(5, 100, kPeriod), 5u);      // 2 s a round at 5
  EXPECT_EQ(Ticker::VisitsPerTick(5, 1'000, kPeriod), 5u);    // exactly 2 s
  EXPECT_EQ(Ticker::VisitsPerTick(5, 1'001, kPeriod), 6u);
  EXPECT_EQ(Ticker::VisitsPerTick(5, 10'000, kPeriod), 50u);
  EXPECT_EQ(Ticker::VisitsPerTick(0, 0, kPeriod), 1u);
  EXPECT_EQ(Ticker::VisitsPerTick(1, 4'000, 2 * kPeriod), 40u);
  AddThreads(1'001);
  provider_.per_tick = 5;
  EXPECT_EQ(Wake().size(), 6u);
  EXPECT_EQ(counts_.visits, 6u);
  // A round takes 167 ticks: the next wake-up may stand for the most.
  EXPECT_EQ(next_, 10u);
  // 167 more wake-ups (x 6 >= 1,001) visit every thread.
  std::vector<int> seen(1'001, 0);
  for (int i = 0; i < 167; ++i) {
    for (const std::string& line : Wake()) {
      ++seen[std::stoi(line.substr(6))];
    }
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 0), 0);
}

TEST_F(WallTickerTest, TheCpuBudgetCapsTheVisitsEvenBelowTheConfiguredFloor) {
  using Ticker = internal::WallTicker<FakeProvider>;
  constexpr int64_t kPeriod = 10'000'000;  // 10 ms
  // 10,000 threads want 50 a tick for a 2 s round; a cap of 7 holds them
  // to 7, and a cap of 2 to 2, below the configured 5 (visits that cost
  // more than the budget allows five of); never below one.
  EXPECT_EQ(Ticker::VisitsPerTick(5, 10'000, kPeriod, 7), 7u);
  EXPECT_EQ(Ticker::VisitsPerTick(5, 10'000, kPeriod, 2), 2u);
  EXPECT_EQ(Ticker::VisitsPerTick(5, 100, kPeriod, 2), 2u);
  EXPECT_EQ(Ticker::VisitsPerTick(5, 100, kPeriod, 0), 1u);
  EXPECT_EQ(Ticker::VisitsPerTick(5, 1'001, kPeriod, 100), 6u);
  // The budget's cap: 1% of a core at 10 ms a tick, 15 us a visit: 6.67.
  EXPECT_EQ(internal::VisitBudgetPerTick(0.01, kPeriod, 15'000), 6u);
  EXPECT_EQ(internal::VisitBudgetPerTick(0.01, kPeriod, 1'000), 100u);
  EXPECT_EQ(internal::VisitBudgetPerTick(0.01, kPeriod, 1e9), 1u);
  EXPECT_EQ(internal::VisitBudgetPerTick(0, kPeriod, 15'000), SIZE_MAX);   // no budget
  EXPECT_EQ(internal::VisitBudgetPerTick(0.01, kPeriod, 0), SIZE_MAX);     // not measured
  // A wake-up under the cap visits 7 of 10,000 and counts the 43 the
  // 2 s round wanted as deferred.
  AddThreads(10'000);
  provider_.per_tick = 5;
  log_.clear();
  next_ = 10;
  counts_ = ticker_.VisitNext(provider_, host_, pointers_, TickTime::At(0), /*batch=*/1,
                              /*max_batch=*/10, next_, steady_, /*cap=*/7);
  EXPECT_EQ(log_.size(), 7u);
  EXPECT_EQ(counts_.visits, 7u);
  EXPECT_EQ(counts_.deferred, 43u);
  // Without a cap nothing is deferred.
  EXPECT_EQ(Wake().size(), 50u);
  EXPECT_EQ(counts_.deferred, 0u);
}

// A thread that ran and was not visited for a round (ProfilerBase's due
// list) is visited first, out of the round (TickTime::out_of_round), even
// past the tick's visits, and again in its round (that visit is a sample;
// the one ahead only begins a following); an entry whose slot was reused
// or is retiring is not.
TEST_F(WallTickerTest, DueThreadsAreVisitedFirstAndOnlyOnce) {
  AddThreads(6);
  provider_.per_tick = 2;
  slot(4).wall_due = true;
  slot(5).wall_due = true;
  slot(1).wall_due = true;
  slot(3).wall_due = true;
  const std::vector<internal::WallDue> due = {
      {&slot(4), slot(4).generation},
      {&slot(5), slot(5).generation + 1},  // its slot was reused since
      {&slot(1), slot(1).generation},
      {&slot(3), slot(3).generation},
  };
  slot(3).retiring.store(true);  // unregistering
  log_.clear();
  next_ = 10;
  counts_ = ticker_.VisitNext(provider_, host_, pointers_, TickTime::At(7), /*batch=*/1,
                              /*max_batch=*/10, next_, steady_, /*cap=*/SIZE_MAX, due);
  // 4 and 1 first; then the round from 0: 0 and 1.
  EXPECT_THAT(log_, ElementsAre("visit 4 at 7 ahead", "visit 1 at 7 ahead", "visit 0 at 7",
                                "visit 1 at 7"));
  EXPECT_EQ(counts_.visits, 4u);
  EXPECT_EQ(slot(4).wall_last_visit_ns, 7);
  EXPECT_EQ(slot(5).wall_last_visit_ns, internal::SlotBase::kNeverVisited);
  EXPECT_EQ(slot(3).wall_last_visit_ns, internal::SlotBase::kNeverVisited);
}

// The weight of a thread's first visit (TickTime::round_ns) is how long a
// thread waits between two visits now: the planned round (threads over
// the visits a tick, the budget's cap included, times the period) times
// the pace of the wake-ups (TickTime::pace: the back-off, the budget's
// spacing, lateness), whatever the times of earlier visits.
TEST_F(WallTickerTest, AFirstVisitWeighsTheTimeARoundTakes) {
  AddThreads(8);
  provider_.per_tick = 2;  // 4 ticks a round, planned 40 ms
  constexpr int64_t kMs = 1'000'000;
  Wake(1, 1000 * kMs);
  EXPECT_EQ(slot(0).data.round_ns, 40 * kMs);
  AddThreads(8);  // 16 threads: twice as long a round
  Wake(1, 1030 * kMs);
  EXPECT_EQ(slot(2).data.round_ns, 80 * kMs);
  log_.clear();
  next_ = 10;
  TickTime slow = TickTime::At(1060 * kMs);
  slow.pace = 2.5;  // wake-ups 2.5 periods apart
  counts_ = ticker_.VisitNext(provider_, host_, pointers_, slow, 1, 10, next_, steady_);
  EXPECT_EQ(slot(4).data.round_ns, 200 * kMs);
  // The budget's cap of 1 a tick, below the configured 2: one visit, and
  // 16 ticks a round.
  log_.clear();
  counts_ = ticker_.VisitNext(provider_, host_, pointers_, TickTime::At(1090 * kMs), 1, 10,
                              next_, steady_, /*cap=*/1);
  EXPECT_EQ(counts_.visits, 1u);
  EXPECT_EQ(slot(6).data.round_ns, 160 * kMs);
  EXPECT_EQ(slot(7).data.round_ns, 0);  // not visited yet
  provider_.per_tick = 1;
  counts_ = ticker_.VisitNext(provider_, host_, pointers_, TickTime::At(1120 * kMs), 1, 10,
                              next_, steady_, /*cap=*/1);
  EXPECT_EQ(slot(7).data.round_ns, 160 * kMs);
}

// A wake-up that visits some of the threads hands the threads' time since
// the last one (TickTime::thread_ns) out to its visits (Horvitz-Thompson:
// a thread visited with chance k/n weighs n/k intervals): what a window
// holds is its threads' time, whatever the visits a wake-up makes.
TEST_F(WallTickerTest, AWakeUpHandsTheThreadsTimeOutToItsVisits) {
  constexpr int64_t kMs = 1'000'000;
  AddThreads(10);
  provider_.per_tick = 2;
  int64_t total = 0;
  auto wake = [&](int64_t at, double thread_ns, size_t cap = SIZE_MAX) {
    log_.clear();
    next_ = 10;
    TickTime when = TickTime::At(at);
    when.thread_ns = thread_ns;
    total += static_cast<int64_t>(thread_ns);
    counts_ = ticker_.VisitNext(provider_, host_, pointers_, when, 1, 10, next_, steady_, cap);
    return log_;
  };
  auto taken = [&] {
    int64_t sum = 0;
    for (auto& s : slots_) sum += s->data.weight_taken;
    return sum;
  };
  // 10 threads for 10 ms, 2 visits: 50 ms each.
  EXPECT_THAT(wake(100 * kMs, 100.0 * kMs),
              ElementsAre("visit 0 at 100000000", "visit 1 at 100000000"));
  EXPECT_TRUE(slot(0).data.round_weights);
  EXPECT_EQ(slot(0).data.round_ns, 50 * kMs);
  EXPECT_EQ(slot(1).data.round_ns, 50 * kMs);
  EXPECT_EQ(taken(), total);
  // A budget's cap of one visit a tick: one visit weighs all 15 ms x 10.
  wake(115 * kMs, 150.0 * kMs, /*cap=*/1);
  EXPECT_EQ(slot(2).data.round_ns, 150 * kMs);
  EXPECT_EQ(taken(), total);
  // A thread not armed yet leaves its share to the next visit, and the
  // round robin goes on until the time is handed out.
  slot(4).data.use = RoundWeight::kNotYet;
  EXPECT_THAT(wake(125 * kMs, 90.0 * kMs),
              ElementsAre("visit 3 at 125000000", "visit 4 at 125000000",
                          "visit 5 at 125000000"));
  EXPECT_EQ(slot(3).data.round_ns, 45 * kMs);
  EXPECT_EQ(slot(5).data.round_ns, 45 * kMs);
  EXPECT_EQ(taken(), total);
  EXPECT_EQ(counts_.unattributed_ns, 0u);
  // None is armed (a burst of registrations; at most 4x the visits are
  // tried): the time goes to the next wake-up's visits.
  for (int i : {6, 7, 8, 9, 0, 1, 2, 3}) slot(i).data.use = RoundWeight::kNotYet;
  EXPECT_EQ(wake(135 * kMs, 100.0 * kMs).size(), 8u);
  EXPECT_EQ(taken(), total - 100 * kMs);
  for (auto& s : slots_) s->data.use = RoundWeight::kTaken;
  wake(145 * kMs, 100.0 * kMs);
  EXPECT_EQ(slot(4).data.round_ns, 100 * kMs);
  EXPECT_EQ(slot(5).data.round_ns, 100 * kMs);
  EXPECT_EQ(taken(), total);
  EXPECT_EQ(counts_.unattributed_ns, 0u);
  // A thread that keeps its own account (followed, or credited since its
  // arming) is out of thread_ns (TickerPacing::BeginOwnAccounts): its
  // visit counts as one and takes no share, which goes to the other visits
  // (dropped, it left the total off by its share against its time). Its
  // account's beginning is reported once. A thread found ended takes no
  // share and is not counted as a visit: its time since the last wake-up is
  // not in thread_ns (TickerPacing::Ended), its tail weighs it
  // (WallTimeProvider::TakeTail); the next thread is visited instead.
  slot(6).data.use = RoundWeight::kOwnAccount;
  slot(7).data.use = RoundWeight::kEnded;
  EXPECT_THAT(wake(155 * kMs, 100.0 * kMs),
              ElementsAre("visit 6 at 155000000", "visit 7 at 155000000",
                          "visit 8 at 155000000"));
  EXPECT_EQ(slot(8).data.round_ns, 100 * kMs);
  EXPECT_EQ(taken(), total);
  EXPECT_EQ(counts_.unattributed_ns, 0u);
  EXPECT_EQ(counts_.own_accounts_begun, 1u);
  EXPECT_TRUE(slot(6).ticker_own_account);
  EXPECT_FALSE(slot(8).ticker_own_account);
  // Visited again: not reported again. When the last visits of a wake-up
  // are to such threads, their shares go to the next wake-up's visits.
  slot(9).data.use = RoundWeight::kOwnAccount;
  EXPECT_THAT(wake(165 * kMs, 100.0 * kMs),
              ElementsAre("visit 9 at 165000000", "visit 0 at 165000000"));
  EXPECT_EQ(counts_.own_accounts_begun, 1u);
  EXPECT_EQ(slot(0).data.round_ns, 100 * kMs);
  EXPECT_EQ(taken(), total);
  for (int i : {1, 2}) slot(i).data.use = RoundWeight::kOwnAccount;
  EXPECT_THAT(wake(175 * kMs, 100.0 * kMs),
              ElementsAre("visit 1 at 175000000", "visit 2 at 175000000"));
  EXPECT_EQ(counts_.own_accounts_begun, 2u);
  EXPECT_EQ(taken(), total - 100 * kMs);
  EXPECT_THAT(wake(185 * kMs, 50.0 * kMs),
              ElementsAre("visit 3 at 185000000", "visit 4 at 185000000"));
  EXPECT_EQ(slot(3).data.round_ns, 75 * kMs);
  EXPECT_EQ(taken(), total);
  EXPECT_EQ(counts_.unattributed_ns, 0u);
}

// A wake-up tells the visits up to when the threads' time was handed out
// (TickTime::handed_ns): a thread whose own account begins at a wake-up that
// visits every thread credits its time from there, its time before being in
// the earlier wake-ups' shares.
TEST_F(WallTickerTest, AWakeUpSaysUpToWhenTheThreadsTimeWasHandedOut) {
  constexpr int64_t kMs = 1'000'000;
  AddThreads(4);
  provider_.per_tick = 2;
  int64_t handed_seen = -1;
  provider_.on_visit = [&](TickTime when) { handed_seen = when.handed_ns; };
  TickTime when = TickTime::At(100 * kMs);
  when.thread_ns = 40.0 * kMs;
  next_ = 10;
  ticker_.VisitNext(provider_, host_, pointers_, when, 1, 10, next_, steady_);
  EXPECT_EQ(handed_seen, 0);  // none before
  when = TickTime::At(110 * kMs);
  when.thread_ns = 40.0 * kMs;
  ticker_.VisitNext(provider_, host_, pointers_, when, 1, 10, next_, steady_);
  EXPECT_EQ(handed_seen, 100 * kMs);
  // Two threads, each visited: they weigh their own intervals, and the
  // time stays handed out up to 110 ms.
  pointers_.resize(2);
  for (int64_t at : {120, 130}) {
    when = TickTime::At(at * kMs);
    when.thread_ns = 20.0 * kMs;
    ticker_.VisitNext(provider_, host_, pointers_, when, 1, 10, next_, steady_);
    EXPECT_FALSE(slot(0).data.round_weights);
    EXPECT_EQ(handed_seen, 110 * kMs);
  }
  // No time to hand out (every thread left keeps its own account): handed
  // out up to then all the same.
  pointers_.clear();
  for (auto& s : slots_) pointers_.push_back(s.get());
  when = TickTime::At(140 * kMs);
  ticker_.VisitNext(provider_, host_, pointers_, when, 1, 10, next_, steady_);
  when = TickTime::At(150 * kMs);
  when.thread_ns = 40.0 * kMs;
  ticker_.VisitNext(provider_, host_, pointers_, when, 1, 10, next_, steady_);
  EXPECT_EQ(handed_seen, 140 * kMs);
}

// With no thread left, the time is counted as unattributed, never lost
// silently; when a wake-up visits every thread, its visits weigh the time
// since each thread's previous visit instead (round_weights off), and
// threads that end before the next are their tails' to credit.
TEST_F(WallTickerTest, TimeNoThreadCanTakeIsCountedAndEveryThreadVisitedWeighsItsOwnInterval) {
  constexpr int64_t kMs = 1'000'000;
  AddThreads(4);
  provider_.per_tick = 2;
  for (auto& s : slots_) s->data.use = RoundWeight::kNotYet;
  TickTime when = TickTime::At(100 * kMs);
  when.thread_ns = 40.0 * kMs;
  next_ = 10;
  counts_ = ticker_.VisitNext(provider_, host_, pointers_, when, 1, 10, next_, steady_);
  EXPECT_EQ(counts_.unattributed_ns, 0u);  // carried
  std::vector<internal::SlotBase*> none;
  when.scheduled_ns = when.now_ns = 110 * kMs;
  when.thread_ns = 15.0 * kMs;  // their time until they ended
  counts_ = ticker_.VisitNext(provider_, host_, none, when, 1, 10, next_, steady_);
  EXPECT_EQ(counts_.unattributed_ns, static_cast<uint64_t>(55 * kMs));
  // Two threads, two visits a tick: each visited at every wake-up.
  pointers_.resize(2);
  when.scheduled_ns = when.now_ns = 120 * kMs;
  when.thread_ns = 20.0 * kMs;
  counts_ = ticker_.VisitNext(provider_, host_, pointers_, when, 1, 10, next_, steady_);
  EXPECT_FALSE(slot(0).data.round_weights);
  EXPECT_FALSE(slot(1).data.round_weights);
  EXPECT_EQ(counts_.unattributed_ns, 0u);
  // Time carried from wake-ups that visited some threads, when the next
  // one visits every thread (weighing their own intervals): nobody takes
  // it, and it is counted.
  pointers_.clear();
  for (auto& s : slots_) pointers_.push_back(s.get());
  when.scheduled_ns = when.now_ns = 130 * kMs;
  when.thread_ns = 40.0 * kMs;
  counts_ = ticker_.VisitNext(provider_, host_, pointers_, when, 1, 10, next_, steady_);
  EXPECT_EQ(counts_.unattributed_ns, 0u);  // carried
  pointers_.resize(2);
  when.scheduled_ns = when.now_ns = 140 * kMs;
  when.thread_ns = 20.0 * kMs;
  counts_ = ticker_.VisitNext(provider_, host_, pointers_, when, 1, 10, next_, steady_);
  EXPECT_EQ(counts_.unattributed_ns, static_cast<uint64_t>(40 * kMs));
  // They end before the next wake-up. The last one visited every thread,
  // so their tails took their time since their last visit, or since arming
  // (WallTimeProvider::TakeTail): nothing is unattributed.
  when.scheduled_ns = when.now_ns = 150 * kMs;
  when.thread_ns = 12.0 * kMs;
  counts_ = ticker_.VisitNext(provider_, host_, none, when, 1, 10, next_, steady_);
  EXPECT_EQ(counts_.unattributed_ns, 0u);
}

TEST_F(WallTickerTest, NoThreadsOrNoPeriodVisitsNothing) {
  EXPECT_THAT(Wake(), IsEmpty());
  EXPECT_EQ(next_, 1u);
  AddThreads(2);
  provider_.period = absl::ZeroDuration();
  EXPECT_THAT(Wake(), IsEmpty());
  EXPECT_EQ(counts_.visits, 0u);
}

TEST_F(WallTickerTest, ThreadsBeingArmedOrRetiredAreLeftAlone) {
  AddThreads(3);
  provider_.per_tick = 3;
  for (int i = 0; i < 3; ++i) slot(i).data.steady = true;
  slot(0).arm_in_flight = true;
  slot(1).retiring.store(true);
  EXPECT_THAT(Wake(), ElementsAre("visit 2 at 0"));
  EXPECT_FALSE(slot(1).visiting.load());
  EXPECT_FALSE(slot(2).visiting.load());
  // The thread being armed broke the run of steady visits; the visited
  // one started a new run.
  EXPECT_EQ(steady_, 1u);
  slot(0).arm_in_flight = false;
  EXPECT_THAT(Wake(), ElementsAre("visit 0 at 0", "visit 2 at 0"));
  EXPECT_EQ(steady_, 3u);
  slot(2).data.steady = false;
  Wake();
  EXPECT_EQ(steady_, 0u);
}

TEST_F(WallTickerTest, ABlockedThreadsStackIsReadWithoutASignalWhenItCanBe) {
  AddThreads(1);
  slot(0).data.decision = TickDecision::kSignalBlocked;
  slot(0).blocked_stack = {1, 2, 3};  // an older episode's
  slot(0).blocked_provisional = true;
  host_.tables_ready = false;
  host_.stacks_readable = true;
  EXPECT_THAT(Wake(), ElementsAre("visit 0 at 0", "read 0"));
  EXPECT_EQ(counts_.stacks_read, 1u);
  EXPECT_EQ(counts_.signals, 0u);
  // The new episode starts without the old one's stack.
  EXPECT_FALSE(slot(0).blocked_provisional);
  host_.stacks_readable = false;
  EXPECT_THAT(Wake(), ElementsAre("visit 0 at 0", "read 0", "signal 0"));
  EXPECT_EQ(counts_.signals, 1u);
  slot(0).data.decision = TickDecision::kSignal;
  EXPECT_THAT(Wake(), ElementsAre("visit 0 at 0", "signal 0"));
}

TEST_F(WallTickerTest, EachCreditGoesWhereTheProviderSays) {
  AddThreads(4);
  provider_.per_tick = 4;
  slot(0).data.decision = TickDecision::kCreditBlocked;
  slot(1).data.decision = TickDecision::kCreditRunning;
  slot(2).data.decision = TickDecision::kCreditSigwait;
  slot(2).blocked_stack = {9};
  slot(3).data.decision = TickDecision::kFollowing;
  EXPECT_THAT(Wake(), ElementsAre("visit 0 at 0", "blocked 0 7000000 1",
                                  "visit 1 at 0", "running 1 7000000 1",
                                  "visit 2 at 0", "synthetic 2 [fake: in sigwait] 7000000",
                                  "visit 3 at 0"));
  // A sigwait is no episode with a stack: the next visit looks again.
  EXPECT_THAT(slot(2).blocked_stack, IsEmpty());
  EXPECT_EQ(counts_.signals + counts_.stacks_read, 0u);
}

// A visit that throws (the heap full; the ticker thread's RunContained
// skips the wake-up) leaves the thread unmarked: its unregistration waits
// for the mark to go (signal_dispatch), and waited for ever before.
TEST_F(WallTickerTest, AVisitThatThrowsLeavesTheThreadUnmarked) {
  AddThreads(2);
  provider_.per_tick = 2;
  slot(0).data.decision = TickDecision::kCreditBlocked;
  host_.credit_throws = true;
  EXPECT_THROW(Wake(), std::bad_alloc);
  EXPECT_FALSE(slot(0).visiting.load());
  EXPECT_FALSE(slot(1).visiting.load());
  // The next wake-up visits as before.
  host_.credit_throws = false;
  EXPECT_THAT(Wake(), ElementsAre("visit 0 at 0", "blocked 0 7000000 1", "visit 1 at 0"));
  EXPECT_FALSE(slot(0).visiting.load());
}

TEST_F(WallTickerTest, TheEpisodesFirstSampleIsDrainedBeforeTheVisitThatNeedsIt) {
  AddThreads(2);
  provider_.per_tick = 2;
  slot(0).data.awaits_stack = true;  // asked for, not yet drained
  slot(1).data.awaits_stack = true;
  slot(1).blocked_stack = {4, 5};  // already there
  EXPECT_THAT(Wake(), ElementsAre("drain 0", "visit 0 at 0", "visit 1 at 0"));
  EXPECT_FALSE(slot(0).data.saw_episode_stack);
  EXPECT_TRUE(slot(1).data.saw_episode_stack);
  // A stackless episode (its first sample had no stack) counts as one.
  slot(0).blocked_stackless = true;
  EXPECT_THAT(Wake(), ElementsAre("visit 0 at 0", "visit 1 at 0"));
  EXPECT_TRUE(slot(0).data.saw_episode_stack);
}

TEST_F(WallTickerTest, AProvisionalEpisodeStackIsSampledAgainOnceWhenTheTablesAreReady) {
  AddThreads(1);
  FakeSlot& s = slot(0);
  s.blocked_stack = {1, 2};
  s.blocked_provisional = true;
  s.blocked_tables_ready = false;
  s.data.decision = TickDecision::kCreditBlocked;
  // Tables not ready: the provisional stack is all there is.
  host_.tables_ready = false;
  Wake();
  EXPECT_TRUE(s.data.saw_episode_stack);
  // Ready: the provider is told there is no episode stack, and the new
  // sample is counted as a resample.
  host_.tables_ready = true;
  s.data.decision = TickDecision::kSignalBlocked;
  EXPECT_THAT(Wake(), ElementsAre("visit 0 at 0", "read 0", "signal 0"));
  EXPECT_FALSE(s.data.saw_episode_stack);
  EXPECT_EQ(counts_.episodes_resampled, 1u);
  EXPECT_TRUE(s.blocked_resampled);
  // Its sample is provisional again (drained meanwhile): not a second time.
  s.blocked_stack = {1, 2, 3};
  s.blocked_provisional = true;
  Wake();
  EXPECT_TRUE(s.data.saw_episode_stack);
  EXPECT_EQ(counts_.episodes_resampled, 0u);
}

TEST_F(WallTickerTest, AStackWalkedWithReadyTablesIsSampledAgainWhenTheyAreRebuilt) {
  AddThreads(1);
  FakeSlot& s = slot(0);
  s.blocked_stack = {1, 2};
  s.blocked_provisional = true;
  s.blocked_tables_ready = true;
  s.blocked_tables_generation = 3;
  s.data.decision = TickDecision::kCreditBlocked;
  host_.generation = 3;
  Wake();
  EXPECT_TRUE(s.data.saw_episode_stack);
  // Only the generation bits a record keeps count.
  host_.generation = 3 + (internal::RecordMeta::kGenerationMask + 1);
  Wake();
  EXPECT_TRUE(s.data.saw_episode_stack);
  host_.generation = 4;
  Wake();
  EXPECT_FALSE(s.data.saw_episode_stack);
}

TEST_F(WallTickerTest, RunningSamplesSinceTheProvidersLastVisitAreReportedOnce) {
  AddThreads(1);
  FakeSlot& s = slot(0);
  Wake();
  EXPECT_FALSE(s.data.saw_running_sample);
  s.running_samples.store(2);
  // A followed thread's ring is drained before the visit (its samples
  // carry its wall time), and when running samples came meanwhile.
  EXPECT_THAT(Wake(), ElementsAre("drain 0", "visit 0 at 0"));
  EXPECT_TRUE(s.data.saw_running_sample);
  EXPECT_EQ(s.running_samples_at_visit, 2u);
  EXPECT_THAT(Wake(), ElementsAre("visit 0 at 0"));
  EXPECT_FALSE(s.data.saw_running_sample);
  s.data.following = true;
  EXPECT_THAT(Wake(), ElementsAre("drain 0", "visit 0 at 0"));
}

}  // namespace
}  // namespace inprof
