// The lazytrain executable itself (LT_LAZYTRAIN: the binary this build made; LT_BIN overrides it):
// `tokenize` in text and --chat mode against the HF expectations committed with the family fixtures
// (tests/fixtures/families/*/cases.jsonl), and `generate --raw` with a tokenizer that has no chat
// template.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "../common/families.h"

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

const std::string kSrc = lt::testing::repo_root().string();
const std::string& kFamilies = lt::testing::kFamiliesDir;

std::string lazytrain() {
  const char* env = std::getenv("LT_BIN");
  return env && *env ? env : LT_LAZYTRAIN;
}

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

struct CliRun {
  int rc;
  std::string out, err;
};

// Runs `lazytrain ARGS < stdin_text` in a fresh temporary directory.
CliRun run_cli(const std::string& args, const std::string& stdin_text = "") {
  const fs::path dir = fs::temp_directory_path() / ("lt_cli_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
                                                    "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::create_directories(dir);
  std::ofstream(dir / "in", std::ios::binary) << stdin_text;
  const std::string cmd = quote(lazytrain()) + " " + args + " < " + quote((dir / "in").string()) + " > " +
                          quote((dir / "out").string()) + " 2> " + quote((dir / "err").string());
  const int rc = std::system(cmd.c_str());
  auto slurp = [](const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  CliRun r{rc, slurp(dir / "out"), slurp(dir / "err")};
  fs::remove_all(dir);
  return r;
}

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

using lt::testing::families;
std::vector<ojson> cases(const std::string& fam, const std::string& kind) { return lt::testing::family_cases(fam, kind); }

// Each output line is {"ids": [...]}, one per input line, equal to the expected ids.
void expect_ids(const std::string& fam, const CliRun& r, const std::vector<ojson>& want) {
  ASSERT_EQ(r.rc, 0) << fam << ": " << r.err;
  const auto got = lines(r.out);
  ASSERT_EQ(got.size(), want.size()) << fam;
  for (size_t i = 0; i < want.size(); ++i) {
    const ojson j = ojson::parse(got[i]);
    EXPECT_EQ(j.at("ids"), want[i]) << fam << " line " << i + 1;
  }
}

// Text mode: {"text"} -> HF encode(text, add_special_tokens=False), on every family's 181 texts.
TEST(CliTokenize, TextModeMatchesHfOnEveryFamily) {
  ASSERT_GE(families().size(), 10u);
  for (const auto& fam : families()) {
    std::string in;
    std::vector<ojson> want;
    for (const auto& c : cases(fam, "text")) {
      in += ojson{{"text", c["text"]}}.dump() + "\n";
      want.push_back(c["ids"]);
    }
    ASSERT_GE(want.size(), 150u) << fam;
    expect_ids(fam, run_cli("tokenize --tokenizer " + quote(kFamilies + fam), in), want);
  }
}

// --chat: the model's own template (extra keys such as enable_thinking and date_string are template
// variables), then encoded: HF apply_chat_template(tokenize=True) ids.
TEST(CliTokenize, ChatModeMatchesHfApplyChatTemplate) {
  int checked = 0;
  for (const auto& fam : families()) {
    std::string in;
    std::vector<ojson> want;
    for (const auto& c : cases(fam, "chat")) {
      if (c.contains("error")) continue;  // refused conversations: checked below
      ojson line = c;
      for (const char* k : {"text", "ids", "kind"}) line.erase(k);
      in += line.dump() + "\n";
      want.push_back(c["ids"]);
    }
    if (want.empty()) continue;  // no chat template (gpt2)
    expect_ids(fam, run_cli("tokenize --chat --tokenizer " + quote(kFamilies + fam), in), want);
    ++checked;
  }
  EXPECT_GE(checked, 8);
}

// A conversation the template refuses (raise_exception: Gemma has no system role) fails the command
// with the template's message; malformed input names its line.
TEST(CliTokenize, RefusalsAndBadInputAreErrors) {
  const auto refused = cases("gemma", "chat");
  bool any = false;
  for (const auto& c : refused) {
    if (!c.contains("error")) continue;
    any = true;
    ojson line = c;
    for (const char* k : {"text", "ids", "kind", "error"}) line.erase(k);
    const CliRun r = run_cli("tokenize --chat --tokenizer " + quote(kFamilies + "gemma"), line.dump() + "\n");
    EXPECT_NE(r.rc, 0);
    EXPECT_NE(r.err.find("chat_template"), std::string::npos) << r.err;
  }
  EXPECT_TRUE(any);
  const CliRun bad = run_cli("tokenize --tokenizer " + quote(kFamilies + "qwen3"), "{\"text\": \"a\"}\n{\"txt\": 1}\n");
  EXPECT_NE(bad.rc, 0);
  EXPECT_NE(bad.err.find("stdin:2"), std::string::npos) << bad.err;
}

// --template chatml: the hand-written ChatML fallback, even for a tokenizer whose own template differs.
TEST(CliTokenize, ChatmlFallbackTemplate) {
  const std::string in = R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]})"
                         "\n";
  const CliRun own = run_cli("tokenize --chat --tokenizer " + quote(kFamilies + "qwen2.5"), in);
  const CliRun fb = run_cli("tokenize --chat --template chatml --tokenizer " + quote(kFamilies + "qwen2.5"), in);
  const CliRun text = run_cli("tokenize --tokenizer " + quote(kFamilies + "qwen2.5"),
                           ojson{{"text", "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nYo<|im_end|>\n"}}.dump() + "\n");
  ASSERT_EQ(own.rc, 0) << own.err;
  ASSERT_EQ(fb.rc, 0) << fb.err;
  EXPECT_EQ(fb.out, text.out);  // no default system message
  EXPECT_NE(own.out, fb.out);   // Qwen2.5's own template adds its default system message
}

// generate --raw encodes the prompt as plain text: a tokenizer directory without any chat template
// works (without --raw, template auto is an error naming the choices).
TEST(CliGenerate, RawNeedsNoTemplate) {
  // The demo tokenizer without its chat template, cut to the fixture model's 300 ids (no added tokens).
  const fs::path tokdir = fs::temp_directory_path() / "lt_cli_raw_tok";
  fs::create_directories(tokdir);
  {
    std::ifstream f(kSrc + "/configs/demo/tokenizer.json");
    ojson j = ojson::parse(f);
    ojson vocab = ojson::object(), merges = ojson::array();
    for (auto it = j["model"]["vocab"].begin(); it != j["model"]["vocab"].end(); ++it)
      if (it.value().get<int>() < 300) vocab[it.key()] = it.value();
    for (const auto& m : j["model"]["merges"])
      if (vocab.contains(m[0].get<std::string>() + m[1].get<std::string>())) merges.push_back(m);
    j["model"]["vocab"] = vocab;
    j["model"]["merges"] = merges;
    j["added_tokens"] = ojson::array();
    std::ofstream(tokdir / "tokenizer.json") << j.dump();
  }
  const std::string common = "generate --model " + quote(kSrc + "/tests/fixtures/hf/qwen2_bias_tied") +
                             " --tokenizer " + quote(tokdir.string()) + " --device cpu --threads 1 --max-new-tokens 3 -p 'What is'";
  const CliRun raw = run_cli(common + " --raw");
  EXPECT_EQ(raw.rc, 0) << raw.err;
  EXPECT_EQ(raw.out.rfind("### prompt 0: What is\n", 0), 0u) << raw.out;
  const CliRun chat = run_cli(common);
  EXPECT_NE(chat.rc, 0);
  EXPECT_NE(chat.err.find("template: 'auto' needs"), std::string::npos) << chat.err;
  fs::remove_all(tokdir);
}

}  // namespace

// Only `train` runs as ranks (data parallel); N copies of another subcommand would each run it whole,
// so launch refuses them with N > 1.
TEST(CliLaunch, RefusesSubcommandsThatDoNotRunAsRanks) {
  const CliRun r = run_cli("launch -n 2 -- eval --help");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("`lazytrain eval` does not run as several ranks"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--program"), std::string::npos) << r.err;
}

// `plan --world-size N`: one rank's plan, with a line of its DRAM, the host total and the collectives.
TEST(CliPlan, WorldSizePrintsThePerRankAndHostLine) {
  const auto r = run_cli("plan --model qwen2.5-0.5b --profile " + quote(kSrc + "/configs/profiles/h200.json") +
                         " --host-mem 64GiB --planner dp --no-compare --world-size 2");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("data parallel: world 2, 2 ranks per host: DRAM 32.00 GiB per rank x 2 = 64.00 GiB per host"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("collectives per rank and step: H2D"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("GPU-GPU link"), std::string::npos) << r.out;
  // Two hosts of two: the same per-rank DRAM as one host of two.
  const auto four = run_cli("plan --model qwen2.5-0.5b --profile " + quote(kSrc + "/configs/profiles/h200.json") +
                            " --host-mem 64GiB --planner dp --no-compare --world-size 4 --ranks-per-host 2 --link-gbps 450");
  ASSERT_EQ(four.rc, 0) << four.err;
  EXPECT_NE(four.out.find("world 4, 2 ranks per host: DRAM 32.00 GiB per rank"), std::string::npos) << four.out;
  EXPECT_NE(four.out.find("at 450 GB/s"), std::string::npos) << four.out;
  // One process: no such line.
  const auto one = run_cli("plan --model qwen2.5-0.5b --profile " + quote(kSrc + "/configs/profiles/h200.json") +
                           " --host-mem 64GiB --planner dp --no-compare");
  ASSERT_EQ(one.rc, 0) << one.err;
  EXPECT_EQ(one.out.find("data parallel"), std::string::npos) << one.out;
}

// `plan --device-update-layers`: a forced count shows in the memory table; bad values and impossible placements are
// errors naming the option or the reason.
TEST(CliPlan, DeviceUpdateLayers) {
  const std::string base = "plan --model qwen2.5-0.5b --profile " + quote(kSrc + "/configs/profiles/h200.json") +
                           " --host-mem 64GiB --planner dp --no-compare ";
  const auto r = run_cli(base + "--device-update-layers 3");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("first 3 layers' update"), std::string::npos) << r.out;
  const auto none = run_cli(base + "--device-update-layers 0");
  ASSERT_EQ(none.rc, 0) << none.err;
  EXPECT_EQ(none.out.find("layers' update"), std::string::npos) << none.out;
  const auto bad = run_cli(base + "--device-update-layers three");
  EXPECT_NE(bad.rc, 0);
  EXPECT_NE(bad.err.find("--device-update-layers must be auto or a count"), std::string::npos) << bad.err;
  const auto dp = run_cli(base + "--device-update-layers 2 --world-size 2");
  EXPECT_NE(dp.rc, 0);
  EXPECT_NE(dp.err.find("world size 2"), std::string::npos) << dp.err;
}

// `plan --seq max`: the longest sequence at the batch, why one granule more does not fit, then its plan (with the
// attention-inclusive TFLOPS line); bad values are errors naming the option.
TEST(CliPlan, SeqMax) {
  const std::string base = "plan --model qwen2.5-0.5b --profile " + quote(kSrc + "/configs/profiles/h200.json") +
                           " --gpu-mem 6GiB --planner dp --no-compare ";
  const auto r = run_cli(base + "--seq max");
  ASSERT_EQ(r.rc, 0) << r.err;
  const size_t at = r.out.find("max feasible seq: ");
  ASSERT_NE(at, std::string::npos) << r.out;
  const int64_t s = std::stoll(r.out.substr(at + 18));
  EXPECT_EQ(s % 1024, 0);
  EXPECT_NE(r.out.find(fmt::format("max feasible seq: {} at batch 1 (dp, multiples of 1024 tokens)", s)),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(fmt::format("seq {} does not fit: gpu short by", s + 1024)), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(fmt::format("batch 1 x seq {} x 1 micro-batches", s)), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("with attention: "), std::string::npos) << r.out;
  for (const auto& [args, needle] :
       {std::pair<std::string, std::string>{"--seq max --batch max", "--batch max and --seq max together"},
        {"--seq 12x", "--seq must be a positive integer or 'max', got '12x'"},
        {"--seq 0", "--seq must be a positive integer or 'max', got '0'"},
        {"--batch two", "--batch must be a positive integer or 'max', got 'two'"}}) {
    const auto bad = run_cli(base + args);
    EXPECT_NE(bad.rc, 0) << args;
    EXPECT_NE(bad.err.find(needle), std::string::npos) << args << ":\n" << bad.err;
  }
}

// `plan --attention-fraction`: packed rows whose segments' causal squares are a small share of the row's plan a
// faster step (the attention core scaled), and the attention-inclusive figures count only those squares; outside
// (0, 1] it is an error naming the option.
TEST(CliPlan, AttentionFractionOfPackedRows) {
  const std::string base = "plan --model qwen2.5-0.5b --batch 1 --seq 16384 --profile " +
                           quote(kSrc + "/configs/profiles/h200.json") + " --planner dp --no-compare ";
  auto step_ms = [](const std::string& out) {
    const size_t at = out.find("predicted step ");
    return at == std::string::npos ? -1.0 : std::stod(out.substr(at + 15));
  };
  const auto whole = run_cli(base);
  const auto packed = run_cli(base + "--attention-fraction 0.05");
  ASSERT_EQ(whole.rc, 0) << whole.err;
  ASSERT_EQ(packed.rc, 0) << packed.err;
  EXPECT_GT(step_ms(packed.out), 0);
  EXPECT_LT(step_ms(packed.out), 0.9 * step_ms(whole.out)) << whole.out << packed.out;
  const auto bad = run_cli(base + "--attention-fraction 2");
  EXPECT_NE(bad.rc, 0);
  EXPECT_NE(bad.err.find("--attention-fraction"), std::string::npos) << bad.err;
}

TEST(CliPlan, BadWorldSizeArgumentsAreClearErrors) {
  struct Case {
    std::string args, needle;
  };
  for (const Case& c : {Case{"--world-size 0", "--world-size must be >= 1, got 0"},
                        Case{"--world-size 2 --ranks-per-host 4", "--ranks-per-host must be in [1, --world-size 2], got 4"},
                        Case{"--world-size 2 --ranks-per-host 0", "--ranks-per-host must be in [1, --world-size 2], got 0"},
                        Case{"--world-size 4 --ranks-per-host 3", "--ranks-per-host 3 must divide --world-size 4"},
                        Case{"--world-size 2 --link-gbps -1", "--link-gbps must be >= 0"},
                        Case{"--world-size 2 --gradients device", "gradients 'device' with world size 2"},
                        Case{"--world-size 2 --master-weights bf16-sr", "master_weights 'bf16-sr' with world size 2"}}) {
    const auto r = run_cli("plan --model tiny-qwen3 --planner dp --no-compare " + c.args);
    EXPECT_NE(r.rc, 0) << c.args;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.args << ":\n" << r.err << r.out;
  }
}
