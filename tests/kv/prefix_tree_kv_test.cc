// PrefixTreeKv: sharing, copy on write and freeing of blocks; eviction to and loading from
// the slow tier (RAM and the block store) with nothing lost; the layer-streaming mode; the
// fast-tier budget never exceeded; errors. Content is checked value by value against what
// was appended, through the views the attention kernel would read.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>

#include <gtest/gtest.h>

#include "platforms/cuda_device.h"
#include "runtime/kv/tree/cuda_disk_tier.h"
#include "runtime/kv/tree/prefix_tree_kv.h"
#include "tests/testing/host_backed_device.h"

namespace strata {
namespace {

using testing::HostBackedDevice;

::testing::AssertionResult IsOk(const Status& s) {
  if (s.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << s.ToString();
}
#define ASSERT_OK(expr) ASSERT_TRUE(IsOk(expr))

constexpr int32_t kLayers = 3, kHeads = 2, kDim = 16, kB = 4;
const KvShape kShape{kLayers, kHeads, kDim, 256};

// A value exactly representable in F16 that depends on everything it must not mix up.
float Val(int32_t layer, int32_t pos, int32_t e, int32_t tag, bool is_v) {
  return float(((layer * 7 + pos * 3 + e + tag * 11) % 64) - 32) / 8.f + (is_v ? 0.125f : 0.f);
}

class TreeFixture {
 public:
  // layers: the layer-streaming tests need more than a few, or two staging areas of one
  // layer each would be as large as the blocks they stand in for.
  // share: the tree's blocks come from this pool, budget_blocks being its limit there.
  Status Make(uint64_t budget_blocks, KvResidency r = KvResidency::kWholeBlocks,
              std::unique_ptr<SlowTier> slow = nullptr, int32_t layers = kLayers,
              const FastTier* share = nullptr) {
    shape = kShape;
    shape.n_layer = layers;
    if (!slow) {
      std::unique_ptr<RamSlowTier> ram;
      STRATA_RETURN_IF_ERROR(RamSlowTier::Create(1 << 24, &ram));
      ram_ = ram.get();
      slow = std::move(ram);
    }
    PrefixTreeKvOptions o;
    o.block_tokens = kB;
    o.max_blocks = 64;
    o.residency = r;
    o.fast_budget_bytes = budget_blocks * PrefixTreeKv::BlockBytes(shape, kB, slow->alignment());
    o.share_fast = share;
    return PrefixTreeKv::Create(shape, o, std::move(slow), &kv);
  }

  // Appends n tokens tagged `tag` to each of seqs in one batch, then checks every view.
  Status Append(const std::vector<SeqId>& seqs, int32_t n, int32_t tag) {
    std::vector<BatchSeq> b;
    for (SeqId s : seqs) b.push_back({s, kv->Length(s), n});
    STRATA_RETURN_IF_ERROR(kv->BeginBatch(b));
    const int32_t row = shape.row();
    for (int32_t l = 0; l < shape.n_layer; ++l) {
      STRATA_RETURN_IF_ERROR(kv->Prepare(l, nullptr, 0));
      for (SeqId s : seqs) {
        std::vector<float> k(size_t(n) * row), v(size_t(n) * row);
        for (int32_t t = 0; t < n; ++t)
          for (int32_t e = 0; e < row; ++e) {
            k[size_t(t) * row + e] = Val(l, kv->Length(s) + t, e, tag, false);
            v[size_t(t) * row + e] = Val(l, kv->Length(s) + t, e, tag, true);
          }
        STRATA_RETURN_IF_ERROR(kv->Append(l, s, k.data(), v.data()));
      }
      for (SeqId s : seqs) {
        for (int32_t t = 0; t < n; ++t) tags[s].push_back(tag);
        Status st = CheckView(l, s);
        tags[s].resize(tags[s].size() - size_t(n));
        STRATA_RETURN_IF_ERROR(st);
      }
    }
    STRATA_RETURN_IF_ERROR(kv->EndBatch());
    for (SeqId s : seqs)
      for (int32_t t = 0; t < n; ++t) tags[s].push_back(tag);
    return kv->CheckInvariants();
  }

  Status CheckView(int32_t l, SeqId s) {
    std::span<const kernels::KvSpan> spans;
    STRATA_RETURN_IF_ERROR(kv->View(l, s, &spans));
    const std::vector<int32_t>& tg = tags[s];
    int32_t covered = 0;
    std::vector<float> k(kShape.row()), v(kShape.row());
    for (const kernels::KvSpan& sp : spans) {
      for (int32_t t = 0; t < sp.n_tokens; ++t) {
        const int32_t pos = sp.pos0 + t;
        if (pos >= int32_t(tg.size())) return Status::Internal("span past the sequence");
        kernels::F16ToF32Row(sp.k + size_t(t) * sp.stride, k.data(), kShape.row());
        kernels::F16ToF32Row(sp.v + size_t(t) * sp.stride, v.data(), kShape.row());
        for (int32_t e = 0; e < kShape.row(); ++e)
          if (k[e] != Val(l, pos, e, tg[pos], false) || v[e] != Val(l, pos, e, tg[pos], true))
            return Status::Internal("layer " + std::to_string(l) + " seq " + std::to_string(s) +
                                    " position " + std::to_string(pos) + " holds wrong values");
      }
      covered += sp.n_tokens;
    }
    if (covered != int32_t(tg.size()))
      return Status::Internal("view covers " + std::to_string(covered) + " of " +
                              std::to_string(tg.size()) + " tokens");
    return Status::OK();
  }

  KvShape shape = kShape;
  std::unique_ptr<PrefixTreeKv> kv;
  RamSlowTier* ram_ = nullptr;
  std::map<SeqId, std::vector<int32_t>> tags;  // per sequence, per position
};

SeqId Fork(TreeFixture& f, SeqId src) {
  SeqId d = -1;
  EXPECT_TRUE(f.kv->ForkSequence(src, &d).ok());
  f.tags[d] = f.tags[src];
  return d;
}

TEST(PrefixTreeKvTest, ForkSharesFullBlocksAndCopiesThePartialTailOnWrite) {
  TreeFixture f;
  ASSERT_OK(f.Make(32));
  SeqId root;
  ASSERT_OK(f.kv->AddSequence(&root));
  ASSERT_OK(f.Append({root}, 10, 1));  // blocks of 4, 4, 2 tokens
  EXPECT_EQ(f.kv->tree_counters().live_blocks, 3u);
  const SeqId a = Fork(f, root), b = Fork(f, root);
  EXPECT_EQ(f.kv->tree_counters().live_blocks, 3u);
  EXPECT_EQ(f.kv->tree_counters().shared_blocks, 3u);
  EXPECT_EQ(f.kv->NewBlocksFor(a, 1), 1);  // the shared tail is copied
  ASSERT_OK(f.Append({a}, 1, 2));
  EXPECT_EQ(f.kv->tree_counters().cow_copies, 1u);
  EXPECT_EQ(f.kv->tree_counters().live_blocks, 4u);
  ASSERT_OK(f.kv->RemoveSequence(root));
  f.tags.erase(root);
  // b is now the tail's only user: it appends in place, filling the block and starting one.
  EXPECT_EQ(f.kv->NewBlocksFor(b, 3), 1);
  ASSERT_OK(f.Append({b}, 3, 3));
  EXPECT_EQ(f.kv->tree_counters().cow_copies, 1u);
  EXPECT_EQ(f.kv->tree_counters().live_blocks, 5u);
  std::vector<PrefixTreeKv::BlockId> pa, pb;
  ASSERT_OK(f.kv->Path(a, &pa));
  ASSERT_OK(f.kv->Path(b, &pb));
  EXPECT_EQ(pa[0], pb[0]);
  EXPECT_EQ(pa[1], pb[1]);
  EXPECT_NE(pa[2], pb[2]);
  ASSERT_OK(f.Append({a, b}, 2, 4));  // siblings in one batch, content kept apart
  ASSERT_OK(f.kv->RemoveSequence(a));
  ASSERT_OK(f.kv->RemoveSequence(b));
  EXPECT_EQ(f.kv->tree_counters().live_blocks, 0u);
  EXPECT_EQ(f.kv->tree_counters().fast_bytes_in_use, 0u);
  EXPECT_TRUE(f.kv->CheckInvariants().ok());
}

TEST(PrefixTreeKvTest, SiblingsSharingATailInOneBatchCopyItOnlyWhileOthersHoldIt) {
  TreeFixture f;
  ASSERT_OK(f.Make(32));
  SeqId root;
  ASSERT_OK(f.kv->AddSequence(&root));
  ASSERT_OK(f.Append({root}, 6, 1));
  const SeqId a = Fork(f, root), b = Fork(f, root);
  ASSERT_OK(f.kv->RemoveSequence(root));
  f.tags.erase(root);
  ASSERT_OK(f.Append({a, b}, 1, 2));
  EXPECT_EQ(f.kv->tree_counters().cow_copies, 1u);  // the second sibling keeps the original
  EXPECT_EQ(f.kv->tree_counters().live_blocks, 3u);
}

// Truncate keeps a sequence at a step's end after its pass also ran tokens generated ahead:
// the path that keeps them (a fork) is untouched, the shared partial block is copied (also
// when it had been evicted), and both go on appending with their own content.
TEST(PrefixTreeKvTest, TruncateCopiesASharedPartialBlockAndLeavesTheSharersIntact) {
  TreeFixture f;
  ASSERT_OK(f.Make(12));
  SeqId a;
  ASSERT_OK(f.kv->AddSequence(&a));
  ASSERT_OK(f.Append({a}, 11, 1));  // blocks of 4, 4, 3
  const SeqId ahead = Fork(f, a);
  ASSERT_OK(f.kv->Truncate(a, 6));  // drops the third block, copies the shared second
  f.tags[a].resize(6);
  EXPECT_EQ(f.kv->Length(a), 6);
  EXPECT_EQ(f.kv->Length(ahead), 11);
  EXPECT_EQ(f.kv->tree_counters().cow_copies, 1u);
  EXPECT_EQ(f.kv->tree_counters().live_blocks, 4u);
  ASSERT_OK(f.kv->CheckInvariants());
  std::vector<PrefixTreeKv::BlockId> pa, pb;
  ASSERT_OK(f.kv->Path(a, &pa));
  ASSERT_OK(f.kv->Path(ahead, &pb));
  ASSERT_EQ(pa.size(), 2u);
  EXPECT_EQ(pa[0], pb[0]);
  EXPECT_NE(pa[1], pb[1]);
  // Each appends its own tokens where it ends; the other's content stays.
  ASSERT_OK(f.Append({a, ahead}, 5, 2));
  ASSERT_OK(f.Append({a}, 1, 3));
  // An unshared block is cut in place; a cut at a block boundary copies nothing.
  ASSERT_OK(f.kv->Truncate(ahead, 14));
  f.tags[ahead].resize(14);
  ASSERT_OK(f.kv->Truncate(a, 8));
  f.tags[a].resize(8);
  EXPECT_EQ(f.kv->tree_counters().cow_copies, 1u);
  ASSERT_OK(f.kv->CheckInvariants());
  ASSERT_OK(f.Append({a, ahead}, 2, 4));
  // A shared partial block only in the slow tier comes back for its copy; the budget holds.
  const SeqId b = Fork(f, ahead);
  for (int i = 0; i < 3; ++i) {
    SeqId x;
    ASSERT_OK(f.kv->AddSequence(&x));
    ASSERT_OK(f.Append({x}, 16, 10 + i));  // pushes ahead's blocks out
  }
  ASSERT_OK(f.kv->Truncate(b, 13));
  f.tags[b].resize(13);
  ASSERT_OK(f.kv->CheckInvariants());
  ASSERT_OK(f.Append({b}, 3, 5));
  ASSERT_OK(f.Append({ahead}, 1, 6));
  const PrefixTreeCounters c = f.kv->tree_counters();
  EXPECT_GT(c.bytes_read, 0u);
  EXPECT_LE(c.peak_fast_bytes, c.fast_budget_bytes);
  // Errors name the problem and change nothing.
  Status s = f.kv->Truncate(b, 99);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("cannot keep 99"), std::string::npos) << s.ToString();
  EXPECT_EQ(f.kv->Truncate(12345, 1).code(), Status::Code::kNotFound);
  EXPECT_EQ(f.kv->Length(b), 16);
  ASSERT_OK(f.kv->CheckInvariants());
}

TEST(PrefixTreeKvTest, EvictedBlocksComeBackIntactAndUnchangedBlocksAreWrittenOnce) {
  TreeFixture f;
  ASSERT_OK(f.Make(6));
  std::vector<SeqId> s(3);
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK(f.kv->AddSequence(&s[i]));
    ASSERT_OK(f.kv->Pin({&s[i], 1}, f.kv->NewBlocksFor(s[i], 12)));
    ASSERT_OK(f.Append({s[i]}, 12, 10 + i)) << i;  // 3 full blocks each
    f.kv->Unpin();
  }
  const PrefixTreeCounters c1 = f.kv->tree_counters();
  EXPECT_GT(c1.bytes_written, 0u);
  EXPECT_EQ(c1.peak_fast_bytes, 6 * c1.block_bytes);
  // Round trips: each sequence comes back, gets a token, and its whole view is checked.
  for (int round = 0; round < 2; ++round)
    for (int i = 0; i < 3; ++i) {
      ASSERT_OK(f.kv->Pin({&s[i], 1}, f.kv->NewBlocksFor(s[i], 1)));
      ASSERT_OK(f.Append({s[i]}, 1, 20 + round)) << "round " << round << " seq " << i;
      f.kv->Unpin();
    }
  const PrefixTreeCounters c2 = f.kv->tree_counters();
  EXPECT_GT(c2.bytes_read, 0u);
  EXPECT_LE(c2.peak_fast_bytes, c2.fast_budget_bytes);
  // 9 full blocks never change after they are first written; only the tails are rewritten.
  EXPECT_LE(c2.blocks_written, 9u + 3u * 2u);
  EXPECT_TRUE(f.kv->CheckInvariants().ok());
}

TEST(PrefixTreeKvTest, TwoTreesInOnePoolTradeBuffersThroughTheirLimits) {
  const uint64_t bb = PrefixTreeKv::BlockBytes(kShape, kB, 64);
  std::unique_ptr<FastTier> pool;
  ASSERT_OK(FastTier::Create(8 * bb, bb, 64, 1 << 20, &pool));
  TreeFixture a, b;
  ASSERT_OK(a.Make(6, KvResidency::kWholeBlocks, nullptr, kLayers, pool.get()));
  ASSERT_OK(b.Make(2, KvResidency::kWholeBlocks, nullptr, kLayers, pool.get()));
  EXPECT_EQ(a.kv->fast_capacity_blocks(), 6);
  EXPECT_EQ(b.kv->fast_capacity_blocks(), 2);
  SeqId sa, sb;
  ASSERT_OK(a.kv->AddSequence(&sa));
  ASSERT_OK(b.kv->AddSequence(&sb));
  ASSERT_OK(a.Append({sa}, 20, 1));  // 5 blocks
  ASSERT_OK(b.Append({sb}, 4, 2));   // 1 block
  EXPECT_EQ(pool->pool_bytes_in_use(), 6 * bb);
  // b cannot pass its limit even though the pool has room.
  Status s = b.Append({sb}, 8, 3);
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted) << s.ToString();

  // a's memory goes to b: a's excess is written to its slow tier, b grows into it.
  ASSERT_OK(a.kv->SetFastLimit(2));
  EXPECT_EQ(a.kv->fast_blocks_in_use(), 2);
  EXPECT_EQ(a.kv->tree_counters().bytes_written, 3 * a.kv->block_bytes());
  ASSERT_OK(b.kv->SetFastLimit(6));
  ASSERT_OK(b.Append({sb}, 16, 4));  // 5 blocks now
  EXPECT_EQ(pool->pool_bytes_in_use(), 7 * bb);
  // And back: a's next batch reads its blocks again, every value checked.
  ASSERT_OK(b.kv->SetFastLimit(2));
  ASSERT_OK(a.kv->SetFastLimit(6));
  ASSERT_OK(a.Append({sa}, 1, 5));
  EXPECT_EQ(a.kv->tree_counters().bytes_read, 3 * a.kv->block_bytes());
  EXPECT_EQ(b.kv->fast_blocks_in_use(), 2);
  EXPECT_EQ(pool->pool_bytes_in_use(), 8 * bb);
  EXPECT_LE(pool->pool_peak_bytes(), pool->budget_bytes());
  ASSERT_OK(a.kv->CheckInvariants());
  ASSERT_OK(b.kv->CheckInvariants());

  // Limits outside the pool, a move during a batch, buffers smaller than a block: errors.
  s = a.kv->SetFastLimit(9);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("[1, 8]"), std::string::npos) << s.ToString();
  std::vector<BatchSeq> batch = {{sa, a.kv->Length(sa), 1}};
  ASSERT_OK(a.kv->BeginBatch(batch));
  EXPECT_FALSE(a.kv->SetFastLimit(4).ok());
  a.kv->AbortBatch();
  TreeFixture wide;
  s = wide.Make(2, KvResidency::kWholeBlocks, nullptr, kLayers + 1, pool.get());
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("cannot hold a block"), std::string::npos) << s.ToString();
}

TEST(PrefixTreeKvTest, LayerStreamingReadsWhatDoesNotFitLayerByLayer) {
  TreeFixture f;
  ASSERT_OK(f.Make(9, KvResidency::kLayerStreaming, nullptr, 12));
  SeqId root;
  ASSERT_OK(f.kv->AddSequence(&root));
  ASSERT_OK(f.Append({root}, 16, 1));
  std::vector<SeqId> beams;
  for (int i = 0; i < 3; ++i) beams.push_back(Fork(f, root));
  ASSERT_OK(f.kv->RemoveSequence(root));
  f.tags.erase(root);
  // Token by token, all beams together, far more KV than 9 blocks.
  for (int t = 0; t < 12; ++t) ASSERT_OK(f.Append(beams, 1, 30 + t)) << t;
  const PrefixTreeCounters c = f.kv->tree_counters();
  EXPECT_GT(c.layer_reads, 0u);
  EXPECT_EQ(c.blocks_loaded, 0u);  // nothing is reloaded whole in this mode
  EXPECT_LE(c.peak_fast_bytes, c.fast_budget_bytes);
  EXPECT_EQ(c.live_blocks, 4u + 3u * 3u);
}

TEST(PrefixTreeKvTest, PrefetchedBlocksAreUsedWithoutReloading) {
  TreeFixture f;
  ASSERT_OK(f.Make(7));
  SeqId a, b;
  ASSERT_OK(f.kv->AddSequence(&a));
  ASSERT_OK(f.kv->AddSequence(&b));
  ASSERT_OK(f.Append({a}, 12, 1));
  ASSERT_OK(f.Append({b}, 12, 2));
  ASSERT_OK(f.kv->Pin({&a, 1}, 3));  // evicts two of b's three blocks
  ASSERT_OK(f.Append({a}, 8, 3));    // leaves one buffer free
  f.kv->Unpin();
  ASSERT_OK(f.kv->Pin({&a, 1}, 0));
  int32_t started = 0;
  ASSERT_OK(f.kv->Prefetch({&b, 1}, 8, &started));
  EXPECT_EQ(started, 1);  // one free buffer; b's resident block is dirty, a's are pinned
  const uint64_t loaded = f.kv->tree_counters().blocks_loaded;
  ASSERT_OK(f.kv->Pin({&b, 1}, 1));
  EXPECT_EQ(f.kv->tree_counters().blocks_loaded, loaded + 1);  // only the other one
  ASSERT_OK(f.Append({b}, 1, 4));  // checks the prefetched block's content too
  f.kv->Unpin();
  EXPECT_EQ(f.kv->tree_counters().blocks_prefetched, 1u);
  EXPECT_TRUE(f.kv->CheckInvariants().ok());
}

// The block store the round-trip tests put behind the tree: room for 64 blocks of a 12-layer
// shape, in the temporary directory.
constexpr int32_t kDeepLayers = 12;
storage::StoreOptions DeepStoreOptions(const std::string& name) {
  KvShape deep = kShape;
  deep.n_layer = kDeepLayers;
  storage::StoreOptions so;
  so.directory = std::filesystem::temp_directory_path().string();
  so.file_name = name + "_" + std::to_string(getpid()) + ".kv";
  so.capacity = 64ull * PrefixTreeKv::BlockBytes(deep, kB, 4096);
  so.block_size = 4096;
  so.report = [](std::string_view) {};
  return so;
}

// Three sequences streamed layer by layer past a budget of 10 blocks, then each pinned and
// reloaded whole `rounds` times; every value is checked through the views. The store's file
// must be gone once the tree is.
void RoundTripThroughTheStore(std::unique_ptr<SlowTier> tier, const storage::StoreOptions& so,
                              int rounds) {
  TreeFixture f;
  ASSERT_OK(f.Make(10, KvResidency::kLayerStreaming, std::move(tier), kDeepLayers));
  std::vector<SeqId> s(3);
  for (SeqId& x : s) ASSERT_OK(f.kv->AddSequence(&x));
  for (int t = 0; t < 5; ++t) ASSERT_OK(f.Append(s, 4, t)) << t;
  f.kv->set_residency(KvResidency::kWholeBlocks);
  for (int round = 0; round < rounds; ++round)
    for (SeqId x : s) {
      ASSERT_OK(f.kv->Pin({&x, 1}, 1));
      ASSERT_OK(f.Append({x}, 1, 9 + round));
      f.kv->Unpin();
    }
  const PrefixTreeCounters c = f.kv->tree_counters();
  EXPECT_GT(c.layer_reads, 0u);
  EXPECT_GT(c.blocks_loaded, 0u);
  EXPECT_GT(c.bytes_written, 0u);
  EXPECT_LE(c.peak_fast_bytes, c.fast_budget_bytes);
  EXPECT_TRUE(f.kv->CheckInvariants().ok());
  f.kv.reset();
  EXPECT_FALSE(std::filesystem::exists(so.directory + "/" + so.file_name));  // cleaned up
}

TEST(PrefixTreeKvTest, BlockStoreTierRoundTripsThroughDirectIo) {
  const storage::StoreOptions so = DeepStoreOptions("strata_tree_test");
  std::unique_ptr<SlowTier> tier;
  ASSERT_OK(OpenBlockStoreTier(so, &tier));
  EXPECT_EQ(tier->alignment(), 4096u);
  RoundTripThroughTheStore(std::move(tier), so, 1);
}

TEST(PrefixTreeKvTest, ErrorsNameTheProblemAndChangeNothing) {
  TreeFixture f;
  Status s = f.Make(0);
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted);
  EXPECT_NE(s.message().find("budget"), std::string::npos) << s.message();

  ASSERT_OK(f.Make(4));
  SeqId a;
  ASSERT_OK(f.kv->AddSequence(&a));
  ASSERT_OK(f.Append({a}, 8, 1));
  BatchSeq wrong{a, 3, 1};
  s = f.kv->BeginBatch({&wrong, 1});
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("position 3"), std::string::npos) << s.message();
  BatchSeq full{a, 8, 300};
  EXPECT_EQ(f.kv->BeginBatch({&full, 1}).code(), Status::Code::kOutOfRange);
  // A group larger than the budget.
  SeqId b;
  ASSERT_OK(f.kv->AddSequence(&b));
  s = f.kv->Pin({&a, 1}, 3);
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted);
  EXPECT_NE(s.message().find("holds 4"), std::string::npos) << s.message();
  f.kv->Unpin();
  // More new blocks in one pass than the budget holds.
  BatchSeq big{b, 0, 20};
  s = f.kv->BeginBatch({&big, 1});
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted);
  EXPECT_NE(s.message().find("too small"), std::string::npos) << s.message();
  EXPECT_EQ(f.kv->Length(b), 0);
  EXPECT_TRUE(f.kv->CheckInvariants().ok());
  EXPECT_EQ(f.kv->RemoveSequence(77).code(), Status::Code::kNotFound);
}

TEST(PrefixTreeKvTest, AFailedEvictionWriteKeepsTheBlockAndReportsTheError) {
  TreeFixture f;
  ASSERT_OK(f.Make(3));
  SeqId a, b;
  ASSERT_OK(f.kv->AddSequence(&a));
  ASSERT_OK(f.kv->AddSequence(&b));
  ASSERT_OK(f.Append({a}, 8, 1));
  f.ram_->FailTransferAfter(0);
  Status s = f.Append({b}, 8, 2);  // must evict a's blocks: the write fails
  EXPECT_EQ(s.code(), Status::Code::kIOError) << s.ToString();
  EXPECT_NE(s.message().find("injected"), std::string::npos) << s.message();
  EXPECT_EQ(f.kv->Length(b), 0);
  EXPECT_TRUE(f.kv->CheckInvariants().ok());
  // Nothing was lost: a's blocks are still readable, and the next attempt succeeds.
  ASSERT_OK(f.Append({a}, 1, 3));
  f.tags[b].clear();
  ASSERT_OK(f.Append({b}, 4, 2));
  EXPECT_TRUE(f.kv->CheckInvariants().ok());
}

TEST(PrefixTreeKvTest, AbortDropsTheBatchesNewBlocks) {
  TreeFixture f;
  ASSERT_OK(f.Make(16));
  SeqId a;
  ASSERT_OK(f.kv->AddSequence(&a));
  ASSERT_OK(f.Append({a}, 3, 1));
  BatchSeq b{a, 3, 6};
  ASSERT_OK(f.kv->BeginBatch({&b, 1}));
  EXPECT_EQ(f.kv->tree_counters().live_blocks, 3u);
  f.kv->AbortBatch();
  EXPECT_EQ(f.kv->tree_counters().live_blocks, 1u);
  EXPECT_EQ(f.kv->Length(a), 3);
  EXPECT_TRUE(f.kv->CheckInvariants().ok());
  ASSERT_OK(f.Append({a}, 2, 2));
}

// Device buffers of `n` extents of `len` bytes each, filled with a pattern of `seed`.
std::vector<std::vector<uint8_t>> Pattern(int n, uint32_t len, int seed) {
  std::vector<std::vector<uint8_t>> b(static_cast<size_t>(n), std::vector<uint8_t>(len));
  for (int i = 0; i < n; ++i)
    for (uint32_t j = 0; j < len; ++j) b[size_t(i)][j] = uint8_t((i * 131 + j * 7 + seed) & 255);
  return b;
}

std::vector<TierExtent> Extents(std::vector<std::vector<uint8_t>>& bufs, uint64_t first) {
  std::vector<TierExtent> e;
  for (size_t i = 0; i < bufs.size(); ++i)
    e.push_back({first + i * bufs[i].size(), bufs[i].data(), uint32_t(bufs[i].size())});
  return e;
}

TEST(CudaDiskTierTest, WritesAndReadsRoundTripThroughStagingInEveryOrder) {
  auto dev = std::make_shared<HostBackedDevice>();
  std::unique_ptr<RamSlowTier> ram;
  ASSERT_OK(RamSlowTier::Create(1 << 20, &ram, 4096));
  std::unique_ptr<SlowTier> tier;
  // Staging for three 8 KiB extents at once.
  ASSERT_OK(OpenCudaDiskTier(dev, std::move(ram), 24 << 10, &tier));
  EXPECT_TRUE(tier->moves_device_memory());
  EXPECT_EQ(tier->alignment(), 4096u);
  EXPECT_NE(tier->Describe().find("staged through"), std::string::npos) << tier->Describe();
  EXPECT_NE(tier->Describe().find("cuda:test"), std::string::npos) << tier->Describe();

  // Four writes of two extents each, none waited for: the third and fourth need staging the
  // first two hold, so the tier finishes those first.
  std::vector<std::vector<std::vector<uint8_t>>> src;
  std::vector<std::unique_ptr<TierTransfer>> writes;
  for (int w = 0; w < 4; ++w) {
    src.push_back(Pattern(2, 8192, w));
    std::unique_ptr<TierTransfer> t;
    ASSERT_OK(tier->Write(Extents(src.back(), uint64_t(w) * 16384), &t));
    writes.push_back(std::move(t));
  }
  for (auto& t : writes) ASSERT_OK(t->Wait());
  // Each copy kernel came after an ordering on the compute stream and before its event.
  size_t copies = 0;
  for (size_t i = 0; i < dev->calls.size(); ++i)
    if (dev->calls[i] == 'c') {
      ++copies;
      ASSERT_GT(i, 0u);
      EXPECT_EQ(dev->calls[i - 1], 'o') << dev->calls;
      ASSERT_LT(i + 1, dev->calls.size());
      EXPECT_EQ(dev->calls[i + 1], 'e') << dev->calls;
    }
  EXPECT_EQ(copies, 4u);

  // Read everything back in one transfer larger than the whole staging region (in pieces),
  // and a single extent again through Done() polling.
  auto back = Pattern(8, 8192, 99);
  std::unique_ptr<TierTransfer> r;
  ASSERT_OK(tier->Read(Extents(back, 0), &r));
  ASSERT_OK(r->Wait());
  for (int w = 0; w < 4; ++w)
    for (int i = 0; i < 2; ++i) EXPECT_EQ(back[size_t(w * 2 + i)], src[size_t(w)][size_t(i)]);
  auto one = Pattern(1, 8192, 7);
  ASSERT_OK(tier->Read(Extents(one, 3 * 16384 + 8192), &r));
  while (!r->Done()) {
  }
  ASSERT_OK(r->Wait());
  EXPECT_EQ(one[0], src[3][1]);
  EXPECT_EQ(dev->host_allocs, 1);  // staging is allocated once
}

TEST(CudaDiskTierTest, ErrorsNameTheTierAndReleaseTheStaging) {
  auto dev = std::make_shared<HostBackedDevice>();
  std::unique_ptr<RamSlowTier> ram;
  ASSERT_OK(RamSlowTier::Create(1 << 20, &ram, 4096));
  RamSlowTier* inner = ram.get();
  std::unique_ptr<SlowTier> tier;
  ASSERT_OK(OpenCudaDiskTier(dev, std::move(ram), 16 << 10, &tier));
  auto data = Pattern(2, 8192, 1);
  std::unique_ptr<TierTransfer> t;
  // A failing disk write: the error names the tier, the device and the direction.
  inner->FailTransferAfter(0);
  ASSERT_OK(tier->Write(Extents(data, 0), &t));
  Status s = t->Wait();
  EXPECT_EQ(s.code(), Status::Code::kIOError) << s.ToString();
  EXPECT_NE(s.message().find("disk tier behind cuda:test"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("write"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("injected"), std::string::npos) << s.message();
  // A failing read leaves the staging free: the whole region serves the next transfer.
  inner->FailTransferAfter(0);
  ASSERT_OK(tier->Read(Extents(data, 0), &t));
  EXPECT_EQ(t->Wait().code(), Status::Code::kIOError);
  ASSERT_OK(tier->Write(Extents(data, 0), &t));
  ASSERT_OK(t->Wait());
  auto back = Pattern(2, 8192, 5);
  ASSERT_OK(tier->Read(Extents(back, 0), &t));
  ASSERT_OK(t->Wait());
  EXPECT_EQ(back, data);
  // One extent larger than all the staging, and extents past the inner tier's capacity.
  std::vector<uint8_t> big(32 << 10);
  TierExtent e{0, big.data(), uint32_t(big.size())};
  s = tier->Read({&e, 1}, &t);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("larger than the 16384 bytes of staging"), std::string::npos)
      << s.message();
  ASSERT_OK(tier->Read(Extents(back, (1 << 20) - 8192), &t));
  EXPECT_EQ(t->Wait().code(), Status::Code::kOutOfRange);
  // Offsets and lengths in the inner tier's alignment (direct I/O needs it).
  TierExtent odd{4096, back[0].data(), 100};
  s = tier->Write({&odd, 1}, &t);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("not aligned to 4096"), std::string::npos) << s.message();
  // A tier that already moves GPU memory cannot be staged again.
  std::unique_ptr<SlowTier> twice;
  s = OpenCudaDiskTier(dev, std::move(tier), 16 << 10, &twice);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("already moves GPU memory"), std::string::npos) << s.message();
}

TEST(CudaDiskTierTest, ThePrefixTreeKeepsEveryValueWithTheBlockStoreBehindStaging) {
  const storage::StoreOptions so = DeepStoreOptions("strata_tree_staged_test");
  std::unique_ptr<SlowTier> store, tier;
  ASSERT_OK(OpenBlockStoreTier(so, &store));
  auto dev = std::make_shared<HostBackedDevice>();
  // Staging for two blocks: loads of a group and layer streaming both overflow it.
  KvShape deep = kShape;
  deep.n_layer = kDeepLayers;
  ASSERT_OK(
      OpenCudaDiskTier(dev, std::move(store), 2 * PrefixTreeKv::BlockBytes(deep, kB, 4096), &tier));
  RoundTripThroughTheStore(std::move(tier), so, 2);
}

}  // namespace
}  // namespace strata
