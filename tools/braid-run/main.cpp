// braid-run: the launcher. See launcher.hpp, or run `braid-run --help`.
#include "launcher.hpp"

int main(int argc, char** argv) {
  braid::run::ParsedArgs parsed = braid::run::parse_args(argc, argv);
  if (!parsed.options) return parsed.exit_code;
  return braid::run::launch(*parsed.options);
}
