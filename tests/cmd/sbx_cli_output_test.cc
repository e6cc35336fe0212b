// The CLI's terminal escaping: what a sandbox or a tenant chose never reaches the
// operator's terminal as control bytes.

#include "src/cmd/sbx_cli_output.h"

#include <string>

#include "gtest/gtest.h"

namespace sbx::cli {
namespace {

TEST(EscapeForTerminalTest, ControlBytesAreEscapedAsLsBDoes) {
  EXPECT_EQ(EscapeForTerminal("\x1b]0;pwned\x07\x1b[2J"), "\\033]0;pwned\\a\\033[2J");
  EXPECT_EQ(EscapeForTerminal("a\tb\nc\rd\x7f\\e"), "a\\tb\\nc\\rd\\177\\\\e");
  EXPECT_EQ(EscapeForTerminal(std::string("nul\0x", 5)), "nul\\000x");
  EXPECT_EQ(EscapeForTerminal("plain name-1.txt"), "plain name-1.txt");
}

TEST(EscapeForTerminalTest, Utf8PassesButC1ControlsBidiAndInvalidBytesDoNot) {
  EXPECT_EQ(EscapeForTerminal("h\xc3\xa9llo \xe6\x97\xa5\xf0\x9f\x98\x80"),
            "h\xc3\xa9llo \xe6\x97\xa5\xf0\x9f\x98\x80");
  EXPECT_EQ(EscapeForTerminal("\xc2\x9b"
                              "2J"),
            "\\302\\2332J");                                                // U+009B, CSI
  EXPECT_EQ(EscapeForTerminal("a\xe2\x80\xaetxt"), "a\\342\\200\\256txt");  // U+202E
  EXPECT_EQ(EscapeForTerminal("\x9b\xff\xc0\xaf"), "\\233\\377\\300\\257");
  EXPECT_EQ(EscapeForTerminal("\xed\xa0\x80"), "\\355\\240\\200");  // a surrogate
  EXPECT_EQ(EscapeForTerminal("\xe6\x97"), "\\346\\227");           // cut short
}

TEST(EscapeForTerminalTest, TextKeepsNewlinesTabsAndBackslashes) {
  EXPECT_EQ(EscapeForTerminal("a\tb\nc\\d\x1b[1m\r", EscapeMode::kText), "a\tb\nc\\d\\033[1m\\r");
}

TEST(TerminalEscaperTest, ASequenceSplitAcrossChunksIsKeptWhole) {
  TerminalEscaper e;
  std::string out = e.Feed("x\xe6");
  out += e.Feed("\x97");
  out += e.Feed("\xa5y\x1b");
  out += e.Finish();
  EXPECT_EQ(out, "x\xe6\x97\xa5y\\033");
  TerminalEscaper cut;
  out = cut.Feed("z\xf0\x9f");
  out += cut.Finish();
  EXPECT_EQ(out, "z\\360\\237");
}

}  // namespace
}  // namespace sbx::cli
