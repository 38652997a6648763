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
    expect_error(j, "embeddings and norms keep fp32");
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
