// The wall ticker's pacing, budget and arm queue
// (internal/wall_ticker_thread.h), from the times and counts they are
// given: no clock, no signal. One test starts the ticker's threads to check
// that they call back and stop; it waits on conditions, never on times.
// Linked into wall_ticker_test (tests/meson.build: a link less).
#include "inprof/internal/wall_ticker_thread.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "inprof/internal/profiler_base.h"

namespace inprof::internal {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kPeriod = 10 * kMs;

TEST(TickerPacingTest, FirstWakeUpHasThePaceOfItsSpacing) {
  TickerPacing pacing;
  pacing.Restart(kPeriod);
  EXPECT_EQ(pacing.WakeUp(1000 * kMs, 1), 1.0);
}

// Lateness starts at 1 and moves 1/8 of the way to each wake-up's: after n
// wake-ups 3 periods late it is 3 - 2 x 0.875^n (n = 1: 1.25; n = 60:
// 3 - 7e-4).
TEST(TickerPacingTest, ATickerThatWakesThreePeriodsLateHasPaceThree) {
  TickerPacing pacing;
  pacing.Restart(kPeriod);
  int64_t now = 1000 * kMs;
  pacing.WakeUp(now, 1);
  now += 3 * kPeriod;
  EXPECT_DOUBLE_EQ(pacing.WakeUp(now, 1), 1.25);
  double pace = 0;
  for (int i = 1; i < 60; ++i) {
    now += 3 * kPeriod;
    pace = pacing.WakeUp(now, 1);
  }
  EXPECT_NEAR(pace, 3.0, 0.01);
  EXPECT_NEAR(pacing.lateness(), 3.0, 0.01);
}

// The planned interval is the period times the batch times the spacing: a
// wake-up 40 ms after the last, standing for 4 ticks, is on time.
TEST(TickerPacingTest, ABatchedWakeUpOnItsPlannedIntervalIsOnTime) {
  TickerPacing pacing;
  pacing.Restart(kPeriod);
  pacing.WakeUp(1000 * kMs, 1);
  EXPECT_DOUBLE_EQ(pacing.WakeUp(1040 * kMs, 4), 1.0);
  EXPECT_DOUBLE_EQ(pacing.lateness(), 1.0);
}

// Early wake-ups lower the lateness (to 1/2 here), never the pace below 1.
TEST(TickerPacingTest, EarlyWakeUpsNeverPaceBelowOne) {
  TickerPacing pacing;
  pacing.Restart(kPeriod);
  int64_t now = 1000 * kMs;
  for (int i = 0; i < 60; ++i) {
    EXPECT_EQ(pacing.WakeUp(now, 1), 1.0);
    now += kPeriod / 2;
  }
  EXPECT_NEAR(pacing.lateness(), 0.5, 0.01);
}

// One wake-up's lateness counts at most 100 periods (a ticker stopped in a
// debugger): 0.875 + 0.125 x 100.
TEST(TickerPacingTest, OneVeryLateWakeUpCountsAsOneHundredPeriods) {
  TickerPacing pacing;
  pacing.Restart(kPeriod);
  pacing.WakeUp(1000 * kMs, 1);
  EXPECT_DOUBLE_EQ(pacing.WakeUp(1000 * kMs + 1000 * kPeriod, 1), 13.375);
}

// After each round of steady visits the next wake-up waits twice as long,
// up to kMaxQuietFactor periods; the pace says so.
TEST(TickerPacingTest, AfterASteadyRoundTheNextWakeUpWaitsTwiceAsLongUpToTheCap) {
  TickerPacing pacing;
  pacing.Restart(kPeriod);
  int64_t now = 1000 * kMs;
  pacing.WakeUp(now, 1);
  pacing.steady_visits = 3;
  std::vector<uint32_t> factors;
  std::vector<double> paces;
  for (int i = 0; i < 5; ++i) {
    pacing.EndWakeUp(/*threads=*/3, /*next=*/1);
    factors.push_back(pacing.quiet_factor());
    now += kPeriod * pacing.quiet_factor();  // on time for its spacing
    paces.push_back(pacing.WakeUp(now, 1));
  }
  EXPECT_EQ(factors, (std::vector<uint32_t>{2, 4, 8, 8, 8}));
  EXPECT_EQ(paces, (std::vector<double>{2, 4, 8, 8, 8}));
  EXPECT_EQ(TickerPacing::kMaxQuietFactor, 8u);
}

// With batches of 5 ticks, a revisit interval of kMaxTickBatch (10)
// periods allows a spacing of 2 at most; with batches of 10, none.
TEST(TickerPacingTest, TheSpacingKeepsRevisitsWithinMaxTickBatchPeriods) {
  TickerPacing pacing;
  pacing.steady_visits = 100;
  pacing.EndWakeUp(100, /*next=*/5);
  EXPECT_EQ(pacing.quiet_factor(), 2u);
  pacing.EndWakeUp(100, /*next=*/5);
  EXPECT_EQ(pacing.quiet_factor(), 2u);
  pacing.EndWakeUp(100, /*next=*/10);
  EXPECT_EQ(pacing.quiet_factor(), 1u);
}

TEST(TickerPacingTest, AnUnsteadyRoundOrNoThreadBringsTheBasePeriodBack) {
  TickerPacing pacing;
  pacing.steady_visits = 3;
  pacing.EndWakeUp(3, 1);
  pacing.EndWakeUp(3, 1);
  ASSERT_EQ(pacing.quiet_factor(), 4u);
  pacing.steady_visits = 2;  // one of 3 threads was not steady
  pacing.EndWakeUp(3, 1);
  EXPECT_EQ(pacing.quiet_factor(), 1u);
  pacing.steady_visits = 0;
  pacing.EndWakeUp(0, 1);
  EXPECT_EQ(pacing.quiet_factor(), 1u);
}

TEST(TickerPacingTest, UnquietSaysWhetherTheTickerMustReplan) {
  TickerPacing pacing;
  EXPECT_FALSE(pacing.Unquiet());
  pacing.steady_visits = 1;
  pacing.EndWakeUp(1, 1);
  ASSERT_EQ(pacing.quiet_factor(), 2u);
  EXPECT_TRUE(pacing.Unquiet());
  EXPECT_EQ(pacing.quiet_factor(), 1u);
  EXPECT_FALSE(pacing.Unquiet());
}

// 1% of a core over a 10 ms period is 100 us of CPU a tick: at 40 us a
// visit, 2 visits (2.5 rounded down).
TEST(TickerPacingTest, AVisitCostOf40UsAtA1PercentBudgetCapsVisitsAt2ATick) {
  TickerPacing pacing;
  pacing.Restart(kPeriod);
  pacing.MeasureCpu(5 * kMs, 0.01);  // the baseline
  EXPECT_EQ(pacing.visit_cap(), SIZE_MAX);
  pacing.AddVisits(10);
  pacing.MeasureCpu(5 * kMs + 10 * 40'000, 0.01);
  EXPECT_DOUBLE_EQ(pacing.cost_per_visit_ns(), 40'000);
  EXPECT_EQ(pacing.visit_cap(), 2u);
}

// Smoothed: 3/4 of the old cost, 1/4 of the new. 40 us then 120 us:
// 60 us, 1.67 visits, so 1 (never 0).
TEST(TickerPacingTest, TheCostPerVisitIsSmoothedAndTheCapIsAtLeastOne) {
  TickerPacing pacing;
  pacing.Restart(kPeriod);
  pacing.MeasureCpu(0, 0.01);
  pacing.AddVisits(1);
  pacing.MeasureCpu(40'000, 0.01);
  pacing.AddVisits(1);
  pacing.MeasureCpu(40'000 + 120'000, 0.01);
  EXPECT_DOUBLE_EQ(pacing.cost_per_visit_ns(), 60'000);
  EXPECT_EQ(pacing.visit_cap(), 1u);
  pacing.AddVisits(1);
  pacing.MeasureCpu(160'000 + 10 * kMs, 0.01);  // 10 ms a visit
  EXPECT_EQ(pacing.visit_cap(), 1u);
}

// The allowance holds the CPU, not only the visits the cap sees. A ticker
// at 1% of 10 ms (100 us a tick) that spends 200 us a tick (2 visits and
// what they do not explain: visits ahead of the round robin, a cost that
// rose) runs 100 us into debt each tick, down to 4 s of budget (40 ms);
// the cap stays at its floor of 1 and the wake-ups come further apart.
// Under budget the debt is paid back; nothing is saved up beyond it.
TEST(TickerPacingTest, TheAllowanceHoldsTheCpuToTheBudgetOverTime) {
  // A round at one visit a tick: 100 s, past kLongRoundNs.
  constexpr size_t kThreads = 10'000;
  TickerPacing pacing;
  pacing.Restart(kPeriod);
  int64_t cpu = 0, now = 1'000 * kMs;
  pacing.MeasureCpu(cpu, 0.01, now, kThreads);  // the baselines
  EXPECT_EQ(pacing.allowance_ns(), 0);
  // 10 wake-ups 10 ms apart, 2 visits each at 40 us, and 120 us more each
  // that the visits do not explain: 200 us a tick, 2% of a core.
  for (int i = 0; i < 10; ++i) {
    pacing.AddVisits(2);
    cpu += 200'000;
    now += 10 * kMs;
    pacing.MeasureCpu(cpu, 0.01, now, kThreads);
  }
  EXPECT_NEAR(pacing.allowance_ns(), -10 * 100'000.0, 1);  // 100 us over a tick
  // The cost alone (100 us a visit) allows 1; the debt scales it by 0.9:
  // below one a tick, the wake-ups come twice as far apart.
  EXPECT_EQ(pacing.visit_cap(), 1u);
  EXPECT_EQ(pacing.budget_stretch(), 2u);  // ceil(1 / 0.9)
  // A batch of 10 ticks stands for 5 (10 apart, as unstretched).
  EXPECT_EQ(pacing.BatchWhenStretched(10), 5u);
  // 500 ticks more at 2%: the debt stops at 4 s of budget (40 ms).
  for (int i = 0; i < 500; ++i) {
    pacing.AddVisits(2);
    cpu += 200'000;
    now += 10 * kMs;
    pacing.MeasureCpu(cpu, 0.01, now, kThreads);
  }
  EXPECT_NEAR(pacing.allowance_ns(), -0.01 * TickerPacing::kBudgetDebtNs, 1);
  EXPECT_EQ(pacing.visit_cap(), 1u);
  EXPECT_EQ(pacing.budget_stretch(), 16u);  // the scale at its floor, 1/16
  EXPECT_EQ(pacing.spacing(), 16u);
  // One tick a wake-up, 16 apart: a thread due is visited within 16, not
  // 160 (10 x 16).
  EXPECT_EQ(pacing.BatchWhenStretched(10), 1u);
  EXPECT_EQ(pacing.BatchWhenStretched(1), 1u);
  // Now 2 visits at 30 us a tick (0.6%): the debt is paid back at 40 us a
  // tick, 40 ms in 1,000 ticks; then the allowance stays at 0.
  for (int i = 0; i < 1'500; ++i) {
    pacing.AddVisits(2);
    cpu += 60'000;
    now += 10 * kMs;
    pacing.MeasureCpu(cpu, 0.01, now, kThreads);
  }
  EXPECT_EQ(pacing.allowance_ns(), 0);
  EXPECT_NEAR(pacing.cost_per_visit_ns(), 30'000, 1);
  EXPECT_EQ(pacing.visit_cap(), 3u);  // 100 us / 30 us, rounded down
  EXPECT_EQ(pacing.budget_stretch(), 1u);
  EXPECT_EQ(pacing.BatchWhenStretched(10), 10u);
  // In debt again (one tick of 10 ms of CPU): the wake-ups spaced, but
  // not for 10 threads (a round of 100 ms at one visit a tick).
  pacing.AddVisits(2);
  cpu += 10 * kMs;
  now += 10 * kMs;
  pacing.MeasureCpu(cpu, 0.01, now, kThreads);
  EXPECT_LT(pacing.allowance_ns(), 0);
  EXPECT_EQ(pacing.visit_cap(), 1u);
  EXPECT_GT(pacing.budget_stretch(), 1u);
  pacing.AddVisits(2);
  cpu += 60'000;
  now += 10 * kMs;
  pacing.MeasureCpu(cpu, 0.01, now, 10);
  EXPECT_EQ(pacing.visit_cap(), 1u);
  EXPECT_EQ(pacing.budget_stretch(), 1u);
}

TEST(TickerPacingTest, NoBudgetNoCap) {
  TickerPacing pacing;
  pacing.Restart(kPeriod);
  pacing.MeasureCpu(0, 0);
  pacing.AddVisits(1);
  pacing.MeasureCpu(kMs, 0);
  EXPECT_DOUBLE_EQ(pacing.cost_per_visit_ns(), kMs);
  EXPECT_EQ(pacing.visit_cap(), SIZE_MAX);
}

// Without visits the CPU counts towards the next ones; a clock that went
// back (another thread's) only sets a new baseline.
TEST(TickerPacingTest, CpuWithoutVisitsCountsTowardsTheNextAndAClockThatWentBackRestarts) {
  TickerPacing pacing;
  pacing.Restart(kPeriod);
  pacing.MeasureCpu(0, 0.01);
  pacing.MeasureCpu(30'000, 0.01);  // no visits yet
  pacing.AddVisits(2);
  pacing.MeasureCpu(80'000, 0.01);
  EXPECT_DOUBLE_EQ(pacing.cost_per_visit_ns(), 40'000);  // 80 us over 2
  pacing.AddVisits(5);
  pacing.MeasureCpu(1'000, 0.01);
  EXPECT_DOUBLE_EQ(pacing.cost_per_visit_ns(), 40'000);
  EXPECT_EQ(pacing.visit_cap(), 2u);
  pacing.AddVisits(1);
  pacing.MeasureCpu(1'000 + 40'000, 0.01);
  EXPECT_DOUBLE_EQ(pacing.cost_per_visit_ns(), 40'000);  // 1 visit since the reset
}

TEST(TickerPacingTest, RestartMeasuresTheCostAgain) {
  TickerPacing pacing;
  pacing.Restart(kPeriod);
  pacing.MeasureCpu(0, 0.01);
  pacing.AddVisits(10);
  pacing.MeasureCpu(400'000, 0.01);
  ASSERT_EQ(pacing.visit_cap(), 2u);
  pacing.Restart(kPeriod);
  EXPECT_EQ(pacing.visit_cap(), SIZE_MAX);
  EXPECT_EQ(pacing.cost_per_visit_ns(), 0);
  pacing.MeasureCpu(0, 0.01);  // a new thread's clock: a baseline again
  EXPECT_EQ(pacing.visit_cap(), SIZE_MAX);
}

// At Stop(), a thread's wait for its next visit is at most the time since
// the last wake-up and a round beyond it: 100 ms + 300 ms.
TEST(TickerPacingTest, StopNotesTheWaitSinceTheLastWakeUpAndForgetsThePace) {
  TickerPacing pacing;
  pacing.Restart(kPeriod);
  pacing.WakeUp(1000 * kMs, 1);
  pacing.WakeUp(1100 * kMs, 1);  // 10 periods late
  pacing.NoteRound(300 * kMs);
  pacing.NoteRound(200 * kMs);
  EXPECT_EQ(pacing.longest_round_ns(), static_cast<uint64_t>(300 * kMs));
  pacing.Stop(1200 * kMs);
  EXPECT_EQ(pacing.longest_round_ns(), static_cast<uint64_t>(400 * kMs));
  EXPECT_EQ(pacing.lateness(), 1.0);
  pacing.Stop(5000 * kMs);  // no wake-up since: nothing to note
  EXPECT_EQ(pacing.longest_round_ns(), static_cast<uint64_t>(400 * kMs));
  EXPECT_EQ(pacing.WakeUp(5000 * kMs, 1), 1.0);  // a first wake-up again
}

// Stop() adds the last wake-up's round, not an earlier one's: 10 ms + 50 ms,
// and the 300 ms of the first stays the longest (not 310 ms).
TEST(TickerPacingTest, StopCountsTheLastWakeUpsRoundOnly) {
  TickerPacing pacing;
  pacing.Restart(kPeriod);
  pacing.WakeUp(1000 * kMs, 1);
  pacing.NoteRound(300 * kMs);
  pacing.WakeUp(1010 * kMs, 1);
  pacing.NoteRound(50 * kMs);
  pacing.NoteRound(-1);  // nothing to note
  pacing.Stop(1020 * kMs);
  EXPECT_EQ(pacing.longest_round_ns(), static_cast<uint64_t>(300 * kMs));
}

// The threads' time between two wake-ups: each count for as long as it
// held, threads that left in between included; nothing before the first
// wake-up.
TEST(TickerPacingTest, ThreadTimeIntegratesTheCountBetweenWakeUps) {
  TickerPacing pacing;
  pacing.Restart(kPeriod);
  pacing.CountThreads(900 * kMs, 5);
  EXPECT_EQ(pacing.ThreadTime(1000 * kMs, 5), 0);  // the first wake-up
  pacing.CountThreads(1010 * kMs, 5);               // 5 for 10 ms, then 6
  pacing.CountThreads(1030 * kMs, 6);               // 6 for 20 ms, then 2
  EXPECT_DOUBLE_EQ(pacing.ThreadTime(1100 * kMs, 2), (50.0 + 120.0 + 140.0) * kMs);
  EXPECT_DOUBLE_EQ(pacing.ThreadTime(1110 * kMs, 2), 20.0 * kMs);
  pacing.Restart(kPeriod);
  EXPECT_EQ(pacing.ThreadTime(1200 * kMs, 2), 0);
}

// A thread that ended leaves the time handed out at the next wake-up from
// the last one on (its tail weighs that: WallTimeProvider::TakeTail), up
// to when it left the count; one registered since the last wake-up stays
// in it (no visit saw it: the next wake-up's visits carry its time).
TEST(TickerPacingTest, AThreadThatEndedLeavesTheTimeSinceTheLastWakeUp) {
  TickerPacing pacing;
  pacing.Restart(kPeriod);
  pacing.CountThreads(900 * kMs, 3);
  EXPECT_EQ(pacing.ThreadTime(1000 * kMs, 3), 0);
  // One of 3 (registered at 900 ms) ends and leaves at 1040 ms.
  pacing.CountThreads(1040 * kMs, 3);
  pacing.Ended(1040 * kMs, 900 * kMs);
  // One registered at 1050 ms leaves at 1070 ms.
  pacing.CountThreads(1050 * kMs, 2);
  pacing.CountThreads(1070 * kMs, 3);
  pacing.Ended(1070 * kMs, 1050 * kMs);
  // 2 threads for 100 ms, and the short one's 20 ms.
  EXPECT_DOUBLE_EQ(pacing.ThreadTime(1100 * kMs, 2), (200.0 + 20.0) * kMs);
  // Queued at the next wake-up (ProfilerBase::Tick reads the queue): one
  // of the 2 ended; it leaves the count later, and that part goes too.
  pacing.CountThreads(1150 * kMs, 2);
  pacing.Ended(1150 * kMs, 900 * kMs);
  EXPECT_DOUBLE_EQ(pacing.ThreadTime(1150 * kMs, 2), 50.0 * kMs);
  pacing.CountThreads(1160 * kMs, 2);
  pacing.Ended(1160 * kMs, 900 * kMs);
  EXPECT_DOUBLE_EQ(pacing.ThreadTime(1200 * kMs, 1), (10.0 + 40.0) * kMs);
  // Before the first wake-up: nothing counted, nothing taken away.
  pacing.Restart(kPeriod);
  pacing.Ended(1300 * kMs, 900 * kMs);
  EXPECT_EQ(pacing.ThreadTime(1400 * kMs, 1), 0);
  // A ticker started at 1500 ms with 4 threads armed (Start()): the first
  // wake-up hands out their time since.
  pacing.Restart(kPeriod, 1500 * kMs);
  EXPECT_DOUBLE_EQ(pacing.ThreadTime(1520 * kMs, 4), 80.0 * kMs);
}

// Threads that keep their own account (SlotBase::ticker_own_account) are
// counted out from the wake-up at which it began: their visits and tails
// credit their time, and a share of it as well would count it twice.
TEST(TickerPacingTest, ThreadsKeepingTheirOwnAccountAreCountedOut) {
  TickerPacing pacing;
  pacing.Restart(kPeriod, 1000 * kMs);
  // 4 threads for 100 ms; at that wake-up 2 begin their own accounts.
  EXPECT_DOUBLE_EQ(pacing.ThreadTime(1100 * kMs, 4), 400.0 * kMs);
  pacing.BeginOwnAccounts(2);
  EXPECT_EQ(pacing.own_accounts(), 2u);
  // One of them leaves at 1150 ms: no Ended (its time was not counted).
  pacing.CountThreads(1150 * kMs, 4);
  pacing.LeaveOwnAccount();
  EXPECT_DOUBLE_EQ(pacing.ThreadTime(1200 * kMs, 3), 200.0 * kMs);
  // Never below none; Stop() and Restart() forget them.
  pacing.LeaveOwnAccount();
  pacing.LeaveOwnAccount();
  EXPECT_EQ(pacing.own_accounts(), 0u);
  pacing.BeginOwnAccounts(3);
  pacing.Stop(1300 * kMs);
  EXPECT_EQ(pacing.own_accounts(), 0u);
  pacing.BeginOwnAccounts(3);
  pacing.Restart(kPeriod, 1400 * kMs);
  EXPECT_DOUBLE_EQ(pacing.ThreadTime(1500 * kMs, 3), 300.0 * kMs);
}

class ArmQueueTest : public ::testing::Test {
 protected:
  void AddSlots(int n) {
    for (int i = 0; i < n; ++i) {
      slots_.push_back(std::make_unique<SlotBase>());
      slots_.back()->generation = 1;
    }
  }
  std::vector<SlotBase*> Arm() {
    std::vector<SlotBase*> armed;
    const size_t n = queue_.ArmBatch([&](SlotBase* slot) { armed.push_back(slot); });
    EXPECT_EQ(n, armed.size());
    return armed;
  }
  std::vector<std::unique_ptr<SlotBase>> slots_;
  ArmQueue queue_;
};

TEST_F(ArmQueueTest, ArmsTheOldestFirstInBatches) {
  AddSlots(40);
  for (auto& s : slots_) queue_.Push(s.get());
  EXPECT_TRUE(slots_[0]->arm_queued);
  std::vector<SlotBase*> armed = Arm();
  ASSERT_EQ(armed.size(), ArmQueue::kBatch);
  for (size_t i = 0; i < armed.size(); ++i) EXPECT_EQ(armed[i], slots_[i].get());
  EXPECT_FALSE(slots_[0]->arm_queued);
  EXPECT_TRUE(slots_[39]->arm_queued);
  EXPECT_EQ(queue_.size(), 8u);
  armed = Arm();
  ASSERT_EQ(armed.size(), 8u);
  EXPECT_EQ(armed[0], slots_[32].get());
  EXPECT_TRUE(queue_.empty());
  EXPECT_TRUE(Arm().empty());
}

TEST_F(ArmQueueTest, SkipsASlotReusedSinceOrWhoseThreadIsRetiring) {
  AddSlots(3);
  for (auto& s : slots_) queue_.Push(s.get());
  ++slots_[0]->generation;  // registered again since
  slots_[1]->retiring.store(true);
  EXPECT_EQ(Arm(), std::vector<SlotBase*>{slots_[2].get()});
  for (auto& s : slots_) EXPECT_FALSE(s->arm_queued);
  EXPECT_TRUE(queue_.empty());
}

TEST_F(ArmQueueTest, AForgottenSlotIsNotArmedAndClearEmptiesTheQueue) {
  AddSlots(3);
  for (auto& s : slots_) queue_.Push(s.get());
  queue_.Forget(slots_[1].get());
  EXPECT_FALSE(slots_[1]->arm_queued);
  queue_.Forget(slots_[1].get());  // not queued: nothing
  EXPECT_EQ(queue_.size(), 2u);
  queue_.Clear();
  EXPECT_TRUE(queue_.empty());
  EXPECT_FALSE(slots_[0]->arm_queued);
  EXPECT_FALSE(slots_[2]->arm_queued);
  EXPECT_TRUE(Arm().empty());
}

// The threads for real: the ticker calls back until Stop, the armer once
// per WakeToArm that found it idle. Waits on conditions (a minute at most,
// a hung thread rather than a slow one).
TEST(WallTickerThreadTest, TicksAndArmsUntilStopped) {
  std::mutex mu;
  std::condition_variable cv;
  int ticks = 0;
  int arms = 0;
  TickerPacing pacing;
  WallTickerThread ticker;
  EXPECT_FALSE(ticker.armer_ready());
  ticker.Start(
      absl::Milliseconds(1), pacing,
      [&](size_t batch, int64_t) {
        std::lock_guard<std::mutex> lock(mu);
        EXPECT_GE(batch, 1u);
        ++ticks;
        cv.notify_all();
        return size_t{2};
      },
      [&] {
        std::lock_guard<std::mutex> lock(mu);
        ++arms;
        cv.notify_all();
      });
  EXPECT_TRUE(ticker.armer_ready());
  ticker.WakeToArm();
  ticker.Replan();
  {
    std::unique_lock<std::mutex> lock(mu);
    EXPECT_TRUE(cv.wait_for(lock, std::chrono::minutes(1),
                            [&] { return ticks >= 3 && arms >= 1; }));
  }

  ticker.Stop(/*in_forked_child=*/false);
  EXPECT_FALSE(ticker.armer_ready());
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(arms, 1);  // one WakeToArm, one call
  ticker.Stop(false);  // idempotent
}

}  // namespace
// A window's edge (TickNow): a wake-up of its own, at the time it was
// asked for, standing for the ticks since the last (at least one), returned
// from only once it ran; none when the ticker is not running. The period
// is an hour: no wake-up of the schedule comes during the test.
TEST(WallTickerThreadTest, TickNowWakesTheTickerAndWaitsForIt) {
  std::mutex mu;
  std::vector<std::pair<size_t, int64_t>> ticks;
  TickerPacing pacing;
  WallTickerThread ticker;
  ticker.TickNow(absl::Milliseconds(10));  // not started: returns at once
  ticker.Start(
      absl::Hours(1), pacing,
      [&](size_t batch, int64_t scheduled_ns) {
        std::lock_guard<std::mutex> lock(mu);
        ticks.emplace_back(batch, scheduled_ns);
        return size_t{4};
      },
      [] {});
  const auto now_ns = [] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  const int64_t before = now_ns();
  ticker.TickNow(absl::Minutes(1));
  const int64_t after = now_ns();
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_EQ(ticks.size(), 1u);
    EXPECT_EQ(ticks[0].first, 1u);  // under a period since the start: one tick
    EXPECT_GE(ticks[0].second, before);
    EXPECT_LE(ticks[0].second, after);
  }
  ticker.TickNow(absl::Minutes(1));
  ticker.Stop(/*in_forked_child=*/false);
  ticker.TickNow(absl::Minutes(1));  // stopped: returns at once
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(ticks.size(), 2u);
}

// After a window's edge the schedule starts again from the edge: the next
// regular wake-up stands for the time after it, so it comes at least half
// a jittered interval (0.5-1.5 periods here) after it. Kept on its old
// schedule instead, it came within 100 ms of an edge and visited a whole
// batch for what was left of one. Deterministic: the property holds for
// every regular wake-up, whatever the machine's load (a starved test
// thread only spaces the edges further apart).
TEST(WallTickerThreadTest, AWindowsEdgeRestartsTheSchedule) {
  constexpr int64_t kMs = 1'000'000;
  std::mutex mu;
  std::atomic<bool> in_edge{false};
  struct Tick {
    int64_t at_ns;
    bool edge;
  };
  std::vector<Tick> ticks;
  const auto now_ns = [] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  TickerPacing pacing;
  WallTickerThread ticker;
  ticker.Start(
      absl::Seconds(1), pacing,
      [&](size_t, int64_t) {
        std::lock_guard<std::mutex> lock(mu);
        ticks.push_back({now_ns(), in_edge.load()});
        return size_t{1};
      },
      [] {});
  // Edges every 100 ms for 1.6 s: past the first regular wake-up's latest
  // time on the old schedule (1.5 s).
  for (int i = 0; i < 16; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    in_edge = true;
    ticker.TickNow(absl::Minutes(1));
    in_edge = false;
  }
  ticker.Stop(/*in_forked_child=*/false);
  std::lock_guard<std::mutex> lock(mu);
  int edges = 0;
  for (size_t i = 0; i < ticks.size(); ++i) {
    if (ticks[i].edge) {
      ++edges;
      continue;
    }
    // 0.5 s after the wake-up before it, less what the edge's own tick
    // took after its time was read (microseconds; 100 ms allowed).
    if (i > 0) {
      EXPECT_GE(ticks[i].at_ns - ticks[i - 1].at_ns, 400 * kMs) << "wake-up " << i;
    }
  }
  EXPECT_EQ(edges, 16);
}

}  // namespace inprof::internal
