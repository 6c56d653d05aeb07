// strata tune's parts and the whole on a tiny synthetic model: the read curve and the cost
// model, quality runs that resume from their file, and Tune's choice between full KV in
// memory and a disk plan within the perplexity bound, written as a config that loads.
#include "tuner/tune.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <set>

#include <gtest/gtest.h>

#include <sys/stat.h>

#include "runtime/config/config.h"
#include "runtime/engine/engine.h"
#include "tests/kv/disk_kv_test_util.h"
#include "tests/testing/test_model.h"
#include "tuner/cost_model.h"
#include "tuner/device_profile.h"
#include "tuner/kv_replay.h"
#include "tuner/quality.h"

namespace strata {
namespace {

using testing::KvTempDir;

// A results line as versions before the records' checksum wrote it: without the "fnv1a"
// field. The tests that edit lines to stand for older versions' strip it first.
std::string WithoutChecksum(const std::string& line) {
  const size_t at = line.rfind(",\"fnv1a\":\"");
  return at == std::string::npos ? line : line.substr(0, at) + "}";
}

std::vector<std::string> Lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_mode & 0777 : 0;
}

DeviceProfile Curve() {
  DeviceProfile d;
  // 10K IOPS at depth 1 (100 us), 80K at depth 16 (200 us), 4 KiB; a quarter of the request
  // rate at 64 KiB.
  d.reads = {{4096, 1, 10000, 100},
             {4096, 16, 80000, 200},
             {65536, 1, 2500, 400},
             {65536, 16, 20000, 800}};
  return d;
}

TEST(ReadableBytesTest, NoSizeButZeroReadsAsZero) {
  EXPECT_EQ(ReadableBytes(0), "0 B");
  EXPECT_EQ(ReadableBytes(1), "1 B");
  EXPECT_EQ(ReadableBytes(1023), "1023 B");
  EXPECT_EQ(ReadableBytes(1024), "1.0 KiB");
  EXPECT_EQ(ReadableBytes(1536), "1.5 KiB");
  EXPECT_EQ(ReadableBytes(uint64_t(512) << 20), "512.0 MiB");
  EXPECT_EQ(ReadableBytes(uint64_t(999999) << 30), "976.6 TiB");
  EXPECT_EQ(ReadableBytes(UINT64_MAX), "16.0 EiB");
}

TEST(DeviceProfileTest, ReadSecondsFollowTheCurve) {
  const DeviceProfile d = Curve();
  // On the curve's points.
  EXPECT_NEAR(d.ReadSeconds(1000, 4096, 16), 1000 / 80000.0, 1e-6);
  EXPECT_NEAR(d.ReadSeconds(1000, 4096, 1), 1000 / 10000.0, 1e-6);
  // Fewer requests than the depth allows run at their own depth, and pay a latency at least.
  EXPECT_NEAR(d.ReadSeconds(1, 4096, 16), 100e-6, 1e-9);
  // Between two blocks a request is bound by the smaller one's request rate or the larger
  // one's bandwidth, whichever is slower: 16 KiB at 80K requests a second (the rate limit;
  // 20K of 64 KiB would move four times the bytes), 32 KiB at 40K (the bandwidth).
  EXPECT_NEAR(d.ReadSeconds(1000, 16384, 16), 1000 / 80000.0, 1e-9);
  EXPECT_NEAR(d.ReadSeconds(1000, 32768, 16), 1000 / 40000.0, 1e-9);
  EXPECT_LT(d.ReadSeconds(1000, 32768, 16), d.ReadSeconds(1000, 65536, 16));
  // The same for the latency of a lone request: 4 KiB's 100 us up to where 64 KiB's 400 us,
  // scaled to the size, is more.
  EXPECT_NEAR(d.ReadSeconds(1, 12288, 1), 100e-6, 1e-9);
  EXPECT_NEAR(d.ReadSeconds(1, 32768, 1), 200e-6, 1e-9);
  const double mid_depth = d.ReadSeconds(1000, 4096, 4);
  EXPECT_LT(mid_depth, d.ReadSeconds(1000, 4096, 1));
  EXPECT_GT(mid_depth, d.ReadSeconds(1000, 4096, 16));
  // Beyond the largest block the bytes per second hold.
  EXPECT_NEAR(d.ReadSeconds(1000, 131072, 16), 2 * d.ReadSeconds(1000, 65536, 16), 1e-9);
  EXPECT_EQ(d.ReadSeconds(0, 4096, 16), 0);
}

TEST(CostModelTest, ALayerWaitsForItsOwnReads) {
  const DeviceProfile d = Curve();
  ComputeProfile c;
  c.batches = {1};
  c.dense_seconds = {0.010};
  DiskStepShape s;
  s.n_layer = 10;
  s.attended_tokens = 100;
  s.queue_depth = 4096;  // holds a layer's reads (the curve's rate is that at depth 16)
  // 100 reads a step, 10 a layer at depth 10, hide under a millisecond of compute a layer.
  s.requests = 100;
  s.bytes = 100 * 4096.0;
  const StepPrediction even = PredictDiskStep(d, c, s);
  EXPECT_NEAR(even.step_seconds, 0.010, 1e-9);
  // The same reads, measured evenly spread, are the same step.
  s.layer_read_shares.assign(10, 0.1);
  EXPECT_NEAR(PredictDiskStep(d, c, s).step_seconds, even.step_seconds, 1e-12);
  // All in one layer: 100 reads at depth 16 take 1.25 ms, and that layer waits for what its
  // millisecond of compute leaves of them.
  s.layer_read_shares.assign(10, 0.0);
  s.layer_read_shares[3] = 1.0;
  const StepPrediction one = PredictDiskStep(d, c, s);
  EXPECT_NEAR(one.step_seconds, 0.009 + d.ReadSeconds(100, 4096, 16), 1e-4);
  EXPECT_GT(one.wait_seconds, 0.2e-3);
  // Shares of a size other than the layers' are ignored (spread evenly).
  s.layer_read_shares = {1.0};
  EXPECT_NEAR(PredictDiskStep(d, c, s).step_seconds, even.step_seconds, 1e-12);
  // The shares from per-layer counts between two snapshots.
  const std::vector<double> shares = LayerReadShares({10, 30, 60}, {10, 10, 20});
  ASSERT_EQ(shares.size(), 3u);
  EXPECT_NEAR(shares[0], 0.0, 1e-12);
  EXPECT_NEAR(shares[1], 20.0 / 60, 1e-12);
  EXPECT_NEAR(shares[2], 40.0 / 60, 1e-12);
  EXPECT_TRUE(LayerReadShares({5, 5}, {5, 5}).empty());
}

TEST(CostModelTest, ReadsHideUnderComputeUntilTheyDoNot) {
  const DeviceProfile d = Curve();
  ComputeProfile c;
  c.batches = {1, 8};
  c.dense_seconds = {0.010, 0.030};
  c.attention_seconds_per_token = 1e-7;
  c.ranks = {16, 64};
  c.score_seconds_per_row = {1e-9, 4e-9};
  EXPECT_NEAR(c.DenseSeconds(4), 0.010 + 3 * 0.020 / 7, 1e-12);
  EXPECT_NEAR(c.DenseSeconds(16), 0.030 + 8 * 0.020 / 7, 1e-12);
  EXPECT_NEAR(c.ScoreSecondsPerRow(32), 2e-9, 1e-15);
  DiskStepShape s;
  s.n_layer = 10;
  s.attended_tokens = 1000;
  s.summary_rows = 8192;
  s.rank = 16;
  s.selections = 18;
  s.queue_depth = 4096;  // holds a layer's reads (the curve's rate is that at depth 16)
  s.bytes = 0;
  const StepPrediction none = PredictDiskStep(d, c, s);
  EXPECT_NEAR(none.compute_seconds, 0.010 + 1000 * 1e-7, 1e-12);
  EXPECT_NEAR(none.select_seconds, 18 * 8192 * 1e-9, 1e-12);
  EXPECT_NEAR(none.step_seconds, none.compute_seconds + none.select_seconds, 1e-12);
  // 100 reads of 4 KiB a step (10 a layer at depth 10): hidden under the layers' compute.
  s.requests = 100;
  s.bytes = 100 * 4096.0;
  const StepPrediction few = PredictDiskStep(d, c, s);
  EXPECT_GT(few.read_seconds, 0);
  EXPECT_NEAR(few.step_seconds, none.step_seconds, 1e-12);
  // 20000 a step: the device is the bound, and the step is its time: the selections run
  // while the reads are in flight, as the compute does.
  s.requests = 20000;
  s.bytes = 20000 * 4096.0;
  const StepPrediction many = PredictDiskStep(d, c, s);
  EXPECT_GT(many.read_seconds, many.compute_seconds + many.select_seconds);
  EXPECT_NEAR(many.step_seconds, many.read_seconds, 1e-9);
  EXPECT_NEAR(many.tokens_per_second, 1.0 / many.step_seconds, 1e-9);
  EXPECT_NEAR(many.wait_seconds, many.read_seconds - many.compute_seconds - many.select_seconds,
              1e-12);
  // The policy's work in a layer's path (per attended group and Q8_0 token) is compute too:
  // hidden under the reads of a device-bound layer, added to a compute-bound one.
  ComputeProfile own = c;
  own.disk_seconds_per_group = 1e-8;
  own.q8_group_sizes = {1};
  own.q8_seconds_per_token = {2e-9};
  s.q8_records = true;
  EXPECT_NEAR(PredictDiskStep(d, own, s).step_seconds, many.step_seconds, 1e-12);
  s.requests = 0;
  s.bytes = 0;
  EXPECT_NEAR(PredictDiskStep(d, own, s).step_seconds,
              none.step_seconds + 10 * 1000 * (1e-8 + 2e-9), 1e-12);  // G = 1
  s.q8_records = false;
  const StepPrediction mem = PredictMemoryStep(c, 8, 4096);
  EXPECT_NEAR(mem.step_seconds, 0.030 + 8 * 4096 * 1e-7, 1e-12);
  EXPECT_NEAR(mem.tokens_per_second, 8 / mem.step_seconds, 1e-9);
  // A batch's attention at its own price where one was measured; one sequence's stays.
  c.attention_seconds_per_token_many = 4e-8;
  EXPECT_NEAR(PredictMemoryStep(c, 8, 4096).step_seconds, 0.030 + 8 * 4096 * 4e-8, 1e-12);
  EXPECT_NEAR(PredictMemoryStep(c, 1, 4096).step_seconds, 0.010 + 4096 * 1e-7, 1e-12);
  s.batch = 8;
  s.requests = 0;
  s.bytes = 0;
  EXPECT_NEAR(PredictDiskStep(d, c, s).compute_seconds, 0.030 + 8 * 1000 * 4e-8, 1e-12);
}

// A layer's reads vary about their mean: where their time and the compute that covers them
// balance, the layers that read more than the mean wait, and the step does with them.
TEST(CostModelTest, ReadsThatBalanceTheirCoverWaitForTheLayersAboveTheMean) {
  const DeviceProfile d = Curve();  // 80,000 reads a second at depth 16 and beyond
  ComputeProfile c;
  c.batches = {1};
  c.dense_seconds = {0.010};
  c.attention_seconds_per_token = 1e-7;
  DiskStepShape s;
  s.n_layer = 10;
  s.attended_tokens = 1000;
  s.queue_depth = 4096;  // holds a layer's reads (the curve's rate is that at depth 16)
  auto at = [&](double reads_a_layer) {
    s.requests = 10 * reads_a_layer;
    s.bytes = s.requests * 4096.0;
    return PredictDiskStep(d, c, s);
  };
  // 1.01 ms of compute a layer; 80.8 reads take as long at 80,000 a second.
  const StepPrediction balanced = at(80.8);
  EXPECT_NEAR(balanced.read_seconds, balanced.compute_seconds, 1e-9);
  // Poisson about 80.8 (a spread of 9): about 0.4 of a spread of reads beyond the mean, a
  // layer, at 12.5 us each; far less than three spreads' worth.
  EXPECT_GT(balanced.wait_seconds, 10 * 0.2 * 9 / 80000.0);
  EXPECT_LT(balanced.wait_seconds, 10 * 3 * 9 / 80000.0);
  // Less wait with fewer reads, more with more, and none or all of it far from the balance.
  EXPECT_LT(at(75).wait_seconds, balanced.wait_seconds);
  EXPECT_GT(at(75).wait_seconds, 0);
  EXPECT_GT(at(86).wait_seconds, balanced.wait_seconds);
  EXPECT_EQ(at(20).wait_seconds, 0);
  const StepPrediction bound = at(400);
  EXPECT_NEAR(bound.wait_seconds, bound.read_seconds - bound.compute_seconds, 1e-12);
}

TEST(CostModelTest, ThePolicysOwnWorkAddsPerStepGroupAndRead) {
  ComputeProfile c;
  c.batches = {1};
  c.dense_seconds = {0.010};
  DiskStepShape s;
  s.batch = 2;
  s.n_layer = 10;
  s.attended_tokens = 800;
  s.group_size = 8;  // 100 groups a layer
  s.requests = 50;
  s.selections = 18;
  s.summary_rows = 4096;
  const double bare = PredictDiskStep(DeviceProfile(), c, s).step_seconds;
  c.disk_overhead_seconds = 1e-3;
  c.disk_seconds_per_group = 1e-7;
  c.disk_seconds_per_request = 2e-6;
  c.disk_seconds_per_request_many = 3e-6;  // several sequences' requests, priced apart
  EXPECT_NEAR(PredictDiskStep(DeviceProfile(), c, s).step_seconds - bare,
              1e-3 + 2 * (10 * 100 * 1e-7 + 50 * 3e-6), 1e-12);
  // Q8_0 records: their tokens' own term may be a saving, priced for several sequences
  // apart from one, at the measured group size nearest the plan's.
  s.q8_records = true;
  c.q8_group_sizes = {4, 16};
  c.q8_seconds_per_token = {-5e-8, -2e-8};
  c.q8_seconds_per_token_many = {-4e-8, -1e-8};
  EXPECT_NEAR(PredictDiskStep(DeviceProfile(), c, s).step_seconds - bare,
              1e-3 + 2 * (10 * 100 * 1e-7 + 50 * 3e-6 - 10 * 800 * 4e-8), 1e-12);
  s.group_size = 12;  // nearer 16 than 4
  const double with_q8 = PredictDiskStep(DeviceProfile(), c, s).step_seconds;
  s.q8_records = false;
  EXPECT_NEAR(with_q8 - PredictDiskStep(DeviceProfile(), c, s).step_seconds, -2 * 10 * 800 * 1e-8,
              1e-12);
  s.q8_records = true;
  s.group_size = 8;
  s.batch = 1;
  ComputeProfile none = c;
  none.disk_overhead_seconds = none.disk_seconds_per_group = none.disk_seconds_per_request = 0;
  none.disk_seconds_per_request_many = 0;
  none.q8_seconds_per_token.clear();
  none.q8_seconds_per_token_many.clear();
  EXPECT_NEAR(PredictDiskStep(DeviceProfile(), c, s).step_seconds -
                  PredictDiskStep(DeviceProfile(), none, s).step_seconds,
              1e-3 + 10 * 100 * 1e-7 + 50 * 2e-6 - 10 * 800 * 5e-8, 1e-12);
}

// The selection's own work: per layer selection (and unit of its rank), candidate group and
// attended group shared by the cores a batch selects on, per read request not (the reads are
// queued in sequence order); one sequence and several priced apart.
TEST(CostModelTest, TheSelectionsOwnWorkIsPricedPerSelectionRankCandidateGroupAndRead) {
  ComputeProfile c;
  c.threads = 2;
  c.batches = {1, 8};
  c.dense_seconds = {0.010, 0.030};
  DiskStepShape s;
  s.n_layer = 10;
  s.attended_tokens = 800;
  s.group_size = 8;  // 100 groups a layer
  s.requests = 50;
  s.selections = 18;
  s.summary_rows = 2400;  // per-token summary rows of 600 candidate groups
  s.summary_group_rows = 4;
  EXPECT_DOUBLE_EQ(CandidateGroups(s), 600);
  const ComputeProfile none = c;
  s.rank = 24;
  c.select_one = {.per_selection = 1e-5,
                  .per_candidate = 4e-9,
                  .per_group = 1e-8,
                  .per_request = 3e-6,
                  .per_rank = 2e-7};
  c.select_many = {.per_selection = 2e-5,
                   .per_candidate = 5e-9,
                   .per_group = 2e-8,
                   .per_request = 1e-6,
                   .per_rank = 3e-7};
  EXPECT_NEAR(SelectionSeconds(c, s) - SelectionSeconds(none, s),
              18 * (1e-5 + 600 * 4e-9 + 24 * 2e-7) + 1000 * 1e-8 + 50 * 3e-6, 1e-12);
  // A quarter of the rank: the rank's part a quarter.
  s.rank = 6;
  EXPECT_NEAR(SelectionSeconds(c, s) - SelectionSeconds(none, s),
              18 * (1e-5 + 600 * 4e-9 + 6 * 2e-7) + 1000 * 1e-8 + 50 * 3e-6, 1e-12);
  // Several sequences: their own prices, per selection, rank, candidate and group over the
  // cores.
  s.rank = 24;
  s.batch = 8;
  EXPECT_NEAR(SelectionSeconds(c, s) - SelectionSeconds(none, s),
              8.0 / 2 * (18 * (2e-5 + 600 * 5e-9 + 24 * 3e-7) + 1000 * 2e-8) + 8 * 50 * 1e-6,
              1e-12);
  EXPECT_NEAR(PredictDiskStep(DeviceProfile(), c, s).select_seconds, SelectionSeconds(c, s), 1e-15);
}

// Scoring is priced by rank and by summary rows a group: a per-group summary (a row a group)
// pays each group's softmax term on every row, a per-token one on every G-th; from two
// sequences on, at one core's rate.
TEST(CostModelTest, ScoringIsPricedByRankAndRowsAGroup) {
  ComputeProfile c;
  c.ranks = {16, 64};
  c.score_group_sizes = {1, 4, 16};
  c.score_seconds_per_row = {8e-9,  3e-9, 2e-9,  // rank 16
                             16e-9, 6e-9, 4e-9};
  c.score_seconds_per_row_one_core = {16e-9, 6e-9, 4e-9, 32e-9, 12e-9, 8e-9};
  EXPECT_NEAR(c.ScoreSecondsPerRow(16, 1), 8e-9, 1e-18);
  EXPECT_NEAR(c.ScoreSecondsPerRow(16, 4), 3e-9, 1e-18);
  EXPECT_NEAR(c.ScoreSecondsPerRow(64, 16), 4e-9, 1e-18);
  // Between measured sizes, linear in 1 / G: G = 2 is halfway from 1/1 to 1/4 by a third.
  EXPECT_NEAR(c.ScoreSecondsPerRow(16, 2), 8e-9 + (0.5 - 1.0) / (0.25 - 1.0) * (3e-9 - 8e-9),
              1e-18);
  // G = 8 lies between 1/4 and 1/16 at (1/8 - 1/4) / (1/16 - 1/4) = 2/3.
  EXPECT_NEAR(c.ScoreSecondsPerRow(16, 8), 3e-9 + 2.0 / 3.0 * (2e-9 - 3e-9), 1e-18);
  // Beyond them the nearest; between ranks linear, beyond them proportional.
  EXPECT_NEAR(c.ScoreSecondsPerRow(16, 32), 2e-9, 1e-18);
  EXPECT_NEAR(c.ScoreSecondsPerRow(40, 4), 4.5e-9, 1e-18);
  EXPECT_NEAR(c.ScoreSecondsPerRow(8, 1), 4e-9, 1e-18);
  EXPECT_NEAR(c.ScoreSecondsPerRow(128, 1), 32e-9, 1e-18);
  EXPECT_NEAR(c.ScoreSecondsPerRow(16, 4, /*one_core=*/true), 6e-9, 1e-18);
  // The step: one sequence's selections at the pool's rate; eight on two cores at one
  // core's rate, four at a time.
  c.threads = 2;
  DiskStepShape s;
  s.n_layer = 10;
  s.rank = 16;
  s.selections = 18;
  s.summary_rows = 4096;
  s.summary_group_rows = 4;
  EXPECT_NEAR(SelectionSeconds(c, s), 18 * 4096 * 3e-9, 1e-12);
  s.summary_group_rows = 1;
  EXPECT_NEAR(SelectionSeconds(c, s), 18 * 4096 * 8e-9, 1e-12);
  s.batch = 8;
  EXPECT_NEAR(SelectionSeconds(c, s), 8.0 / 2 * 18 * 4096 * 16e-9, 1e-12);
}

// The low-rank query is priced at the plan's rank: linear between measured ranks, the
// nearest beyond them (its norm and Wq do not shrink with the rank), each further row of a
// batch's call at that rank's price a row; a selection pays it once a layer selection.
TEST(CostModelTest, TheLowRankQueryIsPricedAtThePlansRank) {
  ComputeProfile c;
  c.ranks = {8, 32};
  c.query_seconds = {10e-6, 30e-6};
  c.query_row_seconds = {1e-6, 3e-6};
  EXPECT_NEAR(c.QuerySeconds(8), 10e-6, 1e-15);
  EXPECT_NEAR(c.QuerySeconds(32), 30e-6, 1e-15);
  EXPECT_NEAR(c.QuerySeconds(20), 20e-6, 1e-15);
  EXPECT_NEAR(c.QuerySeconds(4), 10e-6, 1e-15);
  EXPECT_NEAR(c.QuerySeconds(64), 30e-6, 1e-15);
  EXPECT_NEAR(c.QuerySeconds(8, 3), 12e-6, 1e-15);
  EXPECT_NEAR(c.QuerySeconds(20, 5), 20e-6 + 4 * 2e-6, 1e-15);
  EXPECT_NEAR(c.Scaled(2.0).QuerySeconds(20, 5), 2 * c.QuerySeconds(20, 5), 1e-15);
  // A table that does not match the ranks prices nothing rather than another rank's.
  ComputeProfile bad = c;
  bad.query_seconds.pop_back();
  EXPECT_EQ(bad.QuerySeconds(8), 0);
  // In the step: with no scoring table, a selection of rank 8 costs a third of rank 32's.
  c.threads = 2;
  DiskStepShape s;
  s.n_layer = 10;
  s.selections = 18;
  s.rank = 8;
  const double small = SelectionSeconds(c, s);
  s.rank = 32;
  EXPECT_NEAR(small, 18 * 10e-6, 1e-12);
  EXPECT_NEAR(SelectionSeconds(c, s), 18 * 30e-6, 1e-12);
  s.batch = 4;
  EXPECT_NEAR(SelectionSeconds(c, s), 18 * (30e-6 + 3 * 3e-6), 1e-12);
}

// Sequences of a batch select side by side, each whole on one worker: from two sequences
// on, their scoring and the selection's per-layer work spread over min(batch, threads)
// cores.
TEST(CostModelTest, ABatchsSelectionsShareTheCores) {
  ComputeProfile c;
  c.batches = {1, 8};
  c.dense_seconds = {0.010, 0.030};
  c.ranks = {16};
  c.score_seconds_per_row = {1e-9};
  c.select_one.per_selection = c.select_many.per_selection = 2e-6;
  DiskStepShape s;
  s.n_layer = 10;
  s.summary_rows = 4096;
  s.rank = 16;
  s.selections = 18;
  const double per_sequence = 18 * (4096 * 1e-9 + 2e-6);
  auto selection = [&](int32_t threads, int32_t batch) {
    c.threads = threads;
    s.batch = batch;
    return PredictDiskStep(DeviceProfile(), c, s).step_seconds - c.DenseSeconds(batch);
  };
  EXPECT_NEAR(selection(2, 1), per_sequence, 1e-12);
  EXPECT_NEAR(selection(2, 8), 8 * per_sequence / 2, 1e-12);
  EXPECT_NEAR(selection(4, 2), 2 * per_sequence / 2, 1e-12);  // no more cores than sequences
  EXPECT_NEAR(selection(1, 8), 8 * per_sequence, 1e-12);
  // Several sequences' scoring at the scale their runs fitted; one sequence's stays.
  c.select_many.score_scale = 1.5;
  EXPECT_NEAR(selection(2, 8), 8 * 18 * (4096 * 1.5e-9 + 2e-6) / 2, 1e-12);
  EXPECT_NEAR(selection(2, 1), per_sequence, 1e-12);
}

TEST(CostModelTest, ARefinementsReadsWaitBeyondTheNextGuessSelection) {
  const DeviceProfile d = Curve();
  ComputeProfile c;
  c.batches = {8};
  c.dense_seconds = {0.030};  // 3 ms a layer
  DiskStepShape s;
  s.batch = 8;
  s.n_layer = 10;
  s.queue_depth = 4096;  // holds a layer's reads (the curve's rate is that at depth 16)
  s.requests = 20 * 10;  // 160 a layer for the batch: 2 ms, under the layer's compute
  s.bytes = 4096.0 * s.requests;
  const double hidden = PredictDiskStep(d, c, s).step_seconds;
  EXPECT_NEAR(hidden, 0.030, 1e-12);
  // A quarter of them a refinement's: issued just before the layer attends, they add their
  // time to the layer's.
  s.refine_requests = 5 * 10;
  const double refine = d.ReadSeconds(40, 4096, 16);
  EXPECT_NEAR(PredictDiskStep(d, c, s).step_seconds, 0.030 + 10 * refine, 1e-12);
  // The next layer's guess selection runs meanwhile and covers part of that time.
  c.select_many.per_selection = 0.5 * refine * 2 / 8;  // half of it, a layer, over 2 cores
  c.threads = 2;
  s.selections = 10;
  const StepPrediction p = PredictDiskStep(d, c, s);
  EXPECT_NEAR(p.select_seconds, 10 * 0.5 * refine, 1e-12);
  EXPECT_NEAR(p.step_seconds, p.select_seconds + 0.030 + 10 * 0.5 * refine, 1e-12);
  // Fewer than one refinement read a layer: only that share of the layers reads, each
  // waiting one read's latency, not every layer.
  c.select_many = {};
  s.refine_requests = 0.25 * 10 / 8;  // a quarter of a read a layer for the batch
  EXPECT_NEAR(PredictDiskStep(d, c, s).step_seconds, 0.030 + 10 * 0.25 * d.ReadSeconds(1, 4096, 16),
              1e-12);
  // I/O-bound, all reads take what they take with or without refinements.
  s.requests = 2000 * 10;
  s.bytes = 4096.0 * s.requests;
  s.refine_requests = 10;
  EXPECT_NEAR(PredictDiskStep(d, c, s).step_seconds, 10 * d.ReadSeconds(16000, 4096, 16), 1e-12);
}

TEST(CostModelTest, AQueueDeepensOnlyWhereTheCurveServesMoreReadsAtOnce) {
  ComputeProfile c;
  c.batches = {8};
  c.dense_seconds = {0.010};
  DiskStepShape s;
  s.batch = 8;
  s.n_layer = 10;
  s.queue_depth = 64;
  s.requests = 100;  // 80 a layer for the batch, past the queue of 64
  s.bytes = 4096.0 * s.requests;
  // A device that serves twice the reads at 256 in flight as at 64: the layer's 80 reads
  // finish sooner in a deeper queue, and the step is bound by them.
  DeviceProfile deep;
  deep.reads = {{4096, 1, 2000, 500}, {4096, 64, 20000, 3200}, {4096, 256, 40000, 6400}};
  const uint32_t chosen = ChooseQueueDepth(deep, c, s);
  EXPECT_EQ(chosen, 256u);
  DiskStepShape at = s;
  at.queue_depth = chosen;
  EXPECT_LT(PredictDiskStep(deep, c, at).step_seconds,
            (1 - kMinQueueDepthGain) * PredictDiskStep(deep, c, s).step_seconds);
  // One whose rate is flat past 64 (an eMMC's request rate): the default stays.
  DeviceProfile flat = deep;
  flat.reads[2].iops = 20000;
  EXPECT_EQ(ChooseQueueDepth(flat, c, s), 64u);
  // Reads hidden under compute gain nothing from a deeper queue.
  DiskStepShape few = s;
  few.requests = 10;
  few.bytes = 4096.0 * few.requests;
  EXPECT_EQ(ChooseQueueDepth(deep, c, few), 64u);
  // Never shallower than asked, even where the curve is fastest at a shallow depth.
  DeviceProfile shallow;
  shallow.reads = {{4096, 16, 40000, 400}, {4096, 64, 20000, 3200}};
  EXPECT_EQ(ChooseQueueDepth(shallow, c, s), 64u);
}

// The store starts reads beyond its queue only as it reaps earlier ones, which it does once
// the layer waits: those reads run after the compute that covers the others.
TEST(CostModelTest, ReadsBeyondTheQueueRunAfterTheirCover) {
  const DeviceProfile d = Curve();  // 80,000 reads a second at depth 16 and beyond
  ComputeProfile c;
  c.batches = {1};
  c.dense_seconds = {0.010};  // 1 ms a layer
  DiskStepShape s;
  s.n_layer = 10;
  auto wait = [&](double reads_a_layer, uint32_t depth) {
    s.queue_depth = depth;
    s.requests = 10 * reads_a_layer;
    s.bytes = s.requests * 4096.0;
    s.layer_read_shares.assign(10, 0.1);
    return PredictDiskStep(d, c, s).wait_seconds;
  };
  // 40 reads a layer take 0.5 ms: hidden in a queue that holds them; past a queue of 16, the
  // 24 left start once the layer's millisecond is done, and it waits about their 0.3 ms.
  EXPECT_LT(wait(40, 4096), 1e-6);
  EXPECT_GT(wait(40, 16), 10 * 0.8 * d.ReadSeconds(24, 4096, 16));
  EXPECT_LT(wait(40, 16), 10 * 1.3 * d.ReadSeconds(24, 4096, 16));
  // 400 a layer take 5 ms, bound by the device either way: in a deep queue the layer waits
  // 4 ms past its compute; past a queue of 16, the time of the 384 started after it.
  EXPECT_NEAR(wait(400, 4096), 10 * (d.ReadSeconds(400, 4096, 16) - 0.001), 1e-9);
  EXPECT_NEAR(wait(400, 16), 10 * d.ReadSeconds(384, 4096, 16), 1e-9);
  // A queue that holds a layer's reads, their spread about the mean included, changes
  // nothing; one that holds the mean but not the layers above it does.
  EXPECT_EQ(wait(12, 64), wait(12, 4096));
  EXPECT_GT(wait(12, 16), wait(12, 4096));
}

TEST(CostModelTest, AScaledProfileIsTheSameMachineSlowerButNotItsDevice) {
  const DeviceProfile d = Curve();
  ComputeProfile c;
  c.batches = {1, 8};
  c.dense_seconds = {0.010, 0.030};
  c.attention_seconds_per_token = 1e-7;
  c.ranks = {16};
  c.score_seconds_per_row = {1e-9};
  c.query_seconds = {1e-5};
  c.query_row_seconds = {1e-6};
  c.disk_overhead_seconds = 1e-3;
  c.disk_seconds_per_request = 2e-6;
  c.anchor_seconds = 0.004;
  const ComputeProfile slow = c.Scaled(2.0);
  EXPECT_DOUBLE_EQ(slow.anchor_seconds, 0.008);
  EXPECT_DOUBLE_EQ(slow.DenseSeconds(4), 2 * c.DenseSeconds(4));
  DiskStepShape s;
  s.n_layer = 10;
  s.attended_tokens = 1000;
  s.summary_rows = 8192;
  s.rank = 16;
  s.selections = 18;
  s.queue_depth = 4096;  // holds a layer's reads (the curve's rate is that at depth 16)
  s.requests = 100;      // hidden under compute: every part of the step is the CPU's
  s.bytes = 100 * 4096.0;
  EXPECT_NEAR(PredictDiskStep(d, slow, s).step_seconds, 2 * PredictDiskStep(d, c, s).step_seconds,
              1e-12);
  EXPECT_NEAR(PredictMemoryStep(slow, 8, 4096).step_seconds,
              2 * PredictMemoryStep(c, 8, 4096).step_seconds, 1e-12);
  // Bound by the device: its reads take what they took.
  s.requests = 20000;
  s.bytes = 20000 * 4096.0;
  const StepPrediction fast_cpu = PredictDiskStep(d, c, s), slow_cpu = PredictDiskStep(d, slow, s);
  EXPECT_DOUBLE_EQ(slow_cpu.read_seconds, fast_cpu.read_seconds);
  EXPECT_LT(slow_cpu.step_seconds, 2 * fast_cpu.step_seconds);
}

TEST(CostModelTest, AttentionTakesTheSlotGroupsMeasuredNotEverySlot) {
  DiskKvPlan plan;
  plan.layout.group_size = 8;
  plan.sink_groups = 1;
  plan.recent_groups = 2;
  plan.groups_per_step = 10;
  plan.reuse_slots = 40;
  plan.transient_groups = 4;
  DiskKvOptions o;
  o.attend_resident = true;
  // Unmeasured: every slot and read-through slot, besides sink, recent and rolling groups.
  EXPECT_EQ(ShapeOfPlan(plan, o, 1, 8192, 10, 0, 0).attended_tokens, (1 + 44 + 2 + 1) * 8);
  // Measured (all layers): 150 slot groups a step over 10 layers attend 15 a layer.
  EXPECT_EQ(ShapeOfPlan(plan, o, 1, 8192, 10, 0, 0, 150).attended_tokens, (1 + 15 + 2 + 1) * 8);
  // Never more than the slots hold, nor than the context.
  EXPECT_EQ(ShapeOfPlan(plan, o, 1, 8192, 10, 0, 0, 1e6).attended_tokens, (1 + 44 + 2 + 1) * 8);
  EXPECT_EQ(ShapeOfPlan(plan, o, 1, 100, 10, 0, 0).attended_tokens, 100);
  // Without attend_resident only the selection is attended among the slots.
  o.attend_resident = false;
  EXPECT_EQ(ShapeOfPlan(plan, o, 1, 8192, 10, 0, 0).attended_tokens, (1 + 10 + 2 + 1) * 8);
}

// A selection scores the groups between the sink and the recent ones: a row each for a
// per-group summary, G for a per-token one; a layer that takes every such group (and has
// no read-through slots to rank them for) scores none.
TEST(CostModelTest, ASelectionScoresTheRowsBetweenSinkAndRecentGroups) {
  DiskKvPlan plan;
  plan.layout.group_size = 8;
  plan.sink_groups = 1;
  plan.recent_groups = 2;
  plan.groups_per_step = 10;
  plan.layer_groups.assign(10, 10);
  DiskKvOptions o;
  plan.group_summary = false;
  DiskStepShape s = ShapeOfPlan(plan, o, 1, 8192, 10, 0, 0);
  EXPECT_EQ(s.summary_group_rows, 8);
  EXPECT_EQ(s.summary_rows, (1024 - 3) * 8);
  plan.group_summary = true;
  s = ShapeOfPlan(plan, o, 1, 8192, 10, 0, 0);
  EXPECT_EQ(s.summary_group_rows, 1);
  EXPECT_EQ(s.summary_rows, 1024 - 3);
  // Two of ten layers take all 1021 groups: they score nothing, the average drops by a fifth.
  plan.layer_groups[0] = plan.layer_groups[1] = 1021;
  EXPECT_EQ(ShapeOfPlan(plan, o, 1, 8192, 10, 0, 0).summary_rows, std::llround(1021 * 8.0 / 10.0));
  // With read-through slots every layer ranks its groups.
  plan.transient_groups = 2;
  EXPECT_EQ(ShapeOfPlan(plan, o, 1, 8192, 10, 0, 0).summary_rows, 1021);
}

TEST(CostModelTest, NonNegativeFitRecoversConstantsAndNeverGoesNegative) {
  // y = 0.5 + 2 a + 3 b exactly: recovered.
  std::vector<std::vector<double>> x = {{1, 1, 0}, {1, 0, 1}, {1, 2, 1}, {1, 1, 3}, {1, 4, 2}};
  std::vector<double> y;
  for (const auto& r : x) y.push_back(0.5 * r[0] + 2 * r[1] + 3 * r[2]);
  std::vector<double> c = FitNonNegative(x, y);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_NEAR(c[0], 0.5, 1e-9);
  EXPECT_NEAR(c[1], 2, 1e-9);
  EXPECT_NEAR(c[2], 3, 1e-9);
  // y = 4 a - 1: the unconstrained intercept would be negative; the fit keeps it at 0 and
  // is the best non-negative one (the slope through the origin).
  y.clear();
  for (const auto& r : x) y.push_back(4 * r[1] - 1);
  c = FitNonNegative(x, y);
  EXPECT_EQ(c[0], 0);
  for (double v : c) EXPECT_GE(v, 0);
  // Every residual negative (the model over-predicts): nothing to add.
  y.assign(x.size(), -1.0);
  c = FitNonNegative(x, y);
  EXPECT_EQ(c, std::vector<double>(3, 0.0));
}

TEST(QualitySummaryTest, TheBoundHoldsTheUpperEstimateOfTheLoss) {
  // Four positions whose NLL exceeds full KV's by 0.1, 0.3, 0.1, 0.3: mean 0.2, sample
  // standard deviation 0.2/sqrt(3), standard error half that.
  QualitySummary q;
  q.sum.positions = 4;
  q.full_nll = 10.0;
  q.sum.nll = 10.8;
  q.diff_sq = 0.01 + 0.09 + 0.01 + 0.09;
  const double se = 0.2 / std::sqrt(3.0) / 2.0;
  EXPECT_NEAR(q.ppl_loss(), std::exp(0.2) - 1, 1e-12);
  EXPECT_NEAR(q.ppl_loss_upper(), std::exp(0.2 + kQualityZ * se) - 1, 1e-12);
  EXPECT_NEAR(q.ppl_loss_upper(0), q.ppl_loss(), 1e-12);
  // The same mean with no spread: the estimate is the mean.
  q.diff_sq = 4 * 0.04;
  EXPECT_NEAR(q.ppl_loss_upper(), q.ppl_loss(), 1e-9);
}

TEST(DeviceProfileTest, MeasuresTheKvDirectoryThroughTheStore) {
  KvTempDir dir;
  DeviceProfileOptions o;
  o.kv_dir = dir.path();
  o.blocks = {4096, 65536};
  o.depths = {1, 8};
  o.seconds_per_point = 0.05;
  o.file_bytes = uint64_t(16) << 20;
  o.stream_bytes = uint64_t(16) << 20;
  o.threads = 1;
  DeviceProfile p;
  STRATA_ASSERT_OK(ProfileDevice(o, &p));
  ASSERT_EQ(p.reads.size(), 4u);
  for (const ReadCurvePoint& r : p.reads) {
    EXPECT_GT(r.iops, 0) << r.block << " x" << r.depth;
    EXPECT_GT(r.mean_us, 0) << r.block << " x" << r.depth;
  }
  EXPECT_GT(p.memory_gb_per_s, 0);
  EXPECT_GT(p.platform.cores, 0);
  EXPECT_NE(p.Fingerprint().find("cores="), std::string::npos);
  // The probe file is gone.
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
  o.kv_dir = dir.path() + "/missing";
  EXPECT_FALSE(ProfileDevice(o, &p).ok());
}

// The probe file kept for disk anchors: their bursts read the profile's anchor point again
// and give the device's slowdown against it; without a probe the factor stays 1.
TEST(DeviceProfileTest, DiskAnchorsReadTheProbeAgain) {
  KvTempDir dir;
  DeviceProfileOptions o;
  o.kv_dir = dir.path();
  o.blocks = {4096};
  o.depths = {1, 4};
  o.seconds_per_point = 0.02;
  o.rounds = 2;
  o.file_bytes = uint64_t(8) << 20;
  o.stream_bytes = uint64_t(8) << 20;
  o.threads = 1;
  DeviceProfile p;
  std::unique_ptr<DiskProbe> probe;
  STRATA_ASSERT_OK(ProfileDevice(o, &p, &probe));
  ASSERT_NE(probe, nullptr);
  ASSERT_NE(p.AnchorPoint(), nullptr);
  EXPECT_EQ(p.AnchorPoint()->depth, 4u);
  DiskAnchor anchor(probe.get(), p);
  EXPECT_EQ(anchor.Factor(), 1.0);
  for (int i = 0; i < 3; ++i) STRATA_ASSERT_OK(anchor.Step());
  // A measured rate against the profile's: never exactly the profile's, and the same
  // device within a wide margin.
  EXPECT_NE(anchor.Factor(), 1.0);
  EXPECT_GT(anchor.Factor(), 0.05);
  EXPECT_LT(anchor.Factor(), 20.0);
  DiskAnchor none(nullptr, p);
  STRATA_ASSERT_OK(none.Step());
  EXPECT_EQ(none.Factor(), 1.0);
}

TEST(DeviceProfileTest, ASlowerDeviceScalesEveryRead) {
  const DeviceProfile d = Curve();
  const DeviceProfile slow = d.Scaled(2.0);
  for (double n : {1.0, 10.0, 1000.0})
    for (uint32_t depth : {1u, 4u, 16u})
      EXPECT_NEAR(slow.ReadSeconds(n, 16384, depth), 2 * d.ReadSeconds(n, 16384, depth), 1e-12);
  // The anchor point: 4 KiB at the deepest depth up to 16.
  ASSERT_NE(d.AnchorPoint(), nullptr);
  EXPECT_EQ(d.AnchorPoint()->block, 4096u);
  EXPECT_EQ(d.AnchorPoint()->depth, 16u);
  EXPECT_EQ(DeviceProfile().AnchorPoint(), nullptr);
}

// A synthetic model of three layers with a context of 1024, its identity adapters, and a text long
// enough for two evaluation windows of 1024 tokens in its second half.
class TuneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SyntheticModelSpec spec;
    spec.n_ctx_train = 2048;
    spec.n_layer = 3;  // the middle layer's selection is refined (its reads counted apart)
    STRATA_ASSERT_OK(testing::LoadSyntheticModel(spec, dir_.path(), "m", &model_));
    adapters_ = dir_.path() + "/m.adapters";
    STRATA_ASSERT_OK(testing::WriteIdentityAdapters(*model_, {1, 2, 4}, adapters_));
    text_ = dir_.path() + "/text.txt";
    std::ofstream t(text_);
    for (int i = 0; i < 400; ++i) t << SyntheticTrainingText() << "\n";
  }

  TuneOptions Options() {
    TuneOptions o;
    o.model_path = dir_.path() + "/m.gguf";
    o.adapters = adapters_;
    o.text_path = text_;
    o.work_dir = dir_.path() + "/work";
    o.kv_dir = kv_dir_.path();
    o.batches = {1};
    o.contexts = {1024};
    o.threads = 2;
    o.windows = 2;
    o.scored = 16;
    o.verify_steps = 4;
    o.max_candidates = 4;
    o.quick = true;
    return o;
  }

  // Quality runs of 8 positions in 2 windows, cached under the work directory.
  QualityOptions Quality() {
    QualityOptions qo;
    qo.text_path = text_;
    qo.scored = 8;
    qo.windows = 2;
    qo.cache_dir = dir_.path() + "/work";
    qo.threads = 2;
    return qo;
  }
  // Every group of a 512-token context selected, F16 records: the same keys as full KV.
  DiskKvOptions EveryGroup() {
    DiskKvOptions d;
    d.dir = kv_dir_.path();
    d.adapters = adapters_;
    d.group_size = 4;
    d.groups_per_step = 512 / 4;
    d.record_type = KvRecordType::kF16;
    d.budget_bytes = int64_t(64) << 20;
    return d;
  }

  void WindowsSideBySide(int32_t scored);

  KvTempDir dir_, kv_dir_;
  std::unique_ptr<Model> model_;
  std::string adapters_, text_;
};

TEST_F(TuneTest, ThreadsSearchTimesEveryCountFromAllCoresDown) {
  ThreadsChoice tc;
  STRATA_ASSERT_OK(ChooseThreads(*model_, 4, 2, 2, &tc));
  EXPECT_EQ(tc.counts, (std::vector<int32_t>{4, 2, 1}));
  ASSERT_EQ(tc.seconds_per_token.size(), 3u);
  for (double s : tc.seconds_per_token) EXPECT_GT(s, 0);
  // The choice is the fastest, unless a larger count is within the margin of it.
  const auto best = std::min_element(tc.seconds_per_token.begin(), tc.seconds_per_token.end());
  const int32_t chosen =
      int32_t(std::find(tc.counts.begin(), tc.counts.end(), tc.threads) - tc.counts.begin());
  ASSERT_LT(chosen, 3);
  EXPECT_LE(chosen, best - tc.seconds_per_token.begin());
  EXPECT_LE(*best, tc.seconds_per_token[size_t(chosen)]);
  EXPECT_FALSE(ChooseThreads(*model_, 0, 1, 2, &tc).ok());
}

TEST_F(TuneTest, AnchorStepsAreTimedOneAtATimeWithinTheirRoom) {
  AnchorTimer a;
  EXPECT_FALSE(a.Step().ok());  // not initialised
  STRATA_ASSERT_OK(a.Init(*model_, 1, -1, 2));
  STRATA_ASSERT_OK(a.Step());  // the warm-up, not counted
  EXPECT_EQ(a.Seconds(), 0);
  STRATA_ASSERT_OK(a.Step());
  STRATA_ASSERT_OK(a.Step());
  EXPECT_GT(a.Seconds(), 0);
  const Status past = a.Step();
  EXPECT_FALSE(past.ok());
  EXPECT_NE(past.message().find("out of steps"), std::string::npos) << past.ToString();
}

TEST_F(TuneTest, QualityRunsResumeFromTheirFile) {
  const QualityOptions qo = Quality();
  DiskKvOptions d = EveryGroup();
  QualitySummary first, again;
  int32_t ran = 0;
  {
    std::unique_ptr<QualityProfiler> q;
    STRATA_ASSERT_OK(QualityProfiler::Open(*model_, qo, &q));
    EXPECT_GE(q->WindowsAvailable(512), 2);
    STRATA_ASSERT_OK(q->Measure(d, "all", 512, &first, &ran));
    EXPECT_EQ(ran, 2);
  }
  EXPECT_EQ(first.windows, 2);
  EXPECT_EQ(first.sum.positions, 16);
  EXPECT_NEAR(first.ppl_loss(), 0.0, 2e-3);
  EXPECT_GT(first.agreement(), 0.9);
  EXPECT_GT(first.sum.steps, 0);
  // Each step attends (at least) what it selects, every group at every layer.
  EXPECT_GE(first.attended_groups_per_step(), 0.9 * 128 * model_->hparams().n_layer);
  // An interrupted run leaves a line cut short: it is ignored, the rest is kept.
  { std::ofstream(qo.cache_dir + "/quality.jsonl", std::ios::app) << "{\"key\": \"cut"; }
  std::unique_ptr<QualityProfiler> q;
  STRATA_ASSERT_OK(QualityProfiler::Open(*model_, qo, &q));
  STRATA_ASSERT_OK(q->Measure(d, "all", 512, &again, &ran));
  EXPECT_EQ(ran, 0);
  EXPECT_EQ(again.sum.nll, first.sum.nll);
  EXPECT_EQ(again.sum.reads, first.sum.reads);
  EXPECT_EQ(again.sum.refine_reads, first.sum.refine_reads);
  EXPECT_EQ(again.attended_groups_per_step(), first.attended_groups_per_step());
  EXPECT_EQ(again.full_nll, first.full_nll);
  // Another configuration is measured, in windows of one position, whose only step (the
  // slots' fill: on this model later steps read nothing) is counted. Two groups a step of
  // 128 read, and the refinements (exact queries) read some of what the guesses missed.
  QualityOptions one = qo;
  one.scored = 1;
  STRATA_ASSERT_OK(QualityProfiler::Open(*model_, one, &q));
  d.groups_per_step = 2;
  STRATA_ASSERT_OK(q->Measure(d, "two", 512, &again, &ran));
  EXPECT_EQ(ran, 2);
  EXPECT_EQ(again.sum.steps, 2);
  EXPECT_GT(again.sum.reads, 0);
  EXPECT_GT(again.refine_requests_per_step(), 0);
  EXPECT_LT(again.refine_requests_per_step(), again.requests_per_step());
  // Each layer's reads are counted: their shares cover the layers and sum to one.
  const std::vector<double> shares = again.layer_read_shares();
  ASSERT_EQ(shares.size(), size_t(model_->hparams().n_layer));
  double total = 0;
  for (double x : shares) total += x;
  EXPECT_NEAR(total, 1.0, 1e-9);
  // A line written before the refinements' reads were counted is measured again; the
  // other lines are kept, those written before the reads were counted by layer too.
  {
    std::ifstream in(qo.cache_dir + "/quality.jsonl");
    std::string line, kept;
    int32_t stripped = 0, unlayered = 0;
    while (std::getline(in, line)) {
      line = WithoutChecksum(line);
      if (line.find("/two\"") == std::string::npos) {
        const size_t at = line.find("\"layer_reads\"");
        if (at != std::string::npos) {
          line = line.substr(0, at) + line.substr(line.find(',', line.find(']', at)) + 1);
          ++unlayered;
        }
        kept += line + "\n";
        continue;
      }
      const size_t at = line.find("\"refine_reads\"");
      ASSERT_NE(at, std::string::npos);
      kept += line.substr(0, at) + line.substr(line.find(',', at) + 1) + "\n";
      ++stripped;
    }
    EXPECT_EQ(stripped, 2);
    EXPECT_GE(unlayered, 2);
    in.close();
    std::ofstream(qo.cache_dir + "/quality.jsonl", std::ios::trunc) << kept;
  }
  STRATA_ASSERT_OK(QualityProfiler::Open(*model_, one, &q));
  QualitySummary old_lines;
  STRATA_ASSERT_OK(q->Measure(d, "two", 512, &old_lines, &ran));
  EXPECT_EQ(ran, 2);
  EXPECT_EQ(old_lines.sum.refine_reads, again.sum.refine_reads);
  STRATA_ASSERT_OK(q->Measure(EveryGroup(), "all", 512, &again, &ran));
  EXPECT_EQ(ran, 2);  // one position a window is another line than eight
  STRATA_ASSERT_OK(QualityProfiler::Open(*model_, qo, &q));
  STRATA_ASSERT_OK(q->Measure(EveryGroup(), "all", 512, &again, &ran));
  EXPECT_EQ(ran, 0);                               // the eight-position lines were kept
  EXPECT_TRUE(again.layer_read_shares().empty());  // without per-layer counts: spread evenly
}

// The results file after an interruption: its last line cut short, or a line altered.
// Each such line is reported once, naming the file and the line, and measured again; the
// whole lines are kept, and a line appended afterwards reads back whole (it does not
// continue the cut one). The work files are their owner's only: they hold activations.
TEST_F(TuneTest, ADamagedResultsLineIsReportedOnceAndMeasuredAgain) {
  QualityOptions qo = Quality();
  std::vector<std::string> said;
  qo.log = [&said](const std::string& line) { said.push_back(line); };
  const std::string results = qo.cache_dir + "/quality.jsonl";
  const DiskKvOptions d = EveryGroup();
  QualitySummary first, again;
  int32_t ran = 0;
  std::unique_ptr<QualityProfiler> q;
  STRATA_ASSERT_OK(QualityProfiler::Open(*model_, qo, &q));
  STRATA_ASSERT_OK(q->Measure(d, "all", 512, &first, &ran));
  ASSERT_EQ(ran, 2);
  const std::vector<std::string> whole = Lines(results);
  ASSERT_EQ(whole.size(), 4u);  // full KV's two windows, then the plan's
  ASSERT_NE(whole[3].find("/all\""), std::string::npos) << whole[3];
  EXPECT_TRUE(said.empty());

  EXPECT_EQ(ModeOf(qo.cache_dir), 0700u);
  int files = 0;
  for (const auto& f : std::filesystem::directory_iterator(qo.cache_dir)) {
    EXPECT_EQ(ModeOf(f.path().string()), 0600u) << f.path();
    ++files;
  }
  EXPECT_EQ(files, 3);  // the results and the two windows' captures; no temporary file

  // Cut in the middle of the last line, as a kill while it was written leaves it.
  {
    const std::string all = Slurp(results);
    std::ofstream(results, std::ios::binary | std::ios::trunc)
        << all.substr(0, all.size() - whole[3].size() / 2);
  }
  STRATA_ASSERT_OK(QualityProfiler::Open(*model_, qo, &q));
  ASSERT_EQ(said.size(), 1u);
  EXPECT_NE(said[0].find(results + ": line 4 "), std::string::npos) << said[0];
  STRATA_ASSERT_OK(q->Measure(d, "all", 512, &again, &ran));
  EXPECT_EQ(ran, 1);
  EXPECT_EQ(again.sum.nll, first.sum.nll);
  EXPECT_EQ(again.sum.reads, first.sum.reads);
  // The file holds the three whole lines and the window measured again, each a line of its
  // own: read again, nothing is reported and nothing measured.
  EXPECT_EQ(Lines(results).size(), 4u);
  said.clear();
  STRATA_ASSERT_OK(QualityProfiler::Open(*model_, qo, &q));
  STRATA_ASSERT_OK(q->Measure(d, "all", 512, &again, &ran));
  EXPECT_EQ(ran, 0);
  EXPECT_TRUE(said.empty()) << said[0];
  EXPECT_EQ(again.sum.nll, first.sum.nll);

  // A line altered, still JSON: its checksum tells. A whole line without its newline (the
  // write cut just before it) is not trusted either.
  {
    std::vector<std::string> lines = Lines(results);
    ASSERT_EQ(lines.size(), 4u);
    ASSERT_NE(lines[2].find("/all\""), std::string::npos) << lines[2];
    const std::string was = "\"positions\":8";
    const size_t at = lines[2].find(was);
    ASSERT_NE(at, std::string::npos);
    lines[2].replace(at, was.size(), "\"positions\":9");
    std::string text;
    for (const std::string& l : lines) text += l + "\n";
    text.pop_back();
    std::ofstream(results, std::ios::binary | std::ios::trunc) << text;
    said.clear();
    STRATA_ASSERT_OK(QualityProfiler::Open(*model_, qo, &q));
    ASSERT_EQ(said.size(), 1u);
    EXPECT_NE(said[0].find(results + ": lines 3, 4 "), std::string::npos) << said[0];
  }
  STRATA_ASSERT_OK(q->Measure(d, "all", 512, &again, &ran));
  EXPECT_EQ(ran, 2);
  EXPECT_EQ(again.sum.nll, first.sum.nll);
  EXPECT_EQ(again.full_nll, first.full_nll);
  said.clear();
  STRATA_ASSERT_OK(QualityProfiler::Open(*model_, qo, &q));
  STRATA_ASSERT_OK(q->Measure(d, "all", 512, &again, &ran));
  EXPECT_EQ(ran, 0);
  EXPECT_TRUE(said.empty());
  EXPECT_EQ(ModeOf(results), 0600u);
}

// A capture cut short or altered is reported and computed again; one written before
// captures carried a checksum (the data and nothing after it) is still read.
TEST_F(TuneTest, ADamagedCaptureIsReportedAndComputedAgain) {
  const QualityOptions qo = Quality();
  std::unique_ptr<QualityProfiler> q;
  STRATA_ASSERT_OK(QualityProfiler::Open(*model_, qo, &q));
  const std::span<const int32_t> tokens(q->tokens().data(), 255);
  std::vector<std::string> said;
  const auto log = [&said](const std::string& line) { said.push_back(line); };
  KvCapture made, read;
  bool computed = false;
  STRATA_ASSERT_OK(LoadOrCapture(*model_, tokens, qo.cache_dir, 2, &made, &computed, log));
  EXPECT_TRUE(computed);
  std::string path;
  for (const auto& f : std::filesystem::directory_iterator(qo.cache_dir))
    if (f.path().extension() == ".kvcap") path = f.path().string();
  ASSERT_FALSE(path.empty());
  EXPECT_EQ(ModeOf(path), 0600u);
  const std::string good = Slurp(path);
  ASSERT_EQ(good.size(), 16 + made.data.size() * 2 + 8);
  std::string altered = good;
  altered[good.size() / 2] = char(altered[good.size() / 2] ^ 0x10);
  for (const std::string& bad :
       {altered, good.substr(0, good.size() - 3), good.substr(0, good.size() / 2), good + "x"}) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bad;
    said.clear();
    STRATA_ASSERT_OK(LoadOrCapture(*model_, tokens, qo.cache_dir, 2, &read, &computed, log));
    EXPECT_TRUE(computed);
    ASSERT_EQ(said.size(), 1u);
    EXPECT_NE(said[0].find(path), std::string::npos) << said[0];
    EXPECT_TRUE(read.data == made.data);
    EXPECT_EQ(Slurp(path), good);  // written again: reported once
  }
  std::ofstream(path, std::ios::binary | std::ios::trunc) << good.substr(0, good.size() - 8);
  said.clear();
  STRATA_ASSERT_OK(LoadOrCapture(*model_, tokens, qo.cache_dir, 2, &read, &computed, log));
  EXPECT_FALSE(computed);
  EXPECT_TRUE(said.empty());
  EXPECT_TRUE(read.data == made.data);
}

// A window's reads are those of its decode once the plan's reads settle (kSettleSteps), as
// a check run counts them: the first step loads the slots the replayed prefix left empty.
// Lines written with another rule are measured again.
TEST_F(TuneTest, QualityWindowsCountTheirReadsOnceTheySettle) {
  QualityOptions qo = Quality();
  qo.windows = 1;
  qo.scored = kSettleSteps + 4;
  DiskKvOptions d = EveryGroup();
  d.groups_per_step = 2;
  std::unique_ptr<QualityProfiler> q;
  STRATA_ASSERT_OK(QualityProfiler::Open(*model_, qo, &q));
  QualitySummary s;
  int32_t ran = 0;
  STRATA_ASSERT_OK(q->Measure(d, "two", 512, &s, &ran));
  EXPECT_EQ(ran, 1);
  EXPECT_EQ(s.sum.positions, qo.scored);
  EXPECT_EQ(s.sum.steps, 4);

  // The same decode, counted by hand.
  std::shared_ptr<const KvCapture> cap;
  STRATA_ASSERT_OK(q->Capture(512, 0, &cap));
  std::unique_ptr<Engine> e;
  STRATA_ASSERT_OK(CreateRunEngine(*model_, qo.threads, 512, 1, &d, &e));
  SeqId seq;
  STRATA_ASSERT_OK(e->NewSequence(&seq));
  const int32_t prefix = 512 - qo.scored - 1;
  STRATA_ASSERT_OK(ReplayPrefix(e->kv(), seq, *cap, prefix));
  const KvCounters before = e->kv().counters();
  KvCounters after_first, settled;
  std::vector<float> logits;
  ForwardBatch b;
  for (int32_t i = 0; i < qo.scored; ++i) {
    if (i == kSettleSteps) settled = e->kv().counters();
    b.Clear();
    b.Add(seq, prefix + i, std::span<const int32_t>(&q->tokens()[size_t(prefix + i)], 1));
    STRATA_ASSERT_OK(e->Evaluate(b, &logits));
    if (i == 0) after_first = e->kv().counters();
  }
  const KvCounters end = e->kv().counters();
  EXPECT_EQ(s.sum.reads, int64_t(end.reads_issued - settled.reads_issued));
  EXPECT_EQ(s.sum.bytes_read, int64_t(end.bytes_read - settled.bytes_read));
  // The first step fills the slots: it reads more than the later ones do on average (on
  // this model, whose selections barely move, they read nothing).
  const double first = double(after_first.reads_issued - before.reads_issued);
  EXPECT_GT(first, s.requests_per_step());

  // A line without the field, or counted from another step, is measured again.
  for (const std::string field : {"", "\"counted_from\":1,"}) {
    std::ifstream in(qo.cache_dir + "/quality.jsonl");
    std::string line, kept;
    while (std::getline(in, line)) {
      line = WithoutChecksum(line);
      const size_t at = line.find("\"counted_from\"");
      if (at == std::string::npos) continue;  // stripped in the round before
      kept += line.substr(0, at) + field + line.substr(line.find(',', at) + 1) + "\n";
    }
    in.close();
    std::ofstream(qo.cache_dir + "/quality.jsonl", std::ios::trunc) << kept;
    STRATA_ASSERT_OK(QualityProfiler::Open(*model_, qo, &q));
    QualitySummary again;
    STRATA_ASSERT_OK(q->Measure(d, "two", 512, &again, &ran));
    EXPECT_EQ(ran, 1) << field;
    EXPECT_EQ(again.sum.reads, s.sum.reads);
  }
}

// A configuration's windows decoded side by side (memory for both) give what they give
// one at a time (no memory for a second): full KV to the bit, a token's result not
// depending on who shares its pass; the disk policy selects, reads and scores each
// sequence on its own, so its windows too.
// With one scored position a window counts its only step, the slots' fill, which reads;
// on this model the later steps, whose selections barely move, read nothing.
TEST_F(TuneTest, WindowsSideBySideGiveWhatTheyGiveOneAtATime) {
  for (int32_t scored : {8, 1}) {
    SCOPED_TRACE(scored);
    WindowsSideBySide(scored);
  }
}

void TuneTest::WindowsSideBySide(int32_t scored) {
  DiskKvOptions d = EveryGroup();
  d.groups_per_step = 2;
  QualitySummary alone[2], together[2];
  for (bool side_by_side : {false, true}) {
    QualityOptions qo = Quality();
    qo.scored = scored;
    qo.cache_dir += (side_by_side ? "/together" : "/alone") + std::to_string(scored);
    qo.capture_memory_bytes = side_by_side ? uint64_t(1) << 30 : 0;
    std::unique_ptr<QualityProfiler> q;
    STRATA_ASSERT_OK(QualityProfiler::Open(*model_, qo, &q));
    QualitySummary* out = side_by_side ? together : alone;
    int32_t ran = 0;
    STRATA_ASSERT_OK(q->Measure(EveryGroup(), "all", 512, &out[0], &ran));
    EXPECT_EQ(ran, 2);
    STRATA_ASSERT_OK(q->Measure(d, "two", 512, &out[1], &ran));
    EXPECT_EQ(ran, 2);
  }
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(together[i].full_nll, alone[i].full_nll);
    EXPECT_EQ(together[i].sum.positions, alone[i].sum.positions);
    EXPECT_EQ(together[i].sum.nll, alone[i].sum.nll) << i;
    EXPECT_EQ(together[i].sum.agree, alone[i].sum.agree) << i;
    // Reads a step stay a sequence's: the pass's reads shared among its windows.
    EXPECT_EQ(together[i].sum.steps, alone[i].sum.steps);
    EXPECT_EQ(together[i].sum.reads, alone[i].sum.reads) << i;
    EXPECT_EQ(together[i].sum.bytes_read, alone[i].sum.bytes_read) << i;
  }
  if (scored == 1) {
    EXPECT_GT(together[1].sum.reads, 0);
  }
}

TEST_F(TuneTest, ShorterContextsReplayTheLongestContextsCaptures) {
  QualityOptions qo = Quality();
  qo.window_stride = 1024;
  std::unique_ptr<QualityProfiler> q;
  STRATA_ASSERT_OK(QualityProfiler::Open(*model_, qo, &q));
  ASSERT_GE(q->WindowsAvailable(1024), 2);
  EXPECT_EQ(q->WindowsAvailable(512), q->WindowsAvailable(1024));
  EXPECT_EQ(q->WindowBegin(512, 1), 1024u);
  EXPECT_EQ(q->WindowBegin(1024, 1), 1024u);
  // A window's capture spans its stride but the last token, whatever the context.
  std::shared_ptr<const KvCapture> short_cap, long_cap;
  STRATA_ASSERT_OK(q->Capture(512, 1, &short_cap));
  STRATA_ASSERT_OK(q->Capture(1024, 1, &long_cap));
  EXPECT_EQ(short_cap->n_tokens, 1023);
  EXPECT_TRUE(short_cap->data == long_cap->data);
  // Without memory for captures, each call reads its own copy back from the work directory;
  // with it, the first read stays loaded for both contexts.
  EXPECT_NE(short_cap.get(), long_cap.get());
  {
    QualityOptions held = qo;
    held.capture_memory_bytes = uint64_t(1) << 30;
    std::unique_ptr<QualityProfiler> h;
    STRATA_ASSERT_OK(QualityProfiler::Open(*model_, held, &h));
    std::shared_ptr<const KvCapture> a, b;
    STRATA_ASSERT_OK(h->Capture(512, 1, &a));
    STRATA_ASSERT_OK(h->Capture(1024, 1, &b));
    EXPECT_EQ(a.get(), b.get());
    EXPECT_TRUE(a->data == long_cap->data);
  }
  EXPECT_FALSE(q->Capture(512, q->WindowsAvailable(512), &short_cap).ok());
  const DiskKvOptions d = EveryGroup();
  QualitySummary s;
  int32_t ran = 0;
  STRATA_ASSERT_OK(q->Measure(d, "all", 512, &s, &ran));
  EXPECT_EQ(ran, 2);
  EXPECT_NEAR(s.ppl_loss(), 0.0, 2e-3);
  STRATA_ASSERT_OK(q->Measure(d, "all", 1024, &s, &ran));
  EXPECT_EQ(ran, 2);
  // Two windows, one capture each, shared by both contexts.
  int captures = 0;
  for (const auto& f : std::filesystem::directory_iterator(qo.cache_dir))
    captures += f.path().extension() == ".kvcap";
  EXPECT_EQ(captures, 2);
}

TEST_F(TuneTest, FullKvWhereItFitsAndWinsADiskPlanWithinTheBoundWhereItDoesNotFit) {
  TuneOptions o = Options();
  o.kv_memory_bytes = int64_t(1) << 30;
  // No disk plan measured: full KV, which fits, is the choice. Variants too are capped: one
  // whose parent was passed over for its speed may be measured (it reads less), and on a
  // machine where the parents' selection is dear, it may beat full KV. Threads left to the
  // tuner: it picks a count it timed, which the profile and the written config use.
  const int32_t variants = o.max_variants;
  o.max_candidates = 0;
  o.max_variants = 0;
  o.threads = 0;
  TuneReport mem;
  STRATA_ASSERT_OK(Tune(*model_, o, nullptr, &mem));
  EXPECT_GE(mem.compute.threads, 1);
  EXPECT_LE(mem.compute.threads, mem.device.platform.cores);
  EXPECT_EQ(TunedConfig(*model_, o, mem).engine.n_threads, mem.compute.threads);
  o.threads = 2;
  ASSERT_EQ(mem.choices.size(), 1u);
  EXPECT_FALSE(mem.choices[0].disk);
  EXPECT_EQ(mem.choices[0].quality_runs, 0);
  EXPECT_GT(mem.choices[0].measured_tokens_per_second, 0);
  const StepPrediction full = PredictMemoryStep(mem.compute, 1, 1024);
  EXPECT_DOUBLE_EQ(mem.choices[0].predicted.tokens_per_second, full.tokens_per_second);
  // With plans measured, a disk plan is chosen over full KV only when it is predicted
  // faster and keeps the bound
  o.max_candidates = 4;
  o.max_variants = variants;
  STRATA_ASSERT_OK(Tune(*model_, o, nullptr, &mem));
  const TunedChoice& m = mem.choices[0];
  // (or, as a runner-up, measured faster than the plan predicted fastest).
  if (m.disk) {
    if (m.predicted_best.empty()) {
      EXPECT_GT(m.predicted.tokens_per_second,
                PredictMemoryStep(mem.compute, 1, 1024).tokens_per_second);
    } else {
      for (const TunedCandidate& k : m.candidates) {
        if (k.key == m.predicted_best) {
          EXPECT_GT(m.measured_tokens_per_second, k.measured_tokens_per_second);
        }
      }
    }
    EXPECT_LE(m.ppl_loss, o.max_ppl_loss);
  }

  // Full KV of 1024 tokens takes 3 layers x 1024 x 32 x 2 x 2 bytes = 384 KiB. The small
  // model's loss sits near the bound at every budget (16 positions, two windows), so the
  // search may need more than a few quality runs to find a plan within it.
  o.max_ppl_loss = 0.03;
  o.max_candidates = 8;
  o.kv_memory_bytes = 240 << 10;
  o.repeat_checks = 2;
  TuneReport disk;
  STRATA_ASSERT_OK(Tune(*model_, o, nullptr, &disk));
  ASSERT_EQ(disk.choices.size(), 1u);
  const TunedChoice& c = disk.choices[0];
  EXPECT_TRUE(c.disk);
  EXPECT_LE(c.ppl_loss, o.max_ppl_loss);
  EXPECT_GT(c.quality_runs, 0);
  EXPECT_LE(c.quality_runs, o.max_candidates + o.max_variants);
  EXPECT_GT(c.default_tokens_per_second, 0);
  EXPECT_LE(c.disk_options.budget_bytes, 240 << 10);
  EXPECT_GT(c.disk_options.group_size, 0);  // resolved, not "auto"
  EXPECT_GT(c.disk_options.ratio, 0);
  EXPECT_GT(c.measured_tokens_per_second, 0);
  // The check run timed the anchor step beside itself and priced the plan again at the
  // machine's speed then.
  EXPECT_GT(disk.compute.anchor_seconds, 0);
  EXPECT_GT(c.anchor_seconds, 0);
  EXPECT_GT(c.anchored_tokens_per_second, 0);
  // Every run was measured in two more rounds (repeat_checks), and only those; the first
  // round's figures are the remeasured ones.
  EXPECT_GT(c.remeasured_tokens_per_second, 0);
  EXPECT_GT(c.remeasured_anchored_tokens_per_second, 0);
  ASSERT_EQ(c.measured_again_tokens_per_second.size(), 2u);
  EXPECT_EQ(c.measured_again_tokens_per_second[0], c.remeasured_tokens_per_second);
  EXPECT_GT(c.measured_again_tokens_per_second[1], 0);
  for (const TunedCandidate& k : c.candidates)
    if (k.key != c.key) {
      const bool ran = k.measured_tokens_per_second > 0;
      EXPECT_EQ(k.remeasured_tokens_per_second > 0, ran) << k.key;
      EXPECT_EQ(k.measured_again_tokens_per_second.size(), ran ? 2u : 0u) << k.key;
    }
  // A head of 16 values holds no whole Q8_0 block: the policy stores F16 alone, and the
  // profile times no Q8_0 prices (the real model's are checked in tests/cli/tune_test.sh).
  ASSERT_EQ(model_->hparams().head_dim, 16);
  EXPECT_TRUE(disk.compute.q8_group_sizes.empty());
  EXPECT_EQ(disk.compute.Q8SecondsPerToken(4, false), 0.0);
  // The runners-up by prediction ran beside the plan predicted fastest, and the choice is
  // whichever of them measured fastest (no --validate runs here).
  int ran = 0;
  for (const TunedCandidate& k : c.candidates) {
    if (!(k.measured_tokens_per_second > 0)) continue;
    ++ran;
    EXPECT_TRUE(k.within_bound) << k.key;
    // The check counted its own reads and priced the plan again with them.
    EXPECT_GT(k.predicted_at_measured_reads, 0) << k.key;
    EXPECT_EQ(k.measured_requests_per_step > 0, k.measured_bytes_per_step > 0) << k.key;
    EXPECT_LE(k.measured_tokens_per_second, c.measured_tokens_per_second) << k.key;
    // It attended slot groups every layer, and the quality windows, of as many steps after
    // the same settling, counted about as many (resident groups grow as a sequence decodes).
    EXPECT_GT(k.measured_attended_groups_per_step, 0) << k.key;
    EXPECT_NEAR(k.measured_attended_groups_per_step, k.attended_groups_per_step,
                0.25 * k.attended_groups_per_step)
        << k.key;
  }
  int within = 0;
  for (const TunedCandidate& k : c.candidates) within += k.within_bound ? 1 : 0;
  EXPECT_GE(ran, std::min(within - 1, o.runners_up));
  if (!c.predicted_best.empty()) {
    EXPECT_NE(c.predicted_best, c.key);
  }

  // What is written loads, and start-up picks the entry and its settings.
  const Config written = TunedConfig(*model_, o, disk);
  Config loaded;
  STRATA_ASSERT_OK(ParseConfig(ConfigToYaml(written), "strata.yaml", &loaded));
  ASSERT_EQ(loaded.tuned.size(), 1u);
  EXPECT_EQ(loaded.provenance.model_identity, model_->identity_hex());
  EXPECT_EQ(loaded.provenance.machine, disk.device.Fingerprint());
  EXPECT_EQ(loaded.engine.n_ctx, 1024);
  Config start = loaded;
  start.engine.kv.policy = KvPolicyKind::kMemory;
  STRATA_ASSERT_OK(SelectTuned(1, 1024, &start));
  EXPECT_EQ(start.engine.kv.policy, KvPolicyKind::kDisk);
  EXPECT_EQ(start.engine.kv.disk.group_size, c.disk_options.group_size);
  EXPECT_EQ(start.engine.kv.disk.ratio, c.disk_options.ratio);
  EXPECT_EQ(start.engine.kv.disk.budget_bytes, c.disk_options.budget_bytes);
  EXPECT_EQ(start.engine.kv.disk.groups_per_step, c.disk_options.groups_per_step);
  EXPECT_NE(start.tuned_choice.find("batch 1, context 1024"), std::string::npos);

  // A rerun finds every quality result in its file: a plan measured before is not measured
  // again (which plans a rerun visits may differ: the speed profile is measured afresh).
  std::vector<std::string> first, second;
  auto collect = [](std::vector<std::string>* out) {
    return [out](const std::string& l) { out->push_back(l); };
  };
  TuneReport once, rerun;
  STRATA_ASSERT_OK(Tune(*model_, o, collect(&first), &once));
  STRATA_ASSERT_OK(Tune(*model_, o, collect(&second), &rerun));
  std::set<std::string> measured;
  for (const std::string& l : first)
    if (l.find(": ppl") != std::string::npos) measured.insert(l.substr(0, l.find(": ppl")));
  int cached = 0;
  for (const std::string& l : second) {
    if (l.find(": ppl") == std::string::npos) continue;
    if (measured.count(l.substr(0, l.find(": ppl"))) == 0) continue;
    EXPECT_NE(l.find("(cached)"), std::string::npos) << l;
    ++cached;
  }
  EXPECT_GT(cached, 0);
}

// A batch larger than a plan's pass (on this small model, a budget below full KV stages one
// token a pass): the fitting runs that cannot step it at once are left out, and the check
// runs step it in several passes, its three sequences replaying the two quality windows.
TEST_F(TuneTest, ABatchLargerThanAPlansPassIsTunedInSeveralPasses) {
  TuneOptions o = Options();
  o.batches = {3};
  o.kv_memory_bytes = 3 * (int64_t(320) << 10);  // below full KV a sequence: a disk plan
  o.max_ppl_loss = 1.0;
  o.max_candidates = 1;
  o.max_variants = 0;
  o.runners_up = 0;
  TuneReport r;
  STRATA_ASSERT_OK(Tune(*model_, o, nullptr, &r));
  ASSERT_EQ(r.choices.size(), 1u);
  const TunedChoice& c = r.choices[0];
  EXPECT_TRUE(c.disk);
  EXPECT_EQ(c.batch, 3);
  EXPECT_GT(c.measured_tokens_per_second, 0);
  EXPECT_GT(c.default_tokens_per_second, 0);
}

// Memory no plan fits is refused before anything is measured (nothing logged), naming the
// flag, what it gives and the least the tuner could plan with.
TEST_F(TuneTest, NoPlanInTheMemoryIsAnErrorThatSaysSo) {
  TuneOptions o = Options();
  o.kv_memory_bytes = 4 << 10;
  TuneReport r;
  std::vector<std::string> said;
  const auto say = [&said](const std::string& line) { said.push_back(line); };
  Status st = Tune(*model_, o, say, &r);
  EXPECT_EQ(st.code(), Status::Code::kResourceExhausted) << st.ToString();
  EXPECT_NE(st.message().find("--kv-memory 4.0 KiB"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("the least the tuner can plan with is"), std::string::npos)
      << st.ToString();
  EXPECT_TRUE(said.empty()) << said[0];
  // The whole process in a byte: less than the weights, known before the step that measures
  // what the process needs.
  o.kv_memory_bytes = 0;
  o.process_memory_bytes = 1;
  st = Tune(*model_, o, say, &r);
  EXPECT_EQ(st.code(), Status::Code::kResourceExhausted) << st.ToString();
  EXPECT_NE(st.message().find("--memory 1 B leaves no room for KV: the model's weights"),
            std::string::npos)
      << st.ToString();
  EXPECT_TRUE(said.empty()) << said[0];
  o.process_memory_bytes = 0;
  o.contexts = {1 << 20};
  st = Tune(*model_, o, nullptr, &r);
  EXPECT_FALSE(st.ok());
  o.contexts = {1024};
  o.text_path = dir_.path() + "/no-such-text";
  st = Tune(*model_, o, nullptr, &r);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("no-such-text"), std::string::npos) << st.ToString();
}

}  // namespace
}  // namespace strata
