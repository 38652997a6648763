// The planner's settings from the environment, read once at the first call (the one reader of getenv in src/plan):
//   LT_PROFILE_DIR  a directory searched first for resource profiles (profile.h, resolve_profile)
//   LT_MILP_MPS     a file the MILP planner writes its model to (MPS format) before solving; a debugging aid
// An empty value counts as unset.
#pragma once
#include <string>

namespace lt {

struct PlanEnv {
  std::string profile_dir;  // LT_PROFILE_DIR; empty: unset
  std::string milp_mps;     // LT_MILP_MPS; empty: unset
};

const PlanEnv& plan_env();

}  // namespace lt
