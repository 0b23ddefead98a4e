"""The package's layers (README, "Development"): each imports only those below it, and no module
imports itself back through another."""
import ast
import os

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "criu_gpushare")
# From the top: a package may import any package of a lower rank, never one of its own or higher.
RANK = {"cli": 5, "hook": 5, "engine": 4, "criu": 3, "gpu": 2, "shimctl": 2, "store": 1,
        "config": 0, "errors": 0, "waits": 0, "procfs": 0, "": 0}


def _modules():
    for root, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(root, f)
                rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                yield (rel[:-9] if rel.endswith("__init__") else rel), path


def _imports(module, path):
    is_pkg = path.endswith("__init__.py")
    here = module.split(".") if is_pkg else module.split(".")[:-1]
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = here[:len(here) - (node.level - 1)] if node.level > 1 else here
            target = ".".join(base + (node.module.split(".") if node.module else []))
            for alias in node.names:
                yield f"{target}.{alias.name}".strip(".")


def _package(name):
    return name.split(".")[0] if name else ""


def test_no_package_imports_a_package_above_it():
    wrong = []
    for module, path in _modules():
        mine = _package(module)
        for target in _imports(module, path):
            theirs = _package(target)
            if theirs in RANK and theirs != mine and RANK[theirs] >= RANK.get(mine, 0) and theirs != "":
                if not (RANK[theirs] == 0 and RANK.get(mine, 0) == 0):
                    wrong.append(f"{module} imports {target}")
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles():
    modules = dict(_modules())
    graph = {m: {t if t in modules else t.rsplit(".", 1)[0] for t in _imports(m, p)} & set(modules)
             for m, p in modules.items()}
    state, cycles = {}, []

    def visit(m, stack):
        state[m] = "open"
        stack.append(m)
        for t in graph[m] - {m}:
            if state.get(t) == "open":
                cycles.append(" -> ".join(stack[stack.index(t):] + [t]))
            elif t not in state:
                visit(t, stack)
        stack.pop()
        state[m] = "done"

    for m in modules:
        if m not in state:
            visit(m, [])
    assert not cycles, "\n".join(cycles)
