// The bounds-checked reader the DWARF and CFI parsers share
// (include/inprof/base/byte_cursor.h): every read stays inside [p, end),
// including when a corrupt length has already put p past end.
#include "inprof/base/byte_cursor.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace inprof::internal {
namespace {

TEST(ByteCursorTest, ReadsLittleEndianAndLeb128) {
  const std::vector<uint8_t> bytes = {0x34, 0x12, 0xe5, 0x8e, 0x26, 0x7f, 'a', 'b', 0};
  ByteCursor c{bytes.data(), bytes.data() + bytes.size()};
  uint64_t fixed = 0, uleb = 0;
  int64_t sleb = 0;
  const char* text = nullptr;
  ASSERT_TRUE(c.Fixed(2, &fixed));
  EXPECT_EQ(fixed, 0x1234u);
  ASSERT_TRUE(c.Uleb(&uleb));
  EXPECT_EQ(uleb, 624485u);  // DWARF 5, figure C.1's example
  ASSERT_TRUE(c.Sleb(&sleb));
  EXPECT_EQ(sleb, -1);
  ASSERT_TRUE(c.CString(&text));
  EXPECT_STREQ(text, "ab");
  EXPECT_EQ(c.left(), 0u);
  EXPECT_FALSE(c.Fixed(1, &fixed));
}

TEST(ByteCursorTest, ReadsNothingPastTheEnd) {
  const std::vector<uint8_t> bytes = {0x80, 0x80, 'x'};
  ByteCursor c{bytes.data(), bytes.data() + 2};
  uint64_t v = 0;
  const char* text = nullptr;
  EXPECT_FALSE(c.Uleb(&v));  // a LEB128 still continuing at the end
  ByteCursor s{bytes.data() + 2, bytes.data() + 3};
  EXPECT_FALSE(s.CString(&text));  // no NUL before the end
  EXPECT_FALSE(s.Fixed(2, &v));
  EXPECT_FALSE(s.Skip(2));
}

TEST(ByteCursorTest, ACursorStartingPastItsEndHasNothingLeft) {
  // What a CIE whose length field says 2 gave the CFI reader: its fields
  // begin after where the length says it ends.
  const std::vector<uint8_t> bytes(16, 0x80);
  ByteCursor c{bytes.data() + 10, bytes.data() + 6};
  uint64_t v = 0;
  int64_t sv = 0;
  const char* text = nullptr;
  EXPECT_EQ(c.left(), 0u);
  EXPECT_FALSE(c.Fixed(1, &v));
  EXPECT_FALSE(c.Skip(1));
  EXPECT_FALSE(c.Uleb(&v));
  EXPECT_FALSE(c.Sleb(&sv));
  EXPECT_FALSE(c.CString(&text));
  EXPECT_EQ(c.p, bytes.data() + 10);
}

}  // namespace
}  // namespace inprof::internal
