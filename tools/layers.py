#!/usr/bin/env python3
"""Calls between the library's object files, as nm shows them (issue 14).

    tools/layers.py BUILD_DIR [--graph] [--src SRC] [--lib NAME]
    tools/layers.py --src SRC [--graph] OBJ.o...

Finds the objects of the shared library (lib<NAME>.so*.p/*.o, NAME batchkv)
and their sources through BUILD_DIR/compile_commands.json, so a file added to
lib/meson.build is seen without editing this script. With .o files instead,
each is mapped back to its source from meson's naming (kv/cache.c ->
kv_cache.c.o, or lib_kv_cache.c.o when listed from the top).

An edge A -> B is a symbol B defines (nm: T D B R ...) that A leaves
undefined (U): a call, or a function or object whose address A takes.
Reports, and exits 1 on any of:
  - a cycle: a strongly connected component of more than one object;
  - an upward edge: A's layer below B's; or a sideways one, A and B on the
    same level in different folders (events and decide may not call each
    other); or a call a layer is not allowed (ONLY).
The layer of an object is its folder under lib/ (LAYERS). --graph prints
every edge with its symbols, then the edges between folders. Exit 77 (a
skipped meson test) when nm is missing, 2 on a usage or build error.
"""
import json, os, re, shutil, subprocess, sys

# lib/<folder>: its level, bottom to top (docs/design.md, "The layers").
LAYERS = {'base': 0, 'cost': 1, 'kv': 2, 'pool': 3,
          'events': 4, 'decide': 4, 'sched': 5, 'obs': 6}
# Folders that may call only these (beside their own), whatever the levels say.
ONLY = {'events': {'pool', 'kv', 'base'}}

DEFINED = set('TDBRCVWGSIu')   # nm -P types of a symbol this object defines
UNDEFINED = set('Uwv')         # ... and of one it takes from elsewhere


def die(msg, rc=2):
    print(f'layers: {msg}', file=sys.stderr)
    sys.exit(rc)


def objects_from_build(build, src, lib):
    """[(object path, source path relative to src)] of lib's shared half."""
    cc = os.path.join(build, 'compile_commands.json')
    if not os.path.exists(cc):
        die(f'no {cc}: not a meson build folder?')
    pat = re.compile(r'(^|/)lib' + re.escape(lib) + r'\.(so|dylib)[^/]*\.p/[^/]+\.o$')
    out = []
    for e in json.load(open(cc)):
        if not pat.search(e['output']):
            continue
        obj = os.path.normpath(os.path.join(e['directory'], e['output']))
        source = os.path.normpath(os.path.join(e['directory'], e['file']))
        out.append((obj, os.path.relpath(source, src)))
    if not out:
        die(f'no objects of lib{lib}.so in {cc}')
    if any(s.startswith('..') or not s.startswith('lib' + os.sep) for _, s in out):
        print(f'layers: objects not from lib/ sources (a unity build?): skipped')
        sys.exit(77)
    return sorted(out, key=lambda p: p[1])


def objects_from_names(objs, src):
    """Map meson object names back to lib/ sources (kv_cache.c.o)."""
    names = {}
    libdir = os.path.join(src, 'lib')
    for root, _, files in os.walk(libdir):
        for f in files:
            if f.endswith('.c'):
                path = os.path.relpath(os.path.join(root, f), src)
                under = os.path.relpath(path, 'lib')
                for n in (under, path):
                    names[n.replace(os.sep, '_') + '.o'] = path
    out = []
    for o in objs:
        base = os.path.basename(o)
        if base not in names:
            die(f'{o}: no source under {libdir} gives this object name')
        out.append((o, names[base]))
    return out


def read_nm(nm, obj):
    """(defined, undefined) global symbols of one object."""
    r = subprocess.run([nm, '-P', obj], capture_output=True, text=True)
    if r.returncode != 0:
        die(f'{nm} {obj}: {r.stderr.strip()}')
    defs, undefs = set(), set()
    for line in r.stdout.splitlines():
        f = line.split()
        if len(f) < 2:
            continue
        if f[1] in UNDEFINED:
            undefs.add(f[0])
        elif f[1] in DEFINED:
            defs.add(f[0])
    return defs, undefs


def sccs(nodes, succ):
    """Tarjan's strongly connected components, iteratively."""
    index, low, on, stack, out, n = {}, {}, set(), [], [], 0
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(succ.get(root, ()))))]
        index[root] = low[root] = n; n += 1
        stack.append(root); on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = n; n += 1
                    stack.append(w); on.add(w)
                    work.append((w, iter(sorted(succ.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop(); on.discard(w); comp.append(w)
                    if w == v:
                        break
                out.append(sorted(comp))
    return out


def folder(path):
    parts = path.split(os.sep)
    return parts[1] if len(parts) > 2 and parts[0] == 'lib' else ''


def main(argv):
    graph = '--graph' in argv
    argv = [a for a in argv if a != '--graph']
    opts = {'--src': os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
            '--lib': 'batchkv', '--nm': os.environ.get('NM', 'nm')}
    rest = []
    while argv:
        a = argv.pop(0)
        if a in opts:
            if not argv:
                die(f'{a} needs a value')
            opts[a] = argv.pop(0)
        elif a.startswith('-'):
            die(f'unknown option {a}\n' + __doc__)
        else:
            rest.append(a)
    src, nm = os.path.abspath(opts['--src']), opts['--nm']
    if shutil.which(nm) is None:
        print(f'layers: no {nm}: skipped')
        return 77
    if len(rest) == 1 and os.path.isdir(rest[0]):
        objs = objects_from_build(rest[0], src, opts['--lib'])
    elif rest and all(r.endswith('.o') for r in rest):
        objs = objects_from_names(rest, src)
    else:
        die('give a build folder or .o files\n' + __doc__)

    name, defs, undefs, owner = {}, {}, {}, {}
    for obj, source in objs:
        if not os.path.exists(obj):
            die(f'{obj} is not built (ninja -C BUILD first)')
        name[obj] = source
        defs[source], undefs[source] = read_nm(nm, obj)
        for s in defs[source]:
            owner.setdefault(s, []).append(source)
    bad = 0
    for s, who in sorted(owner.items()):
        if len(who) > 1:
            print(f'symbol {s} defined in {", ".join(who)}')
    nodes = sorted(defs)
    edges = {}                          # (a, b) -> sorted symbols
    for a in nodes:
        for s in undefs[a]:
            for b in owner.get(s, ()):
                if b != a:
                    edges.setdefault((a, b), []).append(s)
    for k in edges:
        edges[k].sort()
    succ = {}
    for a, b in edges:
        succ.setdefault(a, set()).add(b)

    print(f'{len(nodes)} objects, {len(edges)} edges between them')
    if graph:
        print('edges (caller -> callee: symbols):')
        for (a, b), syms in sorted(edges.items()):
            print(f'  {a} -> {b}: {" ".join(syms)}')
        fe = {}
        for (a, b), syms in edges.items():
            fa, fb = folder(a), folder(b)
            if fa != fb:
                fe.setdefault((fa, fb), set()).update(syms)
        print('edges between folders (number of symbols):')
        for (fa, fb), syms in sorted(fe.items(), key=lambda e: (-LAYERS.get(e[0][0], 99), e[0])):
            print(f'  {fa} -> {fb}: {len(syms)}')

    unknown = sorted({folder(n) or '(lib/ itself)' for n in nodes} - set(LAYERS))
    for f in unknown:
        print(f'no layer for lib/{f}: add it to LAYERS in {__file__}')
        bad += 1

    cycles = [c for c in sccs(nodes, succ) if len(c) > 1]
    for c in cycles:
        print(f'cycle: {" <-> ".join(c)}')
        inside = set(c)
        for (a, b), syms in sorted(edges.items()):
            if a in inside and b in inside:
                print(f'    {a} -> {b}: {" ".join(syms)}')
    bad += len(cycles)

    for (a, b), syms in sorted(edges.items()):
        fa, fb = folder(a), folder(b)
        if fa == fb or fa not in LAYERS or fb not in LAYERS:
            continue
        why = None
        if LAYERS[fa] < LAYERS[fb]:
            why = f'upward ({fa} {LAYERS[fa]} < {fb} {LAYERS[fb]})'
        elif LAYERS[fa] == LAYERS[fb]:
            why = f'sideways ({fa} and {fb} both on level {LAYERS[fa]})'
        elif fa in ONLY and fb not in ONLY[fa]:
            why = f'not allowed ({fa} may call only {", ".join(sorted(ONLY[fa]))})'
        if why:
            print(f'{why}: {a} -> {b}: {" ".join(syms)}')
            bad += 1

    if bad:
        print(f'layers: {bad} problem(s)')
        return 1
    print('layers: no cycle, no upward edge')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
