// Prints the POOLCUDA_CONF option table as the parser holds it (config_keys()), one key per line:
// key, default and grammar separated by tabs, in the table's order. With `--describe STR`, prints
// instead what `poolcuda check-conf STR` prints on stdout (the effective configuration), or the
// error on stderr with status 2. check_config_docs.py compares both with docs/configuration.md.
// Depends on config/ only.
#include <cstring>
#include <iostream>

#include "config/config.h"

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--describe") == 0) {
    const poolcuda::ParseResult result = poolcuda::parse_config(argv[2]);
    if (!result.config) {
      std::cerr << result.error.message() << '\n';
      return 2;
    }
    std::cout << poolcuda::describe_config(*result.config) << '\n';
    return 0;
  }
  for (const poolcuda::ConfigKeyInfo& key : poolcuda::config_keys())
    std::cout << key.key << '\t' << key.default_value << '\t' << key.grammar << '\n';
  return 0;
}
