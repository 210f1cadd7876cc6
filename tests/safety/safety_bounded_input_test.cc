// Bounded inputs (safety): the report commands (inprof top, collapsed,
// flamegraph, speedscope, diff) and the pprof reader behind them read and
// decode at most PprofReadLimits of one profile: a stream that never ends
// (/dev/zero), a gzip bomb (zeros, or hundreds of millions of empty
// samples) and more samples, entries, frames or name bytes than the limits
// are refused in one line naming the input and the limit, before memory
// runs out.
//
// The commands run under `ulimit -v` (2 GB; not under a sanitizer, whose
// shadow memory needs more address space): before the bounds, the same
// inputs ended in std::bad_alloc there instead of taking the machine's
// memory.
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inprof/pprof_reader.h"
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

constexpr uint64_t kMiB = uint64_t{1} << 20;

std::string Cli() { return EnvOrEmpty("INPROF_CLI"); }
std::string RealProfile() { return EnvOrEmpty("INPROF_REPORT_DATA") + "/go_cpu.pb.gz"; }

std::string Scratch(const std::string& name) {
  return absl::StrCat(TestTmpDir(), "/safety_bounded_input_", getpid(), "_", name);
}

// `inprof ARGS` under a 2 GB address-space limit (see the file comment).
CommandOutput RunCli(const std::string& args) {
  const std::string limit = safety::kSanitized ? "" : "ulimit -v 2000000; ";
  auto r = RunCommandSeparately(absl::StrCat(limit, "exec ", ShellQuote(Cli()), " ", args));
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : CommandOutput{};
}

void ExpectOneLineRefusal(const CommandOutput& r, const std::string& text) {
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr(text));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

// Protobuf by hand: a tag and a length-delimited field.
void Varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void Field(std::string& out, uint32_t field, const std::string& bytes) {
  Varint(out, (uint64_t{field} << 3) | 2);
  Varint(out, bytes.size());
  out += bytes;
}
void VarintField(std::string& out, uint32_t field, uint64_t v) {
  Varint(out, uint64_t{field} << 3);
  Varint(out, v);
}

// strings "", "samples", "count" and sample type samples/count.
std::string Header() {
  std::string out;
  std::string vt;
  VarintField(vt, 1, 1);
  VarintField(vt, 2, 2);
  Field(out, 1, vt);
  Field(out, 6, "");
  Field(out, 6, "samples");
  Field(out, 6, "count");
  return out;
}

// Writes to `path` the gzip of `prefix` followed by `repeat` repeated until
// `total` bytes, compressed as it goes (the plain bytes are never held).
void WriteGzip(const std::string& path, const std::string& prefix,
               const std::string& repeat, uint64_t total) {
  FILE* f = fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  z_stream zs{};
  ASSERT_EQ(deflateInit2(&zs, Z_BEST_SPEED, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY),
            Z_OK);
  std::string chunk;
  while (chunk.size() < kMiB) chunk += repeat;
  std::vector<unsigned char> out(kMiB);
  uint64_t fed = 0;
  auto feed = [&](const std::string& in, int flush) {
    zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
    zs.avail_in = static_cast<uInt>(in.size());
    do {
      zs.next_out = out.data();
      zs.avail_out = static_cast<uInt>(out.size());
      deflate(&zs, flush);
      fwrite(out.data(), 1, out.size() - zs.avail_out, f);
    } while (zs.avail_out == 0);
  };
  feed(prefix, Z_NO_FLUSH);
  fed += prefix.size();
  while (fed + chunk.size() <= total) {
    feed(chunk, Z_NO_FLUSH);
    fed += chunk.size();
  }
  // The rest, in whole repeats.
  std::string rest;
  while (fed + rest.size() + repeat.size() <= total) rest += repeat;
  feed(rest, Z_NO_FLUSH);
  feed(std::string(), Z_FINISH);
  deflateEnd(&zs);
  fclose(f);
}

off_t SizeOf(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? st.st_size : -1;
}

TEST(SafetyBoundedInputTest, AStreamThatNeverEndsIsRefusedAfterTheInputLimit) {
  CommandOutput r = RunCli("top /dev/zero");
  ExpectOneLineRefusal(r, "/dev/zero: more than 256 MiB to read (the reader's limit");
  r = RunCli(absl::StrCat("diff ", ShellQuote(RealProfile()), " /dev/zero -o -"));
  ExpectOneLineRefusal(r, "/dev/zero: more than 256 MiB to read");
}

// 300 MiB of zeros in a gzip of about 0.3 MB.
TEST(SafetyBoundedInputTest, AGzipOfZerosIsRefusedWhileItInflates) {
  const std::string path = Scratch("zeros.pb.gz");
  WriteGzip(path, "", std::string(4096, '\0'), 300 * kMiB);
  EXPECT_LT(SizeOf(path), 2 * static_cast<off_t>(kMiB));
  CommandOutput r = RunCli(absl::StrCat("flamegraph ", ShellQuote(path), " -o -"));
  ExpectOneLineRefusal(r, path + ": decompresses to more than 256 MiB (the reader's limit");
  EXPECT_TRUE(r.out.empty());
  unlink(path.c_str());
}

// The probe's bomb: a gzip of ~0.3 MB holding 157 million empty samples.
TEST(SafetyBoundedInputTest, AGzipOfEmptySamplesIsRefusedWhileItInflates) {
  const std::string path = Scratch("empty_samples.pb.gz");
  WriteGzip(path, Header(), std::string("\x12\x00", 2), 300 * kMiB);
  EXPECT_LT(SizeOf(path), 2 * static_cast<off_t>(kMiB));
  CommandOutput r = RunCli(absl::StrCat("top ", ShellQuote(path)));
  ExpectOneLineRefusal(r, path + ": decompresses to more than 256 MiB");
  unlink(path.c_str());
}

// Within the byte limits, but one sample more than the sample limit: refused
// by the counting pass, before any sample is decoded.
TEST(SafetyBoundedInputTest, MoreSamplesThanTheLimitAreRefused) {
  const std::string path = Scratch("samples.pb.gz");
  const uint64_t samples = PprofReadLimits().max_samples + 1;
  const std::string header = Header();
  WriteGzip(path, header, std::string("\x12\x00", 2), header.size() + 2 * samples);
  CommandOutput r = RunCli(absl::StrCat("collapsed ", ShellQuote(path)));
  ExpectOneLineRefusal(r, absl::StrCat(path, ": more than ", samples - 1,
                                       " samples (the reader's limit"));
  unlink(path.c_str());
}

// The limits leave real profiles alone.
TEST(SafetyBoundedInputTest, ARealProfileIsWithinTheLimits) {
  auto p = ReadPprofFile(RealProfile());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->samples.empty());
}

// Each limit, small, on the reader itself.
TEST(SafetyBoundedInputTest, EachLimitOfTheReaderIsEnforced) {
  std::string profile = Header();
  // One function, one location; 100 samples of 10 frames each.
  Field(profile, 6, std::string(64 << 10, 'f'));  // string 3: a 64 KiB name
  std::string function;
  VarintField(function, 1, 1);
  VarintField(function, 2, 3);
  Field(profile, 5, function);
  std::string line;
  VarintField(line, 1, 1);
  std::string location;
  VarintField(location, 1, 1);
  Field(location, 4, line);
  Field(profile, 4, location);
  std::string sample;
  std::string ids;
  for (int i = 0; i < 10; ++i) Varint(ids, 1);
  Field(sample, 1, ids);
  VarintField(sample, 2, 1);
  for (int i = 0; i < 100; ++i) Field(profile, 2, sample);

  const PprofReadLimits generous;
  auto ok = DecodePprof(profile, generous);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->samples.size(), 100u);

  PprofReadLimits limits = generous;
  limits.max_samples = 99;
  auto r = DecodePprof(profile, limits);
  EXPECT_TRUE(absl::IsResourceExhausted(r.status())) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("more than 99 samples"));

  limits = generous;
  limits.max_entries = 1000;  // 100 x (10 ids + 1 value) + ... > 1000
  r = DecodePprof(profile, limits);
  EXPECT_THAT(r.status().message(), HasSubstr("more than 1000 entries"));

  limits = generous;
  limits.max_frames = 999;
  r = DecodePprof(profile, limits);
  EXPECT_THAT(r.status().message(), HasSubstr("more than 999 stack frames"));

  // 1,000 frames naming the 64 KiB string (62.5 MiB of copies from 64 KiB
  // of input): the copies, not only the input, are bounded.
  limits = generous;
  limits.max_text_bytes = 10 * kMiB;
  r = DecodePprof(profile, limits);
  EXPECT_THAT(r.status().message(), HasSubstr("more than 10 MiB of names"));

  limits = generous;
  limits.max_decoded_bytes = 1000;
  r = DecodePprof(profile, limits);
  EXPECT_THAT(r.status().message(), HasSubstr("more than 1000 bytes of protobuf"));

  const std::string path = Scratch("small.pb");
  {
    FILE* f = fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    fwrite(profile.data(), 1, profile.size(), f);
    fclose(f);
  }
  limits = generous;
  limits.max_input_bytes = 1000;
  r = ReadPprofFile(path, limits);
  EXPECT_THAT(r.status().message(),
              HasSubstr(absl::StrCat("'", path, "': more than 1000 bytes to read")));
  unlink(path.c_str());
}

}  // namespace
}  // namespace inprof
