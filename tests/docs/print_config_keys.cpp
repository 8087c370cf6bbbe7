// Prints the POOLCUDA_CONF option table as the parser holds it (config_keys()), one key per line:
// key, default and grammar separated by tabs, in the table's order. check_config_docs.py
// compares it with docs/configuration.md. Depends on config/ only.
#include <iostream>

#include "config/config.h"

int main() {
  for (const poolcuda::ConfigKeyInfo& key : poolcuda::config_keys())
    std::cout << key.key << '\t' << key.default_value << '\t' << key.grammar << '\n';
  return 0;
}
