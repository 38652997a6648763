// SIGINT/SIGTERM handling for training: the first signal sets a flag that the loop checks after each
// optimizer step (finish the step, save, exit with a message saying how to resume) and the setup checks
// while it reads and tokenises the data and initialises the weights (stop there: nothing trained); a
// second signal restores the default action so that a user can still force-quit.
#pragma once

namespace lt::train {

class StopSignals {
 public:
  StopSignals();   // installs the handlers
  ~StopSignals();  // restores the previous handlers
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  static bool requested();
  static int signal_number();  // the signal received, 0 if none
  static void reset();         // tests
};

}  // namespace lt::train
