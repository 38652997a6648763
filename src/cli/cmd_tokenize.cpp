// `lazytrain tokenize --tokenizer PATH [--chat]`: JSON lines on stdin, one {"ids": [...]} line out
// per input line. {"text": ...} is encoded as HF encode(text, add_special_tokens=False) (special
// tokens written in the text are recognised); with --chat, {"messages": [...],
// "add_generation_prompt": bool, ...} is rendered by the model's chat template (other keys are
// template variables, e.g. enable_thinking) and encoded the same way.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "data/chat_template.h"

namespace lt::cli {

void add_tokenize(CLI::App& app) {
  auto* sub = app.add_subcommand("tokenize", "Encode JSON lines from stdin with a tokenizer (and its chat template)");
  struct Opts {
    std::string tokenizer, template_name = "auto";
    bool chat = false;
  };
  auto o = std::make_shared<Opts>();
  sub->add_option("--tokenizer", o->tokenizer, "tokenizer.json or a directory holding one")->required();
  sub->add_flag("--chat", o->chat, "input lines are {\"messages\": [...], \"add_generation_prompt\": bool}");
  sub->add_option("--template", o->template_name, "chat template for --chat: auto (the model's own) | chatml | llama3 | none");
  sub->callback([o] {
    const data::LoadedTokenizer lt = data::load_tokenizer(o->tokenizer);
    std::optional<data::ChatTemplate> tmpl;
    if (o->chat) tmpl.emplace(data::ChatTemplate::resolve(o->template_name, lt.tokenizer, lt.config));
    std::ios::sync_with_stdio(false);
    std::string line;
    std::string out;
    for (int64_t n = 1; std::getline(std::cin, line); ++n) {
      if (line.empty()) continue;
      nlohmann::ordered_json j;  // message keys keep their order (what tojson/items() show the template)
      try {
        j = nlohmann::ordered_json::parse(line);
      } catch (const nlohmann::json::parse_error& e) {
        fail("stdin:{}: invalid JSON: {}", n, e.what());
      }
      std::vector<int32_t> ids;
      if (!o->chat) {
        LT_CHECK(j.is_object() && j.contains("text") && j["text"].is_string(), "stdin:{}: expected {{\"text\": \"...\"}}", n);
        ids = lt.tokenizer.encode(j["text"].get<std::string>());
      } else {
        LT_CHECK(j.is_object() && j.contains("messages") && j["messages"].is_array(),
                 "stdin:{}: expected {{\"messages\": [...], \"add_generation_prompt\": bool}}", n);
        const bool gen = j.value("add_generation_prompt", false);
        if (tmpl->kind() == data::TemplateKind::Jinja) {
          nlohmann::ordered_json extra = j;
          extra.erase("messages");
          extra.erase("add_generation_prompt");
          ids = tmpl->encode_rendered(j["messages"], gen, extra);
        } else {
          std::vector<data::Message> msgs;
          for (const auto& m : j["messages"]) msgs.push_back({m.value("role", ""), m.value("content", "")});
          ids = gen ? tmpl->encode_prompt(msgs) : tmpl->encode(msgs).ids;
        }
      }
      out = "{\"ids\":[";
      for (size_t i = 0; i < ids.size(); ++i) {
        if (i) out += ',';
        out += std::to_string(ids[i]);
      }
      out += "]}\n";
      std::fwrite(out.data(), 1, out.size(), stdout);
    }
    std::fflush(stdout);
  });
}

}  // namespace lt::cli
