"""bkvheader.py - read include/batchkv.h into plain Python data.

The drift guard (check_bindings.py) compares the Python and Rust bindings with
what this module finds in the header: every BKV_API function (return type and
parameter types), every public struct (field names and types, in order), every
enum value, the status codes of BKV_STATUS_MAP and the integer #defines. It is
a reader for this one header's style (one declaration per statement, comments
in /* */), not a general C parser; anything it cannot read raises ValueError so
that a change of style fails loudly instead of being skipped.

Standard library only: it runs under any Python 3.
"""
import re

_FUNC = re.compile(r"BKV_API\s+([^;{]*?)\b(bkv_\w+)\s*\(([^;{]*?)\)\s*;", re.S)
_STRUCT = re.compile(r"typedef\s+struct\s+(bkv_\w+)\s*\{(.*?)\}\s*(bkv_\w+)\s*;", re.S)
_ENUM = re.compile(r"typedef\s+enum\s+(bkv_\w+)\s*\{(.*?)\}\s*(bkv_\w+)\s*;", re.S)
_OPAQUE = re.compile(r"typedef\s+struct\s+(bkv_\w+)\s+(bkv_\w+)\s*;")
# typedef const char *(*bkv_vllm_key_name_fn)(void *ud, uint64_t key);
_FNTYPE = re.compile(r"typedef\s+([^;{}()]*?\(\s*\*\s*(bkv_\w+)\s*\)\s*\([^;{}]*?\))\s*;", re.S)
_DEFINE = re.compile(r"^#define\s+(BKV_[A-Z0-9_]+)\s+\(?(-?(?:0x[0-9a-fA-F]+|\d+))u?\)?\s*$", re.M)
_STATUS = re.compile(r"X\((\w+),\s*(-?\d+),\s*\"([^\"]*)\"\)")


def _strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def norm_type(t):
    """A C type spelled one way: single spaces, '*' glued to the left."""
    t = re.sub(r"\s+", " ", t.strip())
    t = re.sub(r"\s*\*\s*", "*", t)
    t = t.replace("*const", "* const").replace("* const*", "* const *")
    return t.replace("*const ", "* const ")


def _split_decl(decl):
    """'const int32_t *tokens' -> ('const int32_t*', 'tokens', None);
    'uint32_t reserved[3]' -> ('uint32_t', 'reserved', 3);
    'int (*forward)(void *host, ...)' -> ('fn', 'forward', signature)."""
    decl = decl.strip()
    m = re.match(r"^(.*?)\(\s*\*\s*(\w+)\s*\)\s*\((.*)\)$", decl, re.S)
    if m:
        ret, name, params = m.groups()
        return ("fn(" + norm_type(ret) + ";" + ",".join(p[0] for p in _params(params)) + ")",
                name, None)
    m = re.match(r"^(.*?)(\w+)\s*\[\s*(\w+)\s*\]$", decl, re.S)
    if m:
        return norm_type(m.group(1)), m.group(2), m.group(3)
    m = re.match(r"^(.*?)(\w+)$", decl, re.S)
    if not m or not m.group(1).strip():
        raise ValueError("bkvheader: cannot read declaration %r" % decl)
    return norm_type(m.group(1)), m.group(2), None


def _params(text):
    text = text.strip()
    if text in ("", "void"):
        return []
    out = []
    for p in text.split(","):
        t, n, arr = _split_decl(p)
        if arr is not None:
            raise ValueError("bkvheader: array parameter %r" % p)
        out.append((t, n))
    return out


def parse(path):
    """Return a dict: functions {name: (ret, [(type, name)])}, structs
    {name: [(type, field, array_len_or_None)]}, opaque [names], fntypes
    {name: 'fn(ret;param types)'} (function-pointer typedefs, spelled as a
    function-pointer field's type is), enums {name: {value_name: int}},
    status [(NAME, value, message)], defines {name: int}. A struct field or
    parameter of a typedef'd callback type keeps the typedef's name as its
    type."""
    raw = open(path, encoding="utf-8").read()
    text = _strip_comments(raw)
    body = text
    funcs = {}
    for ret, name, params in _FUNC.findall(body):
        if name in funcs:
            raise ValueError("bkvheader: %s declared twice" % name)
        funcs[name] = (norm_type(ret), _params(params))
    structs = {}
    for tag, fields, name in _STRUCT.findall(body):
        if tag != name:
            raise ValueError("bkvheader: struct tag %s named %s" % (tag, name))
        out = []
        for decl in fields.split(";"):
            if decl.strip():
                out.append(_split_decl(decl))
        structs[name] = out
    enums = {}
    for tag, values, name in _ENUM.findall(body):
        if "BKV_STATUS_MAP" in values:
            continue
        vals, nxt = {}, 0
        for item in values.split(","):
            item = item.strip()
            if not item:
                continue
            if "=" in item:
                k, v = [s.strip() for s in item.split("=", 1)]
                nxt = int(v, 0)
            else:
                k = item
            vals[k] = nxt
            nxt += 1
        enums[name] = vals
    opaque = [n for tag, n in _OPAQUE.findall(body)]
    fntypes = {}
    for decl, name in _FNTYPE.findall(body):
        t, n, _ = _split_decl(decl)
        if n != name or not t.startswith("fn("):
            raise ValueError("bkvheader: cannot read callback typedef %r" % decl)
        if name in fntypes:
            raise ValueError("bkvheader: %s declared twice" % name)
        fntypes[name] = t
    typedefs = len(re.findall(r"\btypedef\b", body))
    read = len(_STRUCT.findall(body)) + len(_ENUM.findall(body)) + len(opaque) + len(fntypes)
    if typedefs != read:
        raise ValueError("bkvheader: read %d of %d typedefs (a kind this reader does not "
                         "know?)" % (read, typedefs))
    status = [(n, int(v), msg) for n, v, msg in _STATUS.findall(raw)]
    defines = {n: int(v, 0) for n, v in _DEFINE.findall(raw)}
    if len(funcs) != raw.count("\nBKV_API "):
        raise ValueError("bkvheader: read %d of %d BKV_API declarations"
                         % (len(funcs), raw.count("\nBKV_API ")))
    return {"functions": funcs, "structs": structs, "opaque": opaque, "fntypes": fntypes,
            "enums": enums, "status": status, "defines": defines}


if __name__ == "__main__":
    import json
    import sys
    print(json.dumps(parse(sys.argv[1]), indent=1))
