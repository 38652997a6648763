// The syntax tree of a Jinja template (the subset real chat templates use) and the parser that
// builds it: HF's settings (trim_blocks, lstrip_blocks, loop controls, {% generation %}).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/jinja/value.h"

namespace lt::data::jinja {

struct Expr;
using ExprP = std::unique_ptr<Expr>;
struct Expr {
  enum Kind { Literal, Name, ListLit, DictLit, TupleLit, Attr, Item, Slice, Call, Filter, Test, Unary, Binary, Cond };
  Kind kind;
  Value lit;                    // Literal
  std::string name;             // Name, Attr, Filter, Test; Unary/Binary operator
  std::vector<ExprP> items;     // List/Tuple items; Dict keys and values interleaved; Call/Filter/Test positional args
  std::vector<std::pair<std::string, ExprP>> kwargs;
  ExprP a, b, c;                // operands / object / slice start, stop, step
  bool negate = false;          // Test: "is not"
  bool has_slice[3] = {false, false, false};
  int line = 0;
  int depth = 1;                // levels of this expression's tree (bounded by Limits::max_nesting)
};

struct Node;
using NodeP = std::unique_ptr<Node>;
using Body = std::vector<NodeP>;
struct Node {
  enum Kind { Text, Output, If, For, Set, SetBlock, Macro, Break, Continue, Generation, CallBlock };
  Kind kind;
  std::string text;                                 // Text
  ExprP expr;                                       // Output, Set value, For iterable, CallBlock call
  std::vector<std::pair<ExprP, Body>> branches;     // If: (cond | null for else, body)
  std::vector<std::string> targets;                 // For loop variables; Set names; Macro name + params
  ExprP set_obj;                                    // Set ns.attr: the object (name in attr)
  std::string attr;
  ExprP filter;                                     // For ... if cond
  Body body, else_body;
  std::vector<ExprP> defaults;                      // Macro parameter defaults (null if none)
  int line = 0;
};

// Bounds on what a template may do (a template is user input): passing one is an lt::Error naming the
// template's origin and the limit, never a crash, a hang or unbounded memory (docs/data.md).
struct Limits {
  int64_t max_nesting = 200;               // parse: blocks inside blocks; levels of one expression; render:
                                           // lists/dicts/namespaces nested in a value set with `ns.attr =`
  int64_t max_call_depth = 100;            // render: macro calls inside macro calls (a macro calling itself)
  int64_t max_render_depth = 1000;         // render: macro calls, blocks and expressions nested, together
  int64_t max_loop_iterations = 1000000;   // render: for-loop iterations of one render, all loops together
  int64_t max_range = 100000;              // render: elements of one range() (the limit of Jinja's sandbox)
  int64_t max_list_items = 1000000;        // render: elements of a list made by `+`
  int64_t max_string_bytes = int64_t(64) << 20;  // render: the output, and any string a template builds
};

// Parses template source; errors are lt::Error naming `origin` and the line.
Body parse_template(const std::string& src, const std::string& origin, const Limits& limits = {});

}  // namespace lt::data::jinja
