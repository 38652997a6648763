// A Jinja chat template, parsed once and rendered with a context (messages, add_generation_prompt,
// special tokens, extra keyword arguments), as HF transformers' apply_chat_template renders it:
// trim_blocks, lstrip_blocks, loop controls, {% generation %} ranges, raise_exception,
// strftime_now, namespace, HF's tojson. Errors (parse errors, raise_exception, type errors, a Limits
// bound passed, memory exhausted) are lt::Error naming the template's origin.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/jinja/ast.h"
#include "data/jinja/value.h"

namespace lt::data::jinja {

struct RenderResult {
  std::string text;
  std::vector<std::pair<size_t, size_t>> generation;  // byte ranges of {% generation %} blocks
};

class Template {
 public:
  // origin: what errors name (the file the template came from).
  Template(const std::string& source, const std::string& origin, const Limits& limits = {});
  RenderResult render(const Value& context) const;  // context: an object
  const std::string& source() const { return source_; }
  bool has_generation_blocks() const { return source_.find("generation") != std::string::npos && has_gen_; }

 private:
  std::string source_, origin_;
  Limits limits_;
  std::shared_ptr<const Body> body_;
  bool has_gen_ = false;
};

}  // namespace lt::data::jinja
