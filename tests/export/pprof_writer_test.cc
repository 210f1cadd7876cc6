#include "inprof/pprof_writer.h"

#include <dirent.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inprof/pprof_reader.h"
#include "inprof/profile_data.h"
#include "inprof/symbolizer.h"
#include "profile.pb.h"
#include "util/test_util.h"

// --- Code whose addresses the profiles carry ---------------------------------

namespace inprof_test {

// Three real frames: a leaf pc and two return addresses.
struct CapturedStack {
  uint64_t frames[3] = {0, 0, 0};
};

class Widget {
 public:
  __attribute__((noinline)) static void Compute(CapturedStack* stack);
};

}  // namespace inprof_test

namespace {

__attribute__((noinline)) void StaticLeafFunction(
    inprof_test::CapturedStack* stack) {
  stack->frames[0] = reinterpret_cast<uintptr_t>(&StaticLeafFunction);
  stack->frames[1] = reinterpret_cast<uintptr_t>(__builtin_return_address(0));
  asm volatile("" : : "r"(stack) : "memory");
}

}  // namespace

void inprof_test::Widget::Compute(CapturedStack* stack) {
  StaticLeafFunction(stack);
  stack->frames[2] = reinterpret_cast<uintptr_t>(__builtin_return_address(0));
  asm volatile("" : : "r"(stack) : "memory");
}

namespace inprof_test {

int g_inlined_call_line = 0;

__attribute__((noinline)) uint64_t CaptureReturnAddress() {
  uint64_t pc = reinterpret_cast<uintptr_t>(__builtin_return_address(0));
  asm volatile("" : "+r"(pc));
  return pc;
}

__attribute__((always_inline)) inline uint64_t InlinedStep() {
  uint64_t pc = (g_inlined_call_line = __LINE__, CaptureReturnAddress());
  asm volatile("" : "+r"(pc));
  return pc;
}

// Returns a return address that lies in InlinedStep's body inlined here.
__attribute__((noinline)) uint64_t OuterStep() {
  uint64_t pc = InlinedStep();
  asm volatile("" : "+r"(pc));  // no tail call
  return pc;
}

}  // namespace inprof_test

// -----------------------------------------------------------------------------

namespace inprof {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::SizeIs;

using inprof_test::CapturedStack;

constexpr char kDropped[] = "[dropped: ring full]";
constexpr char kLeafName[] =
    "(anonymous namespace)::StaticLeafFunction(inprof_test::CapturedStack*)";
constexpr char kComputeName[] =
    "inprof_test::Widget::Compute(inprof_test::CapturedStack*)";

__attribute__((noinline)) CapturedStack CaptureStack() {
  CapturedStack stack;
  inprof_test::Widget::Compute(&stack);
  return stack;
}

ProfileSample Sample(uint32_t thread, std::vector<uint64_t> frames,
                     std::vector<int64_t> values,
                     std::string synthetic_frame = "") {
  ProfileSample sample;
  sample.thread = thread;
  sample.frames = std::move(frames);
  sample.values = std::move(values);
  sample.synthetic_frame = std::move(synthetic_frame);
  return sample;
}

// Two threads, a real three-frame stack, a synthetic frame, an all-zero
// sample that must be left out, and an address outside every module.
ProfileData MakeProfile(const CapturedStack& stack) {
  ProfileData data;
  data.sample_types = {{"cpu-samples", "count"}, {"cpu-time", "nanoseconds"}};
  data.period_type = {"cpu-time", "nanoseconds"};
  data.period = 10'000'000;
  data.time_nanos = 1'700'000'000'000'000'000;
  data.duration_nanos = 60'000'000'000;
  data.default_sample_type = 1;
  data.threads = {{.tid = 101, .name = "main"}, {.tid = 102, .name = "worker"}};
  data.comments = {"engine: test", "dropped samples: 2"};
  const std::vector<uint64_t> frames(std::begin(stack.frames),
                                     std::end(stack.frames));
  data.samples.push_back(Sample(0, frames, {3, 30'000'000}));
  data.samples.push_back(Sample(1, frames, {1, 10'000'000}));
  data.samples.push_back(Sample(1, {}, {2, 0}, kDropped));
  data.samples.push_back(Sample(0, frames, {0, 0}));
  data.samples.push_back(Sample(1, {0x10, frames[2]}, {1, 5}));
  return data;
}

std::string ProfilePath(const std::string& name) {
  return absl::StrCat(testing::TestTmpDir(), "/pprof_writer_", getpid(), "_",
                      name);
}

std::string ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string Gunzip(const std::string& bytes) {
  z_stream zs;
  std::memset(&zs, 0, sizeof zs);
  EXPECT_EQ(inflateInit2(&zs, 15 + 16), Z_OK);
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  zs.avail_in = static_cast<uInt>(bytes.size());
  std::string out;
  int rc = Z_OK;
  while (rc == Z_OK) {
    char buf[16384];
    zs.next_out = reinterpret_cast<Bytef*>(buf);
    zs.avail_out = sizeof buf;
    rc = inflate(&zs, Z_NO_FLUSH);
    out.append(buf, sizeof buf - zs.avail_out);
  }
  EXPECT_EQ(rc, Z_STREAM_END);
  inflateEnd(&zs);
  return out;
}

perftools::profiles::Profile ParseProfileFile(const std::string& path) {
  perftools::profiles::Profile profile;
  EXPECT_TRUE(profile.ParseFromString(Gunzip(ReadFileBytes(path))));
  return profile;
}

std::string SelfExe() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, n) : "";
}

class PprofWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    stack_ = CaptureStack();
    data_ = MakeProfile(stack_);
    path_ = ProfilePath(
        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    path_ += ".pb.gz";
    absl::Status written = WritePprofFile(path_, data_, symbolizer_);
    ASSERT_TRUE(written.ok()) << written;
  }
  void TearDown() override { unlink(path_.c_str()); }

  CapturedStack stack_;
  ProfileData data_;
  Symbolizer symbolizer_;
  std::string path_;
};

TEST_F(PprofWriterTest, ProtocDecodesTheProfile) {
  absl::StatusOr<std::string> text = testing::ProtocDecode(path_);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_THAT(*text, HasSubstr("string_table: \"cpu-time\""));
  EXPECT_THAT(*text, HasSubstr("location {"));
  EXPECT_TRUE(testing::ProtocDecodeOk(path_).ok());
}

// inprof encodes pprof with its own wire writer: libprotobuf (the reference
// implementation, here only in the test) parses the bytes, and writing them
// back gives the same bytes (proto3's canonical form: fields in number order,
// packed repeated scalars, zero values left out), with a negative value and
// a label that is not UTF-8 among them (proto3 strings must be: each stray
// byte is written as U+FFFD, or libprotobuf rejects the whole profile).
TEST_F(PprofWriterTest, EncodingIsWhatLibprotobufWritesByteForByte) {
  ProfileData data = data_;
  data.samples[0].values[1] = -5;
  data.samples[0].labels.push_back({"binary", std::string("\xff\x00\x80", 3)});
  data.samples[0].labels.push_back(
      {"big", "", std::numeric_limits<int64_t>::min(), true});
  absl::StatusOr<std::string> ours = EncodePprof(data, symbolizer_);
  ASSERT_TRUE(ours.ok()) << ours.status();
  perftools::profiles::Profile profile;
  ASSERT_TRUE(profile.ParseFromString(*ours));
  std::string reference;
  ASSERT_TRUE(profile.SerializeToString(&reference));
  EXPECT_EQ(*ours, reference);
  EXPECT_EQ(profile.sample(0).value(1), -5);
  EXPECT_GT(profile.location_size(), 3);
  EXPECT_GT(profile.mapping_size(), 1);
  EXPECT_EQ(profile.string_table(0), "");
  // And inprof's own reader agrees with it on the same bytes.
  absl::StatusOr<DecodedProfile> decoded = DecodePprof(*ours);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_EQ(decoded->samples.size(), static_cast<size_t>(profile.sample_size()));
  EXPECT_EQ(decoded->samples[0].values[1], -5);
  EXPECT_EQ(decoded->samples[0].str_labels.at("binary"),
            std::string("\xef\xbf\xbd\x00\xef\xbf\xbd", 7));
  EXPECT_EQ(decoded->samples[0].num_labels.at("big"),
            std::numeric_limits<int64_t>::min());
}

// Unpacked repeated fields (older writers) and unknown fields (newer
// profile.proto) are read as any protobuf parser reads them.
TEST(PprofReaderTest, ReadsUnpackedFieldsAndSkipsUnknownOnes) {
  perftools::profiles::Profile p;
  p.add_string_table("");
  p.add_string_table("samples");
  p.add_string_table("count");
  p.add_string_table("f");
  auto* st = p.add_sample_type();
  st->set_type(1);
  st->set_unit(2);
  auto* fn = p.add_function();
  fn->set_id(7);
  fn->set_name(3);
  auto* loc = p.add_location();
  loc->set_id(9);
  loc->add_line()->set_function_id(7);
  std::string bytes;
  ASSERT_TRUE(p.SerializeToString(&bytes));
  // A sample written field by field: location_id 9 and value 4 unpacked
  // (tag 0x08, 0x10), an unknown varint field 15 and an unknown fixed64
  // field 16.
  const std::string sample("\x08\x09\x10\x04\x78\x01\x81\x01\x01\x02\x03\x04\x05\x06\x07\x08", 16);
  bytes += std::string("\x12", 1) + static_cast<char>(sample.size()) + sample;
  absl::StatusOr<DecodedProfile> d = DecodePprof(bytes);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->samples.size(), 1u);
  EXPECT_THAT(d->samples[0].stack, ElementsAre("f"));
  EXPECT_THAT(d->samples[0].values, ElementsAre(4));
  // Truncated in the middle of the sample: one clear error.
  absl::StatusOr<DecodedProfile> cut = DecodePprof(bytes.substr(0, bytes.size() - 3));
  ASSERT_FALSE(cut.ok());
  EXPECT_THAT(cut.status().message(),
              HasSubstr("do not parse as perftools.profiles.Profile"));
}

// Empty input, plain or gzipped, and a profile without its string table,
// are said as what they are (before: "string index 0 out of range;
// expected below 0").
TEST(PprofReaderTest, EmptyInputIsSaidAsSuch) {
  absl::StatusOr<DecodedProfile> empty = DecodePprof("");
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().message(), "DecodePprof: empty input, not a pprof profile");
  const std::string empty_gzip("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03\x03\x00"
                               "\x00\x00\x00\x00\x00\x00\x00\x00", 20);
  absl::StatusOr<DecodedProfile> gz = DecodePprof(empty_gzip);
  ASSERT_FALSE(gz.ok());
  EXPECT_EQ(gz.status().message(),
            "DecodePprof: empty input (once gunzipped), not a pprof profile");
  // A period (field 12) and nothing else: no string table.
  absl::StatusOr<DecodedProfile> bare = DecodePprof(std::string("\x60\x05", 2));
  ASSERT_FALSE(bare.ok());
  EXPECT_THAT(bare.status().message(), HasSubstr("2 bytes have no string table"));
  EXPECT_THAT(bare.status().message(), Not(HasSubstr("string index")));
}

// The sums a DecodedProfile offers stop at the int64 limits instead of
// wrapping (undefined behaviour) on values from outside.
TEST(PprofReaderTest, SumsOfHostileValuesSaturate) {
  perftools::profiles::Profile p;
  p.add_string_table("");
  p.add_string_table("cpu-time");
  p.add_string_table("nanoseconds");
  p.add_string_table("f");
  auto* type = p.add_sample_type();
  type->set_type(1);
  type->set_unit(2);
  auto* fn = p.add_function();
  fn->set_id(1);
  fn->set_name(3);
  auto* loc = p.add_location();
  loc->set_id(1);
  loc->add_line()->set_function_id(1);
  for (int64_t v : {std::numeric_limits<int64_t>::max(), int64_t{5},
                    std::numeric_limits<int64_t>::max()}) {
    auto* sample = p.add_sample();
    sample->add_location_id(1);
    sample->add_value(v);
  }
  std::string bytes;
  ASSERT_TRUE(p.SerializeToString(&bytes));
  absl::StatusOr<DecodedProfile> d = DecodePprof(bytes);
  ASSERT_TRUE(d.ok()) << d.status();
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(d->Total(0), kMax);
  EXPECT_EQ(d->FlatByFunction(0).at("f"), kMax);
  EXPECT_EQ(d->CumulativeByFunction(0).at("f"), kMax);
  for (DecodedProfile::Sample& s : d->samples) s.values[0] = -s.values[0] - 1;
  EXPECT_EQ(d->Total(0), std::numeric_limits<int64_t>::min());
}

// RenamePprofStrings (the Datadog upload's type names): only a matching
// sample type is renamed, through a string of its own (the old one stays
// for whatever else shares it), other fields (an unpacked repeated comment
// with a zero among them) are kept, libprotobuf parses the result, and
// malformed input is one error.
TEST(PprofReaderTest, RenameNamesOnlyTheMatchingSampleTypes) {
  perftools::profiles::Profile p;
  for (const char* s : {"", "alloc_space", "bytes", "f", "alloc_space_not"}) p.add_string_table(s);
  auto* st = p.add_sample_type();
  st->set_type(1);
  st->set_unit(2);
  p.set_period(524288);
  p.add_comment(0);
  p.add_comment(3);
  std::string bytes;
  ASSERT_TRUE(p.SerializeToString(&bytes));
  // Comments unpacked: tag 0x68 (field 13, varint) twice, one of them 0.
  bytes += std::string("\x68\x00\x68\x03", 4);
  absl::StatusOr<std::optional<std::string>> none =
      RenamePprofStrings(bytes, {{"inuse_space", "inuse-space"}});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->has_value());
  absl::StatusOr<std::optional<std::string>> renamed =
      RenamePprofStrings(bytes, {{"alloc_space", "alloc-space"}});
  ASSERT_TRUE(renamed.ok()) << renamed.status();
  ASSERT_TRUE(renamed->has_value());
  absl::StatusOr<DecodedProfile> d = DecodePprof(**renamed);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->sample_types.size(), 1u);
  EXPECT_EQ(d->sample_types[0].type, "alloc-space");
  EXPECT_EQ(d->sample_types[0].unit, "bytes");
  perftools::profiles::Profile back;
  ASSERT_TRUE(back.ParseFromString(Gunzip(**renamed)));
  // The old string stays (a function or label may share it); the sample
  // type points at the new one, appended.
  EXPECT_THAT(back.string_table(),
              ElementsAre("", "alloc_space", "bytes", "f", "alloc_space_not", "alloc-space"));
  ASSERT_EQ(back.sample_type_size(), 1);
  EXPECT_EQ(back.sample_type(0).type(), 5);
  EXPECT_EQ(back.period(), 524288);
  EXPECT_THAT(back.comment(), ElementsAre(0, 3, 0, 3));
  absl::StatusOr<std::optional<std::string>> bad =
      RenamePprofStrings(bytes.substr(0, bytes.size() - 5), {{"alloc_space", "x"}});
  EXPECT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("RenamePprofStrings"));
}

TEST(PprofReaderTest, SelectKeepsOnlyTheChosenColumns) {
  perftools::profiles::Profile p;
  for (const char* s : {"", "cpu-time", "nanoseconds", "alloc_space", "bytes", "f",
                        "g", "thread", "w", "note"}) {
    p.add_string_table(s);
  }
  for (auto [type, unit] : {std::pair{1, 2}, std::pair{3, 4}}) {
    auto* st = p.add_sample_type();
    st->set_type(type);
    st->set_unit(unit);
  }
  for (uint64_t id : {1, 2}) {
    auto* fn = p.add_function();
    fn->set_id(id);
    fn->set_name(id == 1 ? 5 : 6);
    auto* loc = p.add_location();
    loc->set_id(id);
    loc->add_line()->set_function_id(id);
  }
  // f: CPU and allocations, labelled; g: CPU only (nothing is left of it).
  auto* both = p.add_sample();
  both->add_location_id(1);
  both->add_value(7);
  both->add_value(4096);
  auto* label = both->add_label();
  label->set_key(7);
  label->set_str(8);
  auto* cpu_only = p.add_sample();
  cpu_only->add_location_id(2);
  cpu_only->add_value(9);
  cpu_only->add_value(0);
  p.mutable_period_type()->set_type(1);
  p.mutable_period_type()->set_unit(2);
  p.set_period(10'000'000);
  p.set_time_nanos(1'700'000'000'000'000'000);
  p.add_comment(9);
  p.set_default_sample_type(1);
  std::string bytes;
  ASSERT_TRUE(p.SerializeToString(&bytes));
  // One more sample, its values unpacked (tag 0x10, field 2 varint): f, 1, 8.
  bytes += std::string("\x12\x06\x08\x01\x10\x01\x10\x08", 8);

  auto alloc = SelectPprofSampleTypes(
      bytes, [](std::string_view t) { return t == "alloc_space"; },
      ValueType{"space", "bytes"}, 524288);
  ASSERT_TRUE(alloc.ok()) << alloc.status();
  absl::StatusOr<DecodedProfile> d = DecodePprof(*alloc);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_THAT(d->sample_types, ElementsAre(ValueType{"alloc_space", "bytes"}));
  ASSERT_EQ(d->samples.size(), 2u);  // g's sample had nothing left
  EXPECT_THAT(d->samples[0].stack, ElementsAre("f"));
  EXPECT_THAT(d->samples[0].values, ElementsAre(4096));
  EXPECT_EQ(d->samples[0].str_labels.at("thread"), "w");
  EXPECT_THAT(d->samples[1].values, ElementsAre(8));
  EXPECT_EQ(d->period_type, (ValueType{"space", "bytes"}));  // "space" appended
  EXPECT_EQ(d->period, 524288);
  EXPECT_EQ(d->default_sample_type, "alloc_space");  // cpu-time was cut
  EXPECT_EQ(d->time_nanos, 1'700'000'000'000'000'000);
  EXPECT_THAT(d->comments, ElementsAre("note"));

  auto cpu = SelectPprofSampleTypes(bytes, [](std::string_view t) { return t == "cpu-time"; });
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  d = DecodePprof(*cpu);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_THAT(d->sample_types, ElementsAre(ValueType{"cpu-time", "nanoseconds"}));
  ASSERT_EQ(d->samples.size(), 3u);
  EXPECT_THAT(d->samples[1].stack, ElementsAre("g"));
  EXPECT_THAT(d->samples[1].values, ElementsAre(9));
  EXPECT_EQ(d->period_type, (ValueType{"cpu-time", "nanoseconds"}));  // kept
  EXPECT_EQ(d->period, 10'000'000);
  EXPECT_EQ(d->default_sample_type, "cpu-time");

  auto none = SelectPprofSampleTypes(bytes, [](std::string_view) { return false; });
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  auto bad = SelectPprofSampleTypes(bytes.substr(0, bytes.size() - 3),
                                    [](std::string_view) { return true; });
  EXPECT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("SelectPprofSampleTypes"));
}

TEST_F(PprofWriterTest, OwnReaderSeesNamesLabelsAndHeader) {
  absl::StatusOr<DecodedProfile> profile = ReadPprofFile(path_);
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_THAT(profile->sample_types,
              ElementsAre(ValueType{"cpu-samples", "count"},
                          ValueType{"cpu-time", "nanoseconds"}));
  EXPECT_EQ(profile->period_type, (ValueType{"cpu-time", "nanoseconds"}));
  EXPECT_EQ(profile->period, 10'000'000);
  EXPECT_EQ(profile->time_nanos, data_.time_nanos);
  EXPECT_EQ(profile->duration_nanos, data_.duration_nanos);
  EXPECT_EQ(profile->default_sample_type, "cpu-time");
  EXPECT_THAT(profile->comments,
              ElementsAre("engine: test", "dropped samples: 2"));
  // The all-zero sample is left out.
  ASSERT_THAT(profile->samples, SizeIs(4));

  const DecodedProfile::Sample& first = profile->samples[0];
  ASSERT_THAT(first.stack, SizeIs(3));
  EXPECT_EQ(first.stack[0], kLeafName);
  EXPECT_EQ(first.stack[1], kComputeName);
  EXPECT_THAT(first.stack[2], HasSubstr("CaptureStack"));
  EXPECT_THAT(first.values, ElementsAre(3, 30'000'000));
  EXPECT_EQ(first.str_labels.at("thread name"), "main");
  EXPECT_EQ(first.num_labels.at("thread id"), 101);

  EXPECT_THAT(profile->samples[2].stack, ElementsAre(kDropped));
  EXPECT_EQ(profile->samples[2].str_labels.at("thread name"), "worker");
  EXPECT_EQ(profile->samples[3].stack[0], "0x10");

  const int cpu = profile->ValueIndex("cpu-time");
  ASSERT_EQ(cpu, 1);
  EXPECT_EQ(profile->ValueIndex("alloc-space"), -1);
  EXPECT_EQ(profile->Total(cpu), 40'000'005);
  EXPECT_EQ(profile->Total(0), 7);
  EXPECT_EQ(profile->ByLabel("thread name", 0).at("worker"), 4);
  EXPECT_EQ(profile->ByLabel("thread id", 0).at("101"), 3);
  const auto cumulative = profile->CumulativeByFunction(cpu);
  EXPECT_EQ(cumulative.at(kComputeName), 40'000'000);
  const auto flat = profile->FlatByFunction(0);
  EXPECT_EQ(flat.at(kDropped), 2);
  EXPECT_EQ(flat.at(kLeafName), 4);
  EXPECT_EQ(flat.count(kComputeName), 0u);
}

TEST_F(PprofWriterTest, DeduplicatesLocationsFunctionsAndStrings) {
  const perftools::profiles::Profile profile = ParseProfileFile(path_);
  std::set<uint64_t> addresses;
  for (const auto& loc : profile.location()) {
    if (loc.address() == 0) continue;  // the synthetic frame
    // The stack appears in three samples and frames[2] once more: one
    // location per address and role.
    EXPECT_TRUE(addresses.insert(loc.address()).second) << loc.address();
  }
  EXPECT_THAT(profile.location(), SizeIs(5));  // 3 + synthetic + 0x10
  std::set<std::string> names;
  for (const auto& fn : profile.function()) {
    EXPECT_TRUE(names.insert(profile.string_table(fn.name())).second)
        << profile.string_table(fn.name());
  }
  std::set<std::string> strings(profile.string_table().begin(),
                                profile.string_table().end());
  EXPECT_EQ(strings.size(), static_cast<size_t>(profile.string_table_size()));
  ASSERT_GT(profile.string_table_size(), 0);
  EXPECT_EQ(profile.string_table(0), "");
}

TEST_F(PprofWriterTest, MappingsCarryBuildIdsAndCapabilities) {
  const perftools::profiles::Profile profile = ParseProfileFile(path_);
  ASSERT_EQ(profile.mapping_size(),
            static_cast<int>(symbolizer_.modules().size()));
  // The test binary is the first mapping, as pprof expects of the main
  // program; compare its build-id with what readelf reads from the file.
  const auto& main_mapping = profile.mapping(0);
  EXPECT_EQ(main_mapping.id(), 1u);
  EXPECT_EQ(profile.string_table(main_mapping.filename()), SelfExe());
  absl::StatusOr<std::string> notes =
      testing::RunCommand(absl::StrCat("readelf -n '", SelfExe(), "'"));
  ASSERT_TRUE(notes.ok()) << notes.status();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(*notes, m, std::regex("Build ID: ([0-9a-f]+)")))
      << *notes;
  EXPECT_EQ(profile.string_table(main_mapping.build_id()), m[1].str());
  EXPECT_TRUE(main_mapping.has_functions());
  EXPECT_TRUE(main_mapping.has_filenames());
  EXPECT_TRUE(main_mapping.has_line_numbers());
  EXPECT_TRUE(main_mapping.has_inline_frames());

  for (const auto& loc : profile.location()) {
    if (loc.mapping_id() == 0) continue;
    const auto& mapping = profile.mapping(loc.mapping_id() - 1);
    EXPECT_GE(loc.address(), mapping.memory_start());
    EXPECT_LT(loc.address(), mapping.memory_limit());
  }
  // Mappings without locations claim nothing.
  std::set<uint64_t> used;
  for (const auto& loc : profile.location()) used.insert(loc.mapping_id());
  for (const auto& mapping : profile.mapping()) {
    if (used.count(mapping.id()) == 0) {
      EXPECT_FALSE(mapping.has_functions())
          << profile.string_table(mapping.filename());
    }
  }
}

TEST_F(PprofWriterTest, GoPprofRawNamesFunctionsAndLabels) {
  INPROF_REQUIRE_TOOL("go");
  std::string warnings;
  absl::StatusOr<std::vector<testing::RawSample>> samples =
      testing::ReadWithGoPprofRaw(path_, &warnings);
  ASSERT_TRUE(samples.ok()) << samples.status();
  EXPECT_THAT(warnings, IsEmpty());
  ASSERT_THAT(*samples, SizeIs(4));

  const testing::RawSample& first = (*samples)[0];
  EXPECT_THAT(first.values, ElementsAre(3, 30'000'000));
  ASSERT_THAT(first.stack, SizeIs(3));
  EXPECT_EQ(first.stack[0], kLeafName);
  EXPECT_EQ(first.stack[1], kComputeName);
  EXPECT_THAT(first.stack[2], HasSubstr("CaptureStack"));
  EXPECT_THAT(first.file_lines[0], HasSubstr("pprof_writer_test.cc:"));
  EXPECT_EQ(first.labels.at("thread name"), "main");
  EXPECT_EQ(first.labels.at("thread id"), "101");

  const testing::RawSample& dropped = (*samples)[2];
  EXPECT_THAT(dropped.stack, ElementsAre(kDropped));
  EXPECT_EQ(dropped.labels.at("thread name"), "worker");
  EXPECT_EQ(dropped.labels.at("thread id"), "102");

  EXPECT_EQ((*samples)[3].stack[0], "0x10");
}

TEST_F(PprofWriterTest, GoPprofShowsComments) {
  INPROF_REQUIRE_TOOL("go");
  absl::StatusOr<std::string> comments =
      testing::GoPprof(absl::StrCat("-comments '", path_, "'"));
  ASSERT_TRUE(comments.ok()) << comments.status();
  EXPECT_THAT(*comments, AllOf(HasSubstr("engine: test"),
                               HasSubstr("dropped samples: 2")));
}

TEST_F(PprofWriterTest, GoPprofTopAgreesWithOwnReader) {
  INPROF_REQUIRE_TOOL("go");
  absl::StatusOr<std::string> top = testing::GoPprof(
      absl::StrCat("-top -sample_index=cpu-samples '", path_, "'"));
  ASSERT_TRUE(top.ok()) << top.status();
  // 7 samples in all; pprof shortens C++ names to Class::Method.
  EXPECT_THAT(*top, HasSubstr("of 7 total"));
  EXPECT_THAT(*top, HasSubstr("inprof_test::Widget::Compute"));
  absl::StatusOr<std::string> warnings =
      testing::GoPprofStderr(absl::StrCat("-top '", path_, "'"));
  ASSERT_TRUE(warnings.ok()) << warnings.status();
  EXPECT_THAT(*warnings, IsEmpty());
}

TEST_F(PprofWriterTest, WritesAtomicallyWithoutLeavingTemporaryFiles) {
  const std::string dir = testing::TestTmpDir();
  const std::string stem = path_.substr(dir.size() + 1);
  DIR* d = opendir(dir.c_str());
  ASSERT_NE(d, nullptr);
  std::vector<std::string> leftovers;
  while (dirent* entry = readdir(d)) {
    const std::string name = entry->d_name;
    if (absl::StartsWith(name, stem) && name != stem) leftovers.push_back(name);
  }
  closedir(d);
  EXPECT_THAT(leftovers, IsEmpty());
  // Overwriting an existing profile works and replaces it.
  data_.comments = {"second"};
  ASSERT_TRUE(WritePprofFile(path_, data_, symbolizer_).ok());
  absl::StatusOr<DecodedProfile> profile = ReadPprofFile(path_);
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_THAT(profile->comments, ElementsAre("second"));
}

TEST_F(PprofWriterTest, UnwritablePathFailsNamingIt) {
  const std::string path =
      testing::TestTmpDir() + "/no_such_directory/profile.pb.gz";
  absl::Status status = WritePprofFile(path, data_, symbolizer_);
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr(path));
  EXPECT_THAT(status.message(), HasSubstr(std::strerror(ENOENT)));
}

TEST(PprofWriterStandaloneTest, InlinedFramesBecomeExtraLinesInnermostFirst) {
  const uint64_t pc = inprof_test::OuterStep();
  ProfileData data;
  data.sample_types = {{"cpu-samples", "count"}};
  data.threads = {{.tid = 7, .name = "main"}};
  data.samples.push_back(Sample(
      0, {reinterpret_cast<uintptr_t>(&inprof_test::CaptureReturnAddress), pc},
      {1}));
  Symbolizer symbolizer;
  const std::string path = ProfilePath("inline.pb.gz");
  ASSERT_TRUE(WritePprofFile(path, data, symbolizer).ok());

  const perftools::profiles::Profile profile = ParseProfileFile(path);
  const perftools::profiles::Location* caller = nullptr;
  for (const auto& loc : profile.location()) {
    if (loc.address() == pc) caller = &loc;
  }
  ASSERT_NE(caller, nullptr);
  ASSERT_EQ(caller->line_size(), 2);
  auto function_name = [&](uint64_t id) {
    return profile.string_table(profile.function(id - 1).name());
  };
  EXPECT_EQ(function_name(caller->line(0).function_id()),
            "inprof_test::InlinedStep()");
  EXPECT_EQ(caller->line(0).line(), inprof_test::g_inlined_call_line);
  EXPECT_EQ(function_name(caller->line(1).function_id()),
            "inprof_test::OuterStep()");

  INPROF_REQUIRE_TOOL("go");

  {
    auto samples = testing::ReadWithGoPprofRaw(path);
    ASSERT_TRUE(samples.ok()) << samples.status();
    ASSERT_THAT(*samples, SizeIs(1));
    EXPECT_THAT(
        (*samples)[0].stack,
        ElementsAre("inprof_test::CaptureReturnAddress()",
                    "inprof_test::InlinedStep()", "inprof_test::OuterStep()"));
    EXPECT_THAT((*samples)[0].file_lines[1],
                HasSubstr(absl::StrCat("pprof_writer_test.cc:",
                                       inprof_test::g_inlined_call_line)));
  }
  unlink(path.c_str());
}

TEST(PprofWriterStandaloneTest, RejectsSampleWithWrongNumberOfValues) {
  ProfileData data;
  data.sample_types = {{"cpu-samples", "count"}};
  data.threads = {{.tid = 1, .name = "t"}};
  data.samples.push_back(Sample(0, {0x10}, {1, 2}));
  Symbolizer symbolizer;
  absl::StatusOr<std::string> encoded = EncodePprof(data, symbolizer);
  ASSERT_FALSE(encoded.ok());
  EXPECT_EQ(encoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(encoded.status().message(), HasSubstr("sample 0 has 2 values"));
}

TEST(PprofWriterStandaloneTest, RejectsUnknownThreadIndex) {
  ProfileData data;
  data.sample_types = {{"cpu-samples", "count"}};
  data.samples.push_back(Sample(3, {0x10}, {1}));
  Symbolizer symbolizer;
  absl::StatusOr<std::string> encoded = EncodePprof(data, symbolizer);
  ASSERT_FALSE(encoded.ok());
  EXPECT_THAT(encoded.status().message(), HasSubstr("thread index 3"));
}

TEST(PprofWriterStandaloneTest, UnsymbolizedProfileKeepsAddressesAndMappings) {
  const CapturedStack stack = CaptureStack();
  ProfileData data = MakeProfile(stack);
  Symbolizer symbolizer(/*symbolize=*/false);
  absl::StatusOr<std::string> encoded = EncodePprof(data, symbolizer);
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  perftools::profiles::Profile profile;
  ASSERT_TRUE(profile.ParseFromString(*encoded));
  bool found_leaf = false;
  for (const auto& loc : profile.location()) {
    if (loc.address() != stack.frames[0]) continue;
    found_leaf = true;
    EXPECT_EQ(loc.mapping_id(), 1u);
    EXPECT_THAT(loc.line(), IsEmpty());
  }
  EXPECT_TRUE(found_leaf);
  EXPECT_FALSE(profile.mapping(0).has_functions());
  EXPECT_THAT(profile.string_table(profile.mapping(0).build_id()),
              Not(IsEmpty()));
}

TEST(PprofWriterStandaloneTest, GzipRoundTrips) {
  std::string input;
  for (int i = 0; i < 100000; ++i) input += static_cast<char>(i * 7 % 251);
  absl::StatusOr<std::string> compressed = GzipCompress(input);
  ASSERT_TRUE(compressed.ok()) << compressed.status();
  ASSERT_GE(compressed->size(), 2u);
  EXPECT_EQ(static_cast<unsigned char>((*compressed)[0]), 0x1f);
  EXPECT_EQ(static_cast<unsigned char>((*compressed)[1]), 0x8b);
  const std::string round_trip = Gunzip(*compressed);
  EXPECT_EQ(round_trip.size(), input.size());
  EXPECT_TRUE(round_trip == input);
  absl::StatusOr<std::string> empty = GzipCompress("");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(Gunzip(*empty), "");
}

TEST(PprofReaderTest, RejectsGarbageAndNamesMissingFiles) {
  EXPECT_FALSE(DecodePprof("\x1f\x8b not really gzip").ok());
  EXPECT_FALSE(DecodePprof("\xff\xff\xff\xff").ok());
  const std::string missing = ProfilePath("missing.pb.gz");
  absl::StatusOr<DecodedProfile> profile = ReadPprofFile(missing);
  ASSERT_FALSE(profile.ok());
  EXPECT_THAT(profile.status().message(), HasSubstr(missing));
}

TEST(GoPprofRawParserTest, ParsesSamplesLabelsAndInlineFrames) {
  // Captured from `go tool pprof -raw` (go1.19) on an inprof profile, plus an
  // inline frame.
  const std::string raw = R"(PeriodType: cpu-time nanoseconds
Period: 10000000
Samples:
cpu-samples/count cpu-time/nanoseconds[dflt]
          3   30000000: 1 2 
                thread name:[my main]
                thread id:[123]
          2          0: 3 
                thread name:[[events]] request:[a [b] c]
Locations
     1: 0x55d0c4a1 M=1 (anonymous namespace)::Leaf(int) /src/a.cc:12 s=0(_ZN12_GLOBAL__N_14LeafEi)
             outer::Caller() /src/a.cc:20 s=0(_ZN5outer6CallerEv)
     2: 0x7f00 M=2 
     3: 0x0 [dropped: ring full] :0 s=0
Mappings
1: 0x55d0c000/0x55d0d000/0x1000 /bin/a 0123 [FN][FL][LN][IN]
)";
  absl::StatusOr<std::vector<testing::RawSample>> samples =
      testing::ParseGoPprofRaw(raw);
  ASSERT_TRUE(samples.ok()) << samples.status();
  ASSERT_THAT(*samples, SizeIs(2));
  EXPECT_THAT((*samples)[0].values, ElementsAre(3, 30000000));
  EXPECT_THAT((*samples)[0].stack,
              ElementsAre("(anonymous namespace)::Leaf(int)", "outer::Caller()",
                          "0x7f00"));
  EXPECT_THAT((*samples)[0].file_lines,
              ElementsAre("/src/a.cc:12", "/src/a.cc:20", ""));
  EXPECT_EQ((*samples)[0].labels.at("thread name"), "my main");
  EXPECT_EQ((*samples)[0].labels.at("thread id"), "123");
  EXPECT_THAT((*samples)[1].stack, ElementsAre("[dropped: ring full]"));
  // Values with brackets of their own (the allocation profiler's thread).
  EXPECT_EQ((*samples)[1].labels.at("thread name"), "[events]");
  EXPECT_EQ((*samples)[1].labels.at("request"), "a [b] c");
}

}  // namespace
}  // namespace inprof
