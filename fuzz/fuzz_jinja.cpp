// libFuzzer target: the Jinja chat-template parser and renderer (src/data/jinja). Any input must
// either render or throw lt::Error: no crash, no sanitizer report, no hang.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "data/jinja/template.h"

using namespace lt::data::jinja;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string src(reinterpret_cast<const char*>(data), size);
  try {
    Template t(src, "fuzz");
    Value ctx = Value::object();
    Value msgs = Value::array();
    for (const char* role : {"system", "user", "assistant"}) {
      Value m = Value::object();
      m.dict->set("role", Value(role));
      m.dict->set("content", Value(std::string("hi <think>x</think> 42")));
      msgs.list->push_back(m);
    }
    ctx.dict->set("messages", msgs);
    ctx.dict->set("add_generation_prompt", Value(true));
    ctx.dict->set("bos_token", Value("<s>"));
    (void)t.render(ctx);
  } catch (const lt::Error&) {
  }
  return 0;
}
