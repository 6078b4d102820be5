#!/usr/bin/env python3
"""Lengths of the C functions in the given files, longest first (issue 14,
point 4):

    tools/funclen.py [--max N] [--max-file N] [--top K] PATH...

A PATH that is a folder stands for every .c and .h file under it. A function
is a top-level brace block whose head (the code since the previous top-level
';', '}' or '{') ends in a parameter list and holds no '=' outside it, read
after comments, strings and preprocessor lines are blanked, so a struct, an
initializer or a parenthesis in a comment is not one. Its length counts the
lines from its name to its closing brace.

Prints the --top (40) longest, then any other over --max. Exits 1 when a
function outside the checkers (named *_check or check_*, or in a file named
check.c) is longer than --max lines, or a file is longer than --max-file.
"""
import os, re, sys


DIRECTIVE = re.compile(r'[ \t]*#')


def blank(text):
    """text with comments, string and char literals (quotes kept) and
    preprocessor lines (with their continuations) turned into spaces;
    newlines are kept so offsets map to the same lines."""
    out, i, n, bol = [], 0, len(text), True
    sp = lambda s: re.sub(r'[^\n]', ' ', s)
    while i < n:
        c = text[i]
        if bol and DIRECTIVE.match(text, i):
            j = i
            while True:                       # to the end of the directive
                k = text.find('\n', j)
                k = n if k < 0 else k
                # a comment opened on the line runs on: skip it whole
                c0 = text.find('/*', j, k)
                if c0 >= 0:
                    e = text.find('*/', c0 + 2)
                    e = n if e < 0 else e + 2
                    if e > k:
                        j = e
                        continue
                if k > i and text[k - 1] == '\\':
                    j = k + 1
                    continue
                break
            out.append(sp(text[i:k])); i = k
            continue
        if text.startswith('/*', i):
            e = text.find('*/', i + 2); e = n if e < 0 else e + 2
            out.append(sp(text[i:e])); i = e
            continue
        if text.startswith('//', i):
            e = text.find('\n', i); e = n if e < 0 else e
            out.append(sp(text[i:e])); i = e
            continue
        if c in '"\'':
            j = i + 1
            while j < n and text[j] != c and text[j] != '\n':
                j += 2 if text[j] == '\\' else 1
            j = min(j, n - 1)
            out.append(c + sp(text[i + 1:j]) + text[j]); i = j + 1
            bol = False
            continue
        out.append(c)
        if c == '\n':
            bol = True
        elif c not in ' \t':
            bol = False
        i += 1
    return ''.join(out)


def head_name(head):
    """The function's name when head (code before a top-level '{') is a
    function's declarator, else None."""
    h = head.rstrip()
    if not h.endswith(')'):
        return None
    # the parameter list: the paren group that closes at the end
    depth, k = 0, len(h) - 1
    while k >= 0:
        depth += {')': 1, '(': -1}.get(h[k], 0)
        if depth == 0:
            break
        k -= 1
    if k < 0:
        return None
    outside = h[:k]
    if '=' in re.sub(r'\([^()]*\)', '', outside):
        return None                       # an initializer, not a function
    m = re.search(r'([A-Za-z_]\w*)\s*$', outside)
    if not m:                             # int (*f(void))(int): the inner one
        m = re.search(r'([A-Za-z_]\w*)\s*\(', outside)
    if not m or m.group(1) in ('if', 'while', 'for', 'switch', 'sizeof',
                               '__attribute__', 'return'):
        return None
    return m.group(1), m.start(1)


def functions(path):
    """[(lines, name, path, first line)] of the functions in path."""
    text = open(path, errors='replace').read()
    code = blank(text)
    line_at = lambda off: text.count('\n', 0, off) + 1
    out, depth, last, start, name = [], 0, 0, None, None
    transparent = 0                       # open extern "C" { blocks
    for i, c in enumerate(code):
        if c == '{':
            if depth == 0:
                head = code[last:i]
                if re.fullmatch(r'\s*extern\s*"\s*"\s*', head):
                    transparent += 1; last = i + 1
                    continue
                hn = head_name(head)
                if hn:
                    name, start = hn[0], line_at(last + hn[1])
            depth += 1
        elif c == '}':
            if depth == 0:
                if transparent:
                    transparent -= 1
                last = i + 1
                continue
            depth -= 1
            if depth == 0:
                if start is not None:
                    out.append((line_at(i) - start + 1, name, path, start))
                start, last = None, i + 1
        elif c == ';' and depth == 0:
            last = i + 1
    return out


def sources(args):
    for p in args:
        if os.path.isdir(p):
            for root, dirs, files in os.walk(p):
                dirs.sort()
                for f in sorted(files):
                    if f.endswith(('.c', '.h')):
                        yield os.path.join(root, f)
        else:
            yield p


def checker(name, path):
    return (name.endswith('_check') or name.startswith('check_')
            or os.path.basename(path) == 'check.c')


def kept_whole(path, line):
    """A function whose opening comment says "Kept whole:" (with the measured
    reason, docs/design.md): a hot loop that every split tried made slower."""
    src = open(path, errors='replace').read().split('\n')
    head = '\n'.join(src[max(0, line - 40):line - 1])
    k = head.rfind('/*')
    return k >= 0 and 'Kept whole:' in head[k:]


def main(argv):
    opts = {'--max': None, '--max-file': None, '--top': '40'}
    args = []
    while argv:
        a = argv.pop(0)
        if a in opts and argv:
            opts[a] = argv.pop(0)
        elif a.startswith('--'):
            sys.exit(f'funclen: unknown option {a}\n{__doc__}')
        else:
            args.append(a)
    limit = int(opts['--max']) if opts['--max'] else None
    flimit = int(opts['--max-file']) if opts['--max-file'] else None
    top = int(opts['--top'])
    files = list(sources(args))
    fs = sorted((f for p in files for f in functions(p)),
                key=lambda f: (-f[0], f[2], f[3]))
    bad = 0
    for k, (n, name, path, line) in enumerate(fs):
        over = limit is not None and n > limit
        if k >= top and not over:
            continue
        flag = ''
        if over:
            if checker(name, path):
                flag = '  (checker: allowed)'
            elif kept_whole(path, line):
                flag = '  (kept whole: allowed)'
            else:
                flag, bad = '  <-- over', bad + 1
        print(f'{n:5d}  {name}  {path}:{line}{flag}')
    if flimit is not None:
        for p in files:
            n = open(p, errors='replace').read().count('\n')
            if n > flimit:
                print(f'{n:5d}  lines in {p}  <-- file over {flimit}')
                bad += 1
    if limit is not None or flimit is not None:
        what = []
        if limit is not None:
            what.append(f'no function over {limit} lines outside the checkers')
        if flimit is not None:
            what.append(f'no file over {flimit} lines')
        print(f'funclen: {bad} over' if bad else 'funclen: ok, ' + ', '.join(what))
    return 1 if bad else 0


if __name__ == '__main__':
    try:
        sys.exit(main(sys.argv[1:]))
    except BrokenPipeError:
        sys.exit(0)
