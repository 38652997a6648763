// Backend interface: see backend.h (owned by the executor module).
