#!/usr/bin/env python3
"""Lengths of the C functions in the given files (top-level brace blocks that
follow a parameter list), longest first: `tools/funclen.py lib/*.c [--max N]`.
Exits 1 when a function outside the checkers (names ending in _check or
check_*) is longer than --max lines."""
import re, sys

def functions(path):
    src = open(path).read().split('\n')
    out, depth, start, name = [], 0, None, None
    for i, line in enumerate(src):
        code = re.sub(r'"(\\.|[^"\\])*"|\'(\\.|[^\'\\])*\'|/\*.*?\*/|//.*', '', line)
        if depth == 0 and '{' in code and start is None:
            # the function head: look back for "name(" on this or earlier lines
            j, head = i, ''
            while j >= 0 and j > i - 8:
                head = src[j] + ' ' + head
                if re.match(r'^[A-Za-z_]', src[j]) and '(' in src[j]:
                    break
                j -= 1
            m = re.search(r'([A-Za-z_][A-Za-z0-9_]*)\s*\(', head)
            if m and not re.match(r'^\s*(struct|union|enum|typedef)\b', src[j] if j >= 0 else '') and '=' not in head.split('(')[0]:
                start, name = j, m.group(1)
        depth += code.count('{') - code.count('}')
        if depth == 0 and start is not None:
            out.append((i - start + 1, name, path, start + 1))
            start = None
    return out

args = sys.argv[1:]
limit = None
if '--max' in args:
    k = args.index('--max'); limit = int(args[k + 1]); del args[k:k + 2]
fs = sorted((f for p in args for f in functions(p)), reverse=True)
bad = 0
for n, name, path, line in fs[:40]:
    checker = name.endswith('_check') or name.startswith('check_')
    flag = ''
    if limit and n > limit and not checker:
        flag, bad = '  <-- over', bad + 1
    print(f'{n:5d}  {name}  {path}:{line}{flag}')
sys.exit(1 if bad else 0)
