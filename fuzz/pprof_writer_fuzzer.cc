// libFuzzer target: inprof's own pprof encoder (EncodePprof) against its
// own decoder (DecodePprof), on profiles built from the fuzzer's bytes:
// arbitrary strings (empty, binary, repeated), negative and huge values,
// labels of both kinds, synthetic frames and unmapped addresses.
//
// Checked: every profile encodes, decodes back, and says what went in
// (strings that are not UTF-8 come back as UTF-8, U+FFFD for stray bytes):
// the same sample types, period, times, comments, and per sample (samples
// whose values are all zero are left out, as the encoder documents) the
// values, the thread labels, the other labels and the synthetic frame.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "inprof/pprof_reader.h"
#include "inprof/pprof_writer.h"
#include "inprof/profile_data.h"
#include "inprof/symbolizer.h"

namespace {

class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return pos_ >= size_; }
  uint8_t U8() { return pos_ < size_ ? data_[pos_++] : 0; }
  int64_t I64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = (v << 8) | U8();
    return static_cast<int64_t>(v);
  }
  std::string Str() {
    const size_t n = U8() % 12;
    std::string s;
    for (size_t i = 0; i < n; ++i) s.push_back(static_cast<char>(U8()));
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// Independent of the encoder's check: decodes code points and rejects
// overlong forms, surrogates and values above U+10FFFF.
bool IsUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    int n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
    if (n < 0 || s.size() - i <= static_cast<size_t>(n)) return n == 0;
    uint32_t cp = n == 0 ? c : c & (0x3f >> n);
    for (int k = 1; k <= n; ++k) {
      const unsigned char d = s[i + k];
      if ((d >> 6) != 2) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n + 1;
  }
  return true;
}

// What the profile must say for a string that went in: itself when it is
// UTF-8; otherwise some UTF-8 string.
bool SameString(const std::string& got, const std::string& in) {
  return IsUtf8(in) ? got == in : IsUtf8(got);
}

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "pprof_writer_fuzzer: round trip lost %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static inprof::Symbolizer* symbolizer = new inprof::Symbolizer(false);
  Bytes in(data, size);
  inprof::ProfileData p;
  const int ntypes = 1 + in.U8() % 3;
  for (int i = 0; i < ntypes; ++i) p.sample_types.push_back({in.Str(), in.Str()});
  p.period_type = {in.Str(), in.Str()};
  p.period = in.I64();
  p.time_nanos = in.I64();
  p.duration_nanos = in.I64();
  for (int i = in.U8() % 3; i > 0; --i) p.comments.push_back(in.Str());
  p.default_sample_type = in.U8() % 4;
  const int nthreads = 1 + in.U8() % 3;
  for (int i = 0; i < nthreads; ++i) p.threads.push_back({in.I64(), in.Str()});
  while (!in.empty() && p.samples.size() < 64) {
    inprof::ProfileSample s;
    s.thread = in.U8() % nthreads;
    for (int i = 0; i < ntypes; ++i) s.values.push_back(in.U8() & 1 ? in.I64() : 0);
    if (in.U8() & 1) {
      s.synthetic_frame = "[" + in.Str() + "]";
    } else {
      for (int i = in.U8() % 4; i > 0; --i) s.frames.push_back(in.I64());
    }
    for (int i = in.U8() % 3; i > 0; --i) {
      inprof::SampleLabel l;
      l.key = "k" + in.Str();
      l.numeric = in.U8() & 1;
      if (l.numeric) {
        l.num = in.I64();
      } else {
        l.str = "v" + in.Str();
      }
      s.labels.push_back(l);
    }
    p.samples.push_back(std::move(s));
  }

  auto bytes = inprof::EncodePprof(p, *symbolizer);
  Check(bytes.ok(), "the encoding");
  auto d = inprof::DecodePprof(*bytes);
  Check(d.ok(), "the decoding");
  Check(d->sample_types.size() == p.sample_types.size(), "sample types");
  for (size_t i = 0; i < p.sample_types.size(); ++i) {
    Check(SameString(d->sample_types[i].type, p.sample_types[i].type) &&
              SameString(d->sample_types[i].unit, p.sample_types[i].unit),
          "a sample type");
  }
  Check(d->period == p.period, "period");
  Check(d->time_nanos == p.time_nanos, "time_nanos");
  Check(d->duration_nanos == p.duration_nanos, "duration_nanos");
  Check(d->comments.size() == p.comments.size(), "comments");
  for (size_t i = 0; i < p.comments.size(); ++i) {
    Check(SameString(d->comments[i], p.comments[i]), "a comment");
  }
  size_t next = 0;
  for (const inprof::ProfileSample& s : p.samples) {
    bool all_zero = true;
    for (int64_t v : s.values) all_zero = all_zero && v == 0;
    if (all_zero) continue;
    Check(next < d->samples.size(), "a sample");
    const auto& got = d->samples[next++];
    Check(got.values == s.values, "values");
    Check(got.num_labels.at("thread id") == p.threads[s.thread].tid, "thread id");
    if (!p.threads[s.thread].name.empty()) {
      Check(SameString(got.str_labels.at("thread name"), p.threads[s.thread].name),
            "thread name");
    }
    if (!s.synthetic_frame.empty()) {
      Check(got.stack.size() == 1 && SameString(got.stack[0], s.synthetic_frame),
            "the synthetic frame");
    } else {
      Check(got.stack.size() == s.frames.size(), "frames");
    }
    // The last label with a key wins, as in the reader's maps.
    for (const inprof::SampleLabel& l : s.labels) {
      bool last = true;
      for (const inprof::SampleLabel& m : s.labels) {
        if (&m > &l && (m.key == l.key || !IsUtf8(m.key))) last = false;
      }
      if (!last || !IsUtf8(l.key) || (!l.numeric && !IsUtf8(l.str))) continue;
      if (l.numeric) {
        Check(got.num_labels.count(l.key) && got.num_labels.at(l.key) == l.num,
              "a numeric label");
      } else {
        Check(got.str_labels.count(l.key) && got.str_labels.at(l.key) == l.str,
              "a string label");
      }
    }
  }
  Check(next == d->samples.size(), "the sample count");
  return 0;
}
