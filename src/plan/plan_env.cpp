#include "plan/plan_env.h"

#include <cstdlib>

namespace lt {

namespace {
std::string env(const char* var) {
  const char* e = std::getenv(var);
  return e ? e : "";
}
}  // namespace

const PlanEnv& plan_env() {
  static const PlanEnv e{env("LT_PROFILE_DIR"), env("LT_MILP_MPS")};
  return e;
}

}  // namespace lt
