// Every help text of the poolcuda CLI: the one-screen overview, each command's help, the
// configuration reference, and the manual page built from the same texts (so the man page can
// never say something the tool's own help does not).
//
// Depends on config/config.h only (the configuration keys come from the parser's option table).
#pragma once

#include <string>
#include <string_view>

namespace poolcuda::cli {

// The overview `poolcuda --help` prints: fits one 80x24 screen.
std::string_view main_help();

// The help of `command` ("run", "report", "trim", "check-conf"), or empty for no such command.
std::string_view command_help(std::string_view command);

// The usage lines at the top of a command's help, on one line.
std::string command_usage(std::string_view command);

// The configuration reference (`poolcuda help conf`): every POOLCUDA_CONF key, its default and
// its values, from the parser's own option table.
std::string conf_help();

// The manual page poolcuda(1), in roff, built from the texts above.
std::string man_page();

}  // namespace poolcuda::cli
