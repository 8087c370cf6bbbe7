#!/usr/bin/env python3
"""Checks that docs/interception.md names only entry points the library hooks.

    check_interception_docs.py LIBPOOLCUDA_SO INTERCEPTION_MD
    check_interception_docs.py --self-test LIBPOOLCUDA_SO INTERCEPTION_MD

Every CUDA function named in backquotes (`cudaX`, `cuX`) in the entry-point column of a runtime
or driver row of the page's "## The entry points" table must be a function the library exports:
a name there that the library does not define is a call a reader would expect it to see, and it
does not. Exits 1 with one line per such name.

--self-test checks the checker: the page as it is must pass, and a page naming a function the
library does not export must fail.
"""
import re
import subprocess
import sys

ROW = re.compile(r"^\|\s*(runtime|driver)\s*\|([^|]*)\|")
NAME = re.compile(r"`((?:cuda|cu)[A-Z]\w*)`")


def exported(library):
    out = subprocess.run(["nm", "-D", "--defined-only", library], check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


def named(text):
    lines = text.splitlines()
    start = next((i for i, l in enumerate(lines) if l.strip() == "## The entry points"), None)
    if start is None:
        return None
    names = []
    for line in lines[start + 1:]:
        if line.startswith("## "):
            break
        m = ROW.match(line)
        if m:
            names += NAME.findall(m.group(2))
    return names


def problems(symbols, text):
    names = named(text)
    if names is None:
        return ["docs/interception.md has no '## The entry points' section"]
    if not names:
        return ["the entry-point table names no function"]
    return [f"docs/interception.md names `{n}`, which libpoolcuda.so does not export"
            for n in sorted(set(names)) if n not in symbols]


def main(argv):
    test = argv[:1] == ["--self-test"]
    if test:
        argv = argv[1:]
    if len(argv) != 2:
        print(__doc__)
        return 2
    symbols = exported(argv[0])
    with open(argv[1], encoding="utf-8") as page:
        text = page.read()
    if test:
        failures = []
        if problems(symbols, text):
            failures.append("the page as it is does not pass")
        unknown = text.replace("| runtime | `cudaMalloc`,",
                               "| runtime | `cudaNoSuchCall`, `cudaMalloc`,", 1)
        if unknown == text or not problems(symbols, unknown):
            failures.append("the check passed a page naming a function the library lacks")
        for failure in failures:
            print("self-test: " + failure)
        return 1 if failures else 0
    found = problems(symbols, text)
    for problem in found:
        print(problem)
    if not found:
        print(f"{len(set(named(text)))} entry points named, each exported by the library")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
