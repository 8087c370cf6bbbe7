#!/usr/bin/env python3
"""Checks docs/configuration.md against the POOLCUDA_CONF option table.

    check_config_docs.py PRINT_CONFIG_KEYS CONFIGURATION_MD
    check_config_docs.py --self-test PRINT_CONFIG_KEYS CONFIGURATION_MD

PRINT_CONFIG_KEYS prints the parser's table (key, default, grammar; tab-separated). The page's
"## Keys" section must hold a table whose rows start with a key and its default in backquotes
(| `log` | `basic` | ...), in the option table's order, and a "### `key`" heading for each key.
Every key of the code must appear in both, with the code's default, and no other key may.
`PRINT_CONFIG_KEYS --describe VALUE` prints what `poolcuda check-conf VALUE` prints: each row of
the "## Errors" table whose value and message are literal (in backquotes, no "...") must give
that message, and the `poolcuda check-conf` example its output line. Exits 1 with one line per
problem.

--self-test checks the checker: the page as it is must pass, and a page with a key left out, a
key the code does not have, a wrong default, a wrong error message or a stale check-conf example
must fail.
"""
import re
import subprocess
import sys

ROW = re.compile(r"^\|\s*`([a-z_]+)`\s*\|\s*`([^`]*)`\s*\|")
ERROR_ROW = re.compile(r"^\|[^|]*\|\s*`([^`]*)`\s*\|\s*`(.*)`\s*\|\s*$")
CHECK_CONF = re.compile(r"^\$ poolcuda check-conf '([^']*)'$")
HEADING = re.compile(r"^###\s+`([a-z_]+)`\s*$")


def code_keys(program):
    out = subprocess.run([program], check=True, stdout=subprocess.PIPE, text=True).stdout
    keys = []
    for line in out.splitlines():
        key, default, _grammar = line.split("\t")
        keys.append((key, default))
    return keys


def keys_section(text):
    """The lines of the '## Keys' section (up to the next level-2 heading)."""
    lines = text.splitlines()
    start = next((i for i, l in enumerate(lines) if l.strip() == "## Keys"), None)
    if start is None:
        return None
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start + 1:end]


def describe(program, value):
    """(status, stdout or stderr line) of PRINT_CONFIG_KEYS --describe VALUE."""
    run = subprocess.run([program, "--describe", value], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    return run.returncode, (run.stdout if run.returncode == 0 else run.stderr).strip()


def example_problems(program, text):
    """The errors table's literal rows and the check-conf example, against the parser."""
    found = []
    lines = text.splitlines()
    start = next((i for i, l in enumerate(lines) if l.strip() == "## Errors"), None)
    if start is None:
        return ["docs/configuration.md has no '## Errors' section"]
    checked = 0
    for line in lines[start + 1:]:
        if line.startswith("## "):
            break
        m = ERROR_ROW.match(line)
        if not m or "..." in m.group(2):
            continue
        value, message = m.group(1), m.group(2)
        status, said = describe(program, value)
        checked += 1
        if status != 2 or said != message:
            found.append(f"errors table: '{value}' gives '{said}' (status {status}), "
                         f"the page says '{message}'")
    if checked == 0:
        found.append("the errors table has no row with a literal value and message")
    for i, line in enumerate(lines[:-1]):
        m = CHECK_CONF.match(line)
        if not m:
            continue
        status, said = describe(program, m.group(1))
        if status != 0 or said != lines[i + 1].strip():
            found.append(f"check-conf example '{m.group(1)}': prints '{said}', "
                         f"the page says '{lines[i + 1].strip()}'")
        break
    else:
        found.append("no '$ poolcuda check-conf ...' example followed by its output")
    return found


def problems(keys, text, program=None):
    section = keys_section(text)
    if section is None:
        return ["docs/configuration.md has no '## Keys' section"]
    rows = [(m.group(1), m.group(2)) for m in map(ROW.match, section) if m]
    headings = [m.group(1) for m in map(HEADING.match, section) if m]
    found = []
    code = dict(keys)
    for key, default in keys:
        documented = [d for k, d in rows if k == key]
        if not documented:
            found.append(f"key '{key}' is in the option table but not in the keys table")
        elif documented[0] != default:
            found.append(f"key '{key}': the keys table says default '{documented[0]}', "
                         f"the code '{default}'")
        if key not in headings:
            found.append(f"key '{key}' is in the option table but has no '### `{key}`' heading")
    for key, _ in rows:
        if key not in code:
            found.append(f"the keys table documents '{key}', which the option table lacks")
    for key in headings:
        if key not in code:
            found.append(f"the heading '### `{key}`' documents a key the option table lacks")
    for name, listed in (("keys table", [k for k, _ in rows]), ("headings", headings)):
        if len(set(listed)) != len(listed):
            found.append(f"a key appears twice in the {name}")
        elif not found and listed != [k for k, _ in keys]:
            found.append(f"the {name} are not in the option table's order: "
                         + ", ".join(k for k, _ in keys))
    if program is not None:
        found += example_problems(program, text)
    return found


def self_test(keys, text, program):
    failures = []
    if problems(keys, text, program):
        failures.append("the page as it is does not pass")
    # An error message or the check-conf example that no longer matches the parser.
    for name, old, new in (("a wrong error message", "expected at least one pool in the list",
                            "expected one pool or more in the list"),
                           ("a stale check-conf example", ",hold:1.5,", ",")):
        if old not in text or not example_problems(program, text.replace(old, new, 1)):
            failures.append(f"the check passed a page with {name}")
    victim, default = keys[len(keys) // 2]
    without = "\n".join(l for l in text.splitlines()
                        if not (ROW.match(l) and ROW.match(l).group(1) == victim)
                        and not (HEADING.match(l) and HEADING.match(l).group(1) == victim))
    cases = {
        f"key '{victim}' left out": without,
        "an unknown key added": text.replace("## Keys\n", "## Keys\n\n### `no_such_key`\n", 1),
        f"a wrong default for '{victim}'": text.replace(f"| `{victim}` | `{default}` |",
                                                        f"| `{victim}` | `{default}x` |", 1),
        "a code key the page lacks": None,
    }
    for name, page in cases.items():
        if page is None:
            found = problems(keys + [("added_in_code", "0")], text)
        else:
            found = page != text and problems(keys, page)
        if not found:
            failures.append(f"the check passed a page with {name}")
    for failure in failures:
        print("self-test: " + failure)
    return 1 if failures else 0


def main(argv):
    test = argv[:1] == ["--self-test"]
    if test:
        argv = argv[1:]
    if len(argv) != 2:
        print(__doc__)
        return 2
    keys = code_keys(argv[0])
    with open(argv[1], encoding="utf-8") as page:
        text = page.read()
    if test:
        return self_test(keys, text, argv[0])
    found = problems(keys, text, argv[0])
    for problem in found:
        print(problem)
    if not found:
        print(f"{len(keys)} keys documented, each with the code's default; the error messages "
              "and the check-conf example as the parser writes them")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
