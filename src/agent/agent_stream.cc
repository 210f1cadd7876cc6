#include "inprof/internal/agent_stream.h"

#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "inprof/internal/sample_record.h"
#include "inprof/spsc_ring.h"

namespace inprof::internal {

size_t AgentRingWords(uint64_t region_bytes) {
  if (region_bytes <= kAgentRingControlBytes) return 0;
  const uint64_t room = (region_bytes - kAgentRingControlBytes) / sizeof(uint64_t);
  size_t words = 1;
  while (words * 2 <= room && words < (size_t{1} << 40)) words *= 2;
  return words >= 16 ? words : 0;
}

AgentRingWriter::AgentRingWriter(void* region, uint64_t region_bytes)
    : control_(static_cast<AgentRingControl*>(region)),
      data_(reinterpret_cast<uint64_t*>(static_cast<char*>(region) +
                                        kAgentRingControlBytes)),
      words_(AgentRingWords(region_bytes)) {}

bool AgentRingWriter::Push(std::span<const uint64_t> record) {
  const uint64_t needed = record.size() + 1;
  if (record.empty() || needed > words_) return false;
  const uint64_t head = control_->head.load(std::memory_order_relaxed);
  const uint64_t tail = control_->tail.load(std::memory_order_acquire);
  // A consumer index ahead of ours, or further back than the ring, is the
  // agent's bug or a stray write: refuse rather than overwrite.
  if (tail > head || head - tail > words_) return false;
  if (head + needed - tail > words_) return false;
  const uint64_t mask = words_ - 1;
  data_[head & mask] = record.size();
  for (size_t i = 0; i < record.size(); ++i) data_[(head + 1 + i) & mask] = record[i];
  control_->head.store(head + needed, std::memory_order_release);
  return true;
}

uint64_t AgentRingWriter::pending_words() const {
  return control_->head.load(std::memory_order_relaxed) -
         control_->tail.load(std::memory_order_acquire);
}

uint64_t AgentRingWriter::samples_consumed() const {
  return control_->samples_consumed.load(std::memory_order_acquire);
}

AgentRingReader::AgentRingReader(void* region, uint64_t region_bytes)
    : control_(static_cast<AgentRingControl*>(region)),
      data_(reinterpret_cast<const uint64_t*>(static_cast<char*>(region) +
                                              kAgentRingControlBytes)),
      words_(AgentRingWords(region_bytes)) {
  if (words_ == 0) error_ = absl::StrCat("a region of ", region_bytes, " bytes holds no ring");
}

AgentRingReader::Result AgentRingReader::Pop(std::vector<uint64_t>& record) {
  if (!error_.empty()) return kCorrupt;
  const uint64_t head = control_->head.load(std::memory_order_acquire);
  if (head == tail_) return kEmpty;
  if (head < tail_ || head - tail_ > words_) {
    error_ = absl::StrCat("the ring's write index ", head,
                          " is impossible (read index ", tail_, ", ",
                          words_, " words)");
    return kCorrupt;
  }
  const uint64_t mask = words_ - 1;
  const uint64_t length = data_[tail_ & mask];
  // `length >= written`, not `length + 1 > written`: a length of 2^64-1
  // must not wrap around (fuzz/agent_stream_fuzzer.cc).
  if (length == 0 || length >= head - tail_) {
    error_ = absl::StrCat("a record of ", length, " words at index ", tail_,
                          " does not fit the ", head - tail_,
                          " words written");
    return kCorrupt;
  }
  record.resize(length);
  for (uint64_t i = 0; i < length; ++i) record[i] = data_[(tail_ + 1 + i) & mask];
  tail_ += length + 1;
  control_->tail.store(tail_, std::memory_order_release);
  return kRecord;
}

void AgentRingReader::AddSamplesConsumed(uint64_t n) {
  if (n == 0) return;
  control_->samples_consumed.store(
      control_->samples_consumed.load(std::memory_order_relaxed) + n,
      std::memory_order_release);
}

namespace {

enum OpType : uint64_t {
  kDescribe = 1,
  kEngine = 2,
  kString = 3,
  kThreadAdd = 4,
  kThreadName = 5,
  kThreadRemove = 6,
  kSample = 7,
  kSynthetic = 8,
  kStats = 9,
  kEnd = 10,
  kStateSample = 11,     // an AgentSample with `state`
  kStateSynthetic = 12,  // an AgentSynthetic with `state`
  kEventsNote = 13,
  kDumpThread = 14,
  kDumpEnd = 15,
};

void PutString(std::vector<uint64_t>& out, const std::string& s) {
  out.push_back(s.size());
  const size_t at = out.size();
  out.resize(at + (s.size() + 7) / 8, 0);
  if (!s.empty()) std::memcpy(out.data() + at, s.data(), s.size());
}

// Reads words from a record, remembering the first error.
class Reader {
 public:
  Reader(std::span<const uint64_t> words, const char* op) : words_(words), op_(op) {}

  uint64_t Word(const char* field) {
    if (!ok()) return 0;
    if (at_ >= words_.size()) {
      Fail(field, "is missing (the record ends)");
      return 0;
    }
    return words_[at_++];
  }
  uint32_t U32(const char* field) {
    const uint64_t v = Word(field);
    if (v > UINT32_MAX) Fail(field, absl::StrCat("is ", v, ", above 2^32-1"));
    return static_cast<uint32_t>(v);
  }
  size_t Count(const char* field, size_t max) {
    const uint64_t v = Word(field);
    if (ok() && v > max) Fail(field, absl::StrCat("is ", v, ", above ", max));
    if (ok() && v > words_.size() - at_) {
      Fail(field, absl::StrCat("is ", v, ", more than the ", words_.size() - at_,
                               " words left"));
    }
    return ok() ? static_cast<size_t>(v) : 0;
  }
  std::string String(const char* field) {
    const uint64_t bytes = Word(field);
    if (!ok()) return {};
    if (bytes > kAgentOpMaxStringBytes) {
      Fail(field, absl::StrCat("has ", bytes, " bytes, above ", kAgentOpMaxStringBytes));
      return {};
    }
    const size_t words = (bytes + 7) / 8;
    if (words > words_.size() - at_) {
      Fail(field, absl::StrCat("has ", bytes, " bytes, past the record's end"));
      return {};
    }
    // One encoding per string: the padding after it is zero.
    const char* packed = reinterpret_cast<const char*>(words_.data() + at_);
    for (size_t i = bytes; i < words * sizeof(uint64_t); ++i) {
      if (packed[i] != 0) {
        Fail(field, absl::StrCat("has ", bytes, " bytes and then padding that is not zero"));
        return {};
      }
    }
    std::string s(packed, bytes);
    at_ += words;
    return s;
  }
  template <typename T>
  void Words(std::vector<T>& out, size_t n) {
    out.resize(n);
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<T>(words_[at_ + i]);
    at_ += n;
  }
  absl::Status Finish() {
    if (ok() && at_ != words_.size()) {
      Fail("record", absl::StrCat("has ", words_.size() - at_, " words after its end"));
    }
    return status_;
  }
  bool ok() const { return status_.ok(); }

 private:
  void Fail(const char* field, const std::string& why) {
    if (ok()) {
      status_ = absl::InvalidArgumentError(
          absl::StrCat("agent stream: ", op_, " record: ", field, " ", why));
    }
  }
  std::span<const uint64_t> words_;
  const char* op_;
  size_t at_ = 1;  // after the type word
  absl::Status status_;
};

struct Encoder {
  std::vector<uint64_t>& out;
  void operator()(const AgentDescribe& d) {
    out.push_back(kDescribe);
    out.push_back(static_cast<uint64_t>(d.period));
    out.push_back(d.sample_types.size());
    for (const ValueType& t : d.sample_types) {
      PutString(out, t.type);
      PutString(out, t.unit);
    }
    PutString(out, d.period_type.type);
    PutString(out, d.period_type.unit);
    PutString(out, d.engine);
    out.push_back(d.omitted_types);
  }
  void operator()(const AgentEngine& e) {
    out.push_back(kEngine);
    PutString(out, e.detail);
  }
  void operator()(const AgentString& s) {
    out.push_back(kString);
    out.push_back(s.id);
    PutString(out, s.text);
  }
  void operator()(const AgentThreadAdd& t) {
    out.push_back(kThreadAdd);
    out.push_back(t.index);
    out.push_back(static_cast<uint64_t>(t.tid));
    PutString(out, t.name);
  }
  void operator()(const AgentThreadName& t) {
    out.push_back(kThreadName);
    out.push_back(t.index);
    PutString(out, t.name);
  }
  void operator()(const AgentThreadRemove& t) {
    out.push_back(kThreadRemove);
    out.push_back(t.index);
  }
  void operator()(const AgentSample& s) {
    std::vector<uint64_t> tmp;
    EncodeAgentSample(s.thread, s.value_offset, s.values, s.labels, s.frames, s.state, tmp);
    out.insert(out.end(), tmp.begin(), tmp.end());
  }
  void operator()(const AgentSynthetic& s) {
    out.push_back(s.state ? kStateSynthetic : kSynthetic);
    out.push_back(s.thread);
    out.push_back(s.value_offset);
    out.push_back(s.values.size());
    for (int64_t v : s.values) out.push_back(static_cast<uint64_t>(v));
    PutString(out, s.frame);
  }
  void operator()(const AgentStats& s) {
    out.push_back(kStats);
    out.push_back(s.counters.size());
    out.insert(out.end(), s.counters.begin(), s.counters.end());
  }
  void operator()(const AgentEnd&) { out.push_back(kEnd); }
  void operator()(const AgentDumpThread& t) {
    out.push_back(kDumpThread);
    out.push_back(t.request);
    out.push_back(static_cast<uint64_t>(t.tid));
    out.push_back(t.frames.size());
    out.insert(out.end(), t.frames.begin(), t.frames.end());
    PutString(out, t.name);
    PutString(out, t.synthetic);
    out.push_back(t.labels.size());
    for (const AgentDumpLabel& l : t.labels) {
      out.push_back(l.numeric ? 1 : 0);
      out.push_back(static_cast<uint64_t>(l.num));
      PutString(out, l.key);
      PutString(out, l.str);
    }
  }
  void operator()(const AgentDumpEnd& e) {
    out.push_back(kDumpEnd);
    out.push_back(e.request);
    PutString(out, e.error);
    out.push_back(e.comments.size());
    for (const std::string& c : e.comments) PutString(out, c);
  }
  void operator()(const AgentEventsNote& n) {
    out.push_back(kEventsNote);
    out.push_back(static_cast<uint64_t>(n.period));
    out.push_back(static_cast<uint64_t>(n.lock_period));
    PutString(out, n.line);
  }
};

}  // namespace

void EncodeAgentSample(uint32_t thread, uint32_t value_offset,
                       std::span<const int64_t> values,
                       std::span<const uint64_t> labels,
                       std::span<const uint64_t> frames, bool state,
                       std::vector<uint64_t>& out) {
  out.clear();
  out.reserve(6 + values.size() + labels.size() + frames.size());
  out.push_back(state ? kStateSample : kSample);
  out.push_back(thread);
  out.push_back(value_offset);
  out.push_back(values.size());
  out.push_back(labels.size());
  out.push_back(frames.size());
  for (int64_t v : values) out.push_back(static_cast<uint64_t>(v));
  out.insert(out.end(), labels.begin(), labels.end());
  out.insert(out.end(), frames.begin(), frames.end());
}

void EncodeAgentOp(const AgentOp& op, std::vector<uint64_t>& out) {
  out.clear();
  std::visit(Encoder{out}, op);
}

std::vector<uint64_t> EncodeAgentOp(const AgentOp& op) {
  std::vector<uint64_t> out;
  EncodeAgentOp(op, out);
  return out;
}

absl::StatusOr<AgentOp> DecodeAgentOp(std::span<const uint64_t> record) {
  if (record.empty()) {
    return absl::InvalidArgumentError("agent stream: an empty record");
  }
  switch (record[0]) {
    case kDescribe: {
      Reader r(record, "describe");
      AgentDescribe d;
      d.period = static_cast<int64_t>(r.Word("period"));
      const size_t n = r.Count("sample type count", kAgentOpMaxValues);
      for (size_t i = 0; i < n && r.ok(); ++i) {
        ValueType t;
        t.type = r.String("sample type");
        t.unit = r.String("sample unit");
        d.sample_types.push_back(std::move(t));
      }
      d.period_type.type = r.String("period type");
      d.period_type.unit = r.String("period unit");
      d.engine = r.String("engine");
      d.omitted_types = r.Word("omitted sample types");
      if (absl::Status s = r.Finish(); !s.ok()) return s;
      if (d.sample_types.size() < 64 && (d.omitted_types >> d.sample_types.size()) != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "agent stream: describe record: omitted sample types 0x",
            absl::Hex(d.omitted_types), " name types past its ", d.sample_types.size()));
      }
      return d;
    }
    case kEngine: {
      Reader r(record, "engine");
      AgentEngine e{r.String("detail")};
      if (absl::Status s = r.Finish(); !s.ok()) return s;
      return e;
    }
    case kString: {
      Reader r(record, "string");
      AgentString s;
      s.id = r.U32("id");
      s.text = r.String("text");
      if (absl::Status st = r.Finish(); !st.ok()) return st;
      return s;
    }
    case kThreadAdd: {
      Reader r(record, "thread");
      AgentThreadAdd t;
      t.index = r.U32("index");
      t.tid = static_cast<int64_t>(r.Word("tid"));
      t.name = r.String("name");
      if (absl::Status s = r.Finish(); !s.ok()) return s;
      return t;
    }
    case kThreadName: {
      Reader r(record, "thread name");
      AgentThreadName t;
      t.index = r.U32("index");
      t.name = r.String("name");
      if (absl::Status s = r.Finish(); !s.ok()) return s;
      return t;
    }
    case kThreadRemove: {
      Reader r(record, "thread removal");
      AgentThreadRemove t{r.U32("index")};
      if (absl::Status s = r.Finish(); !s.ok()) return s;
      return t;
    }
    case kSample:
    case kStateSample: {
      Reader r(record, record[0] == kSample ? "sample" : "state sample");
      AgentSample s;
      s.state = record[0] == kStateSample;
      s.thread = r.U32("thread");
      s.value_offset = r.U32("value offset");
      const uint64_t nvalues = r.Word("value count");
      const uint64_t nlabels = r.Word("label word count");
      const uint64_t nframes = r.Word("frame count");
      if (r.ok()) {
        const uint64_t left = record.size() - 6;
        if (nvalues > kAgentOpMaxValues || nlabels > kAgentOpMaxLabelWords ||
            nframes > kAgentOpMaxFrames || nvalues + nlabels + nframes != left) {
          return absl::InvalidArgumentError(absl::StrCat(
              "agent stream: sample record: ", nvalues, " values, ", nlabels,
              " label words and ", nframes, " frames do not make its ", left,
              " words (at most ", kAgentOpMaxValues, ", ", kAgentOpMaxLabelWords,
              ", ", kAgentOpMaxFrames, ")"));
        }
        r.Words(s.values, nvalues);
        r.Words(s.labels, nlabels);
        r.Words(s.frames, nframes);
      }
      if (absl::Status st = r.Finish(); !st.ok()) return st;
      return s;
    }
    case kSynthetic:
    case kStateSynthetic: {
      Reader r(record, record[0] == kSynthetic ? "synthetic" : "state synthetic");
      AgentSynthetic s;
      s.state = record[0] == kStateSynthetic;
      s.thread = r.U32("thread");
      s.value_offset = r.U32("value offset");
      const size_t n = r.Count("value count", kAgentOpMaxValues);
      if (r.ok()) r.Words(s.values, n);
      s.frame = r.String("frame");
      if (absl::Status st = r.Finish(); !st.ok()) return st;
      return s;
    }
    case kStats: {
      Reader r(record, "stats");
      AgentStats s;
      const size_t n = r.Count("counter count", kAgentOpMaxValues);
      if (r.ok()) r.Words(s.counters, n);
      if (absl::Status st = r.Finish(); !st.ok()) return st;
      return s;
    }
    case kEnd: {
      Reader r(record, "end");
      if (absl::Status st = r.Finish(); !st.ok()) return st;
      return AgentEnd{};
    }
    case kDumpThread: {
      Reader r(record, "dump thread");
      AgentDumpThread t;
      t.request = r.U32("request");
      t.tid = static_cast<int64_t>(r.Word("tid"));
      const size_t nframes = r.Count("frame count", kAgentOpMaxFrames);
      if (r.ok()) r.Words(t.frames, nframes);
      t.name = r.String("name");
      t.synthetic = r.String("synthetic frame");
      const size_t nlabels = r.Count("label count", kAgentOpMaxDumpLabels);
      for (size_t i = 0; r.ok() && i < nlabels; ++i) {
        AgentDumpLabel& l = t.labels.emplace_back();
        const uint64_t numeric = r.Word("label kind");
        if (r.ok() && numeric > 1) {
          return absl::InvalidArgumentError(absl::StrCat(
              "agent stream: dump thread record: label kind ", numeric, " is not 0 or 1"));
        }
        l.numeric = numeric == 1;
        l.num = static_cast<int64_t>(r.Word("label number"));
        l.key = r.String("label key");
        l.str = r.String("label text");
      }
      if (absl::Status st = r.Finish(); !st.ok()) return st;
      return t;
    }
    case kDumpEnd: {
      Reader r(record, "dump end");
      AgentDumpEnd e;
      e.request = r.U32("request");
      e.error = r.String("error");
      const size_t n = r.Count("comment count", 64);
      for (size_t i = 0; r.ok() && i < n; ++i) e.comments.push_back(r.String("comment"));
      if (absl::Status st = r.Finish(); !st.ok()) return st;
      return e;
    }
    case kEventsNote: {
      Reader r(record, "events note");
      AgentEventsNote n;
      n.period = static_cast<int64_t>(r.Word("period"));
      n.lock_period = static_cast<int64_t>(r.Word("lock period"));
      n.line = r.String("line");
      if (absl::Status st = r.Finish(); !st.ok()) return st;
      return n;
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("agent stream: unknown record type ", record[0]));
  }
}

// ---------------------------------------------------------------------------
// The threads' own rings.

namespace {

constexpr uint64_t kPage = 4096;
constexpr size_t kChunkHeaderBytes = kAgentThreadRingOffset;
static_assert(sizeof(AgentThreadChunkHeader) <= kChunkHeaderBytes);
static_assert(SpscRecordRing<16>::words_offset() == kAgentThreadRingIndexBytes);
// Where an SpscRecordRing keeps its indices and words (the same for every size).
constexpr size_t kRingHead = SpscRecordRing<16>::head_offset();
constexpr size_t kRingTail = SpscRecordRing<16>::tail_offset();
constexpr size_t kRingWords = SpscRecordRing<16>::words_offset();

uint64_t LoadWord(const char* at) {
  return reinterpret_cast<const std::atomic<uint64_t>*>(at)->load(
      std::memory_order_acquire);
}

}  // namespace

uint32_t AgentThreadChunkBytes(const AgentThreadRingLayout& layout) {
  const uint64_t bytes = kChunkHeaderBytes + uint64_t{layout.ring_bytes};
  return static_cast<uint32_t>((bytes + kPage - 1) / kPage * kPage);
}

uint64_t AgentThreadAreaOffset(uint64_t region_bytes) {
  return (region_bytes + kPage - 1) / kPage * kPage;
}

AgentThreadAreaSummary ReadAgentThreadArea(
    const void* area, uint64_t bytes,
    const std::function<void(const AgentLeftoverSample&)>& on_sample) {
  AgentThreadAreaSummary summary;
  if (bytes < kAgentThreadAreaHeaderBytes) return summary;  // none was made
  const char* base = static_cast<const char*>(area);
  AgentThreadAreaShape h;
  std::memcpy(&h, base, sizeof(h));
  const uint32_t chunks = reinterpret_cast<const AgentThreadAreaHeader*>(base)->chunks.load(
      std::memory_order_acquire);
  if (h.magic != kAgentThreadAreaMagic) {
    summary.error = "its threads' ring area has no header";
    return summary;
  }
  const uint64_t ring_words = h.ring_words;
  if (h.num_providers == 0 || h.num_providers > kAgentMaxProviders ||
      ring_words < 16 || (ring_words & (ring_words - 1)) != 0 ||
      ring_words > (uint64_t{1} << 20) || h.ring_offset < kChunkHeaderBytes ||
      h.ring_offset % 64 != 0 ||
      uint64_t{h.ring_offset} + kRingWords + ring_words * 8 > h.chunk_bytes ||
      h.chunk_bytes % kPage != 0 ||  // chunks are whole pages: aligned
      h.leaf_words > 1024) {
    summary.error = "its threads' ring area has an impossible layout";
    return summary;
  }
  size_t value_counts[kAgentMaxProviders] = {};  // as RecordView reads them
  for (uint32_t p = 0; p < h.num_providers; ++p) {
    if (h.value_counts[p] > kAgentOpMaxValues ||
        h.value_offsets[p] + uint64_t{h.value_counts[p]} > kAgentOpMaxValues) {
      summary.error = "its threads' ring area has an impossible layout";
      return summary;
    }
    value_counts[p] = h.value_counts[p];
  }
  const uint64_t room = (bytes - kAgentThreadAreaHeaderBytes) / h.chunk_bytes;
  const uint64_t n = chunks < room ? chunks : room;
  if (n == 0) return summary;
  const uint64_t mask = ring_words - 1;
  std::vector<uint64_t> record(ring_words);
  for (uint64_t c = 0; c < n; ++c) {
    const char* chunk = base + kAgentThreadAreaHeaderBytes + c * h.chunk_bytes;
    const auto* ch = reinterpret_cast<const AgentThreadChunkHeader*>(chunk);
    if (ch->in_use.load(std::memory_order_acquire) != 1) continue;
    ++summary.rings;
    char name[sizeof(ch->name) + 1] = {};
    std::memcpy(name, ch->name, sizeof(ch->name));
    const char* ring = chunk + h.ring_offset;
    const uint64_t* words = reinterpret_cast<const uint64_t*>(ring + kRingWords);
    const uint64_t head = LoadWord(ring + kRingHead);
    uint64_t tail = LoadWord(ring + kRingTail);
    if (tail > head || head - tail > ring_words) {
      ++summary.skipped;
      continue;
    }
    while (tail < head) {
      const uint64_t length = words[tail & mask];
      if (length == 0 || length >= ring_words || length > head - tail - 1) {
        ++summary.skipped;
        break;
      }
      for (uint64_t i = 0; i < length; ++i) record[i] = words[(tail + 1 + i) & mask];
      tail += 1 + length;
      // A record whose parts do not fill it exactly is skipped.
      const RecordView view =
          RecordView::Read(record.data(), length,
                           std::span<const size_t>(value_counts, h.num_providers), h.leaf_words);
      if (!view.ok() || view.layout.size() != length) {
        ++summary.skipped;
        continue;
      }
      const RecordMeta meta = view.meta;
      const uint64_t provider = meta.provider;
      AgentLeftoverSample s;
      s.tid = ch->tid;
      s.thread_name = name;
      s.provider = static_cast<uint32_t>(provider);
      s.value_offset = h.value_offsets[provider];
      s.blocked = meta.blocked;
      s.state_label = ((h.state_label_providers >> provider) & 1) != 0;
      s.values = view.values();
      s.labels = view.labels();
      s.frames = view.frames();
      ++summary.samples;
      on_sample(s);
    }
  }
  return summary;
}

}  // namespace inprof::internal
