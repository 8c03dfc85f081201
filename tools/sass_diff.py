#!/usr/bin/env python3
"""Compares the machine code (SASS) of two builds kernel by kernel: a refactor that moves code
between files must leave every kernel it keeps identical.

    tools/sass_diff.py BASE_LIB NEW_LIB     (libllmk.a or any object cuobjdump reads)

Prints the kernels only one side has and the kernels whose SASS differs (instructions compared
without their addresses), then a one-line verdict; exits 1 when a kept kernel differs.
Needs cuobjdump (the CUDA toolkit) on PATH.
"""

import re
import subprocess
import sys
from collections import defaultdict

ADDRESS = re.compile(r"/\*[0-9a-f]{4,}\*/")
# An anonymous namespace's mangled name carries hashes of its file, which any edit changes.
ANONYMOUS = re.compile(r"_GLOBAL__N__[0-9a-f]+_(\d+_\w+?)_[0-9a-f]{8}")
ENCODING = re.compile(r"/\* 0x[0-9a-f]+ \*/")


def kernels(path: str) -> dict:
    """{(arch, mangled name): [instruction lines]} of every kernel in `path`."""
    text = subprocess.run(["cuobjdump", "-sass", path], check=True, capture_output=True, text=True).stdout
    found, arch, name = defaultdict(list), "?", None
    for line in text.splitlines():
        if line.strip().startswith("arch = "):
            arch = line.split("=", 1)[1].strip()
        elif line.strip().startswith("Function : "):
            name = (arch, ANONYMOUS.sub(r"_GLOBAL__N_\1", line.split(":", 1)[1].strip()))
        elif name is not None and ADDRESS.search(line):
            instruction = ENCODING.sub("", ADDRESS.sub("", line)).strip()
            if instruction:
                found[name].append(instruction)
    return found


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    base, new = kernels(sys.argv[1]), kernels(sys.argv[2])
    only_base = sorted(set(base) - set(new))
    only_new = sorted(set(new) - set(base))
    changed = sorted(k for k in set(base) & set(new) if base[k] != new[k])
    for arch, name in only_base:
        print(f"only in base: {arch} {name}")
    for arch, name in only_new:
        print(f"only in new:  {arch} {name}")
    for arch, name in changed:
        print(f"SASS differs: {arch} {name} ({len(base[(arch, name)])} -> {len(new[(arch, name)])} instructions)")
    kept = len(set(base) & set(new))
    print(f"sass_diff: {kept} kernels in both, {kept - len(changed)} identical, {len(changed)} differ; "
          f"{len(only_base)} only in base, {len(only_new)} only in new")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
