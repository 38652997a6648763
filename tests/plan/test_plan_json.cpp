#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "plan/plan.h"
#include "plan/simulator.h"
#include "plan_test_util.h"

namespace lt {
namespace {

using nlohmann::json;

Plan sample_plan() {
  std::mt19937 rng(3);
  Instance in = test::random_instance(rng, 6, false);
  std::vector<Tier> t = {Tier::Gpu, Tier::Cpu, Tier::None, Tier::Nvme, Tier::None, Tier::Gpu, Tier::Gpu};
  Plan p = test::plan_for(in, t);
  p.optimizer_8bit = {"model.layers.0.mlp.up_proj.weight"};
  p.predicted = simulate(in, p).pred;
  return p;
}

void expect_error(const json& j, const std::string& needle) {
  try {
    plan_from_json(j, "p.json");
    ADD_FAILURE() << "accepted a plan that should fail with '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(PlanJson, RoundTrip) {
  Plan p = sample_plan();
  json j = plan_to_json(p);
  Plan q = plan_from_json(j);
  EXPECT_EQ(plan_to_json(q).dump(), j.dump());
  EXPECT_EQ(q.tier, p.tier);
  EXPECT_EQ(q.traffic.size(), 2u);
  EXPECT_EQ(q.traffic[1].nvme_read.size(), 1u);
  EXPECT_EQ(plan_windows(q).size(), 13u + 2u);  // 2L+1 + recompute windows R_1 and R_3
}

// The held gradients' staging ring depth: written only when not the default, read back, 0 refused.
TEST(PlanJson, GradientRingDepth) {
  Plan p = sample_plan();
  EXPECT_FALSE(plan_to_json(p).contains("gradient_ring_depth"));
  p.placement.grad_ring_depth = 3;
  json j = plan_to_json(p);
  EXPECT_EQ(j.at("gradient_ring_depth"), 3);
  EXPECT_EQ(plan_from_json(j).placement.grad_ring_depth, 3);
  j["gradient_ring_depth"] = 0;
  expect_error(j, "'gradient_ring_depth' must be >= 1, got 0");
}

TEST(PlanJson, RejectsMalformed) {
  json good = plan_to_json(sample_plan());
  {
    json j = good;
    j["version"] = 9;
    expect_error(j, "version 9");
  }
  {
    json j = good;
    j["bogus"] = 1;
    expect_error(j, "unknown field 'bogus'");
  }
  {
    json j = good;
    j.erase("ring");
    expect_error(j, "missing field 'ring'");
  }
  {
    json j = good;
    j["tier"][0] = "cpu";
    expect_error(j, "tier[0] must be gpu");
  }
  {
    json j = good;
    j["tier"][2] = "disk";
    expect_error(j, "tier[2]");
  }
  {
    json j = good;
    j["blocks"][0] = json::array({0, 2});
    expect_error(j, "blocks[0]");
  }
  {
    json j = good;
    j["traffic"][0]["d2h"] = json::array({json::array({0, 1.0})});
    expect_error(j, "d2h window 0 out of range");
  }
  {
    json j = good;
    j["traffic"][0]["h2d"][0][1] = 0.5;
    expect_error(j, "fractions sum to 0.5");
  }
  {
    json j = good;
    j["traffic"].erase(1);
    expect_error(j, "boundary 3 has tier nvme but no traffic entry");
  }
  {
    json j = good;
    j["ring"] = 1;
    expect_error(j, "ring must be >= 2");
  }
  {
    json j = good;
    j["optimizer_8bit"] = json::array({"model.embed_tokens.weight"});
    expect_error(j, "but embedding_8bit is not set");
    j["embedding_8bit"] = true;
    EXPECT_NO_THROW(plan_from_json(j));
    j["optimizer_8bit"] = json::array({"model.norm.weight"});
    expect_error(j, "norms keep fp32");
  }
  {
    json j = good;
    j["layers"] = "six";
    expect_error(j, "'layers' must be an integer");
  }
  {
    // nvme read issued before the write completed
    json j = good;
    auto w = j["traffic"][1]["nvme_write"][0][0].get<int>();
    j["traffic"][1]["nvme_read"] = json::array({json::array({w, 1.0})});
    expect_error(j, "nvme_read");
  }
}

// Random mutations of a valid plan either load (and then simulate) or throw lt::Error; never crash.
TEST(PlanJson, MutationsNeverCrash) {
  std::mt19937 rng(5);
  Instance in = [] {
    std::mt19937 r(3);
    return test::random_instance(r, 6, false);
  }();
  const json good = plan_to_json(sample_plan());
  std::vector<std::string> keys;
  for (auto& [k, v] : good.items()) keys.push_back(k);
  int loaded = 0, rejected = 0;
  for (int rep = 0; rep < 2000; ++rep) {
    json j = good;
    const int muts = 1 + int(rng() % 3);
    for (int m = 0; m < muts; ++m) {
      const std::string& k = keys[rng() % keys.size()];
      switch (rng() % 6) {
        case 0: j[k] = int(rng() % 40) - 5; break;
        case 1: j[k] = "x"; break;
        case 2: j.erase(k); break;
        case 3:
          if (j.contains("traffic") && j["traffic"].is_array() && !j["traffic"].empty()) {
            auto& t = j["traffic"][rng() % j["traffic"].size()];
            const char* f[] = {"d2h", "h2d", "nvme_read", "nvme_write", "boundary"};
            const char* name = f[rng() % 5];
            if (std::string(name) == "boundary") t[name] = int(rng() % 10) - 2;
            else t[name] = json::array({json::array({int(rng() % 20) - 2, double(rng() % 3) / 2})});
          }
          break;
        case 4:
          if (j.contains("tier") && j["tier"].is_array() && !j["tier"].empty())
            j["tier"][rng() % j["tier"].size()] = std::vector<std::string>{"none", "gpu", "cpu", "nvme"}[rng() % 4];
          break;
        case 5:
          if (j.contains("blocks") && j["blocks"].is_array()) j["blocks"].push_back(json::array({1, 2}));
          break;
      }
    }
    try {
      Plan p = plan_from_json(j, "m.json");
      ++loaded;
      if (p.layers == in.L) simulate(in, p);
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 1000);
  EXPECT_GT(loaded, 10);
}

TEST(PlanJson, ShapeMismatch) {
  Plan p = sample_plan();
  EXPECT_NO_THROW(check_plan_matches(p, 6, 8, 16, 1, 4));
  EXPECT_THROW(check_plan_matches(p, 7, 8, 16, 1, 4), Error);
  try {
    check_plan_matches(p, 6, 8, 16, 2, 4);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("batch 1, the run uses 2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lt
