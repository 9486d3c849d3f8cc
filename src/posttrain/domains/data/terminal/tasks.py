"""Shell task templates of the `terminal` domain, written for posttrain.

Invariant: a template is a pure function of its `random.Random`; it returns
the initial files, the prompt, a gold script that solves it, a wrong script
that does not, and the end-state checks ("checks", judged by checker.py)
plus commands whose stdout must match ("runs", executed in the session after
the episode). Imported by file by posttrain.domains.terminal.
"""

WORDS = [
    "alpha",
    "bravo",
    "delta",
    "echo",
    "kilo",
    "lima",
    "oscar",
    "papa",
    "romeo",
    "sierra",
    "tango",
    "victor",
    "zulu",
]
NAMES = ["ada", "grace", "alan", "edsger", "barbara", "donald", "ken", "dennis", "margaret", "linus"]


def t_make_tree(rng):
    proj = rng.choice(["webapp", "toolkit", "engine", "atlas"])
    subs = rng.sample(["src", "tests", "docs", "scripts", "assets"], 3)
    return dict(
        level=1,
        prompt=f"Create a directory `{proj}` containing the subdirectories {', '.join('`' + s + '`' for s in subs)}, and a file `{proj}/README.md` whose only line is `# {proj}`.",
        files={},
        gold=f"mkdir -p {' '.join(proj + '/' + s for s in subs)}\necho '# {proj}' > {proj}/README.md\n",
        wrong=f"mkdir -p {' '.join(proj + '/' + s for s in subs[:2])}\necho '# {proj}' > {proj}/README.md\n",
        checks=[{"type": "dir", "path": f"{proj}/{s}"} for s in subs]
        + [{"type": "lines", "path": f"{proj}/README.md", "lines": [f"# {proj}"]}],
    )


def t_rename_ext(rng):
    names = rng.sample(WORDS, 4)
    files = {f"notes/{n}.txt": f"{n}\n" for n in names}
    files["notes/keep.log"] = "log\n"
    return dict(
        level=1,
        prompt="In the directory `notes`, rename every file ending in `.txt` so that it ends in `.md` instead (same base name). Leave other files alone.",
        files=files,
        gold='cd notes && for f in *.txt; do mv "$f" "${f%.txt}.md"; done\n',
        wrong=f"cd notes && mv {names[0]}.txt {names[0]}.md\n",
        checks=[{"type": "equals", "path": f"notes/{n}.md", "text": f"{n}\n"} for n in names]
        + [
            {"type": "count", "dir": "notes", "glob": "*.txt", "n": 0},
            {"type": "equals", "path": "notes/keep.log", "text": "log\n"},
        ],
    )


def t_fix_port(rng):
    old, new = rng.choice([80, 8000, 3000]), rng.choice([8080, 9090, 5000])
    host = rng.choice(["example.org", "localhost", "10.0.0.5"])
    conf = f"[server]\nhost = {host}\nport = {old}\n\n[client]\nport = {old + 1}\nretries = 3\n"
    return dict(
        level=2,
        prompt=f"The file `app.ini` sets `port = {old}` in its `[server]` section. Change that port to {new}. Do not change anything else (the `[client]` port stays).",
        files={"app.ini": conf},
        gold=f"sed -i 's/^port = {old}$/port = {new}/' app.ini\n",
        wrong=f"sed -i 's/^port = .*/port = {new}/' app.ini\n",
        checks=[{"type": "equals", "path": "app.ini", "text": conf.replace(f"port = {old}\n", f"port = {new}\n", 1)}],
    )


def t_uncomment(rng):
    key = rng.choice(["feature_search", "fast_mode", "audit_log", "dark_theme"])
    conf = f"# settings\nname = demo\n#{key} = on\n#{key}_level = 2\ntimeout = 30\n"
    return dict(
        level=2,
        prompt=f"In `settings.conf`, the line `#{key} = on` is commented out. Enable it by removing the leading `#` on exactly that line; leave every other line as it is.",
        files={"settings.conf": conf},
        gold=f"sed -i 's/^#{key} = on$/{key} = on/' settings.conf\n",
        wrong=f"sed -i 's/^#{key}/{key}/' settings.conf\n",
        checks=[{"type": "equals", "path": "settings.conf", "text": conf.replace(f"#{key} = on", f"{key} = on")}],
    )


def t_count_rows(rng):
    n = rng.randint(3, 12)
    rows = "".join(f"{rng.choice(NAMES)},{rng.randint(1, 99)}\n" for _ in range(n))
    return dict(
        level=1,
        prompt="`data.csv` has a header line followed by data rows. Write the number of data rows (not counting the header) to `count.txt`, as a single number on one line.",
        files={"data.csv": "name,score\n" + rows},
        gold="echo $(( $(wc -l < data.csv) - 1 )) > count.txt\n",
        wrong="wc -l < data.csv > count.txt\n",
        checks=[{"type": "lines", "path": "count.txt", "lines": [str(n)]}],
    )


def t_sort_unique(rng):
    names = [rng.choice(NAMES) for _ in range(rng.randint(8, 14))]
    return dict(
        level=1,
        prompt="Write the distinct lines of `names.txt`, sorted alphabetically, one per line, to `unique.txt`.",
        files={"names.txt": "\n".join(names) + "\n"},
        gold="sort -u names.txt > unique.txt\n",
        wrong="sort names.txt > unique.txt\n",
        checks=[{"type": "lines", "path": "unique.txt", "lines": sorted(set(names))}],
    )


def t_delete_tmp(rng):
    keep = [f"work/{w}.txt" for w in rng.sample(WORDS, 3)]
    tmp = ["work/a.tmp", "work/deep/b.tmp", f"work/deep/er/{rng.choice(WORDS)}.tmp"]
    files = {p: "x\n" for p in keep + tmp}
    files["work/deep/keep.tmpl"] = "template\n"
    return dict(
        level=1,
        prompt="Delete every file whose name ends in `.tmp` anywhere under the directory `work` (including subdirectories). Keep all other files.",
        files=files,
        gold="find work -type f -name '*.tmp' -delete\n",
        wrong="rm -f work/*.tmp\n",
        checks=[{"type": "absent", "path": p} for p in tmp]
        + [{"type": "equals", "path": p, "text": "x\n"} for p in keep]
        + [{"type": "equals", "path": "work/deep/keep.tmpl", "text": "template\n"}],
    )


def t_greet_script(rng):
    word = rng.choice(["Hello", "Welcome", "Greetings"])
    who = rng.choice(NAMES).capitalize()
    return dict(
        level=2,
        prompt=f"Write an executable shell script `greet.sh` that prints `{word}, NAME!` where NAME is its first argument. For example `./greet.sh Sam` prints `{word}, Sam!`.",
        files={},
        gold=f"printf '#!/bin/sh\\necho \"{word}, $1!\"\\n' > greet.sh\nchmod +x greet.sh\n",
        wrong=f"printf '#!/bin/sh\\necho \"{word}, $1!\"\\n' > greet.sh\n",
        checks=[{"type": "mode", "path": "greet.sh", "exec": True}],
        runs=[{"cmd": f"./greet.sh {who}", "stdout": f"{word}, {who}!\n"}],
    )


def t_symlink(rng):
    ver = f"v{rng.randint(2, 9)}"
    return dict(
        level=1,
        prompt=f"Create a symbolic link named `current` that points to the relative path `releases/{ver}`.",
        files={f"releases/{ver}/app.txt": "new\n", "releases/v1/app.txt": "old\n"},
        gold=f"ln -s releases/{ver} current\n",
        wrong="ln -s releases/v1 current\n",
        checks=[{"type": "symlink", "path": "current", "target": f"releases/{ver}"}],
    )


def t_json_version(rng):
    major, minor, patch = rng.randint(0, 3), rng.randint(0, 9), rng.randint(0, 9)
    name = rng.choice(["widget", "gizmo", "parser"])
    doc = {"name": name, "version": f"{major}.{minor}.{patch}", "private": True, "deps": {"left-pad": "1.3.0"}}
    import json

    bumped = dict(doc, version=f"{major}.{minor}.{patch + 1}")
    return dict(
        level=2,
        prompt="Bump the patch number of the `version` field in `package.json` by one (e.g. 1.2.3 -> 1.2.4), keeping every other field unchanged and the file valid JSON.",
        files={"package.json": json.dumps(doc, indent=2) + "\n"},
        gold="python3 - <<'PY'\nimport json\nd = json.load(open('package.json'))\na, b, c = d['version'].split('.')\nd['version'] = f'{a}.{b}.{int(c) + 1}'\njson.dump(d, open('package.json', 'w'), indent=2)\nPY\n",
        wrong="python3 - <<'PY'\nimport json\nd = json.load(open('package.json'))\na, b, c = d['version'].split('.')\nd['version'] = f'{a}.{int(b) + 1}.0'\njson.dump(d, open('package.json', 'w'), indent=2)\nPY\n",
        checks=[{"type": "json", "path": "package.json", "value": bumped}],
    )


def t_csv_column(rng):
    people = rng.sample(NAMES, 5)
    rows = [f"{p},{p}@{rng.choice(['mail.test', 'corp.test'])},{rng.randint(20, 60)}" for p in people]
    return dict(
        level=2,
        prompt="`people.csv` has no header; its columns are name,email,age. Write the email column, in the same order, one per line, to `emails.txt`.",
        files={"people.csv": "\n".join(rows) + "\n"},
        gold="cut -d, -f2 people.csv > emails.txt\n",
        wrong="cut -d, -f1 people.csv > emails.txt\n",
        checks=[{"type": "lines", "path": "emails.txt", "lines": [r.split(",")[1] for r in rows]}],
    )


def t_replace_word(rng):
    docs = {f"docs/{w}.md": f"The {w} colour scheme.\nColour is set per colour group.\n" for w in rng.sample(WORDS, 3)}
    docs["docs/sub/deep.md"] = "deep colour\n"
    fixed = {p: t.replace("colour", "color").replace("Colour", "Color") for p, t in docs.items()}
    return dict(
        level=2,
        prompt="In every file under `docs` (including subdirectories), replace the word `colour` with `color` and `Colour` with `Color`.",
        files=docs,
        gold="find docs -type f -exec sed -i 's/colour/color/g; s/Colour/Color/g' {} +\n",
        wrong="sed -i 's/colour/color/g' docs/*.md\n",
        checks=[{"type": "equals", "path": p, "text": t} for p, t in fixed.items()],
    )


def t_append_once(rng):
    tool = rng.choice(["mytool", "fastcc", "zq"])
    line = f'export PATH="$PATH:/opt/{tool}/bin"'
    rc = "# shell setup\nalias ll='ls -l'\n"
    return dict(
        level=2,
        prompt=f"Append the line `{line}` to the end of `.bashrc`, keeping its existing lines.",
        files={".bashrc": rc},
        gold=f"echo '{line}' >> .bashrc\n",
        wrong=f"echo '{line}' > .bashrc\n",
        checks=[{"type": "equals", "path": ".bashrc", "text": rc + line + "\n"}],
    )


def t_backup_dir(rng):
    files = {f"config/{w}.yaml": f"{w}: {rng.randint(1, 9)}\n" for w in rng.sample(WORDS, 3)}
    files["config/nested/extra.yaml"] = "extra: true\n"
    return dict(
        level=1,
        prompt="Make a copy of the directory `config` (with all its contents, including subdirectories) named `config.bak`.",
        files=files,
        gold="cp -r config config.bak\n",
        wrong="mkdir config.bak && cp config/*.yaml config.bak/\n",
        checks=[{"type": "equals", "path": p.replace("config/", "config.bak/", 1), "text": t} for p, t in files.items()]
        + [{"type": "equals", "path": p, "text": t} for p, t in files.items()],
    )


def t_grep_errors(rng):
    lines = []
    for i in range(rng.randint(8, 14)):
        lvl = rng.choice(["INFO", "INFO", "WARN", "ERROR"])
        lines.append(f"2026-01-0{1 + i % 9} {lvl} request {i} {'failed' if lvl == 'ERROR' else 'ok'}")
    lines.insert(2, "2026-01-01 ERROR disk full")
    lines.append("2026-01-09 INFO ERRORS resolved")
    errors = [x for x in lines if " ERROR " in x]
    return dict(
        level=2,
        prompt="Copy the lines of `app.log` whose level field is exactly `ERROR` into `errors.log`, in their original order. (The level is the second space-separated field.)",
        files={"app.log": "\n".join(lines) + "\n"},
        gold="awk '$2 == \"ERROR\"' app.log > errors.log\n",
        wrong="grep ERROR app.log > errors.log\n",
        checks=[{"type": "lines", "path": "errors.log", "lines": errors}],
    )


def t_env_file(rng):
    port = rng.randint(5000, 6000)
    host = rng.choice(["db.internal", "localhost", "10.1.2.3"])
    return dict(
        level=1,
        prompt=f"Create a file `.env` with exactly two lines: `DB_HOST={host}` and then `DB_PORT={port}`.",
        files={},
        gold=f"printf 'DB_HOST={host}\\nDB_PORT={port}\\n' > .env\n",
        wrong=f"printf 'DB_HOST={host}\\n' > .env\n",
        checks=[{"type": "lines", "path": ".env", "lines": [f"DB_HOST={host}", f"DB_PORT={port}"]}],
    )


def t_permissions(rng):
    scripts = [f"bin/{w}.sh" for w in rng.sample(WORDS, 3)]
    files = {p: "#!/bin/sh\necho hi\n" for p in scripts}
    files = {p: t.replace("#!", "# !", 1) for p, t in files.items()}  # written non-executable
    files["secrets.txt"] = "token=abc\n"
    return dict(
        level=2,
        prompt="Make every `.sh` file in `bin` executable by its owner, and set the permissions of `secrets.txt` to exactly 600 (read and write for the owner only).",
        files=files,
        gold="chmod u+x bin/*.sh\nchmod 600 secrets.txt\n",
        wrong="chmod 600 secrets.txt\n",
        checks=[{"type": "mode", "path": p, "exec": True} for p in scripts]
        + [{"type": "mode", "path": "secrets.txt", "exact": "600"}],
    )


def t_sum_script(rng):
    nums = [rng.randint(-50, 200) for _ in range(rng.randint(3, 7))]
    feed = " ".join(str(n) for n in nums)  # printf '%s\\n' with a blank line at the end
    prog = rng.choice(["sum.py", "total.py", "add_up.py", "tally.py"])
    return dict(
        level=3,
        prompt=f"Write a Python program `{prog}` that reads integers from standard input, one per line (ignore blank lines), and prints their sum.",
        files={},
        gold=f"cat > {prog} <<'PY'\nimport sys\nprint(sum(int(x) for x in sys.stdin if x.strip()))\nPY\n",
        wrong=f"cat > {prog} <<'PY'\nimport sys\nprint(sum(int(x) for x in sys.stdin.read().split()[:-1]))\nPY\n",
        checks=[{"type": "regex", "path": prog, "pattern": "stdin"}],
        runs=[{"cmd": f"printf '%s\\n' {feed} '' | python3 {prog}", "stdout": f"{sum(nums)}\n"}],
    )


def t_dedupe_inplace(rng):
    items = [rng.choice(WORDS[:6]) for _ in range(12)]
    seen, first = set(), []
    for x in items:
        if x not in seen:
            seen.add(x)
            first.append(x)
    return dict(
        level=2,
        prompt="Remove duplicate lines from `list.txt` in place, keeping the first occurrence of each line and the original order.",
        files={"list.txt": "\n".join(items) + "\n"},
        gold="awk '!seen[$0]++' list.txt > list.tmp && mv list.tmp list.txt\n",
        wrong="sort -u list.txt -o list.txt\n",
        checks=[{"type": "lines", "path": "list.txt", "lines": first}],
    )


def t_top_word(rng):
    words = rng.sample(WORDS, 4)
    counts = [5, 3, 2, 1]
    text = []
    for w, c in zip(words, counts):
        text += [w] * c
    rng.shuffle(text)
    lines = [" ".join(text[i : i + 4]) for i in range(0, len(text), 4)]
    src, dst = f"{rng.choice(NAMES)}.txt", rng.choice(["top.txt", "winner.txt", "most.txt"])
    return dict(
        level=3,
        prompt=f"Find the most frequent word in `{src}` (words are separated by spaces and newlines) and write just that word to `{dst}`.",
        files={src: "\n".join(lines) + "\n"},
        gold=f"tr ' ' '\\n' < {src} | grep -v '^$' | sort | uniq -c | sort -rn | head -1 | awk '{{print $2}}' > {dst}\n",
        wrong=f"tr ' ' '\\n' < {src} | grep -v '^$' | sort | uniq -c | sort -rn | sed -n 2p | awk '{{print $2}}' > {dst}\n",
        checks=[{"type": "lines", "path": dst, "lines": [words[0]]}],
    )


def t_archive(rng):
    files = {f"data/{w}.csv": f"{w},1\n" for w in rng.sample(WORDS, 3)}
    listing = "\n".join(sorted(["data/"] + list(files))) + "\n"
    return dict(
        level=3,
        prompt="Create a gzip-compressed tar archive `data.tar.gz` of the directory `data` (paths inside the archive start with `data/`).",
        files=files,
        gold="tar -czf data.tar.gz data\n",
        wrong="tar -cf data.tar.gz data\n",
        checks=[],
        runs=[{"cmd": "tar -tzf data.tar.gz | sort", "stdout": listing}],
    )


def t_move_logs(rng):
    logs = [f"{w}.log" for w in rng.sample(WORDS, 3)]
    files = {n: f"{n}\n" for n in logs}
    files["notes.txt"] = "n\n"
    return dict(
        level=1,
        prompt="Create a directory `logs` and move every `.log` file from the current directory into it.",
        files=files,
        gold="mkdir -p logs && mv *.log logs/\n",
        wrong="mkdir -p logs && cp *.log logs/\n",
        checks=[{"type": "equals", "path": f"logs/{n}", "text": f"{n}\n"} for n in logs]
        + [{"type": "absent", "path": n} for n in logs]
        + [{"type": "equals", "path": "notes.txt", "text": "n\n"}],
    )


def t_fix_script(rng):
    args = [rng.randint(1, 20) for _ in range(rng.randint(3, 5))]
    broken = '#!/bin/bash\n# prints the sum of all arguments\ntotal=0\nfor x in "$1"; do\n  total=$((total + x))\ndone\necho "$total"\n'
    name = rng.choice(["sum.sh", "addall.sh", "total.sh"])
    return dict(
        level=3,
        prompt=f"`{name}` should print the sum of all its arguments, but it only adds the first one. Fix the script (keep its name; it is run as `bash {name} 1 2 3`).",
        files={name: broken},
        gold=f'sed -i \'s/for x in "$1"/for x in "$@"/\' {name}\n',
        wrong=f"sed -i 's/total=0/total=1/' {name}\n",
        checks=[],
        runs=[
            {"cmd": f"bash {name} " + " ".join(map(str, args)), "stdout": f"{sum(args)}\n"},
            {"cmd": f"bash {name}", "stdout": "0\n"},
        ],
    )


def t_crlf(rng):
    lines = [f"{w} = {rng.randint(1, 9)}" for w in rng.sample(WORDS, 4)]
    return dict(
        level=2,
        prompt="`dos.txt` has Windows (CRLF) line endings. Convert it in place to Unix (LF) line endings without changing anything else.",
        files={"dos.txt": "\r\n".join(lines) + "\r\n"},
        gold="sed -i 's/\\r$//' dos.txt\n",
        wrong="tr -d '\\n' < dos.txt > dos.tmp && mv dos.tmp dos.txt\n",
        checks=[{"type": "equals", "path": "dos.txt", "text": "\n".join(lines) + "\n"}],
    )


def t_split_by_key(rng):
    rows = [(rng.choice(["red", "blue", "green"]), rng.randint(1, 99)) for _ in range(10)]
    groups = {}
    for color, n in rows:
        groups.setdefault(color, []).append(f"{color},{n}")
    out = rng.choice(["by_color", "split", "parts", "colors"])
    return dict(
        level=3,
        prompt=f"`items.csv` has lines `color,number`. Split it into one file per color, `{out}/<color>.csv`, each holding that color's lines in their original order.",
        files={"items.csv": "\n".join(f"{c},{n}" for c, n in rows) + "\n"},
        gold=f'mkdir -p {out} && awk -F, \'{{print > ("{out}/" $1 ".csv")}}\' items.csv\n',
        wrong=f'mkdir -p {out} && awk -F, \'{{print $2 > ("{out}/" $1 ".csv")}}\' items.csv\n',
        checks=[{"type": "lines", "path": f"{out}/{c}.csv", "lines": g} for c, g in groups.items()]
        + [{"type": "count", "dir": out, "glob": "*.csv", "n": len(groups)}],
    )


TEMPLATES = {name[2:]: fn for name, fn in sorted(globals().items()) if name.startswith("t_") and callable(fn)}
