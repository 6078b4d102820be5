#!/usr/bin/env python3
"""check_bindings.py - the drift guard between include/batchkv.h and its bindings.

    check_bindings.py SRCROOT            check; exit 1 with a list of problems
    check_bindings.py SRCROOT --emit-layout   print bindings/layout.c
    check_bindings.py SRCROOT --emit-rust     print Rust declarations (a start
                                              for bindings/rust/src/sys.rs)
    check_bindings.py SRCROOT --emit-python   print ctypes declarations (a
                                              start for batchkv/_ffi.py)

What it checks, against what bkvheader.py reads from the header:

 1. Raw declarations, both languages. Every BKV_API function is declared in
    bindings/python/batchkv/_ffi.py (FUNCTIONS) and in
    bindings/rust/src/sys.rs (extern "C"), with the return and parameter types
    the header gives (through the fixed C -> ctypes and C -> Rust type tables
    below: a changed parameter type, a parameter added or removed fails).
    Every public struct has a ctypes Structure and a #[repr(C)] Rust struct
    with the same fields, in order, of the mapped types; every enum value and
    status code has its constant in both. Every function-pointer typedef
    (bkv_vllm_key_name_fn) has a CFUNCTYPE of the same name in _ffi.py and a
    `pub type NAME = Option<unsafe extern "C" fn(..)>;` in sys.rs with the
    typedef's signature, and a field or parameter of that type is declared
    with it (by name in Rust; in ctypes by signature, as CFUNCTYPE returns
    one cached class per signature).
 2. The safe layer. Every function is used by the Pythonic package (a
    `_lib.<name>` reference outside _ffi.py) and by the Rust wrapper (a
    `sys::<name>` reference in src/lib.rs), or is listed in that language's
    UNBOUND table with the reason. An entry in UNBOUND that is in fact used,
    or that names no header function, fails too.
 3. Use, not names: every function the safe layer wraps is reached by a
    test of that binding (bindings/python/tests, bindings/rust/tests and
    examples): the wrapper that calls it - or a wrapper whose body names
    that wrapper, transitively, or a trait or dunder method - is named in a
    test. A function reached by none fails.
    The same for every field of every public struct: named in a test of
    the binding (its layout test aside) or in a wrapper a test reaches, or
    listed in the language's FIELDS_UNREACHED table ("struct" or
    "struct.field") with the reason.
 5. bindings/layout.c (the sizeof/offsetof program the layout tests compare
    ctypes and Rust against) is exactly what --emit-layout prints now.

The layout itself (sizes, offsets) is checked by the languages' own tests,
which run the compiled layout program: tests/test_layout.py and the Rust
crate's tests/layout.rs.

Standard library only (the ctypes module is imported, the library is not
loaded).
"""
import ast
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bkvheader  # noqa: E402

SCALARS = {
    # C type: (ctypes name, Rust type)
    "int": ("c_int", "c_int"),
    "uint8_t": ("c_uint8", "u8"),
    "int32_t": ("c_int32", "i32"),
    "uint32_t": ("c_uint32", "u32"),
    "int64_t": ("c_int64", "i64"),
    "uint64_t": ("c_uint64", "u64"),
    "size_t": ("c_size_t", "usize"),
    "double": ("c_double", "f64"),
    "char": ("c_char", "c_char"),
    "void": (None, "c_void"),
}


def c_to_py(t, hdr):
    """The ctypes expression a C type must be declared as in _ffi.py."""
    t = bkvheader.norm_type(t)
    if t in hdr["fntypes"]:
        return py_fn_type(hdr["fntypes"][t], hdr)
    if t.startswith("fn("):
        return py_fn_type(t, hdr)
    if t in ("const char*", "char*"):
        return "c_char_p"
    if t == "void* const *":
        return "POINTER(c_void_p)"
    if t.endswith("*"):
        base = t[:-1].replace("const ", "").strip()
        if base == "void" or base in hdr["opaque"]:
            return "c_void_p"
        if base.endswith("*"):  # a pointer to a pointer
            inner = base[:-1].strip()
            if inner == "void" or inner in hdr["opaque"]:
                return "POINTER(c_void_p)"
            return "POINTER(%s)" % c_to_py(inner + "*", hdr)
        return "POINTER(%s)" % c_to_py(base, hdr)
    if t in hdr["enums"] or t == "bkv_status":
        return "c_int"
    if t in hdr["structs"]:
        return t
    if t == "void":
        return "None"
    if t in SCALARS:
        return SCALARS[t][0]
    raise ValueError("no ctypes mapping for C type %r" % t)


def c_to_rs(t, hdr):
    """The Rust type a C type must be declared as in sys.rs."""
    t = bkvheader.norm_type(t)
    if t.endswith("*"):
        pointee = t[:-1].strip()
        if pointee.endswith(" const"):          # T *const *: to a const pointer
            return "*const " + c_to_rs(pointee[:-6], hdr)
        if pointee.startswith("const ") and "*" not in pointee:  # const T *
            return "*const " + c_to_rs(pointee[6:], hdr)
        return "*mut " + c_to_rs(pointee, hdr)   # T *, and const T ** (to a mutable pointer)
    if t.startswith("fn("):
        ret, params = t[3:-1].split(";", 1)
        ps = [c_to_rs(p, hdr) for p in params.split(",")] if params else []
        r = c_to_rs(ret, hdr)
        return "Option<unsafe extern \"C\" fn(%s)%s>" % (", ".join(ps),
                                                        "" if r == "c_void" else " -> " + r)
    if t in hdr["enums"] or t in hdr["structs"] or t in hdr["opaque"] or t in hdr["fntypes"]:
        return t  # a callback typedef by its name: its alias is checked on its own
    if t in SCALARS:
        return SCALARS[t][1]
    raise ValueError("no Rust mapping for C type %r" % t)


def rs_norm(t):
    t = re.sub(r"\s+", " ", t.strip())
    t = t.replace("std::os::raw::", "").replace("core::ffi::", "").replace("libc::", "")
    t = re.sub(r"\bc_int\b", "i32", t)
    t = re.sub(r"\bc_uint\b", "u32", t)
    t = re.sub(r"\bc_char\b", "i8", t)
    t = re.sub(r"\s*,\s*\)", ")", t)
    t = re.sub(r"\(\s*", "(", t)
    return t.replace(" -> ()", "")


# ---------------------------------------------------------------- emitters --

def emit_layout(hdr):
    out = ["/*",
           " * layout.c - sizeof and offsetof of every public struct in batchkv.h, one",
           " * line each: \"S name size align\" and \"F name field offset size\". The Python",
           " * and Rust layout tests compare their declarations with this program's",
           " * output. Generated: bindings/tools/check_bindings.py SRCROOT --emit-layout",
           " * (the drift guard fails when this file differs from what it prints).",
           " */",
           "#include <batchkv.h>", "", "#include <stddef.h>", "#include <stdio.h>", "",
           "#define S(T) printf(\"S %s %zu %zu\\n\", #T, sizeof(T), _Alignof(T))",
           "#define F(T, f) printf(\"F %s %s %zu %zu\\n\", #T, #f, offsetof(T, f), "
           "sizeof(((T *)0)->f))", "",
           "int main(void)", "{"]
    for name, fields in hdr["structs"].items():
        out.append("\tS(%s);" % name)
        for _, f, _ in fields:
            out.append("\tF(%s, %s);" % (name, f))
    out += ["\treturn 0;", "}", ""]
    return "\n".join(out)


# C names that are Rust keywords: sys.rs spells them as raw identifiers.
RS_KEYWORDS = {"as", "box", "crate", "dyn", "enum", "fn", "impl", "in", "loop", "match",
               "mod", "move", "mut", "ref", "self", "struct", "trait", "type", "use", "where"}


def rs_ident(name):
    return "r#" + name if name in RS_KEYWORDS else name


def emit_rust(hdr):
    out = []
    for name, sig in hdr["fntypes"].items():
        out.append("pub type %s = %s;" % (name, c_to_rs(sig, hdr)))
    for name, vals in hdr["enums"].items():
        out.append("pub type %s = c_int;" % name)
        for k, v in vals.items():
            out.append("pub const %s: %s = %d;" % (k, name, v))
    for name, fields in hdr["structs"].items():
        out.append("#[repr(C)]\n#[derive(Copy, Clone)]\npub struct %s {" % name)
        for t, f, arr in fields:
            rt = c_to_rs(t, hdr)
            if arr is not None:
                rt = "[%s; %s]" % (rt, arr)
            out.append("    pub %s: %s," % (rs_ident(f), rt))
        out.append("}")
    out.append("extern \"C\" {")
    for name, (ret, params) in hdr["functions"].items():
        r = c_to_rs(ret, hdr)
        out.append("    pub fn %s(%s)%s;" % (name, ", ".join(
            "%s: %s" % (rs_ident(n), c_to_rs(t, hdr)) for t, n in params), "" if r == "c_void" else
            " -> " + r))
    out.append("}")
    return "\n".join(out)


def emit_python(hdr):
    out = []
    for name, sig in hdr["fntypes"].items():
        ret, params = py_fn_type(sig, hdr)[3:-1].split(";", 1)
        out.append("%s = CFUNCTYPE(%s)" % (name, ", ".join([ret] + (params.split(",") if params
                                                                    else []))))
    for name, fields in hdr["structs"].items():
        out.append("class %s(Structure):\n    _fields_ = [" % name)
        for t, f, arr in fields:
            pt = py_fn_type(t, hdr) if t.startswith("fn(") else c_to_py(t, hdr)
            if arr is not None:
                pt = "%s * %s" % (pt, arr)
            out.append("        (%r, %s)," % (f, pt))
        out.append("    ]")
    out.append("FUNCTIONS = {")
    for name, (ret, params) in hdr["functions"].items():
        out.append("    %r: (%s, [%s])," % (name, c_to_py(ret, hdr),
                                            ", ".join(c_to_py(t, hdr) for t, _ in params)))
    out.append("}")
    return "\n".join(out)


# ---------------------------------------------------------------- checks ----

def ctypes_name(ct):
    """A ctypes type as the strings c_to_py produces."""
    import ctypes
    if ct is None:
        return "None"
    if ct is ctypes.c_void_p:
        return "c_void_p"
    if ct is ctypes.c_char_p:
        return "c_char_p"
    if isinstance(ct, type) and issubclass(ct, ctypes._Pointer):
        return "POINTER(%s)" % ctypes_name(ct._type_)
    if isinstance(ct, type) and issubclass(ct, ctypes.Array):
        return "%s * %d" % (ctypes_name(ct._type_), ct._length_)
    if isinstance(ct, type) and issubclass(ct, ctypes._CFuncPtr):
        return "fn(%s;%s)" % (ctypes_name(ct._restype_),
                              ",".join(ctypes_name(a) for a in ct._argtypes_))
    if isinstance(ct, type) and issubclass(ct, ctypes.Structure):
        return ct.__name__
    # scalars: ctypes aliases (c_int32 is c_int) compare by size and signedness
    for n in ("c_int", "c_uint8", "c_int32", "c_uint32", "c_int64", "c_uint64", "c_size_t",
              "c_double", "c_char"):
        if ct is getattr(ctypes, n):
            return n
    return repr(ct)


def same_ctype(got, want):
    """ctypes makes c_int32 the same object as c_int, c_uint64 as c_ulong, ...:
    compare the names after resolving each scalar to its kind and size."""
    import ctypes

    def canon(s):
        for n in sorted(_SCALAR_KIND, key=len, reverse=True):
            s = re.sub(r"\b%s\b" % n, "%s%d" % (_SCALAR_KIND[n],
                                                 ctypes.sizeof(getattr(ctypes, n))), s)
        return s.replace(" ", "")
    return canon(got) == canon(want)


_SCALAR_KIND = {"c_int": "i", "c_uint8": "u", "c_int32": "i", "c_uint32": "u", "c_int64": "i",
                "c_uint64": "u", "c_size_t": "u", "c_double": "f", "c_char": "i"}


def py_fn_type(t, hdr):
    """c_to_py for a function-pointer type: 'fn(ret;args)' in ctypes names.

    A callback returning a string (const char *) is declared with restype
    c_void_p: ctypes cannot return a c_char_p from a Python callback safely
    (it keeps the bytes object alive forever and warns "memory leak in
    callback function"), so the wrapper returns the address of a buffer it
    keeps alive for as long as the header says, as an int."""
    ret, params = t[3:-1].split(";", 1)
    ps = [c_to_py(p, hdr) for p in params.split(",")] if params else []
    r = c_to_py(ret, hdr)
    if r == "c_char_p":
        r = "c_void_p"
    return "fn(%s;%s)" % (r, ",".join(ps))


def check_python(hdr, root, problems):
    pkg = os.path.join(root, "bindings", "python")
    import importlib.util  # _ffi.py alone: no numpy, no library needed
    spec = importlib.util.spec_from_file_location("bkv_ffi_checked",
                                                  os.path.join(pkg, "batchkv", "_ffi.py"))
    ffi = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ffi)
    for name, (ret, params) in hdr["functions"].items():
        if name not in ffi.FUNCTIONS:
            problems.append("python: %s has no ctypes declaration in _ffi.FUNCTIONS" % name)
            continue
        pr, pa = ffi.FUNCTIONS[name]
        want = [c_to_py(ret, hdr)] + [c_to_py(t, hdr) for t, _ in params]
        got = [ctypes_name(pr)] + [ctypes_name(a) for a in pa]
        if len(got) != len(want) or not all(same_ctype(g, w) for g, w in zip(got, want)):
            problems.append("python: %s declared (%s) -> %s, header says (%s) -> %s" % (
                name, ", ".join(got[1:]), got[0], ", ".join(want[1:]), want[0]))
    for name in ffi.FUNCTIONS:
        if name not in hdr["functions"]:
            problems.append("python: _ffi declares %s, which the header does not" % name)
    import ctypes
    for name, sig in hdr["fntypes"].items():
        ct = getattr(ffi, name, None)
        if not (isinstance(ct, type) and issubclass(ct, ctypes._CFuncPtr)):
            problems.append("python: callback type %s has no CFUNCTYPE in _ffi" % name)
        elif not same_ctype(ctypes_name(ct), py_fn_type(sig, hdr)):
            problems.append("python: callback type %s declared %s, header says %s" % (
                name, ctypes_name(ct), py_fn_type(sig, hdr)))
    for name, fields in hdr["structs"].items():
        cls = getattr(ffi, name, None)
        if cls is None:
            problems.append("python: struct %s has no ctypes Structure in _ffi" % name)
            continue
        got = [(f[0], ctypes_name(f[1])) for f in cls._fields_]
        want = []
        for t, f, arr in fields:
            pt = py_fn_type(t, hdr) if t.startswith("fn(") else c_to_py(t, hdr)
            want.append((f, pt if arr is None else "%s * %s" % (pt, arr)))
        if len(got) != len(want) or not all(g[0] == w[0] and same_ctype(g[1], w[1])
                                            for g, w in zip(got, want)):
            problems.append("python: %s fields %s, header says %s" % (name, got, want))
    for ename, vals in hdr["enums"].items():
        for k, v in vals.items():
            if getattr(ffi, k, None) != v:
                problems.append("python: %s = %s in _ffi, header says %d" % (
                    k, getattr(ffi, k, None), v))
    for n, v, _ in hdr["status"]:
        if getattr(ffi, "BKV_" + n, None) != v:
            problems.append("python: status BKV_%s missing or wrong in _ffi" % n)
    for n, v in hdr["defines"].items():
        if getattr(ffi, n, None) != v and n != "BKV_VERSION_STRING":
            problems.append("python: constant %s missing or wrong in _ffi" % n)
    # the safe layer
    used = set()
    for fn in os.listdir(os.path.join(pkg, "batchkv")):
        if fn.endswith(".py") and fn != "_ffi.py":
            used |= set(re.findall(r"_lib\.(bkv_\w+)", open(os.path.join(pkg, "batchkv", fn)).read()))
    check_safe("python", hdr, used, getattr(ffi, "UNBOUND", {}), problems)
    src = read_tree(root, "bindings/python/batchkv", ".py", skip=("_ffi.py",))
    tests = read_tree(root, "bindings/python/tests", ".py", skip=("test_layout.py", "test_drift.py")) + \
        read_tree(root, "examples/python", ".py")
    pydefs = defs_of(src, r"\s*def (\w+)")
    check_reached("python", hdr, pydefs, tests, r"_lib\.%s\b", getattr(ffi, "UNBOUND", {}),
                  problems)
    check_fields("python", hdr, pydefs, tests, getattr(ffi, "FIELDS_UNREACHED", {}), problems)


# Methods a test reaches without naming them (operators, conversions,
# destructors, context managers).
IMPLICIT = {"fmt", "drop", "from", "deref", "deref_mut", "clone", "eq", "hash", "default",
            "next", "__init__", "__del__", "__enter__", "__exit__", "__repr__", "__len__",
            "__iter__", "__getitem__"}


def defs_of(text, defre):
    """name -> the text of every def of that name (a def runs to the next)."""
    out, cur, buf = {}, None, []
    for ln in text.split("\n"):
        m = re.match(defre, ln)
        if m:
            if cur:
                out[cur] = out.get(cur, "") + "\n".join(buf)
            cur, buf = m.group(1), []
        buf.append(ln)
    if cur:
        out[cur] = out.get(cur, "") + "\n".join(buf)
    return out


def reached_defs(defs, tests):
    """The defs a test names, and those a reached def names, transitively."""
    word = lambda d, text: re.search(r"\b%s\b" % re.escape(d), text)  # noqa: E731
    reached = {d for d in defs if d in IMPLICIT or word(d, tests)}
    grew = True
    while grew:
        grew = False
        for d in defs:
            if d not in reached and any(word(d, defs[r]) for r in reached):
                reached.add(d)
                grew = True
    return reached


def check_reached(lang, hdr, defs, tests, call, unbound, problems):
    reached = reached_defs(defs, tests)
    for name in hdr["functions"]:
        if name in unbound:
            continue
        pat = re.compile(call % re.escape(name))
        if not any(pat.search(defs[d]) for d in reached):
            problems.append("%s: no test reaches %s (no test names a wrapper that calls it)"
                            % (lang, name))


def check_fields(lang, hdr, defs, tests, unreached, problems):
    reached = reached_defs(defs, tests)
    body = "\n".join(defs[d] for d in reached)
    for sname, fields in hdr["structs"].items():
        for _t, f, _arr in fields:
            if f in ("size", "pad", "reserved", "state_pad") or sname in unreached or \
                    "%s.%s" % (sname, f) in unreached:
                continue
            w = re.compile(r"\b%s\b" % re.escape(f))
            if not (w.search(tests) or w.search(body)):
                problems.append("%s: no test reaches %s.%s (named in no test nor in a wrapper "
                                "one reaches), and it is not in FIELDS_UNREACHED" % (lang, sname, f))
    for k, why in unreached.items():
        if k.split(".")[0] not in hdr["structs"]:
            problems.append("%s: FIELDS_UNREACHED names %s, which the header does not" % (lang, k))
        elif not why or len(why.strip()) < 10:
            problems.append("%s: FIELDS_UNREACHED[%s] gives no reason" % (lang, k))


def read_tree(root, sub, ext, skip=()):
    d = os.path.join(root, sub)
    if not os.path.isdir(d):
        return ""
    return "".join(open(os.path.join(d, f)).read() + "\n" for f in sorted(os.listdir(d))
                   if f.endswith(ext) and f not in skip)


def check_safe(lang, hdr, used, unbound, problems):
    for name in hdr["functions"]:
        if name not in used and name not in unbound:
            problems.append("%s: %s is declared but no safe wrapper uses it, and it is not in "
                            "UNBOUND with a reason" % (lang, name))
    for name, why in unbound.items():
        if name not in hdr["functions"]:
            problems.append("%s: UNBOUND names %s, which the header does not declare" % (lang, name))
        elif name in used:
            problems.append("%s: %s is in UNBOUND but the safe layer uses it" % (lang, name))
        elif not why or len(why.strip()) < 10:
            problems.append("%s: UNBOUND[%s] gives no reason" % (lang, name))


def parse_rust(text):
    text = re.sub(r"//[^\n]*", "", text)
    fns = {}
    for m in re.finditer(r"pub fn (bkv_\w+)\s*\((.*?)\)\s*(->\s*([^;]+))?;", text, re.S):
        params = []
        depth, cur = 0, ""
        for ch in m.group(2):
            if ch in "(<":
                depth += 1
            elif ch in ")>":
                depth -= 1
            if ch == "," and depth == 0:
                params.append(cur)
                cur = ""
            else:
                cur += ch
        if cur.strip():
            params.append(cur)
        ps = [rs_norm(p.split(":", 1)[1]) for p in params]
        fns[m.group(1)] = (rs_norm(m.group(4) or "c_void"), ps)
    structs = {}
    for m in re.finditer(r"#\[repr\(C\)\][^{;]*?pub struct (bkv_\w+)\s*\{(.*?)\n\}", text, re.S):
        fields = []
        for line in m.group(2).split("\n"):
            fm = re.match(r"\s*pub (?:r#)?(\w+):\s*(.*?),?\s*$", line)
            if fm:
                fields.append((fm.group(1), rs_norm(fm.group(2).rstrip(","))))
        structs[m.group(1)] = fields
    aliases = dict((a, rs_norm(b)) for a, b in re.findall(r"pub type (bkv_\w+)\s*=\s*([^;]+);", text))
    consts = dict((a, int(b)) for a, b in
                  re.findall(r"pub const (BKV_\w+)\s*:\s*[\w:]+\s*=\s*\(?(-?\d+)\)?", text))
    opaque = re.findall(r"pub struct (bkv_\w+)\s*\{\s*_private:", text)
    return fns, structs, aliases, consts, opaque


def check_rust(hdr, root, problems):
    src = os.path.join(root, "bindings", "rust", "src")
    fns, structs, aliases, consts, opaque = parse_rust(open(os.path.join(src, "sys.rs")).read())
    for name, (ret, params) in hdr["functions"].items():
        if name not in fns:
            problems.append("rust: %s has no extern \"C\" declaration in sys.rs" % name)
            continue
        want = (rs_norm(c_to_rs(ret, hdr)), [rs_norm(c_to_rs(t, hdr)) for t, _ in params])
        if fns[name] != want:
            problems.append("rust: %s declared %s, header says %s" % (name, fns[name], want))
    for name in fns:
        if name not in hdr["functions"]:
            problems.append("rust: sys.rs declares %s, which the header does not" % name)
    for name, fields in hdr["structs"].items():
        want = []
        for t, f, arr in fields:
            rt = rs_norm(c_to_rs(t, hdr))
            want.append((f, rt if arr is None else "[%s; %s]" % (rt, arr)))
        if name not in structs:
            problems.append("rust: struct %s has no #[repr(C)] struct in sys.rs" % name)
        elif structs[name] != want:
            problems.append("rust: %s fields %s, header says %s" % (name, structs[name], want))
    for name, sig in hdr["fntypes"].items():
        want = rs_norm(c_to_rs(sig, hdr))
        if aliases.get(name) != want:
            problems.append("rust: callback type %s is %s in sys.rs, header says `pub type %s = "
                            "%s;`" % (name, aliases.get(name), name, want))
    for name in hdr["opaque"]:
        if name not in opaque:
            problems.append("rust: opaque %s missing in sys.rs" % name)
    for ename, vals in hdr["enums"].items():
        if aliases.get(ename) != "i32":
            problems.append("rust: enum %s is not `pub type %s = c_int;`" % (ename, ename))
        for k, v in vals.items():
            if consts.get(k) != v:
                problems.append("rust: const %s missing or not %d" % (k, v))
    for n, v, _ in hdr["status"]:
        if consts.get("BKV_" + n) != v:
            problems.append("rust: status const BKV_%s missing or not %d" % (n, v))
    for n, v in hdr["defines"].items():
        if consts.get(n) != v:
            problems.append("rust: constant %s missing or not %d" % (n, v))
    lib = open(os.path.join(src, "lib.rs")).read()
    used = set(re.findall(r"sys::(bkv_\w+)\s*\(", lib))
    unbound = {}
    m = re.search(r"UNBOUND: &\[\(&str, &str\)\] = &\[(.*?)\];", lib, re.S)
    if m:
        for a, b in re.findall(r"\(\s*\"(bkv_\w+)\"\s*,\s*\"((?:[^\"\\]|\\.)*)\"\s*,?\s*\)", m.group(1)):
            unbound[a] = b
    check_safe("rust", hdr, used, unbound, problems)
    tests = read_tree(root, "bindings/rust/tests", ".rs", skip=("layout.rs",)) + \
        read_tree(root, "bindings/rust/examples", ".rs")
    rsdefs = defs_of(lib, r'\s*(?:pub(?:\(crate\))? )?(?:const )?(?:unsafe )?'
                          r'(?:extern "C" )?fn (\w+)')
    check_reached("rust", hdr, rsdefs, tests, r"sys::%s\s*\(", unbound, problems)
    fu = {}
    m = re.search(r"FIELDS_UNREACHED: &\[\(&str, &str\)\] = &\[(.*?)\];", lib, re.S)
    if m:
        for a, b in re.findall(r"\(\s*\"([\w.]+)\"\s*,\s*\"((?:[^\"\\]|\\.)*)\"\s*,?\s*\)", m.group(1)):
            fu[a] = b
    check_fields("rust", hdr, rsdefs, tests, fu, problems)


def main(argv):
    root = argv[1]
    hdr = bkvheader.parse(os.path.join(root, "include", "batchkv.h"))
    if len(argv) > 2:
        print({"--emit-layout": emit_layout, "--emit-rust": emit_rust,
               "--emit-python": emit_python}[argv[2]](hdr), end="")
        return 0
    problems = []
    check_python(hdr, root, problems)
    check_rust(hdr, root, problems)
    layout = os.path.join(root, "bindings", "layout.c")
    if not os.path.exists(layout) or open(layout).read() != emit_layout(hdr):
        problems.append("bindings/layout.c differs from what --emit-layout prints (regenerate)")
    for p in problems:
        print("drift:", p)
    print("check_bindings: %d functions, %d structs, %d enums, %d callback types; %d problems"
          % (len(hdr["functions"]), len(hdr["structs"]), len(hdr["enums"]), len(hdr["fntypes"]),
             len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
