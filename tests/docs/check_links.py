#!/usr/bin/env python3
"""Checks that every relative link in the README and the docs/ pages leads somewhere.

    check_links.py ROOT             checks ROOT/README.md and ROOT/docs/*.md
    check_links.py --self-test ROOT also checks that a broken file or anchor is caught

A link is `[text](target)` outside code blocks. A target with a scheme (https:, mailto:) is not
followed. `path` must name an existing file relative to the page; `path#anchor` and `#anchor`
must name a heading of that page (GitHub's anchors: lower case, punctuation dropped, spaces to
hyphens). Exits 1 with one line per broken link.
"""
import os
import re
import sys

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#+\s+(.*)$")


def anchor(heading):
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def prose_lines(text):
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield line


def anchors_of(path):
    with open(path, encoding="utf-8") as f:
        return {anchor(m.group(1)) for line in prose_lines(f.read())
                if (m := HEADING.match(line))}


def broken_links(page):
    problems = []
    with open(page, encoding="utf-8") as f:
        text = f.read()
    for line in prose_lines(text):
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, fragment = target.partition("#")
            resolved = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            if not os.path.exists(resolved):
                problems.append(f"{page}: link to {target}: no such file")
            elif fragment and resolved.endswith(".md") and fragment not in anchors_of(resolved):
                problems.append(f"{page}: link to {target}: no such heading")
    return problems


def pages(root):
    docs = os.path.join(root, "docs")
    return [os.path.join(root, "README.md")] + sorted(
        os.path.join(docs, name) for name in os.listdir(docs) if name.endswith(".md"))


def self_test(root):
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        os.mkdir(os.path.join(tmp, "docs"))
        with open(os.path.join(tmp, "docs", "a.md"), "w") as f:
            f.write("# A page\n\n## Some `code` here\n")
        cases = {"[ok](docs/a.md#some-code-here) [web](https://example.com)": 0,
                 "[gone](docs/b.md)": 1, "[bad anchor](docs/a.md#nothing)": 1,
                 "```\n[in code](nowhere.md)\n```": 0}
        for text, expected in cases.items():
            with open(os.path.join(tmp, "README.md"), "w") as f:
                f.write(text + "\n")
            found = sum(len(broken_links(p)) for p in pages(tmp))
            if found != expected:
                print(f"self-test: {text!r}: {found} broken links found, expected {expected}")
                return 1
    return 0


def main(argv):
    if argv[:1] == ["--self-test"]:
        if self_test(argv[1]):
            return 1
        argv = argv[1:]
    problems = [p for page in pages(argv[0]) for p in broken_links(page)]
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
