# api-doc.awk - read include/batchkv.h and print, for every BKV_API
# declaration, its name and doc comment. Modes (-v mode=...):
#   list      "name<TAB>documented(0/1)" per declaration
#   markdown  docs/api.md: sections, types and the documented functions
# A declaration counts as documented when a /** ... */ comment ends on the
# line right before it and, for non-void functions, says @return.
function flush_decl(   name, s) {
	s = decl
	gsub(/[ \t\n]+/, " ", s)
	name = s
	sub(/\(.*/, "", name)
	sub(/.* \**/, "", name)
	ok = (doc != "" && doc_end == decl_start - 1)
	if (ok && s !~ /BKV_API void [a-z_]+\(/ && doc !~ /@return/)
		ok = 0
	if (mode == "list")
		printf "%s\t%d\n", name, ok
	else {
		printf "### `%s`\n\n```c\n%s\n```\n\n", name, s
		d = doc
		gsub(/^\/\*\*[ ]?/, "", d); gsub(/\n[ \t]*\*\/$/, "", d); gsub(/\*\/$/, "", d)
		gsub(/\n[ \t]*\* ?/, "\n", d)
		sub(/^\n+/, "", d)
		n = split(d, L, "\n"); out = ""; item = 0
		for (i = 1; i <= n; i++) {
			l = L[i]
			if (l ~ /^@param /) { sub(/^@param +/, "", l); p = l; sub(/ .*/, "", p); sub(/^[^ ]+ */, "", l); l = "- `" p "`: " l; item = 1 }
			else if (l ~ /^@return/) { sub(/^@return:? */, "", l); l = "- **Returns:** " l; item = 1 }
			else if (item && l ~ /^ +/) { sub(/^ +/, "  ", l) }
			else if (item) { l = "\n" l; item = 0 }
			out = out l "\n"
		}
		printf "%s\n", out
	}
	decl = ""; doc_keep = ""
}
BEGIN { in_doc = 0; doc = ""; decl = "" }
{
	line = $0
	if (decl != "") {
		decl = decl "\n" line
		if (line ~ /;[ \t]*$/) flush_decl()
		next
	}
	if (line ~ /^\/\*\*/) { in_doc = 1; doc = line; if (line ~ /\*\/[ \t]*$/) { in_doc = 0; doc_end = NR }; next }
	if (in_doc) { doc = doc "\n" line; if (line ~ /\*\/[ \t]*$/) { in_doc = 0; doc_end = NR }; next }
	if (mode == "markdown" && line ~ /^\/\* [A-Z][A-Za-z ,()0-9-]+ +\*\/$/ && prev ~ /^\/\* -+ \*\/$/) {
		s = line; sub(/^\/\* /, "", s); sub(/ +\*\/$/, "", s)
		printf "## %s\n\n", s
	}
	if (line ~ /^BKV_API /) {
		decl = line; decl_start = NR
		if (line ~ /;[ \t]*$/) flush_decl()
	}
	prev = line
}
