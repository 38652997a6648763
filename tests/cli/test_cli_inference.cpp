// `lazytrain generate` / `eval` / `tokenize --chat` on a checkpoint trained by `lazytrain train` from a
// model directory that keeps its chat template only in chat_template.jinja (as current transformers
// saves one): the template travels into the checkpoint, a bad --max-new-tokens is a clear error (it
// corrupted the heap), and eval writes its results into the current directory, not the checkpoint.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "../common/repo_path.h"
#include "io/model_io.h"
#include "model/init.h"

namespace fs = std::filesystem;

namespace {

const char* kTemplate =
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
const char* kChatLine = R"({"messages": [{"role": "user", "content": "What is 1 + 2?"}], "add_generation_prompt": true})";

std::string lazytrain() {
  const char* env = std::getenv("LT_BIN");
  return env && *env ? env : LT_LAZYTRAIN;
}

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct CliRun {
  int rc;  // exit status; 128 + N when the process died of signal N
  std::string out, err;
};

// Runs `lazytrain ARGS < stdin_text` with `cwd` as the working directory.
CliRun run_in(const fs::path& cwd, const std::string& args, const std::string& stdin_text = "") {
  const fs::path io = cwd / ".cli_io";
  fs::create_directories(io);
  std::ofstream(io / "in", std::ios::binary) << stdin_text;
  const std::string cmd = "cd " + quote(cwd.string()) + " && " + quote(lazytrain()) + " " + args + " < " +
                          quote((io / "in").string()) + " > " + quote((io / "out").string()) + " 2> " +
                          quote((io / "err").string());
  const int status = std::system(cmd.c_str());
  CliRun r{WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), slurp(io / "out"), slurp(io / "err")};
  fs::remove_all(io);
  return r;
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Names of the entries under dir (recursively), with their sizes: what a command must leave unchanged.
std::set<std::string> listing(const fs::path& dir) {
  std::set<std::string> s;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    s.insert(fs::relative(e.path(), dir).string() + (e.is_regular_file() ? ":" + std::to_string(e.file_size()) : ""));
  return s;
}

// A model directory (tiny Qwen2 weights, the demo tokenizer, the chat template only in
// chat_template.jinja) and a checkpoint trained from it for one step by `lazytrain train`.
class CliCheckpoint : public ::testing::Test {
 protected:
  static fs::path root, model, ckpt;

  static void SetUpTestSuite() {
    root = fs::temp_directory_path() / ("lt_cli_inference_" + std::to_string(::getpid()));
    model = root / "model";
    fs::remove_all(root);
    fs::create_directories(model);
    lt::ModelConfig c = lt::preset_config("tiny-qwen2");
    c.vocab = 306;
    lt::save_model(model, lt::random_model(c, 11));
    fs::copy_file(lt::testing::repo_root() / "configs/demo/tokenizer.json", model / "tokenizer.json");
    std::ofstream(model / "tokenizer_config.json") << R"({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})";
    std::ofstream(model / "chat_template.jinja", std::ios::binary) << kTemplate;
    std::ofstream(root / "run.yaml") << "model_name_or_path: " << model.string()
                                     << "\ndataset: builtin:math\nmax_samples: 16\ncutoff_len: 96\n"
                                        "per_device_train_batch_size: 2\nmax_steps: 1\nprogress_bar: false\n"
                                        "threads: 1\noutput_dir: "
                                     << (root / "out").string() << "\n";
    const CliRun r = run_in(root, "train run.yaml");
    ASSERT_EQ(r.rc, 0) << r.err;
    ckpt = root / "out" / "checkpoint-1";
  }
  static void TearDownTestSuite() { fs::remove_all(root); }

  // Options of generate/eval for the tests of other things than the checkpoint's tokenizer files: the
  // model directory's tokenizer, CPU decoding on one thread.
  static std::string tokenizer_and_cpu() { return " --tokenizer " + quote(model.string()) + " --device cpu --threads 1"; }

  // A fresh empty working directory for one command.
  fs::path work_dir() const {
    const fs::path d = root / ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(d);
    fs::create_directories(d);
    return d;
  }
};
fs::path CliCheckpoint::root, CliCheckpoint::model, CliCheckpoint::ckpt;

}  // namespace

// The checkpoint has the model's chat_template.jinja: `tokenize --chat` gives the model directory's ids,
// and `generate` (template auto) loads the template.
TEST_F(CliCheckpoint, ChatTemplateJinjaTravelsSoTokenizeChatAndGenerateWork) {
  ASSERT_TRUE(fs::exists(ckpt / "chat_template.jinja"));
  EXPECT_EQ(slurp(ckpt / "chat_template.jinja"), kTemplate);
  const fs::path cwd = work_dir();
  const CliRun from_model = run_in(cwd, "tokenize --chat --tokenizer " + quote(model.string()), std::string(kChatLine) + "\n");
  const CliRun from_ckpt = run_in(cwd, "tokenize --chat --tokenizer " + quote(ckpt.string()), std::string(kChatLine) + "\n");
  ASSERT_EQ(from_model.rc, 0) << from_model.err;
  ASSERT_EQ(from_ckpt.rc, 0) << from_ckpt.err;
  EXPECT_EQ(from_ckpt.out, from_model.out);
  const CliRun gen = run_in(cwd, "generate --model " + quote(ckpt.string()) +
                                     " --device cpu --threads 1 --max-new-tokens 2 -p 'What is 1 + 2?'");
  EXPECT_EQ(gen.rc, 0) << gen.err;
  EXPECT_EQ(gen.out.rfind("### prompt 0: What is 1 + 2?\n", 0), 0u) << gen.out;
}

// --max-new-tokens -1 corrupted the heap (malloc(): corrupted top size, SIGABRT) and -100 was an internal
// error: both are errors naming the flag and what it takes, in generate and eval, before any decoding.
TEST_F(CliCheckpoint, MaxNewTokensNonPositiveIsAClearError) {
  const fs::path cwd = work_dir();
  const auto before = listing(ckpt);
  for (const char* n : {"-1", "-100", "0"}) {
    for (const std::string cmd : {"generate --model " + quote(ckpt.string()) + " -p 'What is 1 + 2?'",
                                  "eval --model " + quote(ckpt.string()) + " --dataset builtin:math-test --max-samples 2"}) {
      const CliRun r = run_in(cwd, cmd + tokenizer_and_cpu() + " --max-new-tokens " + n);
      EXPECT_EQ(r.rc, 1) << cmd << " " << n << ": " << r.err;
      EXPECT_TRUE(has(r.err, std::string("lazytrain: error: --max-new-tokens ") + n +
                                 ": expected the number of new tokens to generate per sequence, >= 1"))
          << r.err;
      EXPECT_FALSE(has(r.err, "internal error")) << r.err;
    }
  }
  // Past the model's positions (and past int64 when added to the prompt): an error naming the limit.
  for (const char* n : {"100000", "9223372036854775807"}) {
    const CliRun r = run_in(cwd, "generate --model " + quote(ckpt.string()) + tokenizer_and_cpu() +
                                     " -p 'What is 1 + 2?' --max-new-tokens " + n);
    EXPECT_EQ(r.rc, 1) << n << ": " << r.err;
    EXPECT_TRUE(has(r.err, "exceeds the model's max_position_embeddings")) << r.err;
  }
  EXPECT_TRUE(fs::is_empty(cwd));  // nothing written
  EXPECT_EQ(listing(ckpt), before);
}

// max_new_tokens: -1 in a train config failed only at the final evaluation, after the whole run, with
// the same heap corruption: the config is refused before training starts.
TEST_F(CliCheckpoint, MaxNewTokensTrainConfigKeyIsRefusedBeforeTraining) {
  const fs::path cwd = work_dir();
  const CliRun r = run_in(cwd, "train " + quote((root / "run.yaml").string()) + " max_new_tokens=-1 do_eval_dataset=builtin:math-test output_dir=" +
                                   quote((cwd / "out").string()));
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_TRUE(has(r.err, "lazytrain: error: config: max_new_tokens must be > 0, got -1")) << r.err;
  EXPECT_FALSE(fs::exists(cwd / "out"));
}

// eval wrote eval_results.jsonl into the model (checkpoint) directory: by default it goes to the
// current directory, --output elsewhere, and the checkpoint is left as the trainer wrote it.
TEST_F(CliCheckpoint, EvalOutputDefaultsToTheCurrentDirectoryNotTheModel) {
  const fs::path cwd = work_dir();
  const auto before = listing(ckpt);
  const std::string eval = "eval --model " + quote(ckpt.string()) + tokenizer_and_cpu() +
                           " --dataset builtin:math-test --max-samples 3 --max-new-tokens 4";
  const CliRun r = run_in(cwd, eval);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(has(r.out, "per-sample results: eval_results.jsonl")) << r.out;
  std::ifstream res(cwd / "eval_results.jsonl");
  int lines = 0;
  for (std::string line; std::getline(res, line);) ++lines;
  EXPECT_EQ(lines, 3);
  EXPECT_FALSE(fs::exists(ckpt / "eval_results.jsonl"));
  EXPECT_EQ(listing(ckpt), before);
  const CliRun named = run_in(cwd, eval + " --output " + quote((cwd / "sub.jsonl").string()));
  ASSERT_EQ(named.rc, 0) << named.err;
  EXPECT_TRUE(fs::exists(cwd / "sub.jsonl"));
  EXPECT_EQ(listing(ckpt), before);
}
