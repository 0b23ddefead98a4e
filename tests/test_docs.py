"""The docs name what exists: every repository file or module a doc names, every `criu-gpushare`
command and flag the README shows, the README's exit codes, the shim's layer table and the
sections one doc cites in another. A rename that forgets a doc fails here, naming the doc.

What counts as a doc: every tracked Markdown file, and the modules of criu_gpushare (their
docstrings and comments name each other by path)."""
import ast
import inspect
import os
import re

import click
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP_DIRS = {".git", ".venv", ".criu", ".build", ".pytest_cache", "__pycache__", "build", "dist",
             "node_modules"}

# Names in the docs that are not files of this repository, each with why.
NOT_OURS = {
    "criu/cr-dump.c": "CRIU's source",
    "criu/include/image.h": "CRIU's source",
    "criu/include/plugin.h": "CRIU's source",
    "train.py": "a user's program in an example command line",
    "cuda.h": "CUDA's header",
}
# Flags of other programs the README shows in their own command lines.
OTHER_FLAGS = {
    "--action-script": "criu's",
}

FILE_EXT = r"(?:py|sh|c|h|md|def|conf|toml|cu|ptx)"
# a relative path with a file extension: engine/steps.py, tests/hook/test_mp_tree.py
PATH_RE = re.compile(r"(?<![\w./$~<>-])((?:[\w.-]+/)+[\w.-]*\w\." + FILE_EXT + r")(?![\w/.-])")
# a folder of the repository: tests/hook/, bench/workloads/
DIR_RE = re.compile(r"(?<![\w./$~<>-])((?:[\w-]+/)+)(?=[\s`),;:]|$)")
# a bare file name: test_cycles.py, hooks.def
BARE_RE = re.compile(r"(?<![\w./$~<>-])([\w-]+\." + FILE_EXT + r")(?![\w/.-])")


def _walk():
    for root, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        for f in files:
            yield os.path.relpath(os.path.join(root, f), ROOT)


FILES = sorted(_walk())
BASENAMES = {os.path.basename(f) for f in FILES}
TOP = {f.split(os.sep)[0] for f in FILES if os.sep in f}


def _docs():
    """Markdown anywhere (but the golden stores' data), and the package's modules."""
    return [f for f in FILES if f.endswith(".md") or (f.startswith("criu_gpushare" + os.sep)
                                                      and f.endswith(".py"))]


def _read(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


def _exists(name, doc):
    """Relative to the repository, to the doc's folder, or to the package (engine/steps.py)."""
    here = os.path.dirname(doc)
    return any(os.path.exists(os.path.join(ROOT, base, name))
               for base in ("", here, "criu_gpushare"))


def missing_names(doc, text):
    """The path-like names in `text` (from `doc`) that name no file or folder of the repository."""
    wrong = set()
    for name in PATH_RE.findall(text):
        if name not in NOT_OURS and not _exists(name, doc):
            wrong.add(name)
    for name in DIR_RE.findall(text):
        if name.split("/")[0] in TOP and not _exists(name, doc):
            wrong.add(name)
    for name in BARE_RE.findall(text):
        if name not in BASENAMES and name not in NOT_OURS:
            wrong.add(name)
    return sorted(wrong)


@pytest.mark.parametrize("doc", _docs())
def test_every_file_a_doc_names_exists(doc):
    wrong = missing_names(doc, _read(doc))
    assert not wrong, f"{doc} names what is not in the repository: {', '.join(wrong)}"


def test_a_doc_naming_a_missing_module_fails():
    text = "the tool (`criu_gpushare/control.py`, `engine/lifecycle.py`), `tests/nowhere/`, x.py"
    assert missing_names("README.md", text) == ["criu_gpushare/control.py", "engine/lifecycle.py",
                                                 "tests/nowhere/", "x.py"]
    assert missing_names("README.md", "`engine/steps.py`, `store/gc.py`, `tests/hook/`, "
                                      "`scripts/gpu-tests.sh`, /etc/criu/runc.conf, hooks.def") == []


# -- the command line ---------------------------------------------------------------------------


def _cli():
    """The command group with every command loaded (the CLI imports a command's module only
    when it runs)."""
    from criu_gpushare.cli import main
    for name in main.list_commands(None):
        main.get_command(None, name)
    return main


def _options(cmd):
    return {o for p in cmd.params if isinstance(p, click.Option) for o in p.opts + p.secondary_opts}


def _code(text):
    """What a reader types: `spans` and the lines of ``` blocks."""
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    for block in re.findall(r"```[^\n]*\n(.*?)```", text, flags=re.S):
        spans.extend(block.splitlines())
    return [s.replace("\\|", "|") for s in spans]  # `ls\|du` in a table is `ls|du`


COMMAND_RE = re.compile(r"(?<![\"\w-])criu-gpushare ([a-z][\w|-]*)(?: ([a-z][\w|-]*))?(.*)")


def cli_mistakes(text, main):
    """Commands and flags in the README's code that the CLI does not have."""
    every_flag = set().union(*(_options(c) for c in _commands(main)))
    wrong = []
    for span in _code(text):
        if span.split(" ")[0] in main.commands:  # `resume --gpu-map`, `restore DIR --store NEW`
            span = "criu-gpushare " + span
        m = COMMAND_RE.search(span)
        flags = set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", span))
        if m:
            verb, sub, rest = m.groups()
            # `store ls|du [--json]`: each alternative must take every flag shown
            alternatives = {}  # "verb [sub]" -> its options (the group's included)
            for v in verb.split("|"):
                cmd = main.commands.get(v)
                if cmd is None:
                    wrong.append(f"criu-gpushare {v}")
                elif isinstance(cmd, click.Group) and sub:
                    for s in sub.split("|"):
                        if s in cmd.commands:
                            alternatives[f"{v} {s}"] = _options(cmd) | _options(cmd.commands[s])
                        else:
                            wrong.append(f"criu-gpushare {v} {s}")
                else:
                    alternatives[v] = _options(cmd)
            # flags after `--` belong to the program `run` starts
            tail = rest.split(" -- ")[0] if " -- " in span else rest
            flags = set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", tail)) - set(OTHER_FLAGS)
            for name, known in alternatives.items():
                wrong += [f"criu-gpushare {name} {f}" for f in sorted(flags - known - _options(main))]
        elif re.match(r"\s*python3? (bench/\w+\.py)", span):
            script = _read(re.match(r"\s*python3? (bench/\w+\.py)", span).group(1))
            wrong += [f"{span.split()[1]} {f}" for f in sorted(flags) if f'"{f}"' not in script]
        elif re.match(r"\s*([A-Z_]+=|criu )", span):
            continue  # CRIU's own command line, or the GPU test script's settings
        else:
            wrong += sorted(flags - every_flag - set(OTHER_FLAGS))
    return wrong


def _commands(group):
    yield group
    for cmd in group.commands.values():
        yield from (_commands(cmd) if isinstance(cmd, click.Group) else [cmd])


def test_readme_commands_and_flags_exist():
    wrong = cli_mistakes(_read("README.md"), _cli())
    assert not wrong, "README.md shows what the CLI does not have: " + ", ".join(wrong)


def test_every_docs_command_exists():
    main = _cli()
    wrong = []
    for doc in _docs():
        if doc.endswith(".md"):
            wrong += [f"{doc}: {w}" for w in cli_mistakes(_read(doc), main)
                      if w.count(" ") == 1 and "--" not in w]  # commands only; flags are README's
    assert not wrong, ", ".join(wrong)


def test_a_readme_naming_a_missing_command_or_flag_fails():
    main = _cli()
    assert cli_mistakes("`criu-gpushare suspend PID --tree --cache DIR`, `criu-gpushare freeze`, "
                        "`criu-gpushare store ls|shred`, and `--no-such-flag`", main) == [
        "criu-gpushare suspend --cache", "criu-gpushare freeze", "criu-gpushare store shred",
        "--no-such-flag"]
    assert cli_mistakes("`criu-gpushare store ls|rm [--json]`", main) == ["criu-gpushare store rm --json"]
    assert cli_mistakes("`criu-gpushare store --cache DIR prefetch`, `criu-gpushare run -- x --y`, "
                        "`criu-gpushare dump PID DIR --criu-opt X`", main) == []


# -- exit codes ---------------------------------------------------------------------------------


def _readme_codes(text):
    section = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    return {int(m) for m in re.findall(r"^\| (\d+) \|", section, flags=re.M)}


def test_readme_exit_codes_are_errors_py():
    from criu_gpushare import errors
    codes = {errors.EXIT_OK, errors.EXIT_BUG, errors.EXIT_USAGE}
    codes |= {c.exit_code for _, c in inspect.getmembers(errors, inspect.isclass)
              if issubclass(c, errors.Error)}
    assert _readme_codes(_read("README.md")) == codes


# -- the shim's layers --------------------------------------------------------------------------


def shim_layers(text):
    """{file stem: layer number} from shim/README.md's table."""
    layers = {}
    for number, files in re.findall(r"^\| (\d+) [^|]*\| ([^|]*) \|", text, flags=re.M):
        for stem in re.findall(r"`(\w+)`", files):
            layers[stem] = int(number)
    return layers


def test_shim_layers_table_is_the_include_graph():
    src = os.path.join(ROOT, "shim", "src")
    layers = shim_layers(_read("shim/README.md"))
    sources = {f[:-2] for f in os.listdir(src) if f.endswith(".c")} - {"version"}
    assert set(layers) == sources, "shim/README.md's layer table and shim/src/*.c differ"
    upward = []
    for f in sorted(os.listdir(src)):
        stem = f.rsplit(".", 1)[0]
        if stem not in layers:
            continue
        for inc in re.findall(r'#include "(\w+)\.h"', _read(os.path.join("shim", "src", f))):
            if layers.get(inc, -1) > layers[stem]:
                upward.append(f"{f} (layer {layers[stem]}) includes {inc}.h (layer {layers[inc]})")
    assert not upward, "shim/README.md: " + "; ".join(upward)
    rows = [int(n) for n in re.findall(r"^\| (\d+) ", _read("shim/README.md"), flags=re.M)]
    assert rows == sorted(rows, reverse=True), "shim/README.md draws the layers top down"


# -- sections one doc cites in another ----------------------------------------------------------

CITED = {"FORMAT.md": "store/FORMAT.md", "README": "README.md", "hooks/README.md": "hooks/README.md"}


def _headings(doc):
    """Headings, and the lead words of paragraphs that open with one ("Why it exists: ...")."""
    text = _read(doc)
    return [h.strip() for h in re.findall(r"^#+ (.*)$", text, flags=re.M)] + \
        re.findall(r"(?:^|\n\n)([A-Z][\w ]{2,40}):", text)


def cited_sections(text):
    """(doc, "title" or section number) for each `FORMAT.md, "Leases"` / `section 7a` / `README,
    "Settings"` the text cites."""
    out = []
    for name, rest in re.findall(r"((?:hooks/)?README|FORMAT\.md)`?,? ((?:\"[^\"]+\"(?: and )?)+)",
                                 text):
        name = "hooks/README.md" if name == "hooks/README" else name
        out += [(CITED[name], t) for t in re.findall(r'"([^"]+)"', rest)]
    for nums in re.findall(r"FORMAT\.md`? sections? ([\dA-Za-z ,\-and]+)", text):
        for a, b in re.findall(r"(\d+[a-z]?)(?:-(\d+))?", nums):
            out += [("store/FORMAT.md", n) for n in
                    ([str(i) for i in range(int(a), int(b) + 1)] if b else [a])]
    return out


def test_cited_sections_exist():
    wrong = []
    for doc in _docs():
        for target, section in cited_sections(_read(doc)):
            titles = _headings(target)
            if not any(t == section or t.startswith(section + ".") or
                       re.sub(r"^[\d a-z]*\. ", "", t).startswith(section) or
                       t.strip("`").startswith(section) for t in titles):
                wrong.append(f"{doc} cites {target}, {section!r}")
    assert not wrong, "\n".join(wrong)


def test_a_missing_section_is_found():
    cites = cited_sections('store/FORMAT.md, "Chunk naming"; FORMAT.md sections 4-6; README, "Settings"')
    assert ("store/FORMAT.md", "Chunk naming") in cites and ("store/FORMAT.md", "5") in cites
    assert ("README.md", "Settings") in cites


# -- the README's map of the package ------------------------------------------------------------


def test_readme_development_names_every_engine_and_cli_module():
    section = _read("README.md").split("## Development", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"([\w]+\.py)", section))
    unnamed = [f"{pkg}/{f}" for pkg in ("engine", "cli")
               for f in sorted(os.listdir(os.path.join(ROOT, "criu_gpushare", pkg)))
               if f.endswith(".py") and not f.startswith("_") and f not in named]
    assert not unnamed, "README.md, Development, does not name: " + ", ".join(unnamed)


def test_tests_index_names_every_test_folder():
    index = _read("tests/README.md")
    folders = sorted(d for d in os.listdir(os.path.join(ROOT, "tests"))
                     if os.path.isdir(os.path.join(ROOT, "tests", d)) and d not in SKIP_DIRS)
    assert [d for d in folders if f"{d}/" not in index] == []


def test_each_test_folder_index_names_its_test_modules():
    """A folder with a README.md lists its test modules there (or tests/README.md does)."""
    index = _read("tests/README.md")
    unnamed = []
    for folder in sorted(os.listdir(os.path.join(ROOT, "tests"))):
        readme = os.path.join("tests", folder, "README.md")
        if not os.path.exists(os.path.join(ROOT, readme)):
            continue
        text = _read(readme) + index
        unnamed += [f"tests/{folder}/{f}" for f in sorted(os.listdir(os.path.join(ROOT, "tests", folder)))
                    if f.startswith("test_") and f.endswith(".py") and f not in text]
    assert not unnamed, "not in their folder's README.md: " + ", ".join(unnamed)


def test_docstrings_parse():
    # the modules this test reads as docs must be Python it can read (a syntax error here would
    # hide a doc from every check above)
    for doc in _docs():
        if doc.endswith(".py"):
            ast.parse(_read(doc))
