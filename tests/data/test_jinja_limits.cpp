// Chat templates are user input: the interpreter's limits (jinja::Limits) turn templates that recurse,
// loop or grow without end into lt::Error naming the template's file and the limit, and the errors of a
// template name the file it came from (chat_template.jinja or tokenizer_config.json) and, for a block
// left open, the tag and the line it opened at.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "../common/repo_path.h"
#include "core/error.h"
#include "data/chat_template.h"
#include "data/jinja/template.h"

using namespace lt::data;
namespace fs = std::filesystem;

namespace {

const std::string kDemoTokenizer = lt::testing::repo_root().string() + "/configs/demo/tokenizer.json";

// A tokenizer directory (the demo tokenizer) whose chat template is `jinja`, kept in chat_template.jinja
// (and, when config_template is set, a different template in tokenizer_config.json, which the file overrides).
struct TemplateDir {
  fs::path dir;
  explicit TemplateDir(const std::string& jinja, const std::string& config_template = "") {
    static int made = 0;
    dir = fs::temp_directory_path() / ("lt_jinja_" + std::to_string(::getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name() + "_" +
                                       std::to_string(made++));
    fs::remove_all(dir);
    fs::create_directories(dir);
    fs::copy_file(kDemoTokenizer, dir / "tokenizer.json");
    nlohmann::json cfg = {{"eos_token", "<|im_end|>"}, {"pad_token", "<|endoftext|>"}};
    if (!config_template.empty()) cfg["chat_template"] = config_template;
    std::ofstream(dir / "tokenizer_config.json") << cfg.dump();
    if (!jinja.empty()) std::ofstream(dir / "chat_template.jinja", std::ios::binary) << jinja;
  }
  ~TemplateDir() { fs::remove_all(dir); }
  std::string jinja_file() const { return (dir / "chat_template.jinja").string(); }
};

// The lt::Error message of f ("" when it does not throw one).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const lt::Error& e) {
    return e.what();
  }
  return "";
}

// Loads the directory's tokenizer and template and renders a one-turn prompt: the error, or "".
std::string render_error(const TemplateDir& d) {
  return error_of([&] {
    const LoadedTokenizer lt = load_tokenizer(d.dir.string());
    const ChatTemplate t = ChatTemplate::resolve("auto", lt.tokenizer, lt.config);
    (void)t.encode_prompt({{"user", "What is 1 + 2?"}});
  });
}

// The error of rendering `src` directly with the given limits.
std::string jinja_error(const std::string& src, const jinja::Limits& limits = {}) {
  return error_of([&] {
    const jinja::Template t(src, "t.jinja", limits);
    (void)t.render(jinja::Value::object());
  });
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

// A macro that calls itself: max_call_depth, not a stack overflow.
TEST(JinjaLimits, RecursiveMacroIsAnErrorNamingTheTemplateFile) {
  const TemplateDir d("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}");
  const std::string e = render_error(d);
  EXPECT_EQ(e.rfind(d.jinja_file() + ":1:", 0), 0u) << e;
  EXPECT_TRUE(has(e, "macro 'f'")) << e;
  EXPECT_TRUE(has(e, "max_call_depth 100")) << e;
  // Bounded recursion within the limit renders.
  EXPECT_EQ(jinja_error("{% macro f(n) %}{{ f(n - 1) if n > 0 else 'x' }}{% endmacro %}{{ f(90) }}"), "");
  // Deep blocks inside each call reach max_render_depth before max_call_depth.
  std::string src = "{% macro f(n) %}";
  for (int k = 0; k < 30; ++k) src += "{% if true %}";
  src += "{{ f(n - 1) if n > 0 else '' }}";
  for (int k = 0; k < 30; ++k) src += "{% endif %}";
  src += "{% endmacro %}{{ f(99) }}";
  EXPECT_TRUE(has(jinja_error(src), "max_render_depth")) << jinja_error(src);
}

// range(10**12) grew a list without bound; range() holds at most max_range (100000) elements, as in
// the Jinja sandbox HF renders with.
TEST(JinjaLimits, HugeRangeIsAnError) {
  const TemplateDir d("{% for i in range(10**12) %}{{ i }}{% endfor %}");
  const std::string e = render_error(d);
  EXPECT_EQ(e.rfind(d.jinja_file() + ":", 0), 0u) << e;
  EXPECT_TRUE(has(e, "range(0, 1000000000000, 1) has 1000000000000 elements")) << e;
  EXPECT_TRUE(has(e, "max_range")) << e;
  EXPECT_EQ(jinja_error("{{ range(100000)|length }}"), "");
  EXPECT_TRUE(has(jinja_error("{{ range(-9223372036854775807, 9223372036854775807, 1)|length }}"), "max_range"));
}

// Loops within max_range each, but nested: max_loop_iterations for the whole render.
TEST(JinjaLimits, LoopIterationsAreBoundedPerRender) {
  const std::string e = jinja_error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}");
  EXPECT_TRUE(has(e, "t.jinja:1: more than 1000000 for-loop iterations in one render (max_loop_iterations)")) << e;
  jinja::Limits small;
  small.max_loop_iterations = 10;
  EXPECT_EQ(jinja_error("{% for i in range(10) %}{% endfor %}", small), "");
  EXPECT_TRUE(has(jinja_error("{% for i in range(11) %}{% endfor %}", small), "max_loop_iterations"));
  EXPECT_TRUE(has(jinja_error("{% for i in range(6) if i > 100 %}{% endfor %}{% for i in range(5) %}{% endfor %}", small),
                  "max_loop_iterations"));  // the `if` filter's iterations count too
}

// Doubling a string 40 times asked for 2^40 bytes (std::bad_alloc, reported as an internal error):
// every string a template builds and its output stay within max_string_bytes (64 MiB).
TEST(JinjaLimits, StringDoublingStopsAtMaxStringBytes) {
  const TemplateDir d(
      "{% set ns = namespace(s='a') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}");
  const std::string e = render_error(d);
  EXPECT_EQ(e.rfind(d.jinja_file() + ":1:", 0), 0u) << e;
  EXPECT_TRUE(has(e, "exceeds the limit of 67108864 bytes (max_string_bytes)")) << e;
  EXPECT_TRUE(has(jinja_error("{{ 'a' * 2**40 }}"), "max_string_bytes"));
  EXPECT_TRUE(has(jinja_error("{{ 'ab'|indent(10**12) }}"), "max_string_bytes"));
  EXPECT_TRUE(has(jinja_error("{{ [1]|tojson(indent=10**12) }}"), "max_string_bytes"));
  jinja::Limits small;
  small.max_string_bytes = 16;
  EXPECT_EQ(jinja_error("{{ 'abcdefgh' ~ 'abcdefgh' }}", small), "");
  for (const char* src : {"{{ 'abcdefgh' ~ 'abcdefghi' }}", "{{ 'abcdefgh' + 'abcdefghi' }}", "{{ 'abc' * 6 }}",
                          "{{ 'aaaa'|replace('a', 'bbbbb') }}", "{{ range(20)|join('') }}",
                          "{{ 'x'.join(['abcdefgh', 'abcdefgh']) }}", "{{ [[1, 2, 3]]|tojson(indent=8) }}",
                          "0123456789{{ '0123456789' }}"})
    EXPECT_TRUE(has(jinja_error(src, small), "max_string_bytes")) << src;
  jinja::Limits few;
  few.max_list_items = 8;
  EXPECT_TRUE(has(jinja_error("{{ ([1, 2, 3, 4, 5] + [6, 7, 8, 9])|length }}", few), "max_list_items"));
}

// Deep nesting in the source (the parser and the evaluation recurse once per level) and in values
// kept in a namespace (printing them recurses) is bounded by max_nesting; a namespace holding itself
// was an endless recursion.
TEST(JinjaLimits, DeepNestingInSourceAndValuesIsAnError) {
  auto repeat = [](const std::string& s, int n) {
    std::string r;
    for (int k = 0; k < n; ++k) r += s;
    return r;
  };
  std::string sum = "{{ 1";
  for (int k = 0; k < 100000; ++k) sum += "+1";
  EXPECT_TRUE(has(jinja_error(sum + " }}"), "t.jinja:1: expression nested deeper than 200 levels (max_nesting)"));
  EXPECT_TRUE(has(jinja_error("{{ " + repeat("(", 100000) + "1" + repeat(")", 100000) + " }}"), "max_nesting"));
  EXPECT_TRUE(has(jinja_error("{{ " + repeat("not ", 100000) + "1 }}"), "max_nesting"));
  EXPECT_TRUE(has(jinja_error("{{ " + repeat("[", 100000) + repeat("]", 100000) + " }}"), "max_nesting"));
  EXPECT_TRUE(has(jinja_error(repeat("{% if true %}", 5000) + "x" + repeat("{% endif %}", 5000)),
                  "blocks nested deeper than 200 levels (max_nesting)"));
  EXPECT_EQ(jinja_error(repeat("{% if true %}", 150) + "x" + repeat("{% endif %}", 150)), "");
  EXPECT_TRUE(has(jinja_error("{% set ns = namespace(a=1) %}{% set ns.a = ns %}{{ ns }}"), "holds the namespace itself"));
  EXPECT_TRUE(has(jinja_error("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = [ns.l] %}"
                              "{% endfor %}{{ ns.l }}"),
                  "max_nesting"));
}

// Other inputs that ended the process with a signal are errors naming the template.
TEST(JinjaLimits, ArithmeticAndFilterMisuseAreErrorsNotSignals) {
  EXPECT_TRUE(has(jinja_error("{{ (-9223372036854775807 - 1) // -1 }}"), "t.jinja:1: integer overflow"));  // SIGFPE
  EXPECT_TRUE(has(jinja_error("{{ (-9223372036854775807 - 1) % -1 }}"), "integer overflow"));
  EXPECT_TRUE(has(jinja_error("{{ 2 ** (10**18) }}"), "integer overflow"));  // took 10^18 multiplications
  EXPECT_EQ(jinja_error("{{ 3 ** 39 }}"), "");
  EXPECT_TRUE(has(jinja_error("{{ 1|dictsort }}"), "dictsort needs a dict"));  // called a null function
  // Errors of the value helpers name the template too.
  EXPECT_EQ(jinja_error("{{ 1 < 'a' }}").rfind("t.jinja: cannot compare", 0), 0u) << jinja_error("{{ 1 < 'a' }}");
}

// Every limit is an lt::Error through `tokenize --chat`'s path too: a ChatTemplate of a real directory
// renders real conversations far inside them (the families' templates: Real/Family.*).
TEST(JinjaLimits, ChatTemplateWithinLimitsRenders) {
  const TemplateDir d(
      "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
      "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}");
  EXPECT_EQ(render_error(d), "");
}

// An unclosed {% for %} was reported as "missing {% else %}" (the first tag that could follow it).
TEST(JinjaBlockErrors, UnclosedBlockNamesItsTagAndLine) {
  struct Case {
    const char* src;
    const char* want;
  };
  for (const Case& c : {
           Case{"a\n{% for m in messages %}\n{{ m }}\n", "t.jinja:2: unclosed {% for %} opened at line 2: no {% endfor %}"},
           Case{"{% for m in messages %}{% else %}x", "unclosed {% for %} opened at line 1: no {% endfor %}"},
           Case{"\n\n{% if true %}x{% elif false %}y", "t.jinja:3: unclosed {% if %} opened at line 3: no {% endif %}"},
           Case{"{% if true %}x{% else %}y", "unclosed {% if %} opened at line 1: no {% endif %}"},
           Case{"{% macro f() %}x", "unclosed {% macro %} opened at line 1: no {% endmacro %}"},
           Case{"{% set x %}x", "unclosed {% set %} opened at line 1: no {% endset %}"},
           Case{"{% generation %}x", "unclosed {% generation %} opened at line 1: no {% endgeneration %}"},
           Case{"{% filter upper %}x", "unclosed {% filter %} opened at line 1: no {% endfilter %}"},
           Case{"{% for a in b %}\n{% if c %}\n{% endfor %}",
                "t.jinja:3: unexpected {% endfor %}: the innermost open block is {% if %} opened at line 2 (closed by "
                "{% endif %})"},
           Case{"x\n{% endif %}", "t.jinja:2: {% endif %} without a matching opening tag"},
           Case{"{% macro f() %}{% else %}{% endmacro %}", "unexpected {% else %}: the innermost open block is {% macro %}"},
       }) {
    const std::string e = jinja_error(c.src);
    EXPECT_TRUE(has(e, c.want)) << c.src << "\n  got: " << e;
    EXPECT_FALSE(has(e, "missing")) << e;
  }
}

// A template kept in chat_template.jinja was reported as tokenizer_config.json's: errors name the file
// the template came from, with the line.
TEST(JinjaBlockErrors, ErrorsNameTheFileTheTemplateCameFrom) {
  const TemplateDir jinja_only("{% for m in messages %}\n{{ m.content }}\n");
  std::string e = render_error(jinja_only);
  EXPECT_EQ(e, jinja_only.jinja_file() + ":1: unclosed {% for %} opened at line 1: no {% endfor %} before the end of "
                                         "the template");
  EXPECT_FALSE(has(e, "tokenizer_config.json")) << e;
  // chat_template.jinja overrides tokenizer_config.json's template: its errors are the file's.
  const TemplateDir both("{{ raise_exception('no system role') }}", "{{ 'fine' }}");
  e = render_error(both);
  EXPECT_EQ(e.rfind(both.jinja_file() + ": the chat template refused the conversation: no system role", 0), 0u) << e;
  // A template in tokenizer_config.json alone is named as that file's chat_template key.
  const TemplateDir config_only("", "{% if true %}x");
  e = render_error(config_only);
  EXPECT_EQ(e.rfind((config_only.dir / "tokenizer_config.json").string() + ": chat_template:1: unclosed {% if %}", 0), 0u)
      << e;
  const TokenizerConfig c = load_tokenizer_config((jinja_only.dir / "tokenizer_config.json").string());
  EXPECT_EQ(c.chat_template_origin, jinja_only.jinja_file());
}
