#!/usr/bin/env python3
"""The Lua mutants of scripts/mutants.sh: small bugs planted one at a time in src/raw/lua/*.lua.

    lua_mutants.py list [--lua DIR] [--file F]... [--sample N --seed S] [--equivalent FILE] [ID...]
        the mutants, one per line (tab-separated: id, sig, file, line, operator, original,
        mutated, equivalent reason or ''), numbered in a fixed order (file, line, column,
        operator); selected by file, by id, or a sample spread over the files
    lua_mutants.py apply ID DEST [--lua DIR]
        write the Lua file of mutant ID, mutated, into the directory DEST
    lua_mutants.py library DIR
        print the function library made of the Lua files in DIR, as FUNCTION LOAD takes it
        (to tell a mutant that no longer compiles: "invalid")

Operators (each on code only: never in comments or, but for `reply`, in strings):
    cmp          `<` <-> `<=`, `>` <-> `>=`
    eq           `==` <-> `~=`
    off-by-one   `+ 1` -> `+ 0` | `- 1`, `- 1` -> `- 0` | `+ 1` (binary operators only)
    del-write    a `redis.call('HSET'|'HDEL'|'ZADD'|'ZREM'|'RPUSH'|'LREM'|'DEL'|'SET'...)`
                 statement removed (the whole call, over several lines if it spans them)
    del-call     a statement that calls one of the scripts' own functions removed
                 (`forget_waiter(owner)`, `mark_left(owner, mark)`, ...)
    del-ttl      a `PEXPIRE` statement removed, or `'PX', ttl` taken out of a SET
    del-guard    a one-line `if COND then return ... end` removed
    cond-true    the condition of an `if`/`elseif` forced to `true`
    cond-false   forced to `false` (not for one-line guards: that is del-guard)
    reply        a reply string changed (`'stale'` -> `'granted'`, ...)

A mutant's sig (8 hex digits) is a hash of its file, operator, original and mutated code and
their occurrence, so it stays when lines move: scripts/mutants-equivalent.txt names the known
equivalent mutants by it.
"""

import hashlib
import os
import random
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
LUA_DIR = os.path.join(HERE, "..", "src", "raw", "lua")
# helpers every script is built on (src/raw/scripts.rs), in this order
HELPERS = ["common.lua", "state.lua", "sem.lua"]

WRITES = {
    "HSET", "HDEL", "HINCRBY", "HSETNX", "ZADD", "ZREM", "ZREMRANGEBYSCORE", "ZREMRANGEBYRANK",
    "RPUSH", "LPUSH", "LREM", "LPOP", "RPOP", "LTRIM", "DEL", "UNLINK", "SET", "INCR", "INCRBY",
}
TTLS = {"PEXPIRE", "EXPIRE", "PEXPIREAT", "EXPIREAT", "PERSIST"}
REPLIES = {
    "granted": "stale", "stale": "granted", "busy": "queued", "queued": "busy",
    "held": "released", "released": "not_held", "not_held": "released",
    "left": "passed", "passed": "left", "mismatch": "busy", "set": "unset", "unset": "set",
}
KEYWORDS = {
    "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "goto", "if",
    "in", "local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while",
}


def code_mask(line):
    """Per character of `line`: 'c' code, 's' inside a string literal (quotes included),
    '-' comment. Lua long brackets are not used by the scripts and are not handled."""
    mask = []
    i, n = 0, len(line)
    while i < n:
        ch = line[i]
        if ch == "-" and line.startswith("--", i):
            mask.extend("-" * (n - i))
            break
        if ch in "'\"":
            j = i + 1
            while j < n and line[j] != ch:
                j += 2 if line[j] == "\\" else 1
            j = min(j + 1, n)
            mask.extend("s" * (j - i))
            i = j
            continue
        mask.append("c")
        i += 1
    return "".join(mask)


def code_of(line):
    """The line without its comment, stripped."""
    m = code_mask(line)
    return "".join(c for c, k in zip(line, m) if k != "-").strip()


class Mutant:
    def __init__(self, file, line, col, op, lines, new, end=None):
        self.file, self.line, self.col, self.op = file, line, col, op
        self.end = end or line  # last line replaced (1-based, inclusive)
        self.old_text = "".join(lines[line - 1:self.end])
        self.new_text = new  # replaces lines line..end (with their newlines)
        self.original = " ".join(code_of(l) for l in lines[line - 1:self.end]).strip()
        self.mutated = " ".join(code_of(l) for l in new.splitlines()).strip()
        self.id = 0
        self.sig = ""

    def key(self):
        return (self.file, self.line, self.col, self.op, self.mutated)


def matching_close(lines, li, ci):
    """(line index, column) of the parenthesis closing the one at lines[li][ci], skipping
    strings and comments; None if it is not found within 20 lines."""
    depth = 0
    for l in range(li, min(li + 20, len(lines))):
        line, mask = lines[l], code_mask(lines[l])
        for c in range(ci if l == li else 0, len(line)):
            if mask[c] != "c":
                continue
            if line[c] == "(":
                depth += 1
            elif line[c] == ")":
                depth -= 1
                if depth == 0:
                    return l, c
    return None


def statement_start(before):
    """Whether code `before` a call (on its line) leaves the call in statement position."""
    b = before.strip()
    return b == "" or re.search(r"(^|\s)(then|else|do)$", b) is not None


CALL = re.compile(r"\b(redis\.p?call|[a-z_][a-z0-9_]*)\s*\(")
COND = re.compile(r"\b(if|elseif)\b")
CMP = re.compile(r"<=|>=|==|~=|<|>")
OFF = re.compile(r"([+-]) 1(?![\d.])")
REPLY = re.compile(r"'([a-z_]+)'")
PX = re.compile(r",\s*'PX',\s*[A-Za-z_][A-Za-z0-9_.]*")


def splice(lines, l, c0, c1, text, l1=None, c1_end=None):
    """Lines l..(l1 or l) with [c0, c1) (or from (l, c0) to (l1, c1_end)) replaced by text."""
    if l1 is None:
        return lines[l][:c0] + text + lines[l][c1:]
    return lines[l][:c0] + text + lines[l1][c1_end:]


def generate_file(name, src):
    lines = src.splitlines(keepends=True)
    out = []
    local_funcs = set(re.findall(r"^\s*local\s+function\s+([a-z_][a-z0-9_]*)", src, re.M))
    local_funcs |= set(re.findall(r"^\s*function\s+([a-z_][a-z0-9_]*)", src, re.M))
    local_funcs -= {"run", "error", "pcall"}
    for li, line in enumerate(lines):
        mask = code_mask(line)
        code = "".join(ch if k == "c" else " " for ch, k in zip(line, mask))
        ln = li + 1
        if not code.strip():
            continue
        # comparisons
        for m in CMP.finditer(code):
            op = m.group(0)
            flip = {"<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "~=", "~=": "=="}[op]
            kind = "eq" if op in ("==", "~=") else "cmp"
            out.append(Mutant(name, ln, m.start(), kind, lines,
                              splice(lines, li, m.start(), m.end(), flip)))
        # off by one (a binary + or -: an operand before it)
        for m in OFF.finditer(code):
            prev = code[:m.start()].rstrip()
            if not prev or not re.search(r"[A-Za-z0-9_)\]]$", prev) or \
                    re.search(r"\b(return|and|or|not|then|else|do)$", prev):
                continue
            alts = ["+ 0", "- 1"] if m.group(1) == "+" else ["- 0", "+ 1"]
            for alt in alts:
                out.append(Mutant(name, ln, m.start(), "off-by-one", lines,
                                  splice(lines, li, m.start(), m.end(), alt)))
        # deleted statements: redis.call writes, TTLs, calls of the scripts' own functions
        for m in CALL.finditer(code):
            fn = m.group(1)
            if fn in KEYWORDS or not statement_start(code[:m.start()]):
                continue
            if m.start() > 0 and code[m.start() - 1] in ".:":
                continue
            paren = m.end() - 1
            close = matching_close(lines, li, paren)
            if close is None:
                continue
            cl, cc = close
            after = lines[cl][cc + 1:]
            after_code = code_of(after)
            if after_code and not re.match(r"^(end\b|else\b|elseif\b)", after_code):
                continue  # not a whole statement (a method call, an operator after it)
            if fn.startswith("redis."):
                cmd = re.match(r"\s*'([A-Z]+)'", line[paren + 1:])
                if not cmd:
                    continue
                if cmd.group(1) in TTLS:
                    kind = "del-ttl"
                elif cmd.group(1) in WRITES:
                    kind = "del-write"
                else:
                    continue
            elif fn in local_funcs or fn in GLOBAL_FUNCS:
                kind = "del-call"
            else:
                continue
            new = splice(lines, li, m.start(), None, "", cl, cc + 1)
            if not code_of(new):
                new = ""  # the whole line(s) went: drop them
            elif not new.endswith("\n"):
                new += "\n"
            out.append(Mutant(name, ln, m.start(), kind, lines, new, end=cl + 1))
        # a TTL argument of SET
        for m in PX.finditer(code):
            out.append(Mutant(name, ln, m.start(), "del-ttl", lines,
                              splice(lines, li, m.start(), m.end(), "")))
        # guards and conditions
        stripped = code.strip()
        guard = re.match(r"^if\s.*\sthen\s+return\b.*\send$", stripped) and \
            not re.search(r"\b(else|elseif)\b", stripped) and stripped.count(" end") == 1
        if guard:
            out.append(Mutant(name, ln, 0, "del-guard", lines, ""))
        for m in COND.finditer(code):
            # the condition: from after the keyword to its `then` (maybe on a later line)
            for l in range(li, min(li + 6, len(lines))):
                lcode = "".join(ch if k == "c" else " " for ch, k in zip(lines[l], code_mask(lines[l])))
                start = m.end() if l == li else 0
                t = re.search(r"\bthen\b", lcode[start:])
                if t:
                    tl, tc = l, start + t.start()
                    break
            else:
                continue
            variants = ["true"] if guard else ["true", "false"]
            for v in variants:
                new = splice(lines, li, m.end(), None, " " + v + " ", tl, tc)
                out.append(Mutant(name, ln, m.start(), "cond-" + v, lines, new, end=tl + 1))
        # reply strings (in strings: the reply tables' first element)
        for m in REPLY.finditer(line):
            if mask[m.start()] != "s" or m.group(1) not in REPLIES:
                continue
            before = code[:m.start()].rstrip()
            if not (before.endswith("{") or re.search(r"\breturn$", before)):
                continue
            new = splice(lines, li, m.start(), m.end(), "'" + REPLIES[m.group(1)] + "'")
            out.append(Mutant(name, ln, m.start(), "reply", lines, new))
    return out


# functions defined in the helper files, which the scripts call (filled by generate)
GLOBAL_FUNCS = set()


def generate(lua_dir):
    files = sorted(f for f in os.listdir(lua_dir) if f.endswith(".lua"))
    sources = {f: open(os.path.join(lua_dir, f), encoding="utf-8").read() for f in files}
    for h in HELPERS:
        if h in sources:
            GLOBAL_FUNCS.update(re.findall(r"^\s*local\s+function\s+([a-z_][a-z0-9_]*)",
                                           sources[h], re.M))
    GLOBAL_FUNCS.difference_update({"run", "read", "refuse"})
    mutants = []
    for f in files:
        mutants.extend(generate_file(f, sources[f]))
    mutants.sort(key=Mutant.key)
    # drop exact duplicates (the same text from two operators)
    seen, unique = set(), []
    for m in mutants:
        k = (m.file, m.line, m.end, m.new_text)
        if k not in seen and m.new_text != m.old_text:
            seen.add(k)
            unique.append(m)
    occurrences = {}
    for i, m in enumerate(unique, 1):
        m.id = i
        base = "\0".join([m.file, m.op, m.original, m.mutated])
        occurrences[base] = occurrences.get(base, 0) + 1
        m.sig = hashlib.sha1(f"{base}\0{occurrences[base]}".encode()).hexdigest()[:8]
    return unique, sources


def read_equivalent(path):
    """sig -> reason, from lines `SIG  FILE:LINE  OPERATOR  reason` ('#' comments)."""
    eq = {}
    if not path or not os.path.exists(path):
        return eq
    for raw in open(path, encoding="utf-8"):
        line = raw.split("#", 1)[0].strip() if raw.lstrip().startswith("#") else raw.strip()
        if not line:
            continue
        parts = line.split(None, 3)
        if len(parts) < 4 or not re.fullmatch(r"[0-9a-f]{8}", parts[0]):
            sys.exit(f"{path}: not `SIG FILE:LINE OPERATOR reason`: {raw.rstrip()}")
        eq[parts[0]] = parts[3]
    return eq


def sample(mutants, n, seed):
    """n mutants spread over the files: each file's mutants shuffled (seeded), then taken in
    turn from each file (files in name order) until n are chosen; listed by id."""
    rng = random.Random(seed)
    by_file = {}
    for m in mutants:
        by_file.setdefault(m.file, []).append(m)
    queues = []
    for f in sorted(by_file):
        ms = list(by_file[f])
        rng.shuffle(ms)
        queues.append(ms)
    chosen = []
    while len(chosen) < n and any(queues):
        for q in queues:
            if q and len(chosen) < n:
                chosen.append(q.pop(0))
    return sorted(chosen, key=lambda m: m.id)


def tsv(s):
    return s.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    cmd, args = argv[0], argv[1:]
    lua = LUA_DIR
    if "--lua" in args:
        i = args.index("--lua")
        lua = args[i + 1]
        del args[i:i + 2]
    if cmd == "library":
        d = args[0]
        src = {f: open(os.path.join(d, f), encoding="utf-8").read()
               for f in sorted(os.listdir(d)) if f.endswith(".lua")}
        code = "#!lua name=fairlock_mutant_check\n" + "\n".join(src[h] for h in HELPERS) + "\n"
        for f in sorted(src):
            if f not in HELPERS:
                code += (f"\nredis.register_function('check_{f[:-4]}', function(KEYS, ARGV)\n"
                         f"{src[f]}\nend)\n")
        sys.stdout.write(code)
        return 0
    mutants, sources = generate(lua)
    if cmd == "apply":
        mid, dest = int(args[0]), args[1]
        m = mutants[mid - 1]
        lines = sources[m.file].splitlines(keepends=True)
        text = "".join(lines[:m.line - 1]) + m.new_text + "".join(lines[m.end:])
        with open(os.path.join(dest, m.file), "w", encoding="utf-8") as f:
            f.write(text)
        print(m.file)
        return 0
    if cmd != "list":
        sys.exit(f"unknown command {cmd}")
    files, ids, n, seed, eq_path = [], [], None, 1, None
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--file":
            files.append(os.path.basename(args[i + 1]))
            i += 2
        elif a == "--sample":
            n = int(args[i + 1])
            i += 2
        elif a == "--seed":
            seed = int(args[i + 1])
            i += 2
        elif a == "--equivalent":
            eq_path = args[i + 1]
            i += 2
        elif re.fullmatch(r"\d+(-\d+)?", a):
            lo, _, hi = a.partition("-")
            ids.extend(range(int(lo), int(hi or lo) + 1))
            i += 1
        else:
            sys.exit(f"unknown argument {a}")
    known = {m.file for m in mutants}
    for f in files:
        if f not in known:
            sys.exit(f"no mutants in {f} (files: {' '.join(sorted(known))})")
    chosen = mutants
    if files:
        chosen = [m for m in chosen if m.file in files]
    if ids:
        bad = [x for x in ids if not 1 <= x <= len(mutants)]
        if bad:
            sys.exit(f"no mutant {bad[0]} (ids 1-{len(mutants)})")
        wanted = set(ids)
        chosen = [m for m in chosen if m.id in wanted]
    if n is not None:
        chosen = sample(chosen, n, seed)
    eq = read_equivalent(eq_path)
    sigs = {m.sig for m in mutants}
    for s in eq:
        if s not in sigs:
            print(f"warning: {eq_path}: {s} names no mutant of the current sources", file=sys.stderr)
    for m in chosen:
        print("\t".join([str(m.id), m.sig, m.file, str(m.line), m.op, tsv(m.original),
                         tsv(m.mutated), tsv(eq.get(m.sig, ""))]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
